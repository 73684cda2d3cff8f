"""Evaluation tasks shared by the training callbacks, ``blindheads test`` and the probes of published models."""
