"""EpisodeRecall: held-out episodes at fixed gaps, the answer's attention weight per head, learnable slopes."""

import pytest
import torch
from helpers import cpu_trainer, tiny_lm

from blindheads.callbacks.episode_recall import EpisodeRecall
from blindheads.datamodules.fineweb import FineWebEdu
from blindheads.datamodules.retrieval_mix import RetrievalMix

BLIND_AT_48 = "alibi(blind_distances=[48, 48, 48, 48], learnable=True)"


def trained(cache_dir, position: str):
    data = FineWebEdu(source="builtin", tokenizer="builtin", seq_len=256, batch_size=2, cache_dir=str(cache_dir),
                      num_workers=0, val_windows=2, retrieval_mix=RetrievalMix(max_gap=128))  # fmt: skip
    model = tiny_lm({"warmup_steps": 1}, dtype="float32", context_length=256, position=position)
    recall = EpisodeRecall(every_n_steps=None, gaps=[8, 128], samples=6, batch_size=4)
    trainer = cpu_trainer(max_steps=1, callbacks=[recall])
    trainer.fit(model, datamodule=data)
    torch.set_flush_denormal(True)  # as blindheads fit does: the float32 `normal` threshold
    try:
        return recall.evaluate(trainer, model)
    finally:
        torch.set_flush_denormal(False)


def test_blind_heads_put_exactly_zero_weight_on_a_far_answer_and_none_on_a_near_one(cache_dir):
    scalars = trained(cache_dir, BLIND_AT_48)
    far = [v for k, v in scalars.items() if k.startswith("recall/gap128/weight/")]
    near = [v for k, v in scalars.items() if k.startswith("recall/gap8/weight/")]
    assert len(far) == len(near) == 2 * 4
    assert scalars["recall/gap128/distance"] > 96, "beyond what two layers blind at 48 can relay"
    assert all(v == 0.0 for v in far), "flushed float32: the far answer's weight is exactly zero"
    assert all(v > 0 for v in near) and scalars["recall/gap8/distance"] < 48
    assert 0 <= scalars["recall/gap8/exact"] <= 1
    slopes = [v for k, v in scalars.items() if k.startswith("recall/slope/head")]
    assert slopes == pytest.approx([87.3365 / 48] * 4, rel=0.01)  # one small step from the blind start


def test_without_a_bias_the_far_answer_gets_weight(cache_dir):
    scalars = trained(cache_dir, "nope")
    assert all(v > 0 for k, v in scalars.items() if k.startswith("recall/gap128/weight/"))
    assert not any(k.startswith("recall/slope/") for k in scalars)


def test_distance_points_class_every_failure_as_blind_or_reachable(cache_dir):
    data = FineWebEdu(source="builtin", tokenizer="builtin", seq_len=64, batch_size=2, cache_dir=str(cache_dir),
                      num_workers=0, val_windows=2, retrieval_mix=RetrievalMix(facts=1, value_digits=(1, 1), max_gap=16))  # fmt: skip
    model = tiny_lm({"warmup_steps": 1}, dtype="float32", context_length=64, position=BLIND_AT_48)
    recall = EpisodeRecall(every_n_steps=None, gaps=[], distances=[0.5, 8], samples=4, batch_size=4)
    trainer = cpu_trainer(max_steps=1, callbacks=[recall])
    trainer.fit(model, datamodule=data)
    torch.set_flush_denormal(True)
    try:
        scalars = recall.evaluate(trainer, model)
    finally:
        torch.set_flush_denormal(False)
    assert scalars["recall/distance0.5x/distance"] == 32 and scalars["recall/distance8x/distance"] == 512
    near, far = "recall/distance0.5x", "recall/distance8x"
    assert scalars[f"{near}/blind"] == 0 and scalars[f"{near}/unreachable"] == 0  # 32 < 48: every head sees it
    assert scalars[f"{far}/blind"] == 1 and scalars[f"{far}/unreachable"] == 1  # 512 > 2 layers x 48
    for point in (near, far):
        parts = [scalars[f"{point}/{part}"] for part in ("exact", "failed_blind", "failed_reachable")]
        assert sum(parts) == pytest.approx(1)
    assert scalars[f"{far}/failed_reachable"] == 0 and scalars[f"{near}/failed_blind"] == 0


def test_distance_episodes_hold_the_answer_exactly_that_far_back_and_grow_beyond_the_window(cache_dir):
    from blindheads.datamodules.retrieval_mix import EpisodeWriter
    from blindheads.evaluation.recall import recall_samples

    data = FineWebEdu(source="builtin", tokenizer="builtin", seq_len=64, batch_size=2, cache_dir=str(cache_dir),
                      num_workers=0, val_windows=2)  # fmt: skip
    data.setup()
    writer = EpisodeWriter(
        RetrievalMix(facts=2, value_digits=(1, 2), min_gap=4, max_gap=4), data.tokenizer.backend_tokenizer, 64
    )
    haystack = data.heldout_tokens(2048).tolist()
    for distance in (30, 64, 200, 512):
        for sample, fact_at in recall_samples(writer, haystack, 0, 64, 8, distance=distance):
            assert sample.answer_start - fact_at == distance
            assert len(sample.tokens) == sample.length >= 64
            assert (sample.length == 64) == (distance < 40)  # longer than the window only where it must be
            answer = sample.answer_tokens
            assert torch.equal(sample.tokens[fact_at : fact_at + len(answer)], answer)
    with pytest.raises(ValueError, match="exactly one of gap and distance"):
        recall_samples(writer, haystack, 0, 64, 1, gap=4, distance=30)
    with pytest.raises(ValueError, match="cannot put an answer 3 tokens after its fact"):
        recall_samples(writer, haystack, 0, 64, 1, distance=3)
