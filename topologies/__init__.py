"""topologies: named DIL networks in Linux network namespaces, with link emulation
(kernel netem where the kernel has it, a userspace channel emulator elsewhere)."""
