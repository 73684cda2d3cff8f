"""No position information at all: attention sees positions only through the causal mask."""

from blindheads.modules.position.base import PositionComponent


class NoPE(PositionComponent):
    """NoPE: ``logit = q.k / sqrt(D)``. Every hook is the identity."""

    name = "nope"
