"""``blindheads lm_eval``: lm-evaluation-harness on blindheads checkpoints (the model: ``evaluation.lm_eval_adapter``)."""

from __future__ import annotations

import json
import sys

from lm_eval.__main__ import cli_evaluate

from blindheads.evaluation.lm_eval_adapter import model_arguments  # and registers the ``blindheads`` model


def main(argv: list[str]) -> None:
    """``blindheads lm_eval ARGS``: lm-evaluation-harness's own CLI with the ``blindheads`` model registered, each
    ``--model_args key=value,...`` handed to it as JSON so that commas in paths survive."""
    argv = list(argv)
    for index, flag in enumerate(argv[:-1]):
        if flag in ("--model_args", "-a") and not argv[index + 1].lstrip().startswith("{"):
            argv[index + 1] = json.dumps(model_arguments(argv[index + 1]))
    sys.argv = ["lm_eval", *argv]
    cli_evaluate()
