"""The conjecture's runs: one per bare-head arm (every B and seed at once) and one per decoder seed, each a
``blindheads conjecture-arm`` (the command: ``blindheads.cli.conjecture``)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from blindheads.experiments.conjecture import far_decoder, far_head
from blindheads.experiments.conjecture.report import plot, summarize
from blindheads.experiments.driver.loop import Run
from blindheads.experiments.driver.records import provenance, write_json

HEAD_ARMS = list(far_head.ARMS)
ARMS = [*HEAD_ARMS, "decoder"]
BIASES = [*map(str, range(11)), "12", "16", "20", "30", "45", "60", far_head.FLUSH_EDGE, "100", far_head.MASKED]
COMMAND = "conjecture-arm"  # the subcommand that trains one run


def runs(args: argparse.Namespace) -> list[Run]:
    """A run per bare-head arm (every B and seed at once) and one per decoder seed."""
    head = [
        Run(arm, Path(args.runs) / arm, {"arm": arm},
            ["--arm", arm, "--seeds", *map(str, args.seeds), "--steps", str(args.steps), "--biases", *args.biases,
             "--every", str(args.every), "--out", str(Path(args.runs) / arm)], [], (COMMAND,))
        for arm in args.arms if arm in HEAD_ARMS
    ]  # fmt: skip
    decoder = [
        Run(f"decoder seed {seed}", Path(args.runs) / "decoder" / f"seed{seed}", {"arm": "decoder", "seed": seed},
            ["--arm", "decoder", "--seeds", str(seed), "--steps", str(args.decoder_steps), "--pretrain",
             str(args.decoder_pretrain), "--biases", *args.biases, "--every", str(args.decoder_every), "--out",
             str(Path(args.runs) / "decoder" / f"seed{seed}")], [], (COMMAND,))
        for seed in args.decoder_seeds if "decoder" in args.arms
    ]  # fmt: skip
    return head + decoder


def train_arm(arm: str, biases: list[str], seeds: list[int], steps: int, pretrain: int, every: int) -> dict:
    """One run: a bare-head arm at every B and seed, or the decoder at its one seed; its rows."""
    if arm == "decoder":
        (seed,) = seeds
        return far_decoder.train_seed(seed, biases, pretrain, steps, every)
    return far_head.train(far_head.ARMS[arm], biases, seeds, steps, every)


def write_summary(out: Path, records: list[dict], command: str, wall_s: float, remaining: list[str],
                  seeds: list[int]) -> pd.DataFrame:  # fmt: skip
    """The conjecture's summary from its runs' records (``report``), and ``results.json``: every run
    with the command, versions and wall time (``seeds``: every seed of the experiment), and the runs not done."""
    rows = [{"arm": record["arm"], **row} for record in records for row in record["rows"]]
    table = summarize(out, rows) if rows else pd.DataFrame()
    if rows:
        plot(out, table)
    else:
        (out / "summary.md").write_text("No run is done yet.\n")
    write_json(out / "results.json", {
        **provenance(command, wall_s, seeds),
        "runs": [{k: v for k, v in r.items() if k not in ("rows", "pretrain")} for r in records],
        "runs_wall_s": round(sum(r["wall_s"] for r in records), 1), "remaining": remaining,
    })  # fmt: skip
    return table
