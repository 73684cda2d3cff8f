"""The retrieval mix: deterministic, exactly resumable, at its rate, inside one window, and disjoint from the
evaluation prompts."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from support.data import make_datamodule, take, write_fineweb_parquet

from blindheads.datamodules.retrieval_mix import KEY_WORDS, TEMPLATES, EpisodeWriter, RetrievalMix, vocabulary_words
from blindheads.evaluation import prompts

SMALL = RetrievalMix(rate=0.5, facts=2, min_gap=4, max_gap=16, seed=3)


@pytest.fixture
def files(tmp_path):
    return [str(p) for p in write_fineweb_parquet(tmp_path, num_files=9, docs_per_file=20)]


def mixed(cache_dir, files, mix=SMALL, **kwargs):
    return make_datamodule(cache_dir, files, seq_len=128, retrieval_mix=mix, **kwargs)


def test_the_same_mix_gives_the_same_windows_and_the_seed_changes_them(cache_dir, files):
    first, second = take(mixed(cache_dir, files), 20), take(mixed(cache_dir, files), 20)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    reseeded = take(mixed(cache_dir, files, RetrievalMix(**{**SMALL.__dict__, "seed": 4})), 20)
    assert not all(torch.equal(a, b) for a, b in zip(first, reseeded))
    plain = take(make_datamodule(cache_dir, files, seq_len=128), 20)
    assert not all(torch.equal(a, b) for a, b in zip(first, plain)), "the mix changes the training windows"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_with_the_mix_is_exact(cache_dir, files, num_workers):
    """Episodes depend on where a document starts in its window: a resumed stream must rebuild the same ones."""
    uninterrupted = take(mixed(cache_dir, files, num_workers=num_workers), 45)
    first = mixed(cache_dir, files, num_workers=num_workers)
    take(first, 11)
    second = mixed(cache_dir, files, num_workers=num_workers)
    second.load_state_dict(first.state_dict())
    resumed = take(second, 34)
    for step, (a, b) in enumerate(zip(uninterrupted[11:], resumed), start=11):
        assert torch.equal(a, b), f"batch {step} differs after resuming"


def test_a_changed_mix_is_refused_on_resume(cache_dir, files):
    state = mixed(cache_dir, files).state_dict()
    take_state = mixed(cache_dir, files)
    take(take_state, 3)
    other = mixed(cache_dir, files, RetrievalMix(**{**SMALL.__dict__, "rate": 0.9}))
    with pytest.raises(ValueError, match="retrieval_mix: .*'rate': 0.5.* -> .*'rate': 0.9"):
        other._check_data(take_state.state_dict()["data"])
    assert state["data"]["retrieval_mix"]["rate"] == 0.5


@pytest.mark.parametrize("rate", [0.0, 0.3, 1.0])
def test_the_rate_is_the_share_of_documents_drawn_and_every_episode_fits_a_window(cache_dir, files, rate):
    dm = mixed(cache_dir, files, RetrievalMix(**{**SMALL.__dict__, "rate": rate}))
    loader = dm.train_dataloader()
    windows = torch.cat([dm.on_after_batch_transfer(b, 0) for b in itertools.islice(loader, 60)])
    statistics = loader.dataset.episodes.statistics
    assert statistics["windows"] >= 150
    assert statistics["drawn"] / statistics["windows"] == pytest.approx(rate, abs=0.08)
    texts = [dm.tokenizer.decode(w.tolist()) for w in windows]
    per_window = [(t.count(" code reads ") - t.count(" So the"), t.count(" So the")) for t in texts]
    assert all(facts == recalls for facts, recalls in per_window), "every fact and its recall share one window"
    if rate == 0:
        assert statistics["episodes"] == sum(recalls for _, recalls in per_window) == 0
    else:  # documents shorter than where their episode must start in the window carry none
        assert 0 < statistics["episodes"] <= statistics["drawn"]
        assert sum(recalls for _, recalls in per_window) > 0
        assert min(statistics["distances"]) >= 4 and max(statistics["distances"]) < 128


def test_a_gap_longer_than_a_window_is_refused(cache_dir, files):
    dm = make_datamodule(cache_dir, files, seq_len=64)
    with pytest.raises(
        ValueError, match="max_gap=200 makes episodes of up to .* tokens, longer than a training window"
    ):
        EpisodeWriter(RetrievalMix(max_gap=200), dm.tokenizer.backend_tokenizer, 64)
    with pytest.raises(ValueError, match="rate must lie in \\[0, 1\\], got 1.5"):
        RetrievalMix(rate=1.5)


@pytest.mark.parametrize(
    ("template", "recall"), [("sentence", " So the"), ("short", " ="), ("assign", "="), ("quiz", " Question:")]
)
def test_no_evaluation_prompt_occurs_in_training(cache_dir, files, template, recall):
    """Evaluation stays held out: the mix shares no template, key word or phrase with passkey and needle."""
    assert not set(KEY_WORDS[0] + KEY_WORDS[1]) & set(prompts.NEEDLE_KEY_WORDS[0] + prompts.NEEDLE_KEY_WORDS[1])
    facts = 1 if template == "quiz" else SMALL.facts  # two quiz facts with 6-digit values outgrow a 128-token window
    mix = RetrievalMix(**{**SMALL.__dict__, "rate": 1.0, "template": template, "facts": facts})
    dm = mixed(cache_dir, files, mix)
    text = " ".join(dm.tokenizer.decode(w.tolist()) for b in take(dm, 60) for w in b)
    assert text.count(recall) > 100
    evaluation_phrases = [
        "pass key",
        "special magic number",
        "Remember it",
        "hidden inside a lot of irrelevant text",
        "The grass is green",
        "mentioned in the provided text",
    ]
    for phrase in evaluation_phrases:
        assert phrase.lower() not in text.lower(), phrase
        assert phrase.lower() not in "".join(TEMPLATES[template][:2]).lower()


def test_the_short_template_puts_answers_a_few_tokens_past_the_gap(cache_dir, files):
    """``wagon = 7.`` ... ``wagon = 7.``: one fact's answer lies its gap plus a handful of tokens back, against
    about 17 more with the sentence template, so a steep head can still see the near one."""
    tokenizer = make_datamodule(cache_dir, files, seq_len=128).tokenizer.backend_tokenizer
    distances = {}
    for template in ("sentence", "short"):
        mix = RetrievalMix(facts=1, value_digits=(1, 1), min_gap=4, max_gap=4, template=template)
        writer = EpisodeWriter(mix, tokenizer, 128)
        _, facts, recalls, gap = writer.episode(random.Random(0))
        text = tokenizer.decode(facts)
        assert (" = " in text) == (template == "short") and (" code reads " in text) == (template == "sentence")
        distances[template] = writer.distances(facts, recalls, gap)[0] - gap
    assert distances["short"] <= 8 < distances["sentence"]
    with pytest.raises(ValueError, match="template must be one of sentence, short, assign, quiz, got 'long'"):
        RetrievalMix(template="long")
    with pytest.raises(ValueError, match="facts=13: the short template has only 12 keys"):
        RetrievalMix(facts=13, template="short")


def test_validation_stays_natural_text(cache_dir, files):
    with_mix, without = mixed(cache_dir, files), make_datamodule(cache_dir, files, seq_len=128)
    assert torch.equal(with_mix.validation_windows(), without.validation_windows())
    assert torch.equal(with_mix.heldout_tokens(500), without.heldout_tokens(500))


@pytest.mark.parametrize("filler_digits", [True, False])
def test_without_filler_digits_the_values_are_the_only_numbers_in_training_and_held_out_text(
    cache_dir, files, filler_digits
):
    """The conjecture's data: a value is the only number a head can find, in training windows and held-out
    episodes alike (with the documents' digits kept, ``doc 7 begins`` puts others around it)."""
    import re

    from blindheads.evaluation.recall import recall_samples

    mix = RetrievalMix(rate=1.0, facts=1, value_digits=(1, 1), min_gap=4, max_gap=16, template="short",
                       filler_digits=filler_digits)  # fmt: skip
    data = mixed(cache_dir, files, mix)
    tokenizer = data.tokenizer.backend_tokenizer
    windows = [tokenizer.decode(w.tolist()) for batch in take(data, 6) for w in batch]
    writer = EpisodeWriter(mix, tokenizer, 128)
    samples = recall_samples(writer, data.heldout_tokens(2000).tolist(), 0, 128, 16, gap=8)
    held_out = [tokenizer.decode(s.tokens.tolist()) for s, *_ in samples]
    for texts in (windows, held_out):
        numbers = [m for text in texts for m in re.finditer(r"\d+", text)]
        others = [m for m in numbers if not m.string[: m.start()].endswith("= ")]  # not a fact's or recall's value
        assert numbers and (others == []) != filler_digits, others[:3]
    assert sum(bool(re.search(r"= \d\.", text)) for text in windows) > len(windows) / 2, "episodes are still there"


def test_the_assign_template_gives_every_one_digit_value_one_token(cache_dir, files):
    """With a small vocabulary `` 2`` is one token and `` 7`` two (a space, then the digit), so ``short``'s one-digit
    answers differ in length by digit; ``assign`` states values with no space before them: one token each."""
    tokenizer = make_datamodule(cache_dir, files, seq_len=128, builtin_vocab_size=1024).tokenizer.backend_tokenizer
    lengths = {}
    for template in ("short", "assign"):
        writer = EpisodeWriter(RetrievalMix(facts=1, value_digits=(1, 1), template=template), tokenizer, 256)
        for seed in range(200):
            _, facts, [(prefix, value)], _ = writer.episode(random.Random(seed))
            assert writer.distances(facts, [(prefix, value)], 1)  # the value is found in its fact
            lengths.setdefault(template, {})[tokenizer.decode(value).strip()] = len(value)
    assert len(lengths["assign"]) == 9 and set(lengths["assign"].values()) == {1}
    assert set(lengths["short"].values()) == {1, 2}


def test_quiz_keys_are_vocabulary_words_that_no_evaluation_prompt_uses(cache_dir, files):
    """Two whole-word tokens of the tokenizer make a quiz key, so no fixed word marks the value; the passkey and needle
    prompts' words (``pass``, ``key``, ``grass``, the needle's key words) are never among them."""
    vocab = {"\u0120pass": 0, "\u0120key": 1, "\u0120grass": 2, "\u0120amber": 3, "\u0120returned": 4, "\u0120Block": 5,
             "\u0120is": 6, "block": 7, "\u0120x2y": 8, "\u0120context": 9}  # fmt: skip
    assert vocabulary_words(vocab) == ["context", "returned"]
    tokenizer = make_datamodule(cache_dir, files, seq_len=128).tokenizer.backend_tokenizer
    writer = EpisodeWriter(RetrievalMix(facts=1, value_digits=(2, 2), max_gap=16, template="quiz"), tokenizer, 128)
    words = set(writer.key_words[0])
    assert writer.key_words == [writer.key_words[0]] * 2 and len(words) > 20
    keys = {tokenizer.decode(writer.episode(random.Random(seed))[1]).split(" is ")[0] for seed in range(50)}
    assert len(keys) > 40 and all(set(key.split()[1:]) <= words for key in keys), sorted(keys)[:5]
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    word_level = Tokenizer(WordLevel({"plum": 0, "[UNK]": 1}, unk_token="[UNK]"))  # no byte-level whole words
    with pytest.raises(ValueError, match="the quiz template keys episodes with whole-word tokens"):
        EpisodeWriter(RetrievalMix(facts=1, max_gap=16, template="quiz"), word_level, 128)
