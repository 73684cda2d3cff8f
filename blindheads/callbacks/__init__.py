"""Callbacks: throughput, per-head underflow, periodic retrieval evaluation."""
