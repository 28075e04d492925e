"""cla_adapters: convergence-layer specs translated to each BPA's configuration.
Built under issue 3; nothing here yet."""
