"""The options every experiment driver (``grid``, ``conjecture``) shares, checked before anything runs: config files
found, seeds distinct and >= 0, ``--out`` apart from ``--runs``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from blindheads.packaged import located


def configs(files: list[str]) -> list[str]:
    """``--config FILE`` for each file, in order: later files override earlier ones."""
    return [option for file in files for option in ("--config", file)]


def distinct(option: str, values: list) -> None:
    """Refuse a value listed twice: a seed counted twice, or two jobs writing one run directory and one log."""
    twice = [value for value, count in Counter(values).items() if count > 1]
    if twice:
        listed = ", ".join(map(str, twice))
        raise ValueError(f"{option} lists {listed} more than once; give each once")


def at_least(option: str, values: list[int], low: int) -> None:
    """Refuse a number below ``low`` before anything is trained (not after the first fit fails on it)."""
    bad = [value for value in values if value < low]
    if bad:
        raise ValueError(f"{option} must be >= {low}, got {', '.join(map(str, bad))}")


def checked(args):
    """The options every experiment has, checked before anything runs: distinct seeds >= 0, --parallel >= 1, config
    files found (``located``), --out (by default the runs' folder + ``-summary``, never a committed results folder)
    apart from --runs; the options after ``--`` without it."""
    distinct("--seeds", args.seeds)
    at_least("--seeds", args.seeds, 0)
    at_least("--parallel", [args.parallel], 1)
    if getattr(args, "hours", None) is not None and not args.hours > 0:
        raise ValueError(f"--hours must be > 0, got {args.hours}")
    args.config = [located(file) for file in args.config]
    args.out = args.out or f"{Path(args.runs)}-summary"
    separate(Path(args.out), Path(args.runs))
    args.extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    return args


def separate(out: Path, runs: Path) -> None:
    """Refuse a summary folder that is, holds or lies in the runs' folder: replacing the summary would take runs."""
    out, runs = out.resolve(), runs.resolve()
    if out == runs or out in runs.parents or runs in out.parents:
        raise ValueError(f"--out {out} and --runs {runs} overlap; give them separate folders")
