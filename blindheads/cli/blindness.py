"""``blindheads blindness``: per-head blindness distances and underflow shares of a position stack."""

from __future__ import annotations

import argparse
import json
import math

import torch

from blindheads.arguments import Parser
from blindheads.blindness import SOFTMAXES, BlindnessReport, blindness_report
from blindheads.modules.config import load_decoder_config
from blindheads.modules.position import build_position
from blindheads.numerics import DTYPES, LEARNING_HORIZON, THRESHOLDS

MAX_HEADS = 4096
MAX_CONTEXT = 2**40  # the fused shares are closed forms; the materialized normaliser stops where its terms vanish


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = Parser(
        "blindheads blindness", "Where each head's position bias alone drives softmax weights to exactly zero."
    )
    parser.add_argument("--heads", type=int, help="number of attention heads (default: from --config)")
    parser.add_argument("--context", type=int, help="context length L (default: from --config, else 2048)")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="draws the starting parameters of learned biases (KERPLE, T5 buckets, FIRE), so an answer repeats",
    )
    parser.add_argument("--dtype", choices=list(DTYPES), help="default: from --config, else bfloat16")
    parser.add_argument(
        "--threshold",
        choices=THRESHOLDS,
        help="normal: flush-to-zero kernels (fused GPU attention); subnormal: subnormals kept "
        "(default: from --config, else normal)",
    )
    parser.add_argument(
        "--softmax",
        default="fused",
        choices=SOFTMAXES,
        help="fused: exp(x - max) before normalising, as FlexAttention and flash kernels test it (the "
        "paper's definition); materialized: normalised weights, as eager and SDPA return them "
        "(each head's bias-only ln Z at the context is taken off tau)",
    )
    parser.add_argument(
        "--horizon",
        type=float,
        default=LEARNING_HORIZON,
        help="the learning horizon H in nats: a head stops learning to read a key its bias puts more than H below "
        "the row's largest weight (default %(default)g, the edge results/conjecture/verdict.md measured: every seed "
        "learned at a bias of 10, none from 16)",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--bias", help="position stack, e.g. 'alibi(wide)+clamp+log_distance' (default: alibi)")
    source.add_argument(
        "--config",
        action="append",
        help="a model YAML (decoder fields, at the top or under model.decoder); repeat it to stack files as "
        "blindheads fit does, later ones winning",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one strict JSON object instead of a table (a head never blind has blind_distance null, one "
        "never past the horizon horizon_distance null)",
    )
    args = parser.parse_args(argv)
    if args.config is None and args.heads is None:
        parser.error("give --heads (or --config)")
    if args.heads is not None and not 1 <= args.heads <= MAX_HEADS:
        parser.error(f"--heads must be between 1 and {MAX_HEADS}, got {args.heads}")
    if args.context is not None and not 1 <= args.context <= MAX_CONTEXT:
        parser.error(f"--context must be between 1 and {MAX_CONTEXT} tokens, got {args.context}")
    if not (math.isfinite(args.horizon) and args.horizon > 0):
        parser.error(f"--horizon must be a finite number of nats above 0, got {args.horizon}")
    return args


def format_table(report: BlindnessReport, spec: str) -> str:
    lines = [
        f"position: {spec}   context: {report.context}   dtype: {report.dtype}   threshold: {report.threshold}"
        f"   tau: {report.tau:.4f}   softmax: {report.softmax}   learning horizon: {report.horizon:g} nats",
        f"{'head':>4}  {'slope':>12}  {'deaf beyond':>12}  {'blind beyond':>14}  {'underflow, last query':>21}"
        f"  {'underflow, all pairs':>20}",
    ]

    def distance(value: float) -> str:
        return "never" if math.isinf(value) else f"{value:.1f}"

    for i, head in enumerate(report.heads):
        slope = "-" if head.slope is None else f"{head.slope:.6g}"
        lines.append(
            f"{i:>4}  {slope:>12}  {distance(head.horizon_distance):>12}  {distance(head.blind_distance):>14}"
            f"  {head.underflow_last_query:>21.2%}  {head.underflow_all_pairs:>20.2%}"
        )
    lines.append(
        f"{'mean':>4}  {'':>12}  {'':>12}  {'':>14}  {report.underflow_last_query:>21.2%}"
        f"  {report.underflow_all_pairs:>20.2%}"
    )
    return "\n".join(lines)


def settings(args: argparse.Namespace) -> dict:
    """What the calculator computes for: every value the model config gives (its position stack, heads, context,
    dtype and threshold), an explicit flag winning over it; without a config, the CLI's defaults."""
    if args.config:
        config = load_decoder_config(*args.config)
        given = {"spec": config.position, "heads": config.num_heads, "context": config.context_length,
                 "dtype": config.dtype, "threshold": config.threshold}  # fmt: skip
    else:
        given = {
            "spec": args.bias or "alibi",
            "heads": None,
            "context": 2048,
            "dtype": "bfloat16",
            "threshold": "normal",
        }
    flags = {"heads": args.heads, "context": args.context, "dtype": args.dtype, "threshold": args.threshold}
    return given | {name: value for name, value in flags.items() if value is not None}


def strict(value):
    """``value`` with every non-finite number as ``None``: JSON has no Infinity (strict parsers reject it), and a
    blind distance of infinity means never blind, which ``null`` says."""
    if isinstance(value, dict):
        return {key: strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(item) for item in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    run = settings(args)
    torch.manual_seed(args.seed)
    stack = build_position(run["spec"], run["heads"], run["context"], run["dtype"], run["threshold"])
    report = blindness_report(stack, run["context"], run["dtype"], run["threshold"], args.softmax, args.horizon)
    spec = run["spec"]
    if args.json:
        print(json.dumps(strict(report.to_dict()), allow_nan=False))
    else:
        print(format_table(report, spec if isinstance(spec, str) else json.dumps(spec)))
