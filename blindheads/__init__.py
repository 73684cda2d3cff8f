"""blindheads: when additive position biases make attention heads blind."""

__version__ = "0.1.0"
