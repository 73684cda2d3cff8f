"""Swappable, composable position handling for attention (see ``base`` for how components compose)."""

from blindheads.modules.position.alibi import ALiBi
from blindheads.modules.position.base import PositionComponent, PositionStack
from blindheads.modules.position.clamp import Clamp
from blindheads.modules.position.fire import FIRE
from blindheads.modules.position.kerple_log import KerpleLog
from blindheads.modules.position.kerple_power import KerplePower
from blindheads.modules.position.log_distance import LogDistance
from blindheads.modules.position.nope import NoPE
from blindheads.modules.position.registry import COMPONENTS, PositionSpec, build_position
from blindheads.modules.position.rope import RoPE
from blindheads.modules.position.sandwich import Sandwich
from blindheads.modules.position.sliding_window import SlidingWindow
from blindheads.modules.position.soft_cap import SoftCap
from blindheads.modules.position.step import Step
from blindheads.modules.position.t5_buckets import T5Buckets

__all__ = [
    "COMPONENTS",
    "FIRE",
    "ALiBi",
    "Clamp",
    "KerpleLog",
    "KerplePower",
    "LogDistance",
    "NoPE",
    "PositionComponent",
    "PositionSpec",
    "PositionStack",
    "RoPE",
    "Sandwich",
    "SlidingWindow",
    "SoftCap",
    "Step",
    "T5Buckets",
    "build_position",
]
