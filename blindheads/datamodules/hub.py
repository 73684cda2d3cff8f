"""One quick question before anything is fetched from the Hugging Face Hub: is it reachable? Without it, a missing
tokenizer or dataset fails after minutes of retries (5 retries with backoff per file); with it, in seconds."""

from __future__ import annotations

import os

from huggingface_hub import constants, get_session

REACHABLE_TIMEOUT_S = 5.0


def require_hub(what: str, instead: str) -> None:
    """Raise ``ConnectionError`` naming ``what`` and the offline alternative when the Hub cannot be reached. In
    offline mode (``HF_HUB_OFFLINE``) the libraries read their caches and fail fast themselves: nothing to ask."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0") or constants.HF_HUB_OFFLINE:
        return
    try:
        get_session().head(constants.ENDPOINT, timeout=REACHABLE_TIMEOUT_S)
    except Exception as error:  # any transport error: DNS, refused, timeout, proxy
        raise ConnectionError(
            f"{what} needs the Hugging Face Hub, and {constants.ENDPOINT} cannot be reached ({error}); {instead}"
        ) from None
