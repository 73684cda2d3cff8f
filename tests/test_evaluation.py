"""Retrieval prompts, teacher-forced scoring, grid summaries and the evaluation callbacks."""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys

import lightning as L
import numpy as np
import pytest
import torch
from support.oracles import OracleDecoder
from support.prompts import prompt_digest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from blindheads.blindness import blind_distances, effective_tau, first_blind_token
from blindheads.callbacks.gradient_blindness import GradientBlindness
from blindheads.callbacks.underflow import UnderflowMonitor
from blindheads.datamodules.text import TextData
from blindheads.datamodules.tokenizer import load_tokenizer
from blindheads.evaluation.contexts import forward_hooks
from blindheads.evaluation.figures import sweep_heatmap
from blindheads.evaluation.prompts import RetrievalSample, needle_samples, passkey_samples
from blindheads.evaluation.scoring import score_samples
from blindheads.evaluation.sweep import SweepScores, auc_over_log_length
from blindheads.evaluation.underflow import gradient_statistics
from blindheads.modules import Decoder, DecoderConfig
from blindheads.modules.config import SIZES
from blindheads.modules.lm import DecoderLM
from blindheads.numerics import flushing_subnormals, tau


@pytest.fixture(scope="module")
def tokenizer(cache_dir):
    return load_tokenizer("builtin", cache_dir)


@pytest.fixture(scope="module")
def haystack(cache_dir):
    dm = TextData(source="builtin", tokenizer="builtin", seq_len=64, cache_dir=str(cache_dir), num_workers=0)
    dm.prepare_data()
    return dm.heldout_tokens(4000).tolist()


def test_passkey_prompts_follow_the_template(tokenizer):
    samples = passkey_samples(tokenizer, [96, 200], [0.0, 0.5, 1.0], samples=2, seed=3)
    assert len(samples) == 2 * 3 * 2
    for sample in samples:
        assert len(sample.tokens) == sample.length, "lengths are exact in the tokenizer"
        assert sample.tokens[0] == tokenizer.eos_token_id and tokenizer.bos_token_id not in sample.tokens[1:].tolist()
        text = tokenizer.decode(sample.tokens[1:].tolist())
        assert text.startswith("There is an important info hidden inside a lot of irrelevant text.")
        assert f"The pass key is {sample.answer}. Remember it. {sample.answer} is the pass key." in text
        assert text.endswith(f"What is the pass key? The pass key is {sample.answer}")
        assert len(sample.answer) == 5 and sample.answer.isdigit()
        assert tokenizer.decode(sample.answer_tokens.tolist()) == f" {sample.answer}"
    shallow, deep = samples[6], samples[10]  # length 200, depths 0 and 1
    where = [tokenizer.decode(s.tokens.tolist()).index("pass key is") for s in (shallow, deep)]
    assert where[0] < 200 < where[0] + 200 < where[1], "depth 0 follows the instruction, depth 1 ends the haystack"


def test_needle_prompts_with_distractors(tokenizer, haystack):
    samples = needle_samples(tokenizer, haystack, [192, 320], [0.0, 0.5, 1.0], samples=2, distractors=2, seed=1)
    for sample in samples:
        assert len(sample.tokens) == sample.length
        text = tokenizer.decode(sample.tokens.tolist())
        assert text.count("One of the special magic numbers for") == 3
        assert len(sample.answer) == 7 and text.endswith(f"mentioned in the provided text is {sample.answer}")


@pytest.mark.slow
def test_prompts_are_identical_across_calls_and_processes(cache_dir):
    here = prompt_digest(cache_dir)
    assert here == prompt_digest(cache_dir)
    code = f"import sys; sys.path.insert(0, 'tests'); from support.prompts import prompt_digest; print(prompt_digest({str(cache_dir)!r}))"
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONHASHSEED": "123", "PATH": ""}
    )
    assert other.stdout.strip() == here, other.stderr[-2000:]


def test_oracle_scores_one_and_an_untrained_model_near_zero(tokenizer, haystack):
    samples = passkey_samples(tokenizer, [96, 192], [0.0, 0.5, 1.0], 2) + needle_samples(
        tokenizer, haystack, [192, 320], [0.0, 0.5, 1.0], 2, distractors=2
    )
    oracle = score_samples(OracleDecoder(tokenizer, len(tokenizer)), tokenizer, samples)
    assert all(s.exact for s in oracle) and all(s.digits == 1.0 for s in oracle)
    untrained = Decoder(DecoderConfig.from_preset("tiny", vocab_size=len(tokenizer), context_length=256)).eval()
    scores = score_samples(untrained, tokenizer, samples)
    assert sum(s.exact for s in scores) == 0
    assert np.mean([s.digits for s in scores]) < 0.2


class Continues(torch.nn.Module):
    """Predicts each next token of what it reads, then ``after``: the answer exactly, and ``after`` beyond it."""

    def __init__(self, after: int, vocab_size: int) -> None:
        super().__init__()
        self.after, self.vocab_size = after, vocab_size
        self.lm_head = torch.nn.Identity()
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # gives the scorer a device to read

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        following = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], self.after)], 1)
        return torch.nn.functional.one_hot(following, self.vocab_size).float()


def test_an_answer_counts_only_where_the_number_ends(tokenizer):
    """``57`` is no answer to ``5``: after the answer's last token the model must not predict another digit."""
    tokens = [tokenizer.eos_token_id, *tokenizer(" So the code reads 5", add_special_tokens=False).input_ids]
    sample = RetrievalSample(len(tokens), 0.0, 0, torch.tensor(tokens), len(tokens) - 1, "5")
    assert tokenizer.decode(sample.answer_tokens) == " 5"
    exact = {}
    for after in ("7", ".", " 7"):
        (token,) = tokenizer(after, add_special_tokens=False).input_ids
        (score,) = score_samples(Continues(token, len(tokenizer)), tokenizer, [sample])
        assert score.predicted == "5" and score.digits == 1
        exact[after] = score.exact
    assert exact == {"7": False, ".": True, " 7": True}  # "5 7" is a second number, not a longer one


def test_auc_is_a_normalised_trapezoid_over_log_length():
    assert auc_over_log_length([256, 512, 1024], [1.0, 1.0, 1.0]) == 1.0
    assert auc_over_log_length([256, 512, 1024], [1.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert auc_over_log_length([256, 1024], [0.5, 0.0]) == pytest.approx(0.25)
    assert auc_over_log_length([512], [0.75]) == 0.75
    assert math.isnan(auc_over_log_length([], []))


def test_grid_summary_splits_domains_at_the_training_length():
    exact = np.array([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    summary = SweepScores([128, 256, 512], [0.0, 1.0], 256, exact, exact, np.full((3, 2), 4.0))
    assert summary.metrics["auc_in_domain"] == pytest.approx(0.75)
    assert summary.metrics["auc_out_of_domain"] == 0.0
    assert summary.metrics["samples_in_domain"] == 16 and summary.metrics["samples_out_of_domain"] == 8
    assert [c["in_domain"] for c in summary.to_dict()["cells"]] == [True, True, True, True, False, False]
    assert sweep_heatmap(summary, "passkey").axes[0].get_title() == "passkey"


class ProbeData(L.LightningDataModule):
    """The builtin held-out text, for driving callbacks through a real Trainer."""

    def __init__(self, cache_dir, seq_len):
        super().__init__()
        self.inner = TextData(
            source="builtin",
            tokenizer="builtin",
            seq_len=seq_len,
            cache_dir=str(cache_dir),
            num_workers=0,
            val_windows=2,
            batch_size=2,
        )
        self.inner.prepare_data()
        self.seq_len, self.tokenizer = seq_len, self.inner.tokenizer

    def heldout_windows(self, count, length):
        return self.inner.heldout_windows(count, length)

    def test_dataloader(self):
        return self.inner.val_dataloader()


def test_monitor_measures_the_calculators_blindness_distance_and_logs_to_tensorboard(cache_dir, tmp_path):
    """With q = 0 every head is bias-dominated: the probe's first all-zero distance is the predicted one."""
    position = "alibi(blind_distances=[20.5, 30.5, 40.5, 60.5], dtype=float32)"
    config = DecoderConfig(**{**SIZES["tiny"].__dict__, "position": position, "dtype": "float32", "vocab_size": 4096})
    model = DecoderLM(config)
    for block in model.decoder.blocks:
        torch.nn.init.zeros_(block.attn.q_proj.weight)
    monitor = UnderflowMonitor(every_n_steps=None, length_factors=[1.0, 2.0])
    gradients = GradientBlindness(every_n_steps=None)
    trainer = L.Trainer(
        accelerator="cpu",
        logger=L.pytorch.loggers.TensorBoardLogger(tmp_path, name="probe"),
        callbacks=[monitor, gradients],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with flushing_subnormals():
        trainer.test(model, datamodule=ProbeData(cache_dir, 128))
    predicted = first_blind_token(blind_distances(model.decoder.position, tau("float32", "normal")))
    for layer in monitor.statistics[256]:
        torch.testing.assert_close(layer.blind_distance, predicted)
        assert (layer.zero_share > 0).all()
    materialized = blind_distances(
        model.decoder.position, effective_tau(model.decoder.position, 256, "float32", "normal", "materialized")
    )
    torch.testing.assert_close(monitor.statistics[256][1].blind_distance, first_blind_token(materialized))
    for (
        layer
    ) in gradients.statistics:  # zero weight -> zero gradient, by algebra; gradients vanish no later than weights
        assert (layer.zero_given_zero_weight == 1).all()
        assert (layer.grad_blind_distance <= layer.weight_blind_distance).all()

    (events,) = tmp_path.rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0, "images": 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    assert {"test/underflow/heatmap", "test/underflow/by_distance", "test/blind_distance/by_head"} <= set(
        tags["images"]
    )
    assert "test/blind_distance/layer1/head3" in tags["scalars"]
    logged = accumulator.Scalars("test/blind_distance/layer1/head3")[0].value
    assert logged == predicted[3].item()
    assert accumulator.Scalars("test/blind_distance_predicted/materialized/head3")[0].value == pytest.approx(
        materialized[3].item()
    )
    assert accumulator.Scalars("test/grad_zero_given_zero_weight/layer1/head2")[0].value == 1.0
    assert accumulator.Scalars("test/underflow/layer0/head0")[0].value == pytest.approx(
        monitor.statistics[128][0].zero_share[0].item()
    )


def test_the_blind_distance_figure_draws_each_layers_measure_beside_each_softmaxs_prediction():
    from blindheads.evaluation.figures import blind_distance_figure

    measured = torch.tensor([[178.0, math.inf, math.inf], [183.0, 358.0, math.inf]])  # (layers, heads)
    predicted = {"materialized": torch.tensor([172.8, 343.3, math.inf]), "fused": torch.tensor([174.7, 349.3, 700.0])}
    axis = blind_distance_figure(measured, predicted, 512).axes[0]
    lines = {line.get_label(): line for line in axis.get_lines()}
    dots, beyond = lines["measured in eager weights (each layer)"], lines["not blind within 512 tokens (each layer)"]
    assert sorted(dots.get_ydata()) == [178.0, 183.0, 358.0] and sorted(map(round, dots.get_xdata())) == [0, 0, 1]
    assert list(beyond.get_ydata()) == [512, 512, 512] and sorted(map(round, beyond.get_xdata())) == [1, 2, 2]
    materialized = lines["predicted, materialized softmax (eager, SDPA: as measured)"]
    assert list(materialized.get_xdata()) == [0, 1] and list(materialized.get_ydata()) == pytest.approx([172.8, 343.3])
    assert list(lines["predicted, fused softmax (FlexAttention)"].get_ydata()) == pytest.approx([174.7, 349.3, 700.0])
    assert [text.get_text() for text in axis.get_legend().get_texts()] == [
        "measured in eager weights (each layer)",
        "not blind within 512 tokens (each layer)",
        "predicted, materialized softmax (eager, SDPA: as measured)",
        "predicted, fused softmax (FlexAttention)",
    ]


@pytest.mark.parametrize(("position", "learns"), [("alibi", False), ("alibi(learnable=True)", True), ("nope", False)])
def test_predicted_blind_distances_are_logged_during_fit_only_where_training_moves_them(position, learns):
    """Fixed slopes predict the same at every step: a flat chart by construction, left to the image."""
    from blindheads.callbacks.underflow import learned

    config = DecoderConfig(**{**SIZES["tiny"].__dict__, "position": position, "vocab_size": 512})
    assert learned(DecoderLM(config).decoder.position) is learns


def test_gradient_statistics_against_autograd_by_hand():
    """Subnormals kept: a key at -103 gets 2^-149, the smallest subnormal, as its weight, and its logit gradient
    w_j (g_j - sum w g) rounds to zero. Keys at -110 have zero weight and zero gradient."""
    logits = torch.tensor(
        [
            [
                [
                    [0.0, -math.inf, -math.inf, -math.inf],
                    [0.0, 0.0, -math.inf, -math.inf],
                    [-110.0, -103.0, 0.0, -math.inf],
                    [-110.0, -103.0, -1.0, 0.0],
                ]
            ]
        ],
        requires_grad=True,
    )
    weights = torch.softmax(logits, dim=-1)
    loss = (weights * torch.tensor([0.1, 0.2, 0.3, 0.4])).sum()
    (grads,) = torch.autograd.grad(loss, logits)
    stats = gradient_statistics(logits.detach(), weights.detach(), grads)
    assert weights[0, 0, 3, 1] > 0 and grads[0, 0, 3, 1] == 0 and weights[0, 0, 3, 0] == 0
    assert stats.zero_given_zero_weight.item() == 1.0  # the two keys at -110
    # 4 non-zero weights other than their row's largest in rows of more than one key: the two at -103 get no gradient
    assert stats.zero_given_nonzero_weight.item() == pytest.approx(2 / 4)
    assert stats.weight_blind_distance.item() == 3 and stats.grad_blind_distance.item() == 2


def slope_gradients(cache_dir, tmp_path, flush: bool):
    """The monitor on a learnable-slope model whose attention is bias only (q = 0), with and without flushing."""
    position = "alibi(blind_distances=[20.5, 30.5, 40.5, 60.5], learnable=True, dtype=float32)"
    config = DecoderConfig(**{**SIZES["tiny"].__dict__, "position": position, "dtype": "float32", "vocab_size": 4096})
    torch.manual_seed(0)
    model = DecoderLM(config)
    for block in model.decoder.blocks:
        torch.nn.init.zeros_(block.attn.q_proj.weight)
    monitor = GradientBlindness(every_n_steps=None)
    trainer = L.Trainer(
        accelerator="cpu", logger=False, callbacks=[monitor], enable_progress_bar=False, enable_model_summary=False
    )
    data = ProbeData(cache_dir, 128)
    with flushing_subnormals() if flush else contextlib.nullcontext():
        log_slopes = model.decoder.position.components[0].log_slopes
        # the reference: plain autograd of the same loss
        (reference,) = torch.autograd.grad(model.loss(data.heldout_windows(1, 128)), log_slopes)
        trainer.test(model, datamodule=data)
    return monitor.slope_grad, reference


def test_slope_gradient_from_beyond_the_blindness_distance(cache_dir, tmp_path):
    flushed, reference = slope_gradients(cache_dir, tmp_path, flush=True)
    torch.testing.assert_close(flushed["slope_grad"], reference.double(), rtol=1e-5, atol=1e-9)
    assert (flushed["slope_grad_beyond_blind"] == 0).all(), "flushed: no gradient from beyond the blindness distance"
    kept, reference = slope_gradients(cache_dir, tmp_path, flush=False)
    torch.testing.assert_close(kept["slope_grad"], reference.double(), rtol=1e-5, atol=1e-9)
    assert (kept["slope_grad_beyond_blind"] != 0).any(), "kept subnormals carry gradient past the normal threshold"
    assert (kept["slope_grad_beyond_blind_share"] < 1e-30).all()


def test_the_eager_softmax_dtype_is_chosen_per_call_and_the_model_keeps_its_own():
    """The monitors measure in the training precision's dtype by asking for it per forward: the weights equal
    torch.softmax of the same logits in that dtype, and the model's softmax dtype is never written."""
    decoder = Decoder(DecoderConfig.from_preset("tiny", position="alibi", vocab_size=256, dtype="float32"))
    tokens = torch.randint(0, 256, (1, 64))
    seen = []
    modules = [block.attn.weights for block in decoder.blocks]
    with forward_hooks(modules, lambda _: lambda module, inputs, output: seen.append((inputs[0], output))):
        decoder.hidden_states(tokens, attention="eager", softmax_dtype=torch.bfloat16)
    for logits, weights in seen:
        assert weights.dtype == torch.bfloat16
        torch.testing.assert_close(weights, torch.softmax(logits.to(torch.bfloat16), dim=-1), rtol=0, atol=0)
    assert all(module.dtype == torch.float32 for module in modules)
    with pytest.raises(ValueError, match="softmax_dtype applies to the eager backend only"):
        decoder.hidden_states(tokens, attention="sdpa", softmax_dtype=torch.bfloat16)


@pytest.mark.parametrize(
    "precision, dtype",
    [
        ("bf16-mixed", torch.bfloat16),
        ("16-mixed", torch.float16),
        ("32-true", torch.float32),
        ("64-true", torch.float64),
    ],
)
def test_the_monitors_measure_in_the_dtype_the_trainer_precision_computes_in(precision, dtype):
    from types import SimpleNamespace

    from blindheads.callbacks.periodic import autocast_dtype

    assert autocast_dtype(SimpleNamespace(precision=precision)) == dtype


def test_loss_by_position_buckets_are_the_mean_token_loss_there_and_average_to_the_windows_loss(cache_dir):
    """LengthExtrapolation's ``at{start}``: the held-out loss on positions start..start+size-1, checked against
    cross-entropy computed by hand on the same held-out windows."""
    from support.data import builtin_data
    from support.models import cpu_trainer, tiny_lm

    from blindheads.callbacks.extrapolation import LengthExtrapolation

    torch.manual_seed(0)
    data, model = builtin_data(cache_dir, 64, 2, 2), tiny_lm({"warmup_steps": 1}, context_length=64, dtype="float32")
    callback = LengthExtrapolation(every_n_steps=None, factors=[1, 2], sequences=3, position_bucket=16)
    trainer = cpu_trainer(max_steps=1, callbacks=[callback])
    trainer.fit(model, datamodule=data)
    scalars = callback.evaluate(trainer, model)
    tokens = data.heldout_windows(3, 128)
    with torch.no_grad():
        logits = model.decoder(tokens[:, :-1])
    by_hand = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none").mean(0)
    assert scalars["extrapolation/2x/bucket1"] == pytest.approx(by_hand[64:].mean().item(), rel=1e-5)
    assert not any("/2x/at" in k for k in scalars), "positions are bucketed at the training length only"
    tokens = data.heldout_windows(3, 64)
    with torch.no_grad():
        logits = model.decoder(tokens[:, :-1])
    by_hand = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none").mean(0)
    for start in range(0, 64, 16):
        expected = by_hand[start : start + 16].mean().item()
        assert scalars[f"extrapolation/1x/at{start}"] == pytest.approx(expected, rel=1e-5)
    buckets = [scalars[f"extrapolation/1x/at{s}"] for s in range(0, 64, 16)]
    assert sum(buckets) / 4 == pytest.approx(scalars["extrapolation/1x/loss"], rel=1e-9)
