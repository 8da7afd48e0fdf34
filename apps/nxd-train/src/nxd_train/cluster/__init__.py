"""Processes and clusters: the launcher's world, peers' heartbeats, interrupts and launch scripts."""
