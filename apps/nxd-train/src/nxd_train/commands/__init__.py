"""The subcommands of `nxd-train`: the command table, each command's handler and what they share."""
