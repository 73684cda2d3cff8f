"""The words of the passkey and needle prompts. The evaluation builds its prompts from them
(``evaluation/prompts.py``) and the training mix keeps every one of them out of its episodes
(``datamodules/retrieval_mix.py``), so what the evaluation asks stays held out of training."""

from __future__ import annotations

import hashlib
import re

PASSKEY_INSTRUCTION = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
PASSKEY_FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = " What is the pass key? The pass key is"

NEEDLE = " One of the special magic numbers for {key} is: {value}."
NEEDLE_QUESTION = (
    " What is the special magic number for {key} mentioned in the provided text?"
    " The special magic number for {key} mentioned in the provided text is"
)
NEEDLE_KEY_WORDS = (
    [
        "amber",
        "ancient",
        "bright",
        "calm",
        "crimson",
        "distant",
        "eager",
        "fragile",
        "golden",
        "hidden",
        "hollow",
        "humble",
        "lively",
        "silent",
        "silver",
        "swift",
        "tender",
        "vivid",
        "wild",
        "wooden",
    ],
    [
        "anchor",
        "badger",
        "canyon",
        "compass",
        "falcon",
        "harbor",
        "lantern",
        "meadow",
        "orchard",
        "pebble",
        "quarry",
        "river",
        "saddle",
        "thistle",
        "tunnel",
        "valley",
        "walnut",
        "willow",
        "window",
        "zephyr",
    ],
)

TEXTS = (PASSKEY_INSTRUCTION, PASSKEY_FILLER, PASSKEY_NEEDLE, PASSKEY_QUESTION, NEEDLE, NEEDLE_QUESTION)


def held_out_words() -> set[str]:
    """Every lower-case word of the prompts' texts and needle keys."""
    text = " ".join(TEXTS) + " " + " ".join(word for words in NEEDLE_KEY_WORDS for word in words)
    return set(re.findall(r"[a-z]+", text.lower()))


def evaluation_value(value: str) -> bool:
    """Whether a passkey key or needle value (a digit string) is the evaluation's to ask: half of all of them, by a
    hash their digits do not show. Training draws only the other half (``datamodules/task_format.py``), so no
    evaluation answer is one training taught."""
    return hashlib.sha256(value.encode()).digest()[0] < 128
