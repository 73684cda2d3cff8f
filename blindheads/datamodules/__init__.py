"""Text for training: FineWeb-Edu streamed, local files or the builtin corpus, in a fixed order, split across ranks
and workers, with exact resume. ``TextData`` (the data module; ``FineWebEdu``, its first name, still names it) is
imported when first named: the modules beside it (the tokenizer cache, the retrieval mix) load without Lightning,
datasets or transformers."""

from __future__ import annotations

from typing import Any

__all__ = ["FineWebEdu", "TextData"]


def __getattr__(name: str) -> Any:
    if name in ("TextData", "FineWebEdu"):  # FineWebEdu: configs and code written before the rename
        from blindheads.datamodules.text import TextData

        return TextData
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
