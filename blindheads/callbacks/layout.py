"""A TensorBoard custom-scalars layout written with the run, so its charts group what belongs together: underflow's
mean per length, each head's measured (and, where positions train, predicted) blind distance, recall per distance,
passkey and needle by length, loss. A chart holds one line where its lines would need telling apart (TensorBoard
colours by run, so one run's lines share a colour); the IMAGES tab sets them side by side. It is built from the
configured evaluations, so every chart draws tags they write (TensorBoard shows an empty "Matches (0)" chart for a
pattern nothing writes)."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger

from blindheads.callbacks.charts import Charted, chart
from blindheads.evaluation.tags import loss_tag
from blindheads.running import running


def layout(trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
    """The CUSTOM SCALARS tab: categories of charts, each a list of tag regexes drawn together. Each callback that
    writes tags worth a chart draws its own (``charts(trainer, pl_module, categories)``, adding to ``categories``);
    the loss comes last, its train and held-out charts first."""
    categories: dict[str, dict] = {}
    for callback in running(trainer).callbacks:
        if isinstance(callback, Charted):
            callback.charts(trainer, pl_module, categories)
    categories["loss"] = {"train (text and retrieval episodes)": chart(loss_tag("train/") + "$"),
                          "held-out text (validation, test)": chart(loss_tag() + "$"),
                          **categories.pop("loss", {})}  # fmt: skip
    return categories


class TensorBoardLayout(L.Callback):
    """Writes the layout once per command, on rank 0, to every TensorBoard logger: when the run starts, after a
    checkpoint's weights are loaded (learnable slopes decide which heads go blind)."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write(trainer, pl_module)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "validate":  # not each validation of a fit
            self._write(trainer, pl_module)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write(trainer, pl_module)

    def _write(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_custom_scalars(layout(trainer, pl_module))
