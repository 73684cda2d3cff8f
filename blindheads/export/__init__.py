"""Sharing checkpoints in the formats the field loads: Hugging Face directories, lm-evaluation-harness."""
