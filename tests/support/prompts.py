"""A digest of retrieval prompts, compared across calls and processes."""

import hashlib

from blindheads.datamodules.tokenizer import load_tokenizer
from blindheads.evaluation.prompts import passkey_samples


def prompt_digest(cache_dir) -> str:
    tok = load_tokenizer("builtin", cache_dir)
    samples = passkey_samples(tok, [128, 256], [0.0, 0.5], samples=3, seed=7)
    return hashlib.sha256(b"".join(s.tokens.numpy().tobytes() for s in samples)).hexdigest()
