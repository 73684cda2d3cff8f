"""A TensorBoard custom-scalars layout written with the run, so its charts group what belongs together: each layer's
heads in one chart, each head's measured against predicted blind distance, passkey and needle by length, recall by
distance."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger

PREFIX = r"(val/|test/)?"


def layout(num_layers: int, num_heads: int) -> dict:
    """The CUSTOM SCALARS tab: categories of charts, each a list of tag regexes drawn together."""

    def chart(*patterns: str) -> list:
        return ["Multiline", [PREFIX + pattern for pattern in patterns]]

    return {
        "underflow: share of weights exactly zero, per layer": {
            f"layer {layer}": chart(rf"underflow/layer{layer}/head\d+$") for layer in range(num_layers)
        },
        "blind distance: measured (every layer) against predicted": {
            f"head {head}": chart(
                rf"blind_distance/layer\d+/head{head}$", rf"blind_distance_predicted/(materialized|fused)/head{head}$"
            )
            for head in range(num_heads)
        },
        "retrieval": {
            "passkey, exact by length and depth": chart(r"passkey/exact/len\d+/depth\d+$"),
            "needle, exact by length and depth": chart(r"needle/exact/len\d+/depth\d+$"),
            "AUC in and beyond the training length": chart(r"(passkey|needle)/auc_(in|out_of)_domain$"),
        },
        "recall by distance": {
            "exact": chart(r"recall/(distance[\d.]+x|gap\d+)/exact$"),
            "failed: fact blind": chart(r"recall/(distance[\d.]+x|gap\d+)/failed_blind$"),
            "failed: fact reachable": chart(r"recall/(distance[\d.]+x|gap\d+)/failed_reachable$"),
        },
        "loss": {
            "train and validation": chart(r"train/loss$", r"loss$"),
            "by length": chart(r"extrapolation/\d+x/loss$"),
        },
    }


class TensorBoardLayout(L.Callback):
    """Writes the layout once per run, on rank 0, to every TensorBoard logger."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not trainer.is_global_zero:
            return
        config = pl_module.decoder.config
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_custom_scalars(layout(config.num_layers, config.num_heads))
