"""Charts of the TensorBoard layout (``layout``): a chart draws every tag matching its patterns, at any stage, and
each callback that writes tags worth a chart draws its own (``Charted``)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import lightning as L

from blindheads.evaluation.tags import STAGES

PREFIX = f"({'|'.join(STAGES)})?"


@runtime_checkable
class Charted(Protocol):
    """A callback that draws the tags it writes: adds its charts to ``categories`` (category -> title -> chart),
    merging with what other callbacks of its kind added."""

    def charts(self, trainer: L.Trainer, pl_module: L.LightningModule, categories: dict[str, dict]) -> None: ...


def chart(*patterns: str) -> list:
    """One line chart of every tag matching ``patterns`` (TensorBoard colours its lines by run, not by tag: what
    must be told apart goes in separate charts)."""
    return ["Multiline", [PREFIX + pattern for pattern in patterns]]
