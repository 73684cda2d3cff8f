"""The conjecture's tables, figure and verdict, computed from its runs' rows alone (so a committed part of the
experiment can be summarised on any machine without rerunning it).

A run *answered* when its held-out accuracy reached 0.9 at a measurement (the best constant answer scores about
0.1-0.14); it *learned* when it answered from below 0.9 at step 0 (a pretrained decoder can answer before any far
training: that is retention, counted apart); one that answered and ended below 0.9 *collapsed*. Per arm the verdict
gives the interval of B (and of starting far weight) between the last B every seed answered and the first from
which none did, how far that lies from exact zero, how the steps to 0.9 grow with B (a log-linear fit) and whether
the stop lies within the budget the fit asks for, and the runs whose far weight was driven to exactly 0.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from blindheads.experiments.conjecture.far_head import MASKED
from blindheads.numerics import tau

LEARNED = 0.9
# -ln(smallest kept weight) of each arm: float64 arms run unflushed (subnormals kept), the others flush float32
EXACT_ZERO = {"float64": tau("float64", "subnormal"), "float64_tiny_eps": tau("float64", "subnormal")}
COLUMNS = ["arm", "condition", "bias", "seed", "far_weight_start", "accuracy_start", "answered", "learned", "steps_to_0.9",
           "collapsed", "final_accuracy", "far_weight_zero_end",
           "constant_accuracy", "budget", "interval", "same_as_masked", "far_weight_end", "key_gradient", "value_gradient", "digit_gradient"]  # fmt: skip


def zero_edge(arm: str) -> float:
    """The far weight's exact-zero edge of an arm, in nats below the row's largest weight."""
    return EXACT_ZERO.get(arm, tau("float32", "normal"))


def summarize(out: Path, rows: list[dict]) -> pd.DataFrame:
    """``runs.csv`` (a row per arm, condition and seed), ``curves.csv`` (held-out accuracy over steps), ``summary.csv``
    and ``summary.md`` (the dose-response: a row per arm and condition), ``verdict.md``; returns the per-seed table."""
    table = pd.DataFrame([{k: v for k, v in row.items() if k != "curve"} for row in rows])
    table["accuracy_start"] = [row["curve"]["accuracy"][0] for row in rows]
    table["budget"] = [max(row["curve"]["step"]) for row in rows]
    table["interval"] = [row["curve"]["step"][1] - row["curve"]["step"][0] for row in rows]  # between measurements
    masked = {(row["arm"], row["seed"]): row["curve"] for row in rows if row["condition"] == MASKED}
    table["same_as_masked"] = [row["curve"] == masked.get((row["arm"], row["seed"])) for row in rows]
    if "far_weight_zero_end" not in table:  # the decoder's far weight is one number: exactly 0 or not
        table["far_weight_zero_end"] = (table["far_weight_end"] == 0).astype(float)
    table["far_weight_zero_end"] = table["far_weight_zero_end"].fillna((table["far_weight_end"] == 0).astype(float))
    table = classify(table)
    table = table.reindex(columns=[c for c in COLUMNS if c in table.columns])
    table.to_csv(out / "runs.csv", index=False)
    curves = pd.DataFrame([
        {"arm": row["arm"], "condition": row["condition"], "seed": row["seed"], "step": step, "accuracy": accuracy}
        for row in rows for step, accuracy in zip(row["curve"]["step"], row["curve"]["accuracy"])
    ])  # fmt: skip
    curves.to_csv(out / "curves.csv", index=False)
    dose = dose_table(table)
    dose.to_csv(out / "summary.csv", index=False)
    (out / "summary.md").write_text(_markdown(dose))
    (out / "verdict.md").write_text(verdict(table))
    return table


def classify(table: pd.DataFrame) -> pd.DataFrame:
    """``answered`` (reached 0.9), ``learned`` (answered from below 0.9 at step 0) and ``collapsed`` (answered,
    ended below) for each row."""
    answered = table["steps_to_0.9"].notna()
    return table.assign(answered=answered, learned=answered & (table["accuracy_start"] < LEARNED),
                        collapsed=answered & (table["final_accuracy"] < LEARNED))  # fmt: skip


def dose_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per arm and condition: B, seeds, how many answered and learned, median starting far weight and its log,
    median steps to 0.9 among the seeds that answered, median final accuracy, median gradient reaching the digit."""
    rows = []
    for (arm, condition), frame in table.groupby(["arm", "condition"], sort=False):
        weight = frame["far_weight_start"].median()
        gradient = frame["key_gradient" if "key_gradient" in frame and frame["key_gradient"].notna().all()
                         else "digit_gradient"].median()  # fmt: skip
        rows.append({
            "arm": arm, "condition": condition, "bias": frame["bias"].iloc[0], "seeds": len(frame),
            "answered": int(frame["answered"].sum()), "learned": int(frame["learned"].sum()),
            "collapsed": int(frame["collapsed"].sum()), "far_weight_start": weight,
            "ln_far_weight_start": math.log(weight) if weight > 0 else -math.inf,
            "exactly_zero": bool((frame["far_weight_start"] == 0).all()),
            "steps_to_0.9": frame["steps_to_0.9"].dropna().median() if frame["answered"].any() else None,
            "final_accuracy": frame["final_accuracy"].median(), "constant_accuracy": frame["constant_accuracy"].max(),
            "gradient": gradient, "interval": frame["interval"].max(), "budget": frame["budget"].max(),
        })  # fmt: skip
    return pd.DataFrame(rows)


def stopping_point(dose: pd.DataFrame) -> dict:
    """For one arm's dose rows: the last B every seed answered, the first from which no seed answered at any larger
    B, and the steps' log-linear growth over the B every seed answered after more than one measurement."""
    dose = dose.sort_values("bias")
    everyone = dose[dose["answered"] == dose["seeds"]]
    nobody_from = None
    for _, row in dose[::-1].iterrows():
        if row["answered"] > 0:
            break
        nobody_from = row
    fit = everyone.dropna(subset=["steps_to_0.9"])
    fit = fit[fit["steps_to_0.9"] > fit["interval"]]  # answered after more than one measurement: a time to fit
    slope = intercept = None
    if len(fit) >= 3:
        slope, intercept = np.polyfit(fit["bias"], np.log(fit["steps_to_0.9"]), 1)
    return {
        "control": bool(len(dose) and dose.iloc[0]["bias"] == 0 and dose.iloc[0]["answered"] == dose.iloc[0]["seeds"]),
        "last_all": everyone.iloc[-1] if len(everyone) else None,
        "first_none": nobody_from,
        "fit_points": len(fit),
        "slope": slope,
        "intercept": intercept,
    }


def budget_edge(point: dict) -> bool:
    """Whether the arm's stop may be its budget: the fit asks at least the budget at the first B none answered."""
    first = point["first_none"]
    if point["slope"] is None or first is None or not math.isfinite(first["bias"]):
        return False
    return math.exp(point["intercept"] + point["slope"] * first["bias"]) >= first["budget"]


def verdict(table: pd.DataFrame) -> str:
    """The verdict, one paragraph per arm and a closing comparison, every number from ``table``."""
    dose = dose_table(table)
    lines = ["# Verdict (computed by blindheads.experiments.conjecture.report from runs.csv)", ""]
    stops = {}
    for arm, frame in dose.groupby("arm", sort=False):
        point, edge, runs = stopping_point(frame), zero_edge(arm), table[table["arm"] == arm]
        lines.append(f"## {arm}")
        if not point["control"]:
            lines += ["The control (B = 0) did not reach 0.9 in every seed: this arm decides nothing.", ""]
            continue
        last, first = point["last_all"], point["first_none"]
        retained = runs[runs["answered"] & ~runs["learned"]]
        lines.append(f"- Every seed reached {LEARNED} up to B = {last['bias']:g} (starting far weight "
                     f"{last['far_weight_start']:.2g}); {len(retained)} of the {int(runs['answered'].sum())} runs that "
                     f"did were at {LEARNED} before any training on far episodes.")  # fmt: skip
        if first is None:
            lines.append("- Some seed reached it at every B measured: no stopping point within this budget.")
        else:
            near = edge + last["ln_far_weight_start"]
            far = edge + first["ln_far_weight_start"] if math.isfinite(first["ln_far_weight_start"]) else 0.0
            lines.append(f"- No seed reached it from B = {first['bias']:g} on (starting far weight "
                         f"{first['far_weight_start']:.2g}): learning stops between B = {last['bias']:g} and "
                         f"{first['bias']:g}, {far:.0f}-{near:.0f} nats before the weight is exactly zero (ln of the "
                         f"smallest weight kept: -{edge:.1f}).")  # fmt: skip
        learned, failed = runs[runs["learned"]], runs[~runs["answered"] & (runs["far_weight_start"] > 0)]
        if len(learned) and len(failed):
            low, high = (
                learned.loc[learned["far_weight_start"].idxmin()],
                failed.loc[failed["far_weight_start"].idxmax()],
            )
            lines.append(
                f"- By starting far weight, over every run: the smallest that learned {low['far_weight_start']:.2g} "
                f"(B = {low['bias']:g}, seed {low['seed']}), the largest that did not reach {LEARNED} "
                f"{high['far_weight_start']:.2g} (B = {high['bias']:g}, seed {high['seed']})."
            )
        if point["slope"] is not None:
            lines.append(f"- Steps to {LEARNED} grow by a factor {math.exp(point['slope']):.2f} per nat of B "
                         f"(log-linear fit over {point['fit_points']} values of B every seed reached).")  # fmt: skip
            if first is not None and math.isfinite(first["bias"]):
                predicted = math.exp(point["intercept"] + point["slope"] * first["bias"])
                lines.append(
                    f"- The fit asks {predicted:.2g} steps at B = {first['bias']:g}, the budget was {first['budget']:g}: "
                    + ("this arm's stop may be its budget's edge, not a stopping point." if budget_edge(point)
                       else "learning stops more abruptly than the fit's growth.")
                )  # fmt: skip
        else:
            slowest = runs["steps_to_0.9"].max()
            if not pd.isna(slowest):
                lines.append(f"- The slowest run reached {LEARNED} in {slowest:g} steps (measured every "
                             f"{frame['interval'].max():g}): too few values of B took longer than one measurement "
                             "to fit a growth.")  # fmt: skip
        if first is not None and not budget_edge(point):
            stops[arm] = (last, first)
        collapsed = runs[runs["collapsed"]]
        if len(collapsed):
            lines.append(f"- {len(collapsed)} runs reached {LEARNED} and ended below it (B = "
                         f"{', '.join(f'{b:g}' for b in collapsed['bias'])}).")  # fmt: skip
        driven = runs[(runs["far_weight_start"] > 0) & (runs["far_weight_zero_end"] > 0)]
        if len(driven):
            lines.append(f"- {len(driven)} runs whose far weight started non-zero ended with it exactly 0 in some "
                         f"held-out episodes (B, seed, share: "
                         f"{'; '.join(f'{r.bias:g}, {r.seed}, {r.far_weight_zero_end:.2f}' for r in driven.itertuples())}).")  # fmt: skip
        zeros = frame[frame["exactly_zero"]]
        if len(zeros):
            zero_runs = runs[runs["condition"].isin(zeros["condition"])]
            lines.append(f"- Exactly zero from the start at {', '.join(zeros['condition'])}: final accuracy "
                         f"{zeros['final_accuracy'].max():.2f} at most (best constant answer "
                         f"{zeros['constant_accuracy'].max():.2f}); the gradient reaching the digit there is "
                         f"{'exactly 0' if (zeros['gradient'] == 0).all() else 'not 0'} ({len(zero_runs)} runs).")  # fmt: skip
        tiny = runs[(runs["far_weight_start"] > 0) & runs["same_as_masked"]]
        if len(tiny):
            lines.append(f"- Runs with a non-zero far weight whose held-out accuracy equals the masked condition's at "
                         f"every measurement: {len(tiny)}, from B = {tiny['bias'].min():g} (the far fact's share of "
                         "the output is lost in rounding).")  # fmt: skip
        lines.append("")
    lines.append("## Across arms")
    if stops:
        named = ", ".join(f"{arm} B in ({last['bias']:g}, {first['bias']:g}]" for arm, (last, first) in stops.items())
        lines.append(f"- Where learning stops (not a budget's edge): {named}.")
        gaps = {arm: zero_edge(arm) + first["ln_far_weight_start"] for arm, (_, first) in stops.items()
                if math.isfinite(first["ln_far_weight_start"])}  # fmt: skip
        if gaps:
            lines.append(f"- It stops at least {min(gaps.values()):.0f} nats before exact zero in each of these arms "
                         f"({', '.join(f'{arm} {gap:.0f}' for arm, gap in gaps.items())}).")  # fmt: skip
        for arm, (_, first) in stops.items():
            if arm != "adam" and "adam" in stops:
                other = stops["adam"][1]["bias"]
                moved = "the same B" if first["bias"] == other else f"B = {first['bias']:g}"
                lines.append(f"- {arm} against adam: no seed reached {LEARNED} from {moved} (adam: B = {other:g}).")
    zero_learned = table[(table["far_weight_start"] == 0) & table["answered"]]
    lines.append(f"- Runs that reached {LEARNED} with a far weight exactly 0 at the start: {len(zero_learned)} of "
                 f"{int((table['far_weight_start'] == 0).sum())}.")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(out: Path, table: pd.DataFrame) -> None:
    """``conjecture.png``: final accuracy against the starting far weight (exact zeros on their own column, far from
    every real weight), steps to 0.9 against B where learning took time, the gradient reaching the digit against B,
    an arm per colour and marker; where each arm stops."""
    dose = dose_table(table)
    figure = Figure(figsize=(16, 5.2))
    accuracy, steps, gradient = figure.subplots(1, 3)
    zero_at = 1e-70  # exact zeros: below every weight and gradient measured (float64's reach 1e-48)
    styles = ["o-", "s--", "^:", "v-.", "D-", "x--"]
    for i, (arm, frame) in enumerate(table.groupby("arm", sort=False)):
        color, style = f"C{i}", styles[i % len(styles)]
        weights = frame["far_weight_start"].where(frame["far_weight_start"] > 0, zero_at)
        accuracy.scatter(weights, frame["final_accuracy"], s=10, color=color, alpha=0.4)
        arm_dose = dose[dose["arm"] == arm].sort_values("bias")
        live = arm_dose[arm_dose["far_weight_start"] > 0]
        accuracy.plot(live["far_weight_start"], live["final_accuracy"], style, color=color, label=arm, markersize=4)
        timed = arm_dose[arm_dose["steps_to_0.9"] > arm_dose["interval"]]
        if len(timed):
            steps.plot(timed["bias"], timed["steps_to_0.9"], style, color=color, label=arm, markersize=4)
        point = stopping_point(arm_dose)
        if point["first_none"] is not None and math.isfinite(point["first_none"]["bias"]):
            steps.axvline(point["first_none"]["bias"], color=color, linewidth=0.8, alpha=0.6)
        finite = arm_dose[np.isfinite(arm_dose["bias"])]
        gradient.plot(finite["bias"], finite["gradient"].where(finite["gradient"] > 0, zero_at), style, color=color,
                      label=arm, markersize=4)  # fmt: skip
    constant = table["constant_accuracy"].max()
    accuracy.axhline(constant, color="grey", linestyle="--", label=f"best constant answer ({constant:.2f})")
    accuracy.axhline(LEARNED, color="grey", linestyle=":")
    accuracy.set_xscale("log")
    accuracy.set_xlim(zero_at / 100, 3)
    accuracy.set_xticks([zero_at, 1e-45, 1e-30, 1e-15, 1], ["0 (exactly)", "1e-45", "1e-30", "1e-15", "1"])
    accuracy.set_xlabel("starting weight on the far fact (lines: median over seeds; dots: seeds)")
    accuracy.set_ylabel("held-out accuracy at the end")
    accuracy.set_title("learning against the starting far weight")
    accuracy.legend(fontsize="x-small")
    steps.set_yscale("log")
    steps.set_xlabel("B: the far keys' bias step (nats)")
    steps.set_ylabel(f"steps to {LEARNED} (median of seeds that reached it)")
    steps.set_title("cost of learning; vertical: no seed learns from here")
    steps.legend(fontsize="x-small")
    gradient.set_yscale("log")
    gradient.set_yticks([zero_at, 1e-45, 1e-30, 1e-15, 1], ["0 (exactly)", "1e-45", "1e-30", "1e-15", "1"])
    gradient.set_xlabel("B (nats)")
    gradient.set_ylabel("gradient reaching the digit at step 0 (median)")
    gradient.set_title(
        "the signal learning gets\n(bare head: at its key; decoder: at its embedding)", fontsize="medium"
    )
    gradient.legend(fontsize="x-small")
    figure.tight_layout()
    figure.savefig(out / "conjecture.png", dpi=120)


def _markdown(frame: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(frame.columns) + " |", "|---" * len(frame.columns) + "|"]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.3g}" if isinstance(value, float) else str(value)
