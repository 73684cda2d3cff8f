"""blindheads recheck: an independent re-evaluation of tested runs' held-out recall.

For each run directory (RUNS/SETUP/seedS, as ``blindheads grid`` makes them: config.yaml, checkpoints/last.ckpt,
results.json), the run's data module and EpisodeRecall are rebuilt from its config as the run configured them
and its decoder is read from last.ckpt (tensors only). At each of the run's recall points, as many fresh episodes as
the run answered are drawn with another seed (the run's episode seed + --seed_offset), and answered by greedy
decoding and a string match (blindheads/evaluation/greedy.py), which shares no code with the teacher-forced scorer
that made the committed numbers. Per point: the greedy exact share, the committed one (results.json's
test/recall/POINT/exact), their difference, and whether it lies within 1.96 standard errors of the difference of two
independent samples, sqrt(p1(1-p1)/n1 + p2(1-p2)/n2). Also per point: the teacher-forced scorer on the same fresh
episodes (so a disagreement can be told apart from sampling), and whether the run's own episodes, redrawn from its
seed, hash as results.json records (the data module rebuilt as the run had it).

Writes recheck.csv and recheck.md (the command, seeds and package versions) into --out.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import cast

import pandas as pd
import torch

from blindheads import atomic
from blindheads.arguments import Parser
from blindheads.callbacks.episode_recall import EpisodeRecall
from blindheads.cli.tested_run import Loaded, load_run
from blindheads.evaluation.greedy import greedy_samples
from blindheads.evaluation.recall import Episode
from blindheads.evaluation.scoring import score_samples
from blindheads.evaluation.tags import recall_tag
from blindheads.experiments.driver.records import provenance, provenance_lines

OFFSET = 1000  # fresh episode seed = the run's + OFFSET
Z = 1.96  # two-sided 95%


def recall_of(loaded: Loaded) -> EpisodeRecall:
    """The run's one EpisodeRecall (refused if its config has several)."""
    if len(loaded.callbacks) != 1:
        count = len(loaded.callbacks)
        raise ValueError(f"{loaded.run_dir} configures {count} EpisodeRecall callbacks; recheck needs one")
    return cast(EpisodeRecall, loaded.callbacks[0])


def draw(loaded: Loaded, seed: int) -> tuple[dict[str, list[Episode]], dict[str, str]]:
    """The episodes of every recall point of the run, drawn by ``seed`` exactly as its EpisodeRecall draws them,
    and each point's episode set (sha256 of the token ids)."""
    run = recall_of(loaded)
    recall = EpisodeRecall(every_n_steps=None, gaps=run.gaps, distances=run.distances, samples=run.samples,
                           batch_size=run.batch_size, seed=seed)  # fmt: skip
    sets = recall.draw(loaded.data, seed)
    episodes = {
        name: recall.episodes(loaded.data, name, where) for name, where in recall.points(loaded.data.seq_len).items()
    }
    return episodes, sets


def within(p1: float, n1: int, p2: float, n2: int) -> tuple[float, bool]:
    """The 95% bound on the difference of two independent shares, and whether ``p1 - p2`` lies within it."""
    bound = Z * math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    return bound, abs(p1 - p2) <= bound + 1e-12


def recheck_run(run_dir: str | Path, offset: int = OFFSET, device: str | None = None, batch_size: int | None = None):
    """One row per recall point of the run (see the module docstring)."""
    if offset == 0:
        raise ValueError("--seed_offset 0 would redraw the run's own episodes; give another")
    loaded = load_run(run_dir, (EpisodeRecall,), device)
    run_dir, results = loaded.run_dir, loaded.results
    metrics = results.get("metrics") or {}
    run_seed = results.get("episode_seed")
    if run_seed is None:
        raise ValueError(f"{run_dir}: results.json records no episode_seed (tested before EpisodeRecall recorded it)")
    fresh_seed = run_seed + offset
    run_sets = results.get("episode_sets") or {}
    _, rebuilt_sets = draw(loaded, run_seed)
    episodes, fresh_sets = draw(loaded, fresh_seed)
    tokenizer, batch = loaded.data.tokenizer, batch_size or recall_of(loaded).batch_size
    rows = []
    for name, drawn in episodes.items():
        tag = recall_tag(name, "exact", "test/")
        if not isinstance(metrics.get(tag), (int, float)):
            raise ValueError(f"{run_dir}: results.json has no {tag}: its test did not measure this point")
        samples = [e.sample for e in drawn]
        with torch.no_grad(), loaded.precision.forward_context():
            greedy = greedy_samples(loaded.decoder, tokenizer, samples, batch)
            scored = score_samples(loaded.decoder, tokenizer, samples, batch)
        scorer = {id(s.sample): s.exact for s in scored}  # the scorer returns its scores grouped by length
        n, p = len(greedy), sum(g.exact for g in greedy) / len(greedy)
        committed, committed_n = float(metrics[tag]), int(metrics.get(recall_tag(name, "episodes", "test/"), n))
        bound, inside = within(p, n, committed, committed_n)
        rows.append({
            "setup": run_dir.parent.name, "seed": run_dir.name, "step": loaded.step, "point": name,
            "distance": sum(e.distance for e in drawn) / n, "episodes": n, "greedy_exact": p,
            "committed_episodes": committed_n, "committed_exact": committed, "difference": p - committed,
            "bound": bound, "within": inside,
            "scorer_exact_fresh": sum(s.exact for s in scored) / n,
            "verdicts_differing": sum(g.exact != scorer[id(g.sample)] for g in greedy),
            "run_episode_seed": run_seed, "fresh_episode_seed": fresh_seed,
            "run_set_reproduced": rebuilt_sets[name] == run_sets.get(name),
            "fresh_set_differs": fresh_sets[name] != run_sets.get(name, rebuilt_sets[name]),
            "fresh_episode_set": fresh_sets[name],
        })  # fmt: skip
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, record: dict) -> str:
    """The short table, under the command, seeds and versions that made it."""
    lines = [
        "# Recall rechecked: greedy decoding on fresh episodes vs the committed teacher-forced recall",
        "",
        *provenance_lines(record),
        "- episode seeds (run -> fresh): "
        + ", ".join(
            f"{r.setup}/{r.seed} {r.run_episode_seed} -> {r.fresh_episode_seed}"
            for r in table.drop_duplicates(["setup", "seed"]).itertuples()
        ),
        "- within: |greedy - committed| <= 1.96 sqrt(p1(1-p1)/n1 + p2(1-p2)/n2); scorer (fresh): the teacher-forced "
        "scorer on the same fresh episodes, differing: episodes where its verdict and greedy's differ; "
        "reproduced: the run's episodes redrawn from its seed hash as its results.json records",
        "",
        "| setup | seed | step | point | distance | n | greedy | committed | difference | ±bound | within "
        "| scorer (fresh) | differing | reproduced |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in table.itertuples():
        lines.append(
            f"| {r.setup} | {r.seed} | {r.step} | {r.point} | {r.distance:.0f} | {r.episodes} | {r.greedy_exact:.3f} "
            f"| {r.committed_exact:.3f} | {r.difference:+.3f} | {r.bound:.3f} | {'yes' if r.within else 'NO'} "
            f"| {r.scorer_exact_fresh:.3f} | {r.verdicts_differing} | {'yes' if r.run_set_reproduced else 'NO'} |"
        )
    outside = int((~table["within"]).sum())
    lines += ["", f"{len(table) - outside} of {len(table)} points within sampling error."]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = Parser("blindheads recheck", __doc__)
    parser.add_argument("runs", nargs="+", help="tested run directories (RUNS/SETUP/seedS)")
    parser.add_argument("--out", required=True, help="folder for recheck.csv and recheck.md")
    parser.add_argument("--seed_offset", type=int, default=OFFSET, help="fresh episode seed = the run's + this")
    parser.add_argument("--device", help="cpu, cuda, cuda:1... (default: cpu for a run trained on the CPU, else cuda)")
    parser.add_argument("--batch_size", type=int, help="episodes per forward pass (default: the run's EpisodeRecall's)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> pd.DataFrame:
    args = parse_args(argv)
    if args.batch_size is not None and args.batch_size < 1:
        raise ValueError(f"--batch_size must be >= 1, got {args.batch_size}")
    started = time.monotonic()
    table = pd.concat(
        [recheck_run(run, args.seed_offset, args.device, args.batch_size) for run in args.runs], ignore_index=True
    )
    command = "blindheads recheck " + " ".join(argv)
    record = provenance(command, time.monotonic() - started, table["fresh_episode_seed"].tolist())
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic.write_text(out / "recheck.csv", table.to_csv(index=False))
        atomic.write_text(out / "recheck.md", markdown(table, record))
    except OSError as error:
        raise ValueError(f"--out {out} cannot be written ({error.strerror or error})") from None
    outside = int((~table["within"]).sum())
    print(f"{len(table) - outside} of {len(table)} points within sampling error; {out / 'recheck.md'}")
    return table
