"""A training run: its plan, its set-up read top to bottom, the loop, data, checkpoints and restore."""
