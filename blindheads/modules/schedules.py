"""Learning-rate schedules, as multipliers of the peak rate, sized from ``max_steps``."""

from __future__ import annotations

import math

SCHEDULES = ("cosine", "wsd")


def lr_multiplier(
    step: int, max_steps: int, schedule: str, warmup_steps: int, decay_fraction: float = 0.2, min_ratio: float = 0.0
) -> float:
    """``cosine``: linear warmup, then cosine from 1 down to ``min_ratio`` at ``max_steps``.
    ``wsd`` (warmup-stable-decay, SmolLM): linear warmup, constant, then in the last ``decay_fraction`` of training a
    ``1 - sqrt`` cooldown from 1 down to ``min_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "cosine":
        progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    if schedule == "wsd":
        decay_steps = max(1, round(decay_fraction * max_steps))
        decay_start = max_steps - decay_steps
        if step < decay_start:
            return 1.0
        progress = min(1.0, (step - decay_start) / decay_steps)
        return min_ratio + (1 - min_ratio) * (1 - math.sqrt(progress))
    raise ValueError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
