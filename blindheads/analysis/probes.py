"""``blindheads probe`` outputs as tables."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import torch

from blindheads.blindness import underflow_all_pairs


def load_probe(directory: str | Path) -> dict:
    return json.loads((Path(directory) / "probe.json").read_text())


def probe_table(directories: list[str | Path]) -> pd.DataFrame:
    """One row per model and length: measured share of causal weights exactly zero (mean over layers and heads)
    beside the share the calculator predicts from the bias alone in each threshold mode."""
    rows = []
    for directory in directories:
        probe = load_probe(directory)
        predicted = {
            mode: torch.tensor([math.inf if d is None else d for d in distances], dtype=torch.float64)
            for mode, distances in probe["predicted_blind_distance"].items()
        }
        for entry in probe["lengths"]:
            row = {
                "model": probe["model"],
                "architecture": probe["architecture"],
                "dtype": probe["dtype"],
                "length": entry["length"],
                "measured_zero_share": float(torch.tensor(entry["zero_share"]).mean()),
            }
            for mode, distances in predicted.items():
                row[f"predicted_zero_share_{mode}"] = float(underflow_all_pairs(distances, entry["length"]).mean())
            rows.append(row)
    return pd.DataFrame(rows)
