"""overlay: the bundle layer (BundleAgent drivers, node supervisor, envelope codec,
custody store, scheduler).  Built under issue 3; nothing here yet."""
