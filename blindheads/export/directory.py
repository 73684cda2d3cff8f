"""blindheads export: a Lightning checkpoint as a Hugging Face model directory."""

from __future__ import annotations

from pathlib import Path

from blindheads.arguments import Parser
from blindheads.checkpoints import checkpoint_tokenizer, decoder_config, load_checkpoint
from blindheads.export.hf import BlindheadsConfig, BlindheadsForCausalLM

REMOTE_CODE = {
    "configuration_blindheads.py": "from blindheads.export.hf import BlindheadsConfig  # noqa: F401\n",
    "modeling_blindheads.py": "from blindheads.export.hf import BlindheadsForCausalLM  # noqa: F401\n",
}


def export(ckpt_path: str | Path, out: str | Path) -> Path:
    """Write config, safetensors weights, the tokenizer and the remote-code stubs for ``AutoModelForCausalLM``."""
    checkpoint = load_checkpoint(ckpt_path)
    config = BlindheadsConfig.from_decoder_config(
        decoder_config(checkpoint),
        auto_map={
            "AutoConfig": "configuration_blindheads.BlindheadsConfig",
            "AutoModelForCausalLM": "modeling_blindheads.BlindheadsForCausalLM",
        },
    )
    model = BlindheadsForCausalLM(config)
    state = {k: v for k, v in checkpoint["state_dict"].items() if k.startswith("decoder.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k not in model._tied_weights_keys]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {ckpt_path} does not match its decoder: missing {missing}, unexpected {unexpected}"
        )
    out = Path(out)
    model.save_pretrained(out)
    for name, source in REMOTE_CODE.items():
        (out / name).write_text(source)
    tokenizer = checkpoint_tokenizer(checkpoint)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def main(argv: list[str]) -> None:
    parser = Parser("blindheads export", __doc__)
    parser.add_argument("--ckpt_path", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    out = export(args.ckpt_path, args.out)
    print(
        f"exported {args.ckpt_path} to {out}/\nload it with: import blindheads.export.hf, then "
        f"AutoModelForCausalLM.from_pretrained({str(out)!r}) and AutoTokenizer.from_pretrained({str(out)!r}); or "
        "pass trust_remote_code=True to both"
    )
