"""RULER's needle-in-a-haystack tasks at any length, offline: lm-evaluation-harness utilities for the
``ruler_niah_*`` tasks beside this file (``--include_path configs/lm_eval``).

The harness's own RULER tasks (``lm_eval/tasks/ruler``) build their samples in ``prepare_niah``, which imports
``wonderwords`` (its word lists give the keys; lm-eval's ``ruler`` extra, not this project's ``eval``) and has nltk
download ``punkt_tab`` when imported, and they declare metric keys from 4096 tokens up. This module builds the samples of
three of them with the standard library and the model's tokenizer alone, nothing downloaded:

- ``ruler_niah_single_1`` (the harness's ``niah_single_1``): a 7-digit number for a word key, in repeated text;
- ``ruler_niah_multikey_2`` (``niah_multikey_2``): the same needle among needles of other keys (the haystack);
- ``ruler_niah_multikey_3`` (``niah_multikey_3``): keys and values UUIDs, among needles of other keys.

The template, needle sentence, haystacks, answer prefix (``gen_prefix``) and score (``string_match_all``: the share
of the answers found in the generated text, which is 0 or 1 here) are RULER's, as are the sizes: the haystack is as
long as fits ``max_seq_length`` minus ``tokens_to_generate`` tokens of the task's tokenizer. What differs from the
harness: keys are adjective-noun pairs from the short lists below (wonderwords' are longer), never the asked key for
another needle; the haystack's size is found to the unit (the harness grows it 5 units at a time below 4096 tokens
and 25 above, which leaves a 256-token prompt one unit of haystack); the random draws are seeded per task and length;
each sample records the depth of its needle (the share of haystack units before it: 0 at the start, near 1 by the
question), and recall is reported per length (metric ``"256"``, as RULER names it) and per length and depth fifth
(``"256_depth_0-20"`` ... ``"256_depth_80-100"``); samples are interleaved across lengths, so ``--limit N`` keeps
every length.

Task arguments (``--metadata '{"max_seq_lengths": [256, 512], "num_samples": 25}'``, or the task file's
``metadata``): ``max_seq_lengths`` (each one of ``LENGTHS``, which the task files declare as metrics),
``num_samples`` per length, ``seed``; the tokenizer is ``tokenizer``, else ``export_dir`` (an export folder,
``--model blindheads``), else ``pretrained`` (``--model hf``), else ``model`` of ``--model_args`` or ``--metadata``
(lm-eval hands the model's arguments to the task).
"""

from __future__ import annotations

import random
import uuid

import datasets
from lm_eval.tasks.ruler.common_utils import (  # transformers only: no nltk, no wonderwords
    get_tokenizer,
    postprocess_pred,
    resolve_tokenizer_name,
    string_match_all,
)

# The lengths the task files declare as metrics (lm-eval aggregates only declared ones).
LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384)
DEPTH_BINS = 5  # fifths of the haystack

# RULER's (lm_eval/tasks/ruler/niah_utils.py and prepare_niah.py).
TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz "
    "you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} "
    "mentioned in the provided text?"
)
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
REPEATED = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

ADJECTIVES = (
    "able", "ancient", "angry", "bitter", "bold", "brave", "bright", "broad", "calm", "clever", "cold", "cozy",
    "crisp", "curious", "damp", "dark", "deep", "eager", "early", "empty", "fancy", "fierce", "gentle", "giant",
    "golden", "grand", "happy", "heavy", "hollow", "humble", "icy", "jolly", "keen", "kind", "lazy", "little",
    "loud", "lucky", "merry", "mighty", "narrow", "nervous", "odd", "old", "pale", "plain", "polite", "proud",
    "quiet", "rapid", "rare", "rough", "round", "royal", "rusty", "salty", "shiny", "silent", "silly", "slow",
    "smooth", "soft", "sour", "steep", "sticky", "stormy", "strange", "sweet", "swift", "tall", "tame", "tender",
    "thick", "tidy", "tiny", "vast", "warm", "weary", "wild", "windy", "wise", "young", "zealous",
)  # fmt: skip
NOUNS = (
    "acorn", "anchor", "apple", "arrow", "badge", "basket", "beacon", "bell", "blanket", "bottle", "bridge",
    "bucket", "cabin", "candle", "canyon", "carpet", "castle", "cherry", "cloud", "comet", "compass", "cottage",
    "crater", "desert", "dolphin", "drum", "eagle", "engine", "falcon", "feather", "fern", "forest", "fountain",
    "garden", "glacier", "harbor", "helmet", "island", "jacket", "kettle", "ladder", "lantern", "lemon", "meadow",
    "mirror", "mountain", "needle", "ocean", "orchard", "otter", "parrot", "pebble", "pepper", "piano", "planet",
    "pocket", "puzzle", "rabbit", "river", "rocket", "saddle", "shadow", "shell", "ship", "spoon", "statue",
    "storm", "tiger", "tower", "trumpet", "tunnel", "valley", "violin", "wagon", "walnut", "window", "wolf",
)  # fmt: skip


def random_value(rng: random.Random, kind: str) -> str:
    """RULER's needle keys and values: ``numbers`` (7 digits), ``words`` (adjective-noun), ``uuids``."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"unknown needle type {kind!r}: numbers, words or uuids")


def single_needle_template() -> str:
    """The template as RULER words it for one needle asked (``prepare_niah.generate_input_output``)."""
    text = TEMPLATE.replace("Some", "A").replace("are all", "is").replace("are", "is")
    return text.replace("answers", "answer")


def draw(rng: random.Random, units: int, haystack: str, type_needle_k: str, type_needle_v: str) -> dict:
    """One prompt with ``units`` haystack units (a line each, RULER's ``repeat`` or ``needle`` haystack) and the
    needle inserted before unit ``index`` of them, as ``prepare_niah.generate_input_output`` builds it."""
    key, value = random_value(rng, type_needle_k), random_value(rng, type_needle_v)
    if haystack == "repeat":
        lines = [REPEATED] * units
    elif haystack == "needle":  # other keys' needles; the asked key is never one of them
        lines = []
        for _ in range(units):
            while (other := random_value(rng, type_needle_k)) == key:
                pass
            lines.append(NEEDLE.format(type_needle_v=type_needle_v, key=other, value=random_value(rng, type_needle_v)))
    else:
        raise ValueError(f"unknown haystack {haystack!r}: repeat or needle")
    index = rng.randrange(units)
    lines.insert(index, NEEDLE.format(type_needle_v=type_needle_v, key=key, value=value))
    singular = type_needle_v[:-1]
    return {
        "input": single_needle_template().format(type_needle_v=singular, context="\n".join(lines), query=key),
        "outputs": [value],
        "gen_prefix": f"The special magic {singular} for {key} mentioned in the provided text is",
        "depth": index / units,
    }


def tokenizer_name(model_args: dict) -> str | None:
    """The tokenizer the model's arguments name: ``tokenizer``, else ``export_dir`` (an export folder, ``--model
    blindheads``), else lm-eval's own choice (``pretrained``, then ``model``)."""
    for key in ("tokenizer", "export_dir"):
        if isinstance(value := model_args.get(key), str) and value:
            return value
    return resolve_tokenizer_name(model_args)


def generate_samples(
    tokenizer,
    *,
    max_seq_length: int,
    haystack: str,
    type_needle_k: str,
    type_needle_v: str,
    num_samples: int,
    tokens_to_generate: int,
    seed: int | str,
    name: str,
) -> list[dict]:
    """``num_samples`` prompts whose tokens plus ``tokens_to_generate`` fit ``max_seq_length``, each with as much
    haystack as fits (as ``prepare_niah.generate_samples``: the size a first prompt allows, shrunk where a sample's
    own keys and values make it too long)."""

    def fits(sample: dict) -> bool:
        return len(tokenizer(sample["input"]).input_ids) + tokens_to_generate <= max_seq_length

    def drawn(rng: random.Random, units: int) -> dict:
        return draw(rng, units, haystack, type_needle_k, type_needle_v)

    probe = random.Random(f"{seed}/{name}/{max_seq_length}/size")
    low, high = 1, 2  # the most units that fit, doubled and then halved: about 2 log2(units) prompts measured
    while fits(drawn(probe, high)):
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(drawn(probe, middle)) else (low, middle)
    rng = random.Random(f"{seed}/{name}/{max_seq_length}")
    samples = []
    for index in range(num_samples):
        for units in range(low, 0, -1):  # a sample's own keys and values may take more tokens: one unit fewer
            sample = drawn(rng, units)
            if fits(sample):
                length = len(tokenizer(sample["input"]).input_ids) + tokens_to_generate
                samples.append({"index": index, **sample, "length": length, "max_length": max_seq_length})
                break
    if not samples:
        raise ValueError(
            f"{name}: no prompt fits max_seq_length={max_seq_length} (the template, one haystack unit, the needle "
            f"and {tokens_to_generate} tokens to generate): give longer max_seq_lengths"
        )
    return samples


def dataset(
    name: str,
    haystack: str,
    type_needle_k: str,
    type_needle_v: str,
    *,
    max_seq_lengths=(256, 512, 1024, 2048),
    num_samples: int = 50,
    tokens_to_generate: int = 32,
    seed: int | str = 42,
    **model_args,
) -> dict[str, datasets.Dataset]:
    """The task's test split: ``num_samples`` prompts per length, interleaved (so ``--limit`` keeps every length)."""
    lengths = [int(length) for length in max_seq_lengths]
    undeclared = [length for length in lengths if length not in LENGTHS]
    if undeclared:
        raise ValueError(f"{name}: max_seq_lengths {undeclared} are not declared metrics; choose from {list(LENGTHS)}")
    tokenizer = get_tokenizer(tokenizer_name(model_args))
    by_length = [
        generate_samples(
            tokenizer,
            max_seq_length=length,
            haystack=haystack,
            type_needle_k=type_needle_k,
            type_needle_v=type_needle_v,
            num_samples=int(num_samples),
            tokens_to_generate=int(tokens_to_generate),
            seed=seed,
            name=name,
        )
        for length in lengths
    ]
    rows = [row for group in zip(*by_length) for row in group]
    rows += [row for group in by_length for row in group[min(map(len, by_length)) :]]  # where a length skipped some
    return {"test": datasets.Dataset.from_list(rows, split=datasets.Split.TEST)}


def niah_single_1(**kwargs) -> dict[str, datasets.Dataset]:
    return dataset("ruler_niah_single_1", "repeat", "words", "numbers", **kwargs)


def niah_multikey_2(**kwargs) -> dict[str, datasets.Dataset]:
    return dataset("ruler_niah_multikey_2", "needle", "words", "numbers", **kwargs)


def niah_multikey_3(**kwargs) -> dict[str, datasets.Dataset]:
    return dataset("ruler_niah_multikey_3", "needle", "uuids", "uuids", **kwargs)


def depth_label(depth: float) -> str:
    """The fifth of the haystack a needle's depth falls in, in percent: ``0-20`` ... ``80-100``."""
    low = min(int(depth * DEPTH_BINS + 1e-9), DEPTH_BINS - 1) * 100 // DEPTH_BINS
    return f"{low}-{low + 100 // DEPTH_BINS}"


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """RULER's score (``string_match_all``) under the sample's length, and under its length and depth fifth."""
    score = string_match_all(postprocess_pred(results), [doc["outputs"]])
    length = str(doc["max_length"])
    return {length: score, f"{length}_depth_{depth_label(doc['depth'])}": score}
