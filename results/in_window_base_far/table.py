"""table.md from the committed files: each in_window_base checkpoint's recall at the in-window grid's in-window
distances (seedN.json, its `blindheads test` results) beside the same seed's in-window ALiBi and float64 arms
(../in_window/recall_by_distance.csv), and the gain of 400 in-window steps, seed by seed (paired t interval).
    .venv/bin/python results/in_window_base_far/table.py"""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from blindheads.experiments.grid.comparisons import paired_t

HERE = Path(__file__).parent
DISTANCES = (64, 112, 144, 192, 232)

base = []
for path in sorted(HERE.glob("seed*.json")):
    metrics = json.loads(path.read_text())["metrics"]
    for key, tokens in metrics.items():
        if key.endswith("/distance") and round(tokens) in DISTANCES:
            point = key.removesuffix("/distance")
            base.append({"seed": int(path.stem[4:]), "distance": round(tokens), "exact": metrics[point + "/exact"],
                         "length": metrics[point + "/length"]})  # fmt: skip
base = pd.DataFrame(base).pivot(index="seed", columns="distance", values="exact")
trained = pd.read_csv(HERE.parent / "in_window" / "recall_by_distance.csv")
trained = trained[trained["distance"].isin(DISTANCES)].pivot_table(index="seed", columns=["setup", "distance"],
                                                                   values="exact")  # fmt: skip
lines = ["| recall at (tokens back) | " + " | ".join(str(d) for d in DISTANCES) + " |", "|---" * 6 + "|"]
for name, table in (("base (64-token windows, 300 steps)", base), ("alibi, after 400 in-window steps",
                    trained["alibi"]), ("alibi_zero_free, after 400 in-window steps", trained["alibi_zero_free"])):  # fmt: skip
    table = table.reindex(base.index).dropna()
    lines.append(f"| {name}, mean of {len(table)} seeds | " + " | ".join(f"{table[d].mean():.2f}" for d in DISTANCES)
                 + " |")  # fmt: skip
for arm in ("alibi", "alibi_zero_free"):
    cells = []
    for d in DISTANCES:
        both = pd.concat([trained[arm][d], base[d]], axis=1, keys=["after", "before"]).dropna()
        row = paired_t(np.asarray(both["after"] - both["before"]))
        cells.append(f"{row['mean_diff']:+.2f} [{row['ci_low']:+.2f}, {row['ci_high']:+.2f}] "
                     f"{row['wins']}/{row['ties']}/{row['losses']}")  # fmt: skip
    lines.append(f"| {arm} - base, per seed (95% t interval, wins/ties/losses) | " + " | ".join(cells) + " |")
lines.append("")
lines.append("Per seed, base: " + "; ".join(f"seed {s} " + " ".join(f"{v:.2f}" for v in row)
                                            for s, row in base.iterrows()))  # fmt: skip
(HERE / "table.md").write_text("\n".join(lines) + "\n")
print((HERE / "table.md").read_text())
