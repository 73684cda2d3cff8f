"""What Lightning sets on a Trainer while it runs, outside its class's declarations (``trainer.callbacks``,
``trainer.datamodule``, ``trainer.log_every_n_steps``), typed in this one place: a type checker reads them through
``running(trainer)``. (The data module as the project's own: ``datamodules.text.datamodule_of``.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:
    import lightning as L


class Running(Protocol):
    """The attributes a Trainer has once built (its callback connector, data connector and logger connector set
    them)."""

    callbacks: list[L.Callback]
    datamodule: L.LightningDataModule | None
    log_every_n_steps: int


def running(trainer: L.Trainer) -> Running:
    """``trainer`` with the attributes Lightning sets at run time typed (the same object)."""
    return cast("Running", trainer)
