"""``blindheads conjecture``: can a head that is blind at a distance learn to use what lies there?

Exactly-zero attention weights pass no gradient. Here every head of a 2-layer model is made blind ``BLIND`` tokens
back (float32, subnormals flushed), so nothing further than ``2 * BLIND`` tokens can reach a prediction through
non-zero weights. The data (``configs/experiments/conjecture.yaml`` over ``laptop.yaml``: an episode of the mix's
short template in every 128-token window, ``kettle = 5.`` ... ``kettle = 5.``) puts answers near (gap 1: 9 tokens
back, a bias of 15 nats: visible) and far (gap 96: 104 tokens back, beyond every path). The same model and data
train under each condition:

- ``nope``: no bias (the control: is the far recall learnable in this budget?);
- ``zero``: the far weights are exactly 0 (default slopes, flushed float32);
- ``learnable``: learnable slopes starting at the blind ones, free to flatten;
- ``subnormal``: the same slopes with subnormals kept (the zero point moves from 87.3 to 103.3 nats: 62 tokens);
- ``clamp``: the bias floored where weights stay non-zero (about 1e-32): tiny but not zero;
- ``log_distance``: log-scaled distances: far weights small, not tiny.

``EpisodeRecall`` logs, every ``--every`` steps, the exact recall at both gaps, the attention weight from each answer
to its fact per layer and head, and the learnable slopes; the summary plots them over training.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from blindheads.analysis.runs import scalars
from blindheads.experiments.runner import configs, launch

BLIND = 52  # tokens back at which every head goes blind (8 heads, float32, normal threshold)
HEADS = 8
STEEP = f"alibi(blind_distances={[BLIND] * HEADS}"
CONDITIONS = {  # the control and the plain blind model first: they run first
    "nope": ("nope", {}),
    "zero": (f"{STEEP})", {}),
    "learnable": (f"{STEEP}, learnable=True)", {}),
    "subnormal": (f"{STEEP})", {"BLINDHEADS_KEEP_SUBNORMALS": "1"}),
    "clamp": (f"{STEEP})+clamp", {}),
    "log_distance": (f"{STEEP})+log_distance", {}),
}
NEAR, FAR = 1, 96  # the gaps measured: answers 9 and 104 tokens back


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="blindheads conjecture", description=__doc__)
    parser.add_argument(
        "--config",
        nargs="+",
        default=["configs/experiments/laptop.yaml", "configs/experiments/conjecture.yaml"],
        help="the model and data; later files override earlier ones",
    )
    parser.add_argument("--conditions", nargs="+", default=list(CONDITIONS), help=f"any of {', '.join(CONDITIONS)}")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--every", type=int, default=100, help="steps between recall measurements")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/conjecture", help="summary directory (tables, figures, results.json)")
    parser.add_argument("--runs", default="runs/conjecture", help="the runs' directory (checkpoints, logs)")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: options for every fit")
    args = parser.parse_args(argv)
    unknown = [c for c in args.conditions if c not in CONDITIONS]
    if unknown:
        parser.error(f"unknown conditions {unknown}; valid: {', '.join(CONDITIONS)}")
    args.extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    return args


def run_condition(name: str, args: argparse.Namespace) -> dict:
    runs = Path(args.runs)
    run_dir = runs / name / f"seed{args.seed}"
    done = run_dir / "done.json"
    if done.exists():
        return json.loads(done.read_text())
    position, env = CONDITIONS[name]
    command = [
        "fit", *configs(args.config), "--model.decoder.position", position, "--seed_everything", str(args.seed),
        "--trainer.max_steps", str(args.steps), "--trainer.val_check_interval", str(args.steps),
        "--trainer.logger.init_args.save_dir", str(runs), "--trainer.logger.init_args.name", name,
        "--trainer.logger.init_args.version", f"seed{args.seed}",
        "--trainer.callbacks+=blindheads.callbacks.episode_recall.EpisodeRecall",
        f"--trainer.callbacks.every_n_steps={args.every}", f"--trainer.callbacks.gaps=[{NEAR}, {FAR}]",
        "--trainer.callbacks.samples=64", *args.extra,
    ]  # fmt: skip
    if (run_dir / "checkpoints" / "last.ckpt").exists():
        command += ["--ckpt_path", "last"]
    started = time.monotonic()
    launch(command, runs / name / f"seed{args.seed}.fit.log", args.parallel, env)
    record = {"condition": name, "position": position, "env": env, "wall_s": round(time.monotonic() - started, 1)}
    done.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{name}: done in {record['wall_s']:.0f} s", flush=True)
    return record


def curves(runs: Path, conditions: list[str], seed: int) -> pd.DataFrame:
    """Every ``recall/`` scalar of every condition: columns condition, tag, step, value."""
    frames = []
    for name in conditions:
        frame = scalars(runs / name / f"seed{seed}")
        frames.append(frame[frame["tag"].str.startswith("recall/")].assign(condition=name))
    return pd.concat(frames, ignore_index=True)


def summarize(out: Path, data: pd.DataFrame, conditions: list[str]) -> pd.DataFrame:
    rows = []
    for name in conditions:
        frame = data[data["condition"] == name]
        last = frame[frame["step"] == frame["step"].max()].set_index("tag")["value"]
        far = last.filter(regex=rf"^recall/gap{FAR}/weight/")
        rows.append({
            "condition": name,
            "position": CONDITIONS[name][0],
            f"exact_gap{NEAR}": last.get(f"recall/gap{NEAR}/exact"),
            f"exact_gap{FAR}": last.get(f"recall/gap{FAR}/exact"),
            f"distance_gap{FAR}": last.get(f"recall/gap{FAR}/distance"),
            "far_weight_max": far.max(),
            "far_weights_exactly_zero": int((far == 0).sum()),
            "far_weights": len(far),
            "slopes_final": ", ".join(f"{v:.3g}" for v in last.filter(regex=r"^recall/slope/").tolist()) or None,
        })  # fmt: skip
    table = pd.DataFrame(rows).set_index("condition")
    table.to_csv(out / "summary.csv")
    lines = ["| " + " | ".join(["condition", *table.columns]) + " |", "|---" * (len(table.columns) + 1) + "|"]
    for name, row in table.iterrows():
        lines.append("| " + " | ".join([name, *(_cell(v) for v in row.tolist())]) + " |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    return table


def plot(out: Path, data: pd.DataFrame, conditions: list[str]) -> None:
    figure = Figure(figsize=(11, 7))
    (near, far), (weight, slopes) = figure.subplots(2, 2)
    for name in conditions:
        frame = data[data["condition"] == name]
        for axis, gap in ((near, NEAR), (far, FAR)):
            curve = frame[frame["tag"] == f"recall/gap{gap}/exact"]
            axis.plot(curve["step"], curve["value"], marker="o", label=name)
        weights = frame[frame["tag"].str.match(rf"^recall/gap{FAR}/weight/")]
        top = weights.groupby("step")["value"].max()
        weight.plot(top.index, top.clip(lower=1e-45).to_numpy(), marker="o", label=name)
        for head, curve in frame[frame["tag"].str.startswith("recall/slope/")].groupby("tag"):
            slopes.plot(curve["step"], curve["value"], label=head.rsplit("/", 1)[-1])
    near.set_title(f"exact recall, gap {NEAR} (visible to every head)")
    far.set_title(f"exact recall, gap {FAR} (beyond every head's blindness)")
    weight.set_title("largest attention weight on the far answer (0 shown at 1e-45)")
    weight.set_yscale("log")
    slopes.set_title(f"learnable slopes (start: blind at {BLIND} tokens)")
    slopes.set_yscale("log")
    for axis in (near, far, weight, slopes):
        axis.set_xlabel("step")
    near.legend(fontsize="small")
    if slopes.lines:
        slopes.legend(fontsize="x-small", ncol=2)
    figure.tight_layout()
    figure.savefig(out / "conjecture.png", dpi=120)


def main(argv: list[str]) -> pd.DataFrame:
    args = parse_args(argv)
    started = time.monotonic()
    with ThreadPoolExecutor(args.parallel) as pool:
        records = list(pool.map(lambda name: run_condition(name, args), args.conditions))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = curves(Path(args.runs), args.conditions, args.seed)
    data.to_csv(out / "curves.csv", index=False)
    table = summarize(out, data, args.conditions)
    plot(out, data, args.conditions)
    provenance = {
        "command": "blindheads conjecture " + " ".join(argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - started, 1),
        "seed": args.seed,
        "python": platform.python_version(),
        "versions": {name: version(name) for name in ("torch", "lightning")},
        "runs": records,
        "summary": json.loads(table.to_json(orient="index")),
    }
    (out / "results.json").write_text(json.dumps(provenance, indent=2) + "\n")
    print(f"summary: {out / 'summary.md'}")
    return table


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "n/a"
    return f"{value:.3g}" if isinstance(value, float) else str(value)
