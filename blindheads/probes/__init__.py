"""Probes of published models: measured attention underflow beside the calculator's prediction."""
