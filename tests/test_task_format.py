"""Training in the passkey and needle prompts' own format: whole windows of sequences laid out as the evaluation lays
out its prompts, keys and corpus filler held out, a distance curriculum that a resume reproduces."""

from __future__ import annotations

import itertools
import random
import re

import pytest
import torch
from support.data import MARKER, make_datamodule, take, write_fineweb_parquet

from blindheads.datamodules.task_format import TaskFormat, TaskWriter
from blindheads.evaluation import prompts
from blindheads.prompt_texts import (
    NEEDLE,
    NEEDLE_QUESTION,
    PASSKEY_FILLER,
    PASSKEY_INSTRUCTION,
    PASSKEY_NEEDLE,
    PASSKEY_QUESTION,
    evaluation_value,
)

TASKS = TaskFormat(needle=0.3, ramp_windows=40, seed=3)
PASSKEY = re.compile(
    re.escape(PASSKEY_INSTRUCTION) + r"(?P<filler>.*)" + re.escape(PASSKEY_QUESTION) + r" (?P<answer>\d+)$", re.S
)
NEEDLE_ASKED = re.compile(
    r"(?P<key>[a-z]+-[a-z]+)".join(re.escape(NEEDLE_QUESTION).split(re.escape("{key}"), 1)).replace(
        re.escape("{key}"), "(?P=key)"
    )
    + r" (?P<answer>\d+)$",
    re.S,
)


@pytest.fixture
def files(tmp_path):
    return [str(p) for p in write_fineweb_parquet(tmp_path, num_files=9, docs_per_file=20)]


def tasks(cache_dir, files, task=TASKS, **kwargs):
    return make_datamodule(cache_dir, files, seq_len=256, task_format=task, **kwargs)


def sequences(dm, batches):
    """Every sequence of the windows: the text between one EOS and the next."""
    eos = dm.tokenizer.eos_token_id
    out = []
    for window in (w for batch in batches for w in batch):
        assert window[0] == eos and window[-1] == eos, "every window is [EOS] sequence ... [EOS]"
        ends = (window == eos).nonzero().flatten().tolist()
        out += [dm.tokenizer.decode(window[a + 1 : b].tolist()) for a, b in itertools.pairwise(ends) if b > a + 1]
    return out


def filler_after_needles(dm, texts):
    """The filler tokens between each sequence's needle and its question."""
    out = []
    for text in texts:
        if asked := PASSKEY.match(text):
            between = asked["filler"].split(PASSKEY_NEEDLE.format(key=asked["answer"]))[1]
        else:
            asked = NEEDLE_ASKED.search(text)
            needle = NEEDLE.format(key=asked["key"], value=asked["answer"])
            between = text[text.index(needle) + len(needle) : asked.start()]
        out.append(len(dm.tokenizer(between, add_special_tokens=False).input_ids))
    return out


def test_every_window_is_sequences_in_the_evaluations_own_format(cache_dir, files):
    dm = tasks(cache_dir, files)
    texts = sequences(dm, take(dm, 10))
    kinds = {"passkey": 0, "corpus": 0, "needle": 0}
    for text in texts:
        if asked := PASSKEY.match(text):
            key = asked["answer"]
            assert len(key) == 5 and PASSKEY_NEEDLE.format(key=key) in asked["filler"], text
            kinds["passkey" if PASSKEY_FILLER[:20] in asked["filler"] else "corpus"] += 1
        else:
            asked = NEEDLE_ASKED.search(text)
            assert asked, text
            assert NEEDLE.format(key=asked["key"], value=asked["answer"]) in text and len(asked["answer"]) == 7
            kinds["needle"] += 1
    assert min(kinds.values()) > 10, kinds
    assert kinds["needle"] / len(texts) == pytest.approx(0.3, abs=0.12)


def test_a_sequence_is_the_evaluation_prompt_of_its_length(cache_dir, files, monkeypatch):
    """A passkey sequence with the standard filler is, token for token, the prompt ``passkey_samples`` builds at its
    length for its key at one of the depths the evaluation can ask."""
    tokenizer = make_datamodule(cache_dir, files, seq_len=256).tokenizer
    writer = TaskWriter(TaskFormat(needle=0.0, corpus_filler=0.0, ramp_windows=0), tokenizer, 256)
    depths = [d / 100 for d in range(101)]
    for seed in range(20):
        rng = random.Random(seed)
        length = rng.randint(writer.shortest, 255)
        tokens = [tokenizer.eos_token_id, *writer.sequence(rng, length, lambda n: [], 256)]
        key = tokenizer.decode(tokens).split()[-1]
        monkeypatch.setattr(prompts, "evaluation_digits", lambda rng, digits, key=key: key)
        evaluated = {tuple(s.tokens.tolist()) for s in prompts.passkey_samples(tokenizer, [length + 1], depths, 1)}
        assert tuple(tokens) in evaluated, tokenizer.decode(tokens)


def test_keys_values_and_corpus_filler_are_held_out(cache_dir, files):
    """No answer training teaches is one the evaluation's split leaves to it, and no corpus text of training is in
    the held-out stream that needle haystacks come from."""
    dm = tasks(cache_dir, files)
    texts = sequences(dm, take(dm, 30))
    answers = [m.group("answer") for t in texts for m in [PASSKEY.match(t) or NEEDLE_ASKED.search(t)]]
    assert len(answers) > 100 and not any(evaluation_value(a) for a in answers)
    assert sum(map(evaluation_value, (str(n) for n in range(10000, 100000)))) == pytest.approx(45000, rel=0.02)
    trained = {int(m) for t in texts for m in MARKER.findall(t)}
    held_out = {int(m) for m in MARKER.findall(dm.tokenizer.decode(dm.heldout_tokens(4000).tolist()))}
    assert trained and held_out and not trained & held_out


def test_the_evaluation_draws_only_its_own_keys(cache_dir, files):
    dm = make_datamodule(cache_dir, files, seq_len=256)
    samples = prompts.passkey_samples(dm.tokenizer, [256, 512], [0.0, 0.5, 1.0], 8)
    samples += prompts.needle_samples(dm.tokenizer, dm.heldout_tokens(2000).tolist(), [256], [0.0, 1.0], 8)
    assert all(evaluation_value(s.answer) for s in samples)


def test_the_distance_rises_over_the_ramp_and_a_resume_reproduces_it(cache_dir, files):
    writer = TaskWriter(TASKS, make_datamodule(cache_dir, files, seq_len=256).tokenizer, 256, streams=2)
    assert [writer.reach(w) for w in (0, 10, 20, 1000)] == [16, 136, 256, 256]
    unit = len(writer.unit)  # standard filler puts the needle at a sentence's start: up to a sentence further back
    dm = tasks(cache_dir, files)
    batches = take(dm, 30)  # 4 windows a batch: the first's reach is 16 + 240 * 3 / 40 = 34 at most, full from 10 on
    early, late = (filler_after_needles(dm, sequences(dm, part)) for part in (batches[:1], batches[10:]))
    assert max(early) <= 34 + unit + 2 < 120 < max(late)  # (+ 2: filler text re-encoded alone)
    first = tasks(cache_dir, files, num_workers=2)
    uninterrupted = take(first, 25)
    half = tasks(cache_dir, files, num_workers=2)
    take(half, 9)
    resumed = tasks(cache_dir, files, num_workers=2)
    resumed.load_state_dict(half.state_dict())
    for step, (a, b) in enumerate(zip(uninterrupted[9:], take(resumed, 16)), start=9):
        assert torch.equal(a, b), f"batch {step} differs after resuming"


def test_the_task_format_replaces_the_mix_and_refuses_both(cache_dir, files):
    from blindheads.datamodules.retrieval_mix import RetrievalMix

    with pytest.raises(ValueError, match="retrieval_mix and data.task_format both write the training stream"):
        tasks(cache_dir, files, retrieval_mix=RetrievalMix())
    with pytest.raises(ValueError, match="need at least .* tokens .* more than a training window"):
        TaskWriter(TaskFormat(), make_datamodule(cache_dir, files, seq_len=64).tokenizer, 64)
    with pytest.raises(ValueError, match="needle must lie in"):
        TaskFormat(needle=2.0)
