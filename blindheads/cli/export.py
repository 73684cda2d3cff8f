"""blindheads export: a Lightning checkpoint as a Hugging Face model directory."""

from __future__ import annotations

import argparse
import json

from blindheads.arguments import Parser
from blindheads.export.directory import export


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = Parser("blindheads export", __doc__)
    parser.add_argument("--ckpt_path", required=True, help="a blindheads checkpoint")
    parser.add_argument("--out", required=True, help="a new or empty directory")
    parser.add_argument("--tokenizer", help="the tokenizer to save beside the model: a folder or Hub name (default: "
                        "the run's own, from the checkpoint's data settings)")  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    out = export(args.ckpt_path, args.out, args.tokenizer)
    if json.loads((out / "config.json").read_text()).get("model_type") == "llama":
        how = "transformers alone: AutoModelForCausalLM.from_pretrained({0!r}) (a LlamaForCausalLM)"
    else:
        how = (
            "transformers alone: AutoModelForCausalLM.from_pretrained({0!r}, trust_remote_code=True) (the model's "
            "code is in the folder); or import blindheads.export.hf first and leave trust_remote_code out"
        )
    print(f"exported {args.ckpt_path} to {out}/\nload it with: " + how.format(str(out)))
