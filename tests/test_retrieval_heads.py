"""Which heads retrieve passkey and needle, and where they go blind: the prompts read as episodes, the blind columns
against a hand-computed softmax of the bias, the cap only beyond the training length, the verdict's arithmetic, and
the command on a tested run against the run's own committed accuracy."""

import json
import math

import pandas as pd
import pytest
import torch
from support.data import builtin_data
from support.runs import TINY_TESTED_RUN, refusal, run_cli

from blindheads.cli.retrieval_heads import bands, cells, onset, verdict
from blindheads.evaluation.prompts import passkey_samples
from blindheads.evaluation.recall import retrieval_episode
from blindheads.evaluation.retrieval_heads import retrieval_heads
from blindheads.modules.config import DecoderConfig
from blindheads.modules.decoder import Decoder

TINY_FLOAT32 = 2.0**-126  # float32's and bfloat16's smallest normal: flushed kernels keep nothing below it


@pytest.fixture(scope="module")
def data(cache_dir):
    data = builtin_data(cache_dir, 128, 2, 2)
    data.setup()
    return data


def decoder(position: str, vocab_size: int) -> Decoder:
    config = DecoderConfig.from_preset("tiny", vocab_size=vocab_size, attention="sdpa", position=position)
    return Decoder(config).eval()


def test_a_passkey_prompts_fact_is_the_nearer_copy_of_its_key_at_its_first_digit(data):
    tokenizer = data.tokenizer
    for sample in passkey_samples(tokenizer, [256], [0.0, 0.5, 1.0], 2):
        episode = retrieval_episode(tokenizer, sample)
        tokens, digits = sample.tokens.tolist(), sample.length - episode.answer  # the answer's content tokens
        assert tokenizer.decode(tokens[episode.fact : episode.fact + digits]).strip() == sample.answer
        assert tokens[episode.fact] == tokens[episode.answer]
        assert tokenizer.decode(tokens[episode.answer : sample.length]).strip() == sample.answer
        text = tokenizer.decode(tokens[: episode.fact])
        assert text.count(sample.answer) == 1, "one copy of the key lies before the fact: the fact is the nearer"
        assert episode.answer >= sample.answer_start and episode.distance > 0


@torch.no_grad()
def test_where_a_head_goes_blind_follows_a_hand_computed_softmax_of_its_bias(data, monkeypatch):
    """With every query projection zero, a logit is the bias alone: the weight the answer's query gives the key is
    exp(-m d) / sum over its row of exp(-m d'), exactly 0 (flushed) below the smallest normal (bfloat16's, the
    preset's dtype, is float32's)."""
    torch.manual_seed(0)
    model = decoder("alibi", len(data.tokenizer))
    for block in model.blocks:
        block.attn.q_proj.weight.zero_()
    samples = passkey_samples(data.tokenizer, [128, 384, 1024], [0.0, 0.25, 0.5, 0.75, 1.0], 1)
    costs = torch.zeros(2, 4)
    costs[0, 0], costs[1, 2] = 0.5, 0.2  # l0h0 the costliest carrier, l1h2 another (an untrained model carries none)
    monkeypatch.setattr("blindheads.evaluation.retrieval_heads.ablation_costs", lambda *args: costs)
    heads, prompts = retrieval_heads(model, data.tokenizer, samples, 128, 4)
    assert [h["carries"] for h in heads] == [True, False, False, False, False, False, True, False]
    slopes = model.position.components[0].head_parameters()["slope"].double()
    queries = torch.tensor([float(p["distance"]) for p in prompts])  # answer - fact: the query is answer - 1
    rows = torch.tensor([float(p["length"]) for p in prompts])
    for row in heads:
        m = slopes[row["head"]]
        answer_query = torch.tensor([retrieval_episode(data.tokenizer, s).answer - 1.0 for s in samples])
        log_z = torch.stack([torch.logsumexp(-m * torch.arange(q + 1, dtype=torch.float64), 0) for q in answer_query])
        log_weight = -m * (queries - 1) - log_z
        clear = (log_weight - math.log(TINY_FLOAT32)).abs() > 0.5  # away from the rounding edge
        blind, seen = clear & (log_weight < math.log(TINY_FLOAT32)), clear & (log_weight > math.log(TINY_FLOAT32))
        assert blind.any() or row["head"] > 0, "the steepest head is blind at 1,024 tokens"
        if blind.any():  # the measured edge lies between the clearly seen and the clearly blind (nan: none)
            assert row["blind_from"] <= queries[blind].min().item() and not row["sighted_to"] >= queries[blind].min()
        if seen.any():
            assert row["sighted_to"] >= queries[seen].max().item() and not row["blind_from"] <= queries[seen].max()
        if (row["layer"], row["head"]) == (0, 0):  # each prompt's top_blind is the costliest carrier's zero
            assert all(p["top_carrier"] == "l0h0" for p in prompts)
            top_blind = torch.tensor([p["top_blind"] for p in prompts])
            assert top_blind[blind].all() and not top_blind[seen].any() and blind.any() and seen.any()
            share = torch.tensor([p["blind_cost_share"] for p in prompts])  # l1h2 (cost 0.2) sees every key here
            assert torch.equal(share[blind], torch.full_like(share[blind], 0.5 / 0.7)) and (share[seen] == 0).all()
            near = torch.tensor([p["near_blind_cost_share"] for p in prompts])  # below e^-12, zero or not
            m2 = slopes[2]  # l1h2's, by the same hand softmax
            log_z2 = torch.stack(
                [torch.logsumexp(-m2 * torch.arange(q + 1, dtype=torch.float64), 0) for q in answer_query]
            )
            below = (log_weight < -12.0).double() * 0.5 + (-m2 * (queries - 1) - log_z2 < -12.0) * 0.2  # the horizon
            torch.testing.assert_close(near.double(), below / 0.7, rtol=0, atol=1e-6)
            assert (near > share).any(), "some key is near-blind without being blind"
        longest = rows.max().item()
        hand = (87.3365 - math.log(sum(math.exp(-m.item() * d) for d in range(int(longest))))) / m.item()
        # the preset computes in bfloat16: its logits round, by up to half a spacing at tau (0.25 nats)
        assert row["blind_distance_predicted"] == pytest.approx(hand, abs=1.0 + 0.25 / m.item())


@torch.no_grad()
@pytest.mark.parametrize("position", ["alibi", "nope"])
def test_the_cap_is_tried_only_beyond_the_training_length_and_only_on_a_bias(data, position):
    torch.manual_seed(0)
    samples = passkey_samples(data.tokenizer, [128, 256], [0.0, 1.0], 2)
    heads, prompts = retrieval_heads(decoder(position, len(data.tokenizer)), data.tokenizer, samples, 128, 4)
    frame = pd.DataFrame(prompts)
    assert len(frame) == 8 and len(heads) == 2 * 4  # the tiny preset: 2 layers of 4 heads
    assert frame[frame["in_domain"]]["exact_capped"].isna().all()
    beyond = frame[~frame["in_domain"]]["exact_capped"]
    assert beyond.isna().all() if position == "nope" else beyond.isin([0.0, 1.0]).all()
    if position == "nope":
        assert all(math.isinf(h["blind_distance_predicted"]) for h in heads)


def test_failure_and_blindness_onsets_are_read_band_by_band():
    prompts = pd.DataFrame({
        "setup": "alibi", "task": "passkey", "seed": "seed0",
        "distance": [40, 40, 100, 100, 200, 200, 600, 600],
        "in_domain": [True, True, True, True, False, False, False, False],
        "exact": [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0],
        "blind_cost_share": [0, 0, 0, 0, 0.2, 0.8, 0.6, 1.0],
        "top_blind": [False, False, False, False, False, True, True, True],
        "carriers_blind": [False] * 7 + [True],
        "exact_capped": [math.nan] * 4 + [1.0, 1.0, 1.0, 0.0],
    })  # fmt: skip
    table = bands(prompts)
    assert table["band"].tolist() == [32, 64, 128, 512]
    assert table["exact"].tolist() == [1.0, 1.0, 0.5, 0.0] and table["blind_cost_share"].tolist() == [0, 0, 0.5, 0.8]
    assert table["top_blind"].tolist() == [0, 0, 0.5, 1]
    assert table["carriers_blind"].tolist() == [0, 0, 0, 0.5]
    assert table["exact_capped"].tolist()[2:] == [1.0, 0.5]
    by_cell = cells(prompts.assign(length=[128, 128, 256, 256, 512, 512, 1024, 1024], depth=0.5,
                                   near_blind_cost_share=prompts["blind_cost_share"]))  # fmt: skip
    assert by_cell["length"].tolist() == [128, 256, 512, 1024] and by_cell["exact"].tolist() == [1.0, 1.0, 0.5, 0.0]
    assert by_cell["distance"].tolist() == [40, 100, 200, 600] and by_cell["in_domain"].tolist() == [1, 1, 0, 0]
    fails, blind = onset(table, in_domain=1.0)
    assert (fails, blind) == (512, 128)  # 0.5 is not below half of 1.0; half the cost blind is blind
    late = "most of its carriers are blind from 128 tokens, it fails only from 512"
    assert verdict(fails, blind, carriers=1, in_domain=1.0) == late
    assert verdict(512, 512, 1, 1.0) == "fails where most of its carriers go blind (512 tokens)"
    assert verdict(128, 512, 1, 1.0) == "fails from 128 tokens, before most of its carriers go blind (512)"
    assert verdict(128, math.nan, 1, 1.0) == "fails from 128 tokens while most of its carriers still see the key"
    assert verdict(math.nan, math.nan, 0, 0.0) == "no head carries it (in domain 0.00)"


RETRIEVAL = """
trainer:
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {every_n_train_steps: 2, save_last: true, save_top_k: 0}
    - class_path: blindheads.callbacks.retrieval.PasskeyEval
      init_args: {every_n_steps: null, lengths: [128, 256], depths: [0.0, 1.0], samples: 2}
    - class_path: blindheads.callbacks.retrieval.NeedleEval
      init_args: {every_n_steps: null, lengths: [128, 256], depths: [0.0, 1.0], samples: 2}
data:
  seq_len: 128
"""


@pytest.mark.slow
def test_a_tested_runs_prompts_are_attributed_and_answered_as_the_run_scored_them(tmp_path, cache_dir, capsys):
    from blindheads.cli import main

    (tmp_path / "tiny.yaml").write_text(TINY_TESTED_RUN)
    (tmp_path / "retrieval.yaml").write_text(RETRIEVAL)
    options = ["--config", str(tmp_path / "tiny.yaml"), "--config", str(tmp_path / "retrieval.yaml"),
               "--data.cache_dir", str(cache_dir), "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")]  # fmt: skip
    for command in (["fit", *options], ["test", *options, "--ckpt_path", "last"]):
        done = run_cli(command)
        assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "runs" / "alibi" / "seed3"
    metrics = json.loads((run / "results.json").read_text())["metrics"]

    main(["retrieval-heads", str(run), "--out", str(tmp_path / "out")])
    assert "1 runs attributed" in capsys.readouterr().out
    assert torch.is_grad_enabled()  # the command leaves the process as it found it
    heads, prompts = pd.read_csv(tmp_path / "out" / "heads.csv"), pd.read_csv(tmp_path / "out" / "prompts.csv")
    shape = heads["layer"].nunique() * heads["head"].nunique()
    assert len(heads) == 2 * shape and set(heads["task"]) == {"passkey", "needle"}
    for task, group in prompts.groupby("task"):
        assert len(group) == 2 * 2 * 2  # lengths x depths x samples, the run's
        inside = group[group["in_domain"]]
        assert inside["exact"].mean() == pytest.approx(metrics[f"test/{task}/acc_in_domain"])
        assert group[~group["in_domain"]]["exact"].mean() == pytest.approx(metrics[f"test/{task}/acc_out_of_domain"])
    report = (tmp_path / "out" / "retrieval_heads.md").read_text()
    assert f"retrieval-heads {run} --out" in report and "| alibi | passkey | 1 |" in report and "torch " in report
    constant = prompts[prompts["task"] == "passkey"]["answer"].astype(str).value_counts().iloc[0] / 8
    assert f"| {constant:.3f} | " in report  # the best constant answer's share, beside the verdict

    main(["retrieval-heads", str(run), "--out", str(tmp_path / "more"), "--samples", "3"])
    more = pd.read_csv(tmp_path / "more" / "prompts.csv")
    assert len(more) == 2 * 2 * 2 * 3
    first = more[more["index"] < 2].reset_index(drop=True)
    pd.testing.assert_series_equal(first["distance"], prompts["distance"])  # the run's prompts among them


def test_a_run_without_retrieval_callbacks_is_one_error_line(tmp_path):
    run = tmp_path / "alibi" / "seed0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("trainer:\n  callbacks: []\n")
    message = refusal(["retrieval-heads", str(run), "--out", str(tmp_path / "out")])
    assert message.startswith("blindheads retrieval-heads: error: ") and "\n" not in message
    assert "configures no PasskeyEval or NeedleEval callback" in message
    assert not (tmp_path / "out").exists()
