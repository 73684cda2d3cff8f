"""``blindheads blindness``: per-head blindness distances and underflow shares of a position stack."""

from __future__ import annotations

import argparse
import json
import math

from blindheads.arguments import Parser
from blindheads.blindness import SOFTMAXES, BlindnessReport, blindness_report
from blindheads.modules.config import load_decoder_config
from blindheads.modules.position import build_position
from blindheads.numerics import DTYPES, THRESHOLDS

MAX_HEADS = 4096
MAX_CONTEXT = 2**40  # the fused shares are closed forms; the materialized normaliser stops where its terms vanish


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = Parser(
        "blindheads blindness", "Where each head's position bias alone drives softmax weights to exactly zero."
    )
    parser.add_argument("--heads", type=int, help="number of attention heads (default: from --config)")
    parser.add_argument("--context", type=int, help="context length L (default: from --config, else 2048)")
    parser.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    parser.add_argument(
        "--threshold",
        default="normal",
        choices=THRESHOLDS,
        help="normal: flush-to-zero kernels (fused GPU attention); subnormal: subnormals kept",
    )
    parser.add_argument(
        "--softmax",
        default="fused",
        choices=SOFTMAXES,
        help="fused: exp(x - max) before normalising, as FlexAttention and flash kernels test it (the "
        "paper's definition); materialized: normalised weights, as eager and SDPA return them "
        "(each head's bias-only ln Z at the context is taken off tau)",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--bias", help="position stack, e.g. 'alibi(wide)+clamp+log_distance' (default: alibi)")
    source.add_argument("--config", help="a model YAML (decoder fields, at the top or under model.decoder)")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object instead of a table (a head never blind has blind_distance Infinity)",
    )
    args = parser.parse_args(argv)
    if args.config is None and args.heads is None:
        parser.error("give --heads (or --config)")
    if args.heads is not None and not 1 <= args.heads <= MAX_HEADS:
        parser.error(f"--heads must be between 1 and {MAX_HEADS}, got {args.heads}")
    if args.context is not None and not 1 <= args.context <= MAX_CONTEXT:
        parser.error(f"--context must be between 1 and {MAX_CONTEXT} tokens, got {args.context}")
    return args


def format_table(report: BlindnessReport, spec: str) -> str:
    lines = [
        f"position: {spec}   context: {report.context}   dtype: {report.dtype}   threshold: {report.threshold}"
        f"   tau: {report.tau:.4f}   softmax: {report.softmax}",
        f"{'head':>4}  {'slope':>12}  {'blind beyond':>14}  {'underflow, last query':>21}  {'underflow, all pairs':>20}",
    ]
    for i, head in enumerate(report.heads):
        slope = "-" if head.slope is None else f"{head.slope:.6g}"
        distance = "never" if math.isinf(head.blind_distance) else f"{head.blind_distance:.1f}"
        lines.append(
            f"{i:>4}  {slope:>12}  {distance:>14}  {head.underflow_last_query:>21.2%}"
            f"  {head.underflow_all_pairs:>20.2%}"
        )
    lines.append(
        f"{'mean':>4}  {'':>12}  {'':>14}  {report.underflow_last_query:>21.2%}  {report.underflow_all_pairs:>20.2%}"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.config:
        config = load_decoder_config(args.config)
        spec, heads, context = config.position, args.heads or config.num_heads, config.context_length
    else:
        spec, heads, context = args.bias or "alibi", args.heads, 2048
    context = context if args.context is None else args.context
    stack = build_position(spec, heads, context, args.dtype, args.threshold)
    report = blindness_report(stack, context, args.dtype, args.threshold, args.softmax)
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        print(format_table(report, spec if isinstance(spec, str) else json.dumps(spec)))
