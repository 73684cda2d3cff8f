"""blindheads retrieval-heads: which heads of tested runs retrieve the passkey and the needle, and does retrieval
beyond the training length fail where those heads go blind?

For each run directory (RUNS/SETUP/seedS, as ``blindheads grid`` makes them), the decoder is read from last.ckpt and
the data module and the passkey and needle callbacks are rebuilt from the run's config; their prompts (the same ones
the run was scored on; ``--samples`` draws more per length and depth, the run's among them) are attributed as
``blindheads/evaluation/retrieval_heads.py`` describes.

Writes into --out: ``heads.csv`` (a row per run, task and layer-head: ablation cost, whether it carries retrieval,
predicted and measured blind distance), ``prompts.csv`` (a row per prompt: key distance, answered, answered under the
cap, the costliest carrier's weight on the key, carriers all exactly blind), ``retrieval_heads.md`` (the command, seeds and versions, and per setup and task, pooled
over seeds, the carriers, retrieval by key distance beside the carriers' blindness, and where each starts).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import pandas as pd
import torch

from blindheads import atomic
from blindheads.arguments import Parser
from blindheads.callbacks.retrieval import NeedleEval, PasskeyEval, RetrievalEval
from blindheads.cli.tested_run import load_run
from blindheads.evaluation.retrieval_heads import retrieval_heads
from blindheads.evaluation.scoring import top_share
from blindheads.experiments.driver.records import provenance, provenance_lines

FAILED = 0.5  # a distance band fails where its exact share is below this share of the in-domain one
BLIND = 0.5  # a distance band is blind where, on average, this share of the carriers' ablation cost is exactly blind


def attribute_run(run_dir: str | Path, samples: int | None, device: str | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The run's heads and prompts tables (see the module docstring), for each of its retrieval callbacks."""
    loaded = load_run(run_dir, (PasskeyEval, NeedleEval), device)
    run = {"setup": loaded.run_dir.parent.name, "seed": loaded.run_dir.name, "step": loaded.step}
    heads, prompts = [], []
    for callback in loaded.callbacks:
        assert isinstance(callback, RetrievalEval)  # load_run keeps only the kinds asked for
        callback.samples = samples or callback.samples  # prompts are drawn per index: the run's are the first
        seq_len = loaded.data.seq_len
        task = {**run, "task": callback.task}
        chosen = callback.prompts(loaded.data, callback.lengths_for(seq_len))
        with loaded.precision.forward_context():
            head_rows, prompt_rows = retrieval_heads(
                loaded.decoder, loaded.data.tokenizer, chosen, seq_len, callback.batch_size
            )
        heads += [{**task, **row} for row in head_rows]
        prompts += [{**task, "training_length": seq_len, **row} for row in prompt_rows]
    return pd.DataFrame(heads), pd.DataFrame(prompts)


def distance_band(distance: float) -> int:
    """The band's lower edge: 0 below 32 tokens, else the power of two at or below ``distance``."""
    return 0 if distance < 32 else 2 ** int(math.log2(distance))


def bands(prompts: pd.DataFrame) -> pd.DataFrame:
    """Per setup, task and key-distance band, pooled over seeds: prompts, exact share, the mean share of the carriers'
    cost exactly blind to the key, the share of prompts whose costliest carrier (each run's own) is, and whose
    carriers all are, exact share under the cap (beyond the training length)."""
    frame = prompts.assign(band=prompts["distance"].map(distance_band))
    grouped = frame.groupby(["setup", "task", "band"], sort=False)
    table = grouped.agg(
        prompts=("exact", "size"),
        beyond=("in_domain", lambda s: float((~s.astype(bool)).mean())),
        exact=("exact", "mean"),
        blind_cost_share=("blind_cost_share", "mean"),
        top_blind=("top_blind", "mean"),
        carriers_blind=("carriers_blind", "mean"),
        exact_capped=("exact_capped", "mean"),
    )
    return table.reset_index().sort_values(["setup", "task", "band"], kind="stable")


def cells(prompts: pd.DataFrame) -> pd.DataFrame:
    """Per setup, task, prompt length and depth (pooled over seeds): prompts, mean key distance, exact share, mean
    blind and near-blind cost shares, exact share under the cap. A cell is one length, so it tells distance from
    length apart: the shallow depths of a long prompt put the key near the question."""
    grouped = prompts.groupby(["setup", "task", "length", "depth"], sort=False)
    table = grouped.agg(
        prompts=("exact", "size"),
        in_domain=("in_domain", "first"),
        distance=("distance", "mean"),
        exact=("exact", "mean"),
        blind_cost_share=("blind_cost_share", "mean"),
        near_blind_cost_share=("near_blind_cost_share", "mean"),
        exact_capped=("exact_capped", "mean"),
    )
    return table.reset_index().sort_values(["setup", "task", "length", "depth"], kind="stable")


def onset(table: pd.DataFrame, in_domain: float) -> tuple[float, float]:
    """The first band (lower edge) where retrieval fails, and the first where at least ``BLIND`` of the carriers'
    cost is blind; nan if none."""
    failed = table[table["exact"] < FAILED * in_domain]["band"]
    blind = table[table["blind_cost_share"] >= BLIND]["band"]
    return (failed.min() if len(failed) else math.nan), (blind.min() if len(blind) else math.nan)


def verdict(fails: float, blind: float, carriers: int, in_domain: float) -> str:
    """Does retrieval fail (by key distance) where its carriers go blind?"""
    if carriers == 0:
        return f"no head carries it (in domain {in_domain:.2f})"
    if math.isnan(fails) and math.isnan(blind):
        return "neither fails nor goes blind at the distances measured"
    if math.isnan(blind):
        return f"fails from {fails:.0f} tokens while most of its carriers still see the key"
    if math.isnan(fails):
        return f"most of its carriers are blind from {blind:.0f} tokens, and it does not fail"
    if fails == blind:
        return f"fails where most of its carriers go blind ({fails:.0f} tokens)"
    if fails < blind:
        return f"fails from {fails:.0f} tokens, before most of its carriers go blind ({blind:.0f})"
    return f"most of its carriers are blind from {blind:.0f} tokens, it fails only from {fails:.0f}"


def markdown(heads: pd.DataFrame, prompts: pd.DataFrame, record: dict) -> str:
    lines = [
        "# Which heads retrieve the key, and does retrieval fail where they go blind?",
        "",
        *provenance_lines(record),
        f"- carriers: heads whose ablation at the answer's query costs at least 0.05 of the in-domain prompts "
        f"answered exactly; blind cost: the share of the carriers' summed cost on carriers that give the key exactly "
        f"0; a band (key distances from a power of two to the next) fails where its exact share is below {FAILED} x "
        f"the in-domain one, and most of its carriers are blind where its mean blind cost is at least {BLIND}; "
        "capped: every head's bias held beyond the training window's farthest key at its value there",
        "",
        "## Per setup and task",
        "",
        "| setup | task | seeds | carriers (ablation cost; blind distance predicted; measured blind from) | in domain "
        "| beyond | beyond, "
        "blind cost >= 0.5 | beyond, < 0.5 | beyond, capped | best constant answer | verdict (by key distance) |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    table = bands(prompts)
    for (setup, task), group in prompts.groupby(["setup", "task"], sort=False):
        own = heads[(heads["setup"] == setup) & (heads["task"] == task) & heads["carries"]]
        carriers = "; ".join(
            f"{r.seed} l{r.layer}h{r.head} {r.ablation_cost:.2f} ({_tokens(r.blind_distance_predicted)}; "
            f"{_tokens(r.blind_from, 'not')})"
            for r in own.sort_values(["seed", "ablation_cost"], ascending=[True, False]).itertuples()
        )
        inside, beyond = group[group["in_domain"]], group[~group["in_domain"].astype(bool)]
        in_domain = inside["exact"].mean()
        fails, blind = onset(table[(table["setup"] == setup) & (table["task"] == task)], in_domain)
        lines.append(
            f"| {setup} | {task} | {group['seed'].nunique()} | {carriers or 'none'} | {_share(inside['exact'])} "
            f"| {_share(beyond['exact'])} | {_share(beyond[beyond['blind_cost_share'] >= BLIND]['exact'])} "
            f"| {_share(beyond[~(beyond['blind_cost_share'] >= BLIND)]['exact'])} "
            f"| {_share(beyond['exact_capped'].dropna())} "
            f"| {top_share(group['answer'].astype(str)):.3f} | {verdict(fails, blind, len(own), in_domain)} |"
        )
    lines += [
        "",
        "Shares are exact answers / prompts (n); beyond: longer than the training length; best constant answer: the "
        "share of the most common answer among the prompts, what always giving it would score.",
        "",
        "## By key distance (pooled over seeds)",
        "",
        "| setup | task | distance from | prompts | beyond the training length | exact | blind cost "
        "| costliest carrier blind | all carriers blind | exact capped |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.setup} | {r.task} | {r.band} | {r.prompts} | {r.beyond:.2f} | {r.exact:.2f} "
        f"| {_value(r.blind_cost_share)} | {r.top_blind:.2f} | {r.carriers_blind:.2f} | {_value(r.exact_capped)} |"
        for r in table.itertuples()
    ]
    lines += [
        "",
        "## By prompt cell (pooled over seeds)",
        "",
        "| setup | task | length | depth | prompts | in domain | key distance | exact | blind cost | near-blind cost "
        "| exact capped |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.setup} | {r.task} | {r.length} | {r.depth:g} | {r.prompts} | {'yes' if r.in_domain else 'no'} "
        f"| {r.distance:.0f} | {r.exact:.2f} | {_value(r.blind_cost_share)} | {_value(r.near_blind_cost_share)} "
        f"| {_value(r.exact_capped)} |"
        for r in cells(prompts).itertuples()
    ]
    return "\n".join(lines) + "\n"


def _value(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.2f}"


def _share(values: pd.Series) -> str:
    return f"{values.mean():.2f} ({len(values)})" if len(values) else "-"


def _tokens(distance: float, none: str = "never") -> str:
    if math.isinf(distance) or math.isnan(distance):
        return f"{none} blind"
    return f"{distance:.0f}" if distance < 1e6 else f"{distance:.1e}"  # log distances: beyond any context


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = Parser("blindheads retrieval-heads", __doc__)
    parser.add_argument("runs", nargs="+", help="tested run directories (RUNS/SETUP/seedS) with passkey or needle")
    parser.add_argument("--out", required=True, help="folder for heads.csv, prompts.csv and retrieval_heads.md")
    parser.add_argument("--samples", type=int, help="prompts per length and depth (default: the run's)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1... (default: cpu for a run trained on the CPU, else cuda)")
    args = parser.parse_args(argv)
    if args.samples is not None and args.samples < 1:
        parser.error(f"--samples must be >= 1, got {args.samples}")
    return args


def main(argv: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    args = parse_args(argv)
    started = time.monotonic()
    with torch.no_grad():
        tables = [attribute_run(run, args.samples, args.device) for run in args.runs]
    heads = pd.concat([h for h, _ in tables], ignore_index=True)
    prompts = pd.concat([p for _, p in tables], ignore_index=True)
    seeds = [int(s.removeprefix("seed")) for s in prompts["seed"].unique() if s.removeprefix("seed").isdigit()]
    record = provenance("blindheads retrieval-heads " + " ".join(argv), time.monotonic() - started, seeds)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic.write_text(out / "heads.csv", heads.to_csv(index=False))
        atomic.write_text(out / "prompts.csv", prompts.to_csv(index=False))
        atomic.write_text(out / "retrieval_heads.md", markdown(heads, prompts, record))
    except OSError as error:
        raise ValueError(f"--out {out} cannot be written ({error.strerror or error})") from None
    print(f"{len(args.runs)} runs attributed; {out / 'retrieval_heads.md'}")
    return heads, prompts
