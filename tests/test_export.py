"""Hugging Face export and the lm-evaluation-harness adapter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lm_eval import simple_evaluate
from lm_eval.api.instance import Instance
from lm_eval.tasks import TaskManager
from support.backends import BACKEND_SPECS
from support.runs import REPO, copy_run, run_cli, tiny_run_args
from transformers import AutoModelForCausalLM, LlamaForCausalLM
from transformers.dynamic_module_utils import get_class_from_dynamic_module

from blindheads.callbacks.lm_eval import LMEvalHarness
from blindheads.datamodules.tokenizer import load_tokenizer
from blindheads.evaluation.lm_eval_adapter import BlindheadsLM
from blindheads.export.directory import export
from blindheads.modules import DecoderConfig
from blindheads.modules.config import SIZES
from blindheads.modules.lm import DecoderLM


def checkpoint_of(model: DecoderLM, path: Path) -> Path:
    """The parts of a Lightning checkpoint that export reads."""
    torch.save({"hyper_parameters": dict(model.hparams), "state_dict": model.state_dict()}, path)
    return path


def tiny_model(spec: str) -> DecoderLM:
    torch.manual_seed(0)
    return DecoderLM(DecoderConfig(**{**SIZES["tiny"].__dict__, "position": spec, "attention": "sdpa"})).eval()


OTHER_FAMILIES = ["kerple_log+clamp", "kerple_power", "fire", "t5_buckets"]  # beside ALiBi


@pytest.mark.parametrize(  # RoPE: a Llama, below
    "spec", [spec for spec in BACKEND_SPECS if not spec.startswith("rope")] + OTHER_FAMILIES
)
def test_export_round_trip_reproduces_the_logits(spec, tmp_path):
    """The folder's own code (transformers' copy of it, not this package's classes, which ``AutoModelForCausalLM``
    prefers in a process that registered them) computes the checkpoint's logits exactly."""
    model = tiny_model(spec)
    with torch.no_grad():  # make learned position parameters differ from their initial values
        for parameter in model.decoder.position.parameters():
            parameter.add_(0.1)
    out = export(checkpoint_of(model, tmp_path / "model.ckpt"), tmp_path / "hf")
    shipped = get_class_from_dynamic_module("modeling_blindheads.BlindheadsForCausalLM", out)
    assert shipped.__module__.startswith("transformers_modules."), shipped.__module__
    loaded = shipped.from_pretrained(out).eval()
    tokens = torch.randint(0, 512, (2, 48))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens).logits, model(tokens), rtol=0, atol=0)


LLAMA_TOLERANCE = 1e-4  # measured: max |logit diff| 3.5e-6 (rope) and 4.5e-6 (rope(500.0)), logits up to 4.5


@pytest.mark.parametrize("spec", ["rope", "rope(500.0)"])
def test_a_rope_decoder_exports_as_a_plain_llama(spec, tmp_path):
    """No remote code: config.json says llama, the weights are Llama's names, transformers alone builds a
    ``LlamaForCausalLM`` whose logits equal the decoder's within float rounding (attention kernels differ). The
    control: the same folder loaded with a wrong RMSNorm epsilon is far outside the tolerance."""
    model = tiny_model(spec)
    out = export(checkpoint_of(model, tmp_path / "model.ckpt"), tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert "auto_map" not in config and not list(out.glob("*.py"))
    assert config["rope_parameters"]["rope_theta"] == (500.0 if "500" in spec else 10000.0)
    tokens = torch.randint(0, 512, (2, 48))
    with torch.no_grad():
        expected = model(tokens)
        loaded = AutoModelForCausalLM.from_pretrained(out).eval()
        assert type(loaded) is LlamaForCausalLM
        difference = (loaded(tokens).logits - expected).abs().max().item()
        wrong_eps = AutoModelForCausalLM.from_pretrained(out, rms_norm_eps=0.5).eval()
        control = (wrong_eps(tokens).logits - expected).abs().max().item()
    assert difference < LLAMA_TOLERANCE < control, (difference, control)


@pytest.mark.slow
def test_an_exported_llama_loads_where_blindheads_cannot_be_imported(tmp_path):
    out = export(checkpoint_of(tiny_model("rope"), tmp_path / "model.ckpt"), tmp_path / "hf")
    tokens = torch.randint(0, 512, (1, 32))
    torch.save(tokens, tmp_path / "tokens.pt")
    script = (  # -I: no PYTHONPATH, no working directory; blindheads made unimportable even if installed
        "import sys; sys.modules['blindheads'] = None\n"
        "import torch\nfrom transformers import AutoModelForCausalLM\n"
        f"model = AutoModelForCausalLM.from_pretrained({str(out)!r}).eval()\n"
        f"with torch.no_grad(): torch.save(model(torch.load({str(tmp_path / 'tokens.pt')!r})).logits, "
        f"{str(tmp_path / 'logits.pt')!r})\n"
        "print(type(model).__name__)"
    )
    result = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "LlamaForCausalLM"
    with torch.no_grad():
        expected = tiny_model("rope")(tokens)
    assert (torch.load(tmp_path / "logits.pt") - expected).abs().max().item() < LLAMA_TOLERANCE


@pytest.mark.slow
def test_export_of_a_trained_run_includes_its_tokenizer(trained_run, tmp_path):
    ckpt = trained_run / "checkpoints/last.ckpt"
    result = run_cli(["export", "--ckpt_path", str(ckpt), "--out", str(tmp_path / "hf")])
    assert result.returncode == 0, result.stderr[-2000:]
    config = json.loads((tmp_path / "hf/config.json").read_text())
    assert config["model_type"] == "blindheads" and config["auto_map"]["AutoModelForCausalLM"]
    assert "load it with: import blindheads.export.hf" in result.stdout
    prompted = subprocess.run(  # stdin closed: a [y/N] prompt would fail the load
        [
            sys.executable,
            "-c",
            "import blindheads.export.hf\nfrom transformers import AutoTokenizer\n"
            f"AutoTokenizer.from_pretrained({str(tmp_path / 'hf')!r})",
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    assert prompted.returncode == 0 and "[y/N]" not in prompted.stdout + prompted.stderr, prompted.stderr[-2000:]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    assert tokenizer.eos_token == "<|endoftext|>" and len(tokenizer) == 4096
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    original = DecoderLM.load_from_checkpoint(ckpt).eval()
    tokens = tokenizer("The grass is green. The sky is blue.", return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens).logits, original(tokens), rtol=0, atol=0)
        generated = loaded.generate(tokens, max_new_tokens=5, do_sample=False)
    assert generated.shape == (1, tokens.shape[1] + 5)


def test_export_of_a_missing_checkpoint_fails_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint .*missing.ckpt does not exist"):
        export(tmp_path / "missing.ckpt", tmp_path / "out")


@pytest.fixture(scope="module")
def adapter(cache_dir):
    torch.manual_seed(0)
    tokenizer = load_tokenizer("builtin", cache_dir)
    decoder = DecoderLM(DecoderConfig(**{**SIZES["tiny"].__dict__, "vocab_size": 4096})).decoder.eval()
    return BlindheadsLM(decoder=decoder, tokenizer=tokenizer, batch_size=3, max_length=128)


def direct_logprob(adapter, context: str, continuation: str) -> float:
    ctx, cont = adapter.tok_encode(context), adapter.tok_encode(continuation)
    tokens = torch.tensor([ctx + cont])
    with torch.no_grad():
        log_probs = F.log_softmax(adapter.decoder(tokens[:, :-1]).float(), dim=-1)[0]
    return float(log_probs[len(ctx) - 1 :].gather(1, torch.tensor(cont)[:, None]).sum())


def test_adapter_loglikelihoods_equal_a_direct_forward_pass(adapter):
    pairs = [("The sky is", " blue."), ("Here we go.", " There and back again."), ("A", " b c d e f")]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    results = adapter.loglikelihood(requests)
    for (context, continuation), (logprob, _) in zip(pairs, results):
        assert logprob == pytest.approx(direct_logprob(adapter, context, continuation), abs=1e-4)


def test_adapter_rolling_loglikelihood_sums_every_token(adapter):
    text = " ".join(["The river flows past the old mill."] * 40)  # longer than max_length: several windows
    (total,) = adapter.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    tokens = [adapter.eot_token_id, *adapter.tok_encode(text)]
    length = adapter.max_length
    assert len(tokens) > 2 * length
    expected = 0.0
    for position in range(1, len(tokens)):  # disjoint windows of max_length predictions, each with its own context
        start = (position - 1) // length * length
        with torch.no_grad():
            logits = adapter.decoder(torch.tensor([tokens[start:position]]))[0, -1].float()
        expected += float(F.log_softmax(logits, dim=-1)[tokens[position]])
    assert total == pytest.approx(expected, rel=1e-3)


def test_adapter_greedy_generation_stops_at_until(adapter):
    (text,) = adapter.generate_until(
        [Instance("generate_until", {}, ("The sky", {"until": ["\n"], "max_gen_toks": 6}), 0)]
    )
    tokens = adapter.tok_encode("The sky")
    expected = ""
    for _ in range(6):
        following = int(adapter.decoder(torch.tensor([tokens]))[0, -1].argmax())
        tokens.append(following)
        expected += adapter.tok_decode([following])
    assert text == expected.split("\n")[0]


def write_local_task(directory: Path) -> Path:
    """The shipped task with its data file's path made absolute, for a command run from another folder."""
    task = (REPO / "configs/lm_eval/tiny_choice.yaml").read_text()
    relative = "configs/lm_eval/tiny_choice.jsonl"
    assert relative in task
    (directory / "tiny_choice.yaml").write_text(task.replace(relative, str(REPO / relative)))
    return directory


@pytest.mark.slow
def test_the_shipped_local_task_runs_and_scores_as_its_loglikelihoods_say(adapter, monkeypatch):
    """``configs/lm_eval/tiny_choice.yaml``, the offline task docs/export.md runs, from the repository's root."""
    monkeypatch.chdir(REPO)
    manager = TaskManager(include_path="configs/lm_eval")
    results = simple_evaluate(model=adapter, tasks=["tiny_choice"], task_manager=manager, bootstrap_iters=0)
    accuracy = results["results"]["tiny_choice"]["acc,none"]
    rows = [json.loads(line) for line in (REPO / "configs/lm_eval/tiny_choice.jsonl").read_text().splitlines()]
    assert len(rows) == 8
    correct = [
        max(range(2), key=lambda c: direct_logprob(adapter, r["question"], r["choices"][c])) == r["label"] for r in rows
    ]
    assert accuracy == pytest.approx(sum(correct) / len(rows))


@pytest.mark.slow
def test_test_command_includes_lm_eval_in_the_results(trained_run, cache_dir, tmp_path):
    tasks = write_local_task(tmp_path)
    run = {"--trainer.logger.init_args.version": "run"}
    copy_run(trained_run, tmp_path)
    result = run_cli(
        [
            "test",
            *tiny_run_args(tmp_path, cache_dir, **run),
            "--ckpt_path",
            "last",
            "--trainer.callbacks+=blindheads.callbacks.lm_eval.LMEvalHarness",
            "--trainer.callbacks.tasks=[tiny_choice]",
            f"--trainer.callbacks.include_path={tasks}",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "alibi/run/results.json").read_text())["metrics"]
    assert 0 <= metrics["test/lm_eval/tiny_choice/acc"] <= 1


@pytest.mark.slow
def test_unknown_lm_eval_task_fails_clearly():
    with pytest.raises(ValueError, match=r"unknown lm-evaluation-harness tasks \['no_such_task'\]"):
        LMEvalHarness(tasks=["no_such_task"])


def test_export_refuses_a_used_or_unwritable_target_and_a_truncated_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = DecoderLM(DecoderConfig(**{**SIZES["tiny"].__dict__, "attention": "sdpa"}))
    ckpt = checkpoint_of(model, tmp_path / "model.ckpt")
    used = tmp_path / "used"
    used.mkdir()
    (used / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"--out .*used already holds config.json: export into a new or empty"):
        export(ckpt, used)
    assert (used / "config.json").read_text() == "{}", "nothing overwritten"
    (tmp_path / "a-file").write_text("")  # a target whose parent is a file: unwritable, even for root
    with pytest.raises(ValueError, match=r"--out .*a-file/hf: cannot be written \(Not a directory\)"):
        export(ckpt, tmp_path / "a-file/hf")
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(ckpt.read_bytes()[:1000])
    with pytest.raises(ValueError, match=r"not a blindheads checkpoint: .*truncated.ckpt \("):
        export(truncated, tmp_path / "out")
    result = run_cli(["export", "--ckpt_path", str(truncated), "--out", str(tmp_path / "cli")])
    assert result.returncode != 0 and len(result.stderr.strip().splitlines()) == 1, result.stderr
