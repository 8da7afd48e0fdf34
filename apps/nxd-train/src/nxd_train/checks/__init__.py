"""The checks a run passes before launch that need the machine, files or memory (config-only rules live in
nxd-config)."""
