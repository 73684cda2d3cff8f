"""Text for training: FineWeb-Edu streamed, local files or the builtin corpus, in a fixed order, split across ranks
and workers, with exact resume. ``FineWebEdu`` (the data module) is imported when first named: the modules beside
it (the tokenizer cache, the retrieval mix) load without Lightning, datasets or transformers."""

from __future__ import annotations

from typing import Any

__all__ = ["FineWebEdu"]


def __getattr__(name: str) -> Any:
    if name == "FineWebEdu":
        from blindheads.datamodules.fineweb import FineWebEdu

        return FineWebEdu
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
