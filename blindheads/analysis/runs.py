"""TensorBoard runs as tables: every scalar, and one comparison row per experiment."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pandas as pd
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from blindheads.evaluation.tags import UNDERFLOW, loss_tag, retrieval_tag

# column -> its tag at a stage: "val/" or "" (retrieval) in the logs, "test/" in results.json
COMPARISON: dict[str, Callable[[str], str]] = {
    "val_loss": loss_tag,
    **{
        f"{task}_{name}": partial(retrieval_tag, task, name)
        for task in ("passkey", "needle")
        for name in ("auc_in_domain", "auc_out_of_domain", "samples_in_domain", "samples_out_of_domain")
    },
}


def run_dirs(root: str | Path) -> list[Path]:
    """Every directory below ``root`` that holds TensorBoard event files (one per run version)."""
    return sorted({p.parent for p in Path(root).rglob("events.out.tfevents.*")})


def find_runs(root: str | Path) -> list[Path]:
    """``run_dirs(root)``, refusing a root that holds none (a wrong folder would otherwise give an empty table)."""
    runs = run_dirs(root)
    if not runs:
        raise FileNotFoundError(
            f"no TensorBoard runs under {Path(root).resolve()}: run `make demo`, or point "
            "runs_dir at the save_dir of fits"
        )
    return runs


def scalars(run_dir: str | Path) -> pd.DataFrame:
    """Every scalar of a run (all its event files, no sampling): columns ``tag``, ``step``, ``value``."""
    rows = []
    for events in sorted(Path(run_dir).glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            rows += [(tag, e.step, e.value) for e in accumulator.Scalars(tag)]
    frame = pd.DataFrame(rows, columns=["tag", "step", "value"])
    return frame.drop_duplicates(["tag", "step"], keep="last").sort_values(["tag", "step"], ignore_index=True)


def _last(frame: pd.DataFrame, tag: str) -> float:
    values = frame.loc[frame["tag"] == tag, "value"]
    return float(values.iloc[-1]) if len(values) else math.nan


def comparison_table(root: str | Path) -> pd.DataFrame:
    """One row per run: the experiment (logger name), version, last step, and the latest validation loss and
    retrieval AUCs with their sample counts; ``test/`` values from a ``results.json`` beside the run win."""
    rows = []
    for run in find_runs(root):
        frame = scalars(run)
        row = {
            "experiment": run.parent.name,
            "version": run.name,
            "step": int(frame["step"].max()) if len(frame) else 0,
            "status": run_status(run, frame),
        }
        row.update(
            {column: _last(frame, tag("val/" if column == "val_loss" else "")) for column, tag in COMPARISON.items()}
        )
        results = run / "results.json"
        if results.exists():
            metrics = json.loads(results.read_text())["metrics"]
            for column, tag in COMPARISON.items():
                value = metrics.get(tag("test/"))
                if isinstance(value, (int, float)):
                    row[column] = value
        rows.append(row)
    return pd.DataFrame(rows)


def run_status(run: Path, frame: pd.DataFrame) -> str:
    """``tested``, ``trained``, or what is missing: a run killed before its first checkpoint, or one stopped short
    of its ``max_steps`` (from its ``config.yaml``), with how to go on."""
    if (run / "results.json").exists():
        return "tested"
    if not any(run.glob("checkpoints/*.ckpt")):
        return "no checkpoint: stopped before its first one"
    config = run / "config.yaml"
    max_steps = (
        (yaml.safe_load(config.read_text()) or {}).get("trainer", {}).get("max_steps") if config.exists() else None
    )
    trained = frame.loc[frame["tag"] == loss_tag("train/"), "step"]
    done = int(trained.max()) + 1 if len(trained) else 0
    if isinstance(max_steps, int) and max_steps > 0 and done < max_steps:
        return f"incomplete: {done} of {max_steps} steps logged (resume with --ckpt_path last)"
    return "trained"


def per_head(frame: pd.DataFrame) -> pd.DataFrame:
    """Each head's underflow at the training length, logged during training, as columns ``layer``, ``head``,
    ``step``, ``value``."""
    parts = frame["tag"].str.extract(UNDERFLOW)
    keep = parts["layer"].notna() & parts["stage"].isna() & parts["at"].isna()
    out = frame[keep].assign(layer=parts.loc[keep, "layer"].astype(int), head=parts.loc[keep, "head"].astype(int))
    return out[["layer", "head", "step", "value"]].reset_index(drop=True)
