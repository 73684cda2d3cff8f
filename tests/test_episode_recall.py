"""EpisodeRecall: held-out episodes at fixed gaps, the answer's attention weight per head, learnable slopes, episodes
drawn per run seed, the constant answer's baseline."""

import json
from collections import Counter

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from support.data import builtin_data
from support.models import cpu_trainer, tiny_lm

from blindheads.callbacks.episode_recall import EpisodeRecall
from blindheads.callbacks.results import ResultsFile
from blindheads.datamodules.retrieval_mix import RetrievalMix
from blindheads.datamodules.text import TextData
from blindheads.experiments.grid.reports import attribution_markdown, distance_markdown
from blindheads.experiments.grid.tables import head_attribution, recall_by_distance

BLIND_AT_48 = "alibi(blind_distances=[48, 48, 48, 48], learnable=True)"


def trained(cache_dir, position: str):
    data = TextData(source="builtin", tokenizer="builtin", seq_len=256, batch_size=2, cache_dir=str(cache_dir),
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


def one_digit_run(cache_dir, recall: EpisodeRecall, position: str = "nope", **trainer):
    """A one-step fit at 64-token windows of one-digit episodes, with ``recall`` (and ``ResultsFile``) attached."""
    data = builtin_data(cache_dir, 64, 2, 2, retrieval_mix=RetrievalMix(facts=1, value_digits=(1, 1), max_gap=16))
    model = tiny_lm({"warmup_steps": 1}, dtype="float32", context_length=64, position=position)
    trainer = cpu_trainer(max_steps=1, callbacks=[recall, ResultsFile()], **trainer)
    trainer.fit(model, datamodule=data)
    return trainer, model, data


def test_distance_points_class_every_failure_as_blind_or_reachable(cache_dir):
    recall = EpisodeRecall(every_n_steps=None, gaps=[], distances=[0.5, 8], samples=4, batch_size=4)
    trainer, model, _ = one_digit_run(cache_dir, recall, BLIND_AT_48)
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
    assert scalars[f"{near}/length"] == 64 and scalars[f"{near}/in_window"] == 1  # padded with text to the window
    assert scalars[f"{far}/length"] > 512 and scalars[f"{far}/in_window"] == 0


def test_each_run_seed_draws_its_own_episodes_and_the_results_record_them(cache_dir, tmp_path, monkeypatch):
    """The episodes follow ``seed_everything`` (PL_GLOBAL_SEED): another seed, other episodes; the same, the same;
    ``results.json`` names the seed and each point's episode set."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # seed_everything sets it: restored after the test
    fields = []
    for seed in (3, 4, 3):
        L.seed_everything(seed)
        recall = EpisodeRecall(every_n_steps=None, gaps=[8], distances=[8], samples=4)
        trainer, model, data = one_digit_run(cache_dir, recall, default_root_dir=tmp_path)
        fields.append(recall.results_fields)
    assert [f["episode_seed"] for f in fields] == [3, 4, 3]
    first, other, again = (f["episode_sets"] for f in fields)
    assert set(first) == {"gap8", "distance8x"} and first == again
    assert all(first[point] != other[point] for point in first)
    trainer.test(model, datamodule=data)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["episode_seed"] == 3 and results["episode_sets"] == first
    assert results["metrics"]["test/recall/distance8x/in_window"] == 0


class Answers(torch.nn.Module):
    """An LM head that predicts ``token`` whatever it reads: a model that always gives one answer."""

    def __init__(self, token: int, vocab_size: int) -> None:
        super().__init__()
        self.token, self.vocab_size = token, vocab_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.one_hot(torch.full(hidden.shape[:-1], self.token), self.vocab_size).float()


def test_a_constant_answer_scores_the_most_common_answers_share_and_is_flagged(cache_dir):
    recall = EpisodeRecall(every_n_steps=None, gaps=[], distances=[0.5], samples=32, seed=0)
    torch.manual_seed(0)  # the model's initialisation
    trainer, model, _ = one_digit_run(cache_dir, recall)
    point = "recall/distance0.5x"
    assert recall.evaluate(trainer, model)[f"{point}/constant_answer"] == 0  # an untrained model's answers vary
    answers = Counter(e.sample.answer_tokens[-1].item() for e in recall.episodes(trainer, "distance0.5x", {}))
    (common, count), *_ = answers.most_common()
    model.decoder.lm_head = Answers(common, 4096)
    scalars = recall.evaluate(trainer, model)
    assert scalars[f"{point}/exact"] == scalars[f"{point}/baseline"] == count / 32 > 1 / 10
    assert scalars[f"{point}/constant_answer"] == 1


def test_distance_episodes_hold_the_answer_exactly_that_far_back_and_grow_beyond_the_window(cache_dir):
    from blindheads.datamodules.retrieval_mix import EpisodeWriter
    from blindheads.evaluation.recall import recall_samples

    data = TextData(source="builtin", tokenizer="builtin", seq_len=64, batch_size=2, cache_dir=str(cache_dir),
                      num_workers=0, val_windows=2)  # fmt: skip
    data.setup()
    writer = EpisodeWriter(
        RetrievalMix(facts=2, value_digits=(1, 2), min_gap=4, max_gap=4), data.tokenizer.backend_tokenizer, 64
    )
    haystack = data.heldout_tokens(2048).tolist()
    haystack[::100] = [0] * len(haystack[::100])  # documents of 99 tokens: EOS (id 0) in every far episode's span
    spaced = 0
    for distance in (30, 64, 200, 512):
        for sample, fact_at, answer_at in recall_samples(writer, haystack, 0, 64, 8, distance=distance):
            assert answer_at - fact_at == distance
            assert 0 not in sample.tokens[1:].tolist(), "one document: no EOS between the fact and its question"
            assert len(sample.tokens) == sample.length >= 64
            assert (sample.length == 64) == (distance < 40)  # longer than the window only where it must be
            answer, lead = sample.answer_tokens, answer_at - sample.answer_start  # lead: a space token, if any
            assert torch.equal(sample.tokens[fact_at - lead : fact_at - lead + len(answer)], answer)
            first = writer.tokenizer.decode([int(sample.tokens[answer_at])])
            assert first.lstrip()[:1].isdigit(), "fact and answer positions hold the value's first digit, not a space"
            spaced += lead
    assert spaced > 0, "this tokenizer stores some values as a space token, then the digits"
    with pytest.raises(ValueError, match="exactly one of gap and distance"):
        recall_samples(writer, haystack, 0, 64, 1, gap=4, distance=30)
    with pytest.raises(ValueError, match="cannot put an answer 3 tokens after its fact"):
        recall_samples(writer, haystack, 0, 64, 1, distance=3)


def test_the_distance_table_names_each_points_episodes_and_marks_constant_answers():
    def metrics(exact, constant):
        values = {}
        for factor, length in ((0.5, 64), (1, 78)):
            point = f"test/recall/distance{factor:g}x"
            values.update({f"{point}/distance": 64 * factor, f"{point}/exact": exact, f"{point}/blind": 0.0,
                           f"{point}/baseline": 0.25, f"{point}/constant_answer": constant, f"{point}/length": length})  # fmt: skip
        return values

    records = [{"setup": "alibi", "seed": seed, "metrics": metrics(0.25, seed)} for seed in (0, 1)]
    text = distance_markdown(recall_by_distance(records))
    assert "| setup | seeds | 0.5x (32; 64-token episodes, in the window) | 1x (64; 78-token episodes, beyond" in text
    assert "| alibi | 2 | 0.25 ± 0.00 (0.00) [one answer: 1/2 seeds] |" in text
    assert text.endswith("| best constant answer | | 0.25 | 0.25 |\n")


def test_the_attribution_table_counts_each_carrier_over_seeds_beside_recall_under_the_cap():
    """Layer 0's head 4 carries recall in both seeds, layer 1's head 2 in one (0.10 >= 0.05), l0h1 in none (0.01); at 4x recall goes
    from 0.20 to 0.90 under the cap, with the carriers near-blind in half the episodes on average."""
    records = []
    for seed, (cost12, near_blind) in enumerate(((0.10, 0.25), (0.0, 0.75))):
        metrics = {"test/recall/heads/layer0/head4/ablation_cost": 0.5, "test/recall/heads/layer0/head1/ablation_cost": 0.01,
                   "test/recall/heads/layer1/head2/ablation_cost": cost12, "test/recall/heads/layer0/head4/blind_by": 256.0}  # fmt: skip
        for factor, exact, capped in ((0.5, 1.0, None), (4, 0.2, 0.9)):
            point = f"test/recall/distance{factor:g}x"
            metrics.update({f"{point}/distance": 64 * factor, f"{point}/exact": exact, f"{point}/carriers_blind": 0.0,
                            f"{point}/carriers_near_blind": near_blind, f"{point}/length": 64 * factor + 16})  # fmt: skip
            if capped is not None:
                metrics[f"{point}/exact_capped"] = capped
        records.append({"setup": "alibi", "seed": seed, "metrics": metrics})
    heads = head_attribution(records)
    assert len(heads) == 6 and heads.set_index(["seed", "layer", "head"]).loc[(0, 0, 4), "blind_by"] == 256.0
    text = attribution_markdown(recall_by_distance(records), heads, 0.05)
    assert "| setup | seeds | carriers | 4x |" in text
    assert "| alibi | 2 | l0h4: 2, l1h2: 1 | 0.20 -> 0.90 [0.00 / 0.50] |" in text
