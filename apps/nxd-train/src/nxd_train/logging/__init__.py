"""What a run reports: the monitor (console, CSV, TensorBoard), W&B, Comet, the log directory and plots."""
