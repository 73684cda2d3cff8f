"""Probes of published ALiBi architectures, on tiny randomly initialised BLOOM, Falcon and MPT built here."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import BloomConfig, BloomForCausalLM, FalconConfig, FalconForCausalLM, MptConfig, MptForCausalLM
from transformers.models.bloom.modeling_bloom import build_alibi_tensor as bloom_alibi
from transformers.models.falcon.modeling_falcon import build_alibi_tensor as falcon_alibi
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

from blindheads.cli.probe import main as probe
from blindheads.datamodules.tokenizer import load_tokenizer
from blindheads.numerics import measure_tau
from blindheads.probes.published import load_published, measure
from blindheads.probes.score_paths import score_path

HEADS, HEAD_DIM = 4, 16
ARCHITECTURES = {
    "bloom": lambda: BloomForCausalLM(BloomConfig(vocab_size=4096, hidden_size=64, n_head=HEADS, n_layer=2)),
    "falcon": lambda: FalconForCausalLM(
        FalconConfig(
            vocab_size=4096,
            hidden_size=64,
            num_attention_heads=HEADS,
            num_hidden_layers=2,
            alibi=True,
            new_decoder_architecture=False,
            multi_query=False,
            parallel_attn=False,
            bias=True,
        )
    ),
    "mpt": lambda: MptForCausalLM(
        MptConfig(
            vocab_size=4096, d_model=64, n_heads=HEADS, n_layers=2, max_seq_len=4096, attn_config={"alibi_bias_max": 12}
        )
    ),
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, cache_dir):
    tokenizer = load_tokenizer("builtin", cache_dir)
    root = tmp_path_factory.mktemp("published")
    for name, build in ARCHITECTURES.items():
        torch.manual_seed(0)
        build().save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def transformers_slopes(name: str) -> torch.Tensor:
    """The slopes the transformers code itself uses, as effective bias per token of distance."""
    if name == "bloom":
        return bloom_alibi(torch.ones(1, 2), HEADS, torch.float32)[:, 0, 1]
    if name == "falcon":
        return falcon_alibi(torch.ones(1, 2), HEADS, torch.float32)[:, 0, 1] / math.sqrt(HEAD_DIM)
    return -build_mpt_alibi_tensor(HEADS, 2)[:, 0, 0]  # MptModel calls it without the config's alibi_bias_max


def bias_only(model):
    """Zero the query/key projections of every layer: the logits are then the position bias alone."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "query_key_value" in name or "Wqkv" in name:
                parameter.zero_()
    return model


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_score_path_slopes_equal_the_transformers_code(name, model_dirs):
    model, _ = load_published(str(model_dirs / name))
    path = score_path(model)
    torch.testing.assert_close(path.slopes.float(), transformers_slopes(name), rtol=1e-6, atol=0)
    if name == "mpt":
        assert "ignores attn_config.alibi_bias_max=12" in path.notes[0]


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_eager_weights_follow_the_predicted_effective_slope(name, model_dirs):
    """ln(w_j / w_(j-1)) of a bias-only head is its effective slope: this checks the whole eager score path."""
    model, _ = load_published(str(model_dirs / name))
    bias_only(model)
    captured = {}
    layer = next(m for m in model.modules() if type(m).__name__.endswith("Attention"))
    layer.register_forward_hook(lambda module, inputs, output: captured.update(weights=output[1]))
    model(torch.randint(0, 4096, (1, 32)), output_attentions=True, use_cache=False)
    last_row = captured["weights"][0, :, -1].double()
    measured = last_row[:, -1].log() - last_row[:, -2].log()
    torch.testing.assert_close(measured, score_path(model).slopes, rtol=1e-2, atol=1e-5)


def test_eager_falcon_computes_what_its_default_attention_computes(model_dirs):
    """The probe reads the weights from eager attention: they must be those of Falcon's default, SDPA (that ALiBi is
    added once, at the predicted slope, test_eager_weights_follow_the_predicted_effective_slope checks)."""
    tokens = torch.randint(0, 4096, (1, 256))
    sdpa = FalconForCausalLM.from_pretrained(model_dirs / "falcon", attn_implementation="sdpa").eval()
    model, _ = load_published(str(model_dirs / "falcon"))
    assert model.config._attn_implementation == "eager"
    torch.testing.assert_close(model(tokens).logits, sdpa(tokens).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_measured_zero_shares_match_the_prediction_for_a_bias_dominated_model(name, model_dirs):
    model, _ = load_published(str(model_dirs / name))
    bias_only(model)
    length = 2048
    (first, _) = measure(model, torch.randint(0, 4096, (1, length)))
    slopes = score_path(model).slopes
    # the weight at distance d is exp(-m d - ln Z): zero once m d > tau - ln Z (this CPU keeps subnormals)
    log_z = torch.logsumexp(-slopes[:, None] * torch.arange(length, dtype=torch.float64), dim=-1)
    predicted = torch.ceil((measure_tau("float32") - log_z) / slopes)
    blind = predicted < length
    assert blind.any()
    measured = first.blind_distance
    assert torch.equal(measured.isinf(), ~blind)
    # Falcon builds ALiBi in bfloat16 (8 significant bits): its bias, so the distance, is off by up to D * 2^-8
    tolerance = 1 + (predicted[blind] * 2**-8 if name == "falcon" else 0)
    assert ((measured[blind] - predicted[blind]).abs() <= tolerance).all(), (measured, predicted)
    expected_share = (length - predicted[blind]) * (length - predicted[blind] + 1) / (length * (length + 1))
    torch.testing.assert_close(first.zero_share[blind], expected_share, rtol=0.02, atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_probe_command_end_to_end(name, model_dirs, tmp_path):
    summary = probe(
        ["--model", str(model_dirs / name), "--lengths", "256", "600", "--out", str(tmp_path), "--retrieval"]
    )
    written = json.loads((tmp_path / "probe.json").read_text())
    assert written["architecture"].startswith(name) and len(written["lengths"]) == 2
    assert len(written["lengths"][1]["zero_share"]) == 2 and len(written["lengths"][1]["zero_share"][0]) == HEADS
    assert set(written["predicted_blind_distance"]) == {"normal", "subnormal"}
    assert {"passkey", "needle"} <= set(summary["retrieval"])
    for image in ("measured_vs_predicted.png", "zero_share_heatmap.png"):
        assert (tmp_path / image).stat().st_size > 10_000
    rows = (tmp_path / "probe.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 * HEADS


def test_a_missing_model_without_the_hub_fails_clearly(monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import, not per call
    with pytest.raises(ValueError, match="cannot load model 'no-such-org/no-such-model'"):
        load_published("no-such-org/no-such-model")


def test_probe_json_has_no_nan():
    from blindheads.probes.outputs import json_safe

    safe = json_safe({"acc": [float("nan"), 0.5], "d": {"x": float("inf")}, "n": 3, "s": "a"})
    assert safe == {"acc": [None, 0.5], "d": {"x": None}, "n": 3, "s": "a"}
    json.dumps(safe, allow_nan=False)


@pytest.mark.slow
def test_a_blindheads_export_is_probed_without_a_prompt_and_a_made_up_name_fails_fast(cache_dir, tmp_path):
    import json

    from support.runs import run_cli

    from blindheads.export.directory import export
    from blindheads.modules import SIZES, DecoderConfig
    from blindheads.modules.lm import DecoderLM

    torch.manual_seed(0)
    config = DecoderConfig(**{**SIZES["tiny"].__dict__, "position": "alibi(blind_distances=[20, 40, 60, 80])",
                              "dtype": "float32", "vocab_size": 4096})  # fmt: skip
    model = DecoderLM(config)
    torch.save({"hyper_parameters": dict(model.hparams), "state_dict": model.state_dict(),
                "datamodule_hyper_parameters": {"tokenizer": "builtin", "cache_dir": str(cache_dir)}},
               tmp_path / "m.ckpt")  # fmt: skip
    export(tmp_path / "m.ckpt", tmp_path / "hf")
    result = run_cli(["probe", "--model", str(tmp_path / "hf"), "--lengths", "128", "--out", str(tmp_path / "p")])
    assert result.returncode == 0 and "[y/N]" not in result.stdout + result.stderr, result.stderr[-2000:]
    probe = json.loads((tmp_path / "p/probe.json").read_text())
    assert probe["architecture"] == "blindheads"
    made_up = run_cli(["probe", "--model", "made-up/no-such-model"], env={"HF_HUB_OFFLINE": "0"}, timeout=60)
    lines = made_up.stderr.strip().splitlines()
    assert made_up.returncode != 0 and lines[-1].startswith("blindheads probe: error: "), made_up.stderr
    assert "Traceback" not in made_up.stderr and len(lines) <= 3, made_up.stderr


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"num_heads": 8, "num_kv_heads": 4},
         "its decoder config does not match its weights: position.components.0.fixed_slopes is (4,), the config "
         "makes (8,)"),
        ({"bogus": 1}, "config.json: its decoder_fields has unknown keys bogus; valid: vocab_size, "),
    ],
    ids=["8 heads for 4-head weights", "an unknown key"],
)  # fmt: skip
def test_an_export_whose_config_does_not_fit_its_weights_is_one_line(trained_run, tmp_path, fields, problem):
    from support.runs import refusal

    from blindheads.export.directory import export

    export(trained_run / "checkpoints/last.ckpt", tmp_path / "hf")
    config = json.loads((tmp_path / "hf/config.json").read_text())
    config["decoder_fields"].update(fields)  # edited by hand
    (tmp_path / "hf/config.json").write_text(json.dumps(config))
    message = refusal(["probe", "--model", str(tmp_path / "hf"), "--lengths", "64", "--out", str(tmp_path / "p")])
    assert message.startswith(f"blindheads probe: error: {tmp_path / 'hf'}") and problem in message, message
    assert "\n" not in message and not (tmp_path / "p").exists()


def test_a_model_folder_without_tokenizer_files_is_one_line(model_dirs, tmp_path):
    for file in ("config.json", "model.safetensors"):
        (tmp_path / file).write_bytes((model_dirs / "bloom" / file).read_bytes())
    with pytest.raises(
        ValueError, match=r"^model folder .* has no tokenizer files \(tokenizer\.json, .*save_pretrained"
    ):
        load_published(str(tmp_path))


def test_the_head_table_names_the_threshold_the_measurement_matches(model_dirs):
    """A bias-dominated BLOOM on this CPU (eager float32 softmax keeps subnormals): each head's measured blind
    distance beside both predictions, and the subnormal one named; the control swaps the two predictions."""
    from blindheads.probes.outputs import head_table
    from blindheads.probes.published import LayerStatistics, predicted_blind_distances

    model, _ = load_published(str(model_dirs / "bloom"))
    bias_only(model)
    length = 2048
    longest = LayerStatistics(length, measure(model, torch.randint(0, 4096, (1, length))))
    predicted = predicted_blind_distances(score_path(model), "float32")
    lines = head_table(longest, predicted)
    assert lines[1].split() == ["head", "measured", "predicted", "normal", "predicted", "subnormal"]
    assert len(lines) == 2 + HEADS + 1
    measured = torch.stack([s.blind_distance for s in longest.layers]).min(0).values
    blind = measured < length
    assert blind.any()
    for head in torch.nonzero(blind).flatten().tolist():
        assert lines[2 + head].split()[:2] == [str(head), f"{measured[head]:.0f}"]
    assert "matches the subnormal threshold" in lines[-1] and "kept subnormals" in lines[-1], lines
    swapped = {"normal": predicted["subnormal"], "subnormal": predicted["normal"]}
    assert "matches the normal threshold" in head_table(longest, swapped)[-1]


def test_the_probe_figure_names_its_prediction_lines():
    from blindheads.evaluation.figures import zero_share_by_distance
    from blindheads.evaluation.underflow import ZeroStatistics

    zeros = torch.zeros(2, 64, dtype=torch.float64)
    zeros[0, 40:] = 1
    layer = ZeroStatistics(zeros, torch.ones(64, dtype=torch.float64), torch.tensor([39, 63]), zeros)
    figure = zero_share_by_distance([layer], torch.tensor([35.0, math.inf]), torch.tensor([41.0, math.inf]))
    labels = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert labels == [
        "head 0",
        "head 1",
        "predicted, normal threshold (subnormals flushed)",
        "predicted, subnormal threshold (subnormals kept)",
    ]
