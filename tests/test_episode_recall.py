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
