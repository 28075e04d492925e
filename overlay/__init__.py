"""overlay: the bundle layer (BundleAgent drivers, node supervisor, envelope codec,
custody store, scheduler, the node and its port for the gateways)."""
