"""A trained run stood up for inference: generate and eval."""
