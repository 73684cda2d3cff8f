"""blindheads conjecture: can a head that is blind at a distance learn to use what lies there?

Exactly-zero attention weights pass no gradient. Here every head of a one-layer model (the laptop model's width, 8
heads) goes blind BLIND tokens back (float32, subnormals flushed), so a fact farther back is seen by no head at all
(with one layer, no chain of weights can bring it either). The data (configs/experiments/conjecture.yaml over
laptop.yaml: an episode of the mix's assign template in every 256-token window, kettle=5; ... kettle=5, in text
without digits, so the value is the only number a head can find) puts answers near (gap 1: 7-9 tokens back, a bias
of 3.2-4.1 nats: visible to every head) and far (gap 225: 231-233 tokens back, beyond every head). The same model and
data train under each condition of configs/experiments/conjecture/:

- nope: no bias (the control: are both recalls learnable in this budget?);
- zero: the far weights are exactly 0;
- learnable: learnable slopes starting at the blind ones, free to flatten;
- subnormal: the same slopes with subnormals kept (the zero edge moves from 190 to 226 tokens, still short of 231);
- clamp: the bias floored where weights stay non-zero (about 1e-32): tiny, not zero;
- log_distance: log-scaled distances: far weights small, not tiny.

EpisodeRecall logs, every --every steps, exact recall at both gaps, whether each answer's fact was blind or even
unreachable, the weight from each answer to its fact per layer and head, and learnable slopes. The verdict: if the
control and every condition learn the near answer, and only the conditions whose far fact is unreachable fail the
far one, exact zeros are what stops them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from blindheads.analysis.runs import scalars
from blindheads.arguments import Parser
from blindheads.evaluation.tags import RECALL, gap_point, recall_tag, recall_weight_tag
from blindheads.experiments.loop import Run, run_experiment
from blindheads.experiments.runner import at_least, checked, configs, distinct, provenance, write_json
from blindheads.experiments.setups import located

BLIND = 190  # tokens back at which every head goes blind (float32, normal threshold)
CONDITIONS = ["nope", "zero", "learnable", "subnormal", "clamp", "log_distance"]  # control and plain blind first
CONDITION_CONFIGS = "configs/experiments/conjecture"
NEAR, FAR = 1, 225  # the gaps measured: answers 7-9 and 231-233 tokens back


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options, every value checked before anything runs (one line naming the bad value and the choices)."""
    parser = Parser("blindheads conjecture", __doc__)
    parser.add_argument(
        "--config",
        nargs="+",
        default=["configs/experiments/laptop.yaml", "configs/experiments/conjecture.yaml"],
        help="the model and data; later files override earlier ones",
    )
    parser.add_argument("--conditions", nargs="+", default=CONDITIONS, help="any of the conditions above")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="seeds")
    parser.add_argument("--steps", type=int, default=800, help="training steps")
    parser.add_argument("--every", type=int, default=100, help="steps between recall measurements")
    parser.add_argument("--runs", default="runs/conjecture", help="checkpoints and logs")
    parser.add_argument("--out", help="summary directory; default: the runs' directory + -summary")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once, one thread each")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: options for every fit")
    args = parser.parse_args(argv)
    unknown = [c for c in args.conditions if c not in CONDITIONS]
    if unknown:
        raise ValueError(f"unknown conditions {unknown}; valid: {', '.join(CONDITIONS)}")
    distinct("--conditions", args.conditions)
    at_least("--steps and --every", [args.steps, args.every], 1)
    if args.every > args.steps:
        raise ValueError(f"--every {args.every} is more than --steps {args.steps}: recall would never be measured")
    return checked(args)


def condition_files(name: str, args: argparse.Namespace) -> list[str]:
    return [*args.config, located(f"{CONDITION_CONFIGS}/{name}.yaml")]


def run_options(name: str, seed: int, args: argparse.Namespace) -> list[str]:
    return [
        *configs(condition_files(name, args)), "--seed_everything", str(seed),
        "--trainer.max_steps", str(args.steps), "--trainer.val_check_interval", str(args.steps),
        "--trainer.logger.init_args.save_dir", args.runs, "--trainer.logger.init_args.name", name,
        "--trainer.logger.init_args.version", f"seed{seed}",
        "--callbacks.use+=recall", f"--callbacks.recall.every_n_steps={args.every}",
        f"--callbacks.recall.gaps=[{NEAR}, {FAR}]", "--callbacks.recall.samples=64", *args.extra,
    ]  # fmt: skip


def runs(args: argparse.Namespace) -> list[Run]:
    """A fit of every condition at every seed."""
    return [
        Run(f"{name} seed {seed}", Path(args.runs) / name / f"seed{seed}", {"condition": name, "seed": seed},
            run_options(name, seed, args), condition_files(name, args))
        for seed in args.seeds for name in args.conditions
    ]  # fmt: skip


def curves(runs: Path, records: list[dict]) -> pd.DataFrame:
    """Every ``recall/`` scalar of every run: columns condition, seed, tag, step, value."""
    frames = []
    for name, seed in ((r["condition"], r["seed"]) for r in records):
        frame = scalars(runs / name / f"seed{seed}")
        parts = frame["tag"].str.extract(RECALL)
        frames.append(frame[parts["point"].notna() & parts["stage"].isna()].assign(condition=name, seed=seed))
    return pd.concat(frames, ignore_index=True)


def summarize(out: Path, data: pd.DataFrame) -> pd.DataFrame:
    """One row per condition and seed, at the last measured step: exact recall near and far, the share of far facts
    blind and unreachable, the far weights (largest, and how many of the layer-heads' are exactly zero)."""
    rows = []
    for (name, seed), frame in data.groupby(["condition", "seed"], sort=False):
        last = frame[frame["step"] == frame["step"].max()].set_index("tag")["value"]
        far = last.filter(regex="^" + recall_weight_tag(gap_point(FAR), r"\d+", r"\d+") + "$")
        rows.append({
            "condition": name,
            "seed": seed,
            "step": int(frame["step"].max()),
            "exact_near": last.get(recall_tag(gap_point(NEAR), "exact")),
            "exact_far": last.get(recall_tag(gap_point(FAR), "exact")),
            "distance_near": last.get(recall_tag(gap_point(NEAR), "distance")),
            "distance_far": last.get(recall_tag(gap_point(FAR), "distance")),
            "far_blind": last.get(recall_tag(gap_point(FAR), "blind")),
            "far_unreachable": last.get(recall_tag(gap_point(FAR), "unreachable")),
            "far_weight_max": far.max(),
            "far_weights_exactly_zero": int((far == 0).sum()),
            "far_weights": len(far),
            "slopes_final": ", ".join(f"{v:.3g}" for v in last.filter(regex="^" + recall_tag("slope", "")).tolist()) or None,
        })  # fmt: skip
    table = pd.DataFrame(rows)
    table.to_csv(out / "summary.csv", index=False)
    lines = ["| " + " | ".join(table.columns) + " |", "|---" * len(table.columns) + "|"]
    for row in table.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    return table


def plot(out: Path, data: pd.DataFrame, near_gap: int = NEAR, far_gap: int = FAR, blind: int = BLIND) -> None:
    """Recall near and far, the far weight and learnable slopes over training: recall a line per condition and seed
    (seeds can differ by all or nothing, which a mean would hide), conditions whose recall curves are identical one
    line, named together. Exactly-zero weights sit on their own row below the log axis, labelled 0."""
    figure = Figure(figsize=(11, 7))
    (near, far), (weight, slopes) = figure.subplots(2, 2)
    floor, always_zero = 1e-46, []  # below the smallest float32 subnormal (1.4e-45)
    colors = {name: f"C{i}" for i, name in enumerate(dict.fromkeys(data["condition"]))}  # the same in every panel
    # (near curves, far curves), a column per seed -> the conditions that have them
    recall: dict[tuple[str, ...], tuple[tuple, list]] = {}
    for name, frame in data.groupby("condition", sort=False):
        curves = tuple(
            frame[frame["tag"] == recall_tag(gap_point(gap), "exact")].pivot_table(
                index="step", columns="seed", values="value"
            )
            for gap in (near_gap, far_gap)
        )
        recall.setdefault(tuple(c.to_csv() for c in curves), (curves, []))[1].append(name)
    styles = ["-", "--", ":", "-."]
    for curves, names in recall.values():
        for axis, table in zip((near, far), curves):
            for i, seed in enumerate(table.columns):
                axis.plot(table.index, table[seed].to_numpy(), marker="o", linestyle=styles[i % len(styles)],
                          color=colors[names[0]], label=" = ".join(names) if i == 0 else None)  # fmt: skip
    for name, frame in data.groupby("condition", sort=False):
        weights = frame[frame["tag"].str.match("^" + recall_weight_tag(gap_point(far_gap), r"\d+", r"\d+") + "$")]
        top = weights.groupby("step")["value"].max()
        if (top == 0).all():  # drawn once below, named together: such lines would hide each other
            always_zero.append(name)
            zero_steps = top.index
        else:
            weight.plot(top.index, top.clip(lower=floor).to_numpy(), marker="o", label=name, color=colors[name])
        for head, curve in frame[frame["tag"].str.startswith(recall_tag("slope", ""))].groupby("tag"):
            mean = curve.groupby("step")["value"].mean()
            slopes.plot(mean.index, mean.to_numpy(), label=head.rsplit("/", 1)[-1])
    seeds = ", ".join(f"{style} seed {seed}" for style, seed in zip(styles, sorted(data["seed"].unique())))
    near.set_title(f"exact recall, gap {near_gap} (visible to every head)\n{seeds}", fontsize="medium")
    far.set_title(f"exact recall, gap {far_gap} (beyond every path when blind)")
    for axis in (near, far):
        axis.set_ylim(-0.02, 1.02)
    if always_zero:
        weight.plot(zero_steps, [floor] * len(zero_steps), "k--", marker="o")
        weight.annotate(f"exactly 0 at every step: {', '.join(always_zero)}", (0.02, 0.06),
                        xycoords="axes fraction", fontsize="small")  # fmt: skip
    weight.set_title("largest weight on the far answer over every layer-head")
    weight.set_yscale("log")
    weight.set_ylim(floor / 10, 1.5)
    ticks = [floor, 1e-40, 1e-30, 1e-20, 1e-10, 1]
    weight.set_yticks(ticks, ["0 (exactly)", "1e-40", "1e-30", "1e-20", "1e-10", "1"])
    weight.legend(fontsize="x-small")
    slopes.set_title(f"learnable slopes, mean of seeds (start: blind at {blind})")
    slopes.ticklabel_format(axis="y", style="plain", useOffset=False)
    for axis in (near, far, weight, slopes):
        axis.set_xlabel("step")
    near.legend(fontsize="small")
    if slopes.lines:
        slopes.legend(fontsize="x-small", ncol=2)
    figure.tight_layout()
    figure.savefig(out / "conjecture.png", dpi=120)


def main(argv: list[str]) -> pd.DataFrame:
    args = parse_args(argv)

    def write(out: Path, records: list[dict], command: str, wall_s: float) -> pd.DataFrame:
        data = curves(Path(args.runs), records)
        data.to_csv(out / "curves.csv", index=False)
        table = summarize(out, data)
        plot(out, data)
        summary = table.to_dict(orient="records")
        write_json(
            out / "results.json", {**provenance(command, wall_s, args.seeds), "runs": records, "summary": summary}
        )
        return table

    return run_experiment("conjecture", argv, args, runs(args), write)


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "n/a"
    return f"{value:.3g}" if isinstance(value, float) else str(value)
