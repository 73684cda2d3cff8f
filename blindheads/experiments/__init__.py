"""Experiments made of many runs: the laptop grid and its summary."""
