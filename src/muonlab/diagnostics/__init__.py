"""Read-only diagnostics over optimizers, models and checkpoints (`muonlab diagnose ...`)."""
