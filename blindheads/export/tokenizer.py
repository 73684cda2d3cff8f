"""The tokenizer an export writes: plain data only. A tokenizer read from a folder or the Hub carries what its
author put in ``tokenizer_config.json``: an ``auto_map`` naming code of theirs (which ``trust_remote_code=True``,
given for the model's own code, would run), a chat template, a tokenizer class whose behaviour is Python. The export
writes none of it: ``plain_tokenizer`` rebuilds the tokenizer from its ``tokenizers`` serialization (tokenizer.json:
vocabulary, merges, normalizer, pre-tokenizer, post-processor, added tokens) as transformers' own
``PreTrainedTokenizerFast``, keeping its special tokens and a few plain settings, and checks that the rebuilt one
encodes as the original did. A tokenizer that is not so reducible (a Python tokenizer with no tokenizer.json, a
backend with custom Python components) is refused in one line naming it."""

from __future__ import annotations

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

# the tokenizer_config.json settings kept: plain values that change no code path
SETTINGS = ("model_max_length", "padding_side", "truncation_side", "clean_up_tokenization_spaces")
PROBE = "The pass key is 4. Remember it.\n  Here we go: \u00e9t\u00e9, 1+1=2, naïve caf\u00e9 \u2014 ok?"
REFUSED = "an export holds its tokenizer as plain data only (tokenizer.json); give a fast tokenizer's folder"


def plain_tokenizer(tokenizer, where: str) -> PreTrainedTokenizerFast:
    """``tokenizer`` rebuilt from its tokenizer.json data as a ``PreTrainedTokenizerFast`` with its special tokens
    and ``SETTINGS`` only: no ``auto_map``, no chat template, no class of its own. ``where`` names it in the one-line
    refusal of a tokenizer that cannot be so rebuilt, or whose rebuilt copy encodes differently."""
    what = f"tokenizer {where} ({type(tokenizer).__name__})"
    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if not isinstance(backend, Tokenizer):
        raise ValueError(f"{what} is a Python tokenizer with no tokenizer.json: {REFUSED}")
    try:
        data = backend.to_str()
    except Exception as error:  # a custom Python normalizer or pre-tokenizer cannot be serialized
        why = str(error).strip().split("\n")[0] or type(error).__name__
        raise ValueError(f"{what}: its backend cannot be written as tokenizer.json ({why}); {REFUSED}") from None
    special = {name: str(token) for name, token in tokenizer.special_tokens_map.items() if isinstance(token, str)}
    extra = [str(token) for token in getattr(tokenizer, "extra_special_tokens", None) or []]
    settings = {name: getattr(tokenizer, name) for name in SETTINGS if hasattr(tokenizer, name)}
    rebuilt = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(data),
        **special,
        **settings,
        **({"extra_special_tokens": extra} if extra else {}),
    )
    probe = "".join(f"{token}{PROBE}" for token in [*special.values(), *extra]) + PROBE
    if len(rebuilt) != len(tokenizer) or rebuilt(probe).input_ids != tokenizer(probe).input_ids:
        raise ValueError(f"{what} encodes differently once reduced to its tokenizer.json: its class adds behaviour in "
                         f"Python; {REFUSED}")  # fmt: skip
    return rebuilt
