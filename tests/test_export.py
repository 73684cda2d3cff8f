"""Hugging Face export and the lm-evaluation-harness adapter."""

from __future__ import annotations

import ast
import json
import os
import pkgutil
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lm_eval import simple_evaluate
from lm_eval.api.instance import Instance
from lm_eval.tasks import TaskManager
from support.backends import BACKEND_SPECS
from support.runs import REPO, copy_run, in_process, refusal, run_cli, tiny_run_args
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.dynamic_module_utils import get_class_from_dynamic_module

import blindheads.modules.position
from blindheads.callbacks.lm_eval import LMEvalHarness
from blindheads.datamodules.tokenizer import builtin_tokenizer_dir, load_tokenizer
from blindheads.evaluation.lm_eval_adapter import BlindheadsLM
from blindheads.export.directory import AUTO_MAP, export
from blindheads.export.remote import relative_imports, remote_code
from blindheads.export.tokenizer import plain_tokenizer
from blindheads.modules import DecoderConfig
from blindheads.modules.config import SIZES
from blindheads.modules.lm import DecoderLM
from blindheads.modules.position import COMPONENTS, PositionComponent
from blindheads.modules.position.registry import builtin_names


def checkpoint_of(model: DecoderLM, path: Path) -> Path:
    """The parts of a Lightning checkpoint that export reads."""
    torch.save({"hyper_parameters": dict(model.hparams), "state_dict": model.state_dict()}, path)
    return path


def tiny_model(spec: str, **fields) -> DecoderLM:
    torch.manual_seed(0)
    config = DecoderConfig(**{**SIZES["tiny"].__dict__, "position": spec, "attention": "sdpa", **fields})
    return DecoderLM(config).eval()


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


def absolute_imports(source: str) -> set[str]:
    """The top-level names of the packages ``source`` imports, relative imports left out."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_remote_code_is_closed_holds_every_position_module_and_imports_only_torch_and_transformers():
    files = remote_code()
    position = blindheads.modules.position
    modules = [f"{position.__name__}.{m.name}" for m in pkgutil.iter_modules(position.__path__)]
    missing = [m for m in modules if f"{m.replace('.', '_')}.py" not in files]
    assert not missing, f"not imported by {position.__name__}'s __init__, so neither registered nor shipped"
    for name, text in files.items():
        relative = {n.module for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom) and n.level}
        assert {f"{module}.py" for module in relative} <= set(files), name
    outside = set().union(*map(absolute_imports, files.values())) - set(sys.stdlib_module_names)
    assert outside == {"torch", "transformers", "yaml"}  # yaml: pyyaml, which transformers requires


def test_relative_imports_rewrite_the_package_imports_and_refuse_what_they_cannot():
    source = (
        "import math\nfrom blindheads.numerics import tau, resolve_dtype  # both\n\n\ndef f():\n"
        "    from blindheads.modules.config import (\n        DecoderConfig,\n    )\n"
    )
    text, imported = relative_imports(source, "example")
    assert text == source.replace("from blindheads.numerics", "from .blindheads_numerics").replace(
        "from blindheads.modules.config", "from .blindheads_modules_config"
    )
    assert imported == ["blindheads.modules.config", "blindheads.numerics"]
    for bad, message in [
        ("x = 1\nimport blindheads.numerics\n", "example, line 2: 'import blindheads...' cannot be shipped"),
        ("from blindheads.modules import backends\n", "example, line 1: imports module backends as a name"),
        ("from .numerics import tau\n", "a relative import cannot be shipped"),
        ("from \\\n    blindheads.numerics import tau\n", "'from blindheads.numerics' is split over lines"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            relative_imports(bad, "example")


def test_a_class_path_stack_is_exported_by_name_and_a_foreign_component_refused(tmp_path, monkeypatch):
    spec = [
        {"class_path": "blindheads.modules.position.ALiBi", "init_args": {"slopes": "wide"}},
        {"class_path": "blindheads.modules.position.Clamp"},
        "log_distance",
    ]
    model = tiny_model(spec)
    out = export(checkpoint_of(model, tmp_path / "model.ckpt"), tmp_path / "hf")
    written = json.loads((out / "config.json").read_text())["decoder_fields"]["position"]
    assert written == [{"alibi": {"slopes": "wide"}}, {"clamp": {}}, "log_distance"]
    loaded = get_class_from_dynamic_module("modeling_blindheads.BlindheadsForCausalLM", out).from_pretrained(out)
    tokens = torch.randint(0, 512, (1, 32))
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(tokens).logits, model(tokens), rtol=0, atol=0)

    class Foreign(PositionComponent):
        name = "zz_foreign"

    try:
        monkeypatch.setattr(sys.modules[__name__], "Foreign", Foreign, raising=False)
        with pytest.raises(ValueError, match=rf"component '{__name__}.Foreign' is not a builtin \(alibi, "):
            builtin_names([{"class_path": f"{__name__}.Foreign"}])
    finally:
        COMPONENTS.pop(Foreign.name)


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


REMOTE_SCRIPT = """import json, os, sys, time
sys.modules["blindheads"] = None  # unimportable, even where it is installed
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tokens = torch.load(sys.argv[1])
for folder in sys.argv[2:]:
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    print(type(model).__module__, type(model).__name__, round(time.perf_counter() - start, 2))
    with torch.no_grad():
        torch.save((model(tokens).logits, model.generate(tokens, max_new_tokens=4, do_sample=False)), folder + ".pt")
    if os.path.exists(os.path.join(folder, "tokenizer_config.json")):  # its class, and its ids of a sentence
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        ids = tokenizer("The grass is green. The sky is blue.").input_ids
        with open(folder + ".tokenizer.json", "w") as file:
            json.dump([type(tokenizer).__module__, type(tokenizer).__name__, ids], file)
"""
REMOTE_TOLERANCE = 1e-5  # measured: 0 (the same code in another interpreter), logits up to 4.5


def load_alone(tokens: torch.Tensor, folders: list[Path], where: Path) -> subprocess.CompletedProcess:
    """``REMOTE_SCRIPT`` on ``folders`` in a fresh interpreter (``-I``: no PYTHONPATH, no working directory, run in
    ``where``) where blindheads cannot be imported; its outputs are beside each folder. Fails unless it succeeds."""
    torch.save(tokens, where / "tokens.pt")
    environment = {**os.environ, "HF_MODULES_CACHE": str(where / "modules")}
    command = [sys.executable, "-I", "-c", REMOTE_SCRIPT, str(where / "tokens.pt"), *map(str, folders)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=where, env=environment)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


@pytest.mark.slow
def test_exports_load_with_transformers_alone(tmp_path):
    """A fresh interpreter (``-I``: no PYTHONPATH, no working directory) where blindheads cannot be imported loads a
    Llama export and two with remote code (``trust_remote_code=True``), each giving the checkpoint's logits; the
    remote-code ones generate its greedy tokens."""
    specs = ["rope", "alibi", "kerple_log+clamp(-10)+log_distance"]
    torch.manual_seed(1)
    tokens = torch.randint(0, 512, (2, 24))
    folders = [export(checkpoint_of(tiny_model(spec), tmp_path / f"{i}.ckpt"), tmp_path / f"m{i}") for i, spec in
               enumerate(specs)]  # fmt: skip
    result = load_alone(tokens, folders, tmp_path)
    loaded = [line.split()[:2] for line in result.stdout.splitlines()]
    assert loaded[0] == ["transformers.models.llama.modeling_llama", "LlamaForCausalLM"], loaded
    assert all(module.startswith("transformers_modules.") for module, _ in loaded[1:]), loaded
    for spec, folder in zip(specs, folders):
        model = tiny_model(spec)
        logits, generated = torch.load(f"{folder}.pt")
        with torch.no_grad():
            expected = model(tokens)
            greedy = tokens
            for _ in range(4):
                greedy = torch.cat([greedy, model(greedy)[:, -1:].argmax(-1)], dim=1)
        tolerance = LLAMA_TOLERANCE if spec == "rope" else REMOTE_TOLERANCE
        assert (logits - expected).abs().max().item() < tolerance, spec
        assert spec == "rope" or torch.equal(generated, greedy), spec


@pytest.mark.slow
def test_export_of_a_trained_run_includes_its_tokenizer(trained_run, tmp_path):
    ckpt = trained_run / "checkpoints/last.ckpt"
    result = run_cli(["export", "--ckpt_path", str(ckpt), "--out", str(tmp_path / "hf")])
    assert result.returncode == 0, result.stderr[-2000:]
    config = json.loads((tmp_path / "hf/config.json").read_text())
    assert config["model_type"] == "blindheads" and config["auto_map"]["AutoModelForCausalLM"]
    assert "load it with: transformers alone" in result.stdout
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
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    assert tokenizer.eos_token == "<|endoftext|>" and len(tokenizer) == 4096
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    original = DecoderLM.load_from_checkpoint(ckpt).eval()
    tokens = tokenizer("The grass is green. The sky is blue.", return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens).logits, original(tokens), rtol=0, atol=0)
        generated = loaded.generate(tokens, max_new_tokens=5, do_sample=False)
    assert generated.shape == (1, tokens.shape[1] + 5)


FOREIGN_MODULE = "foreign_tokenization"  # the code a tokenizer folder's auto_map names: it must never run
FOREIGN_TEMPLATE = "{{ 'FOREIGN TEMPLATE' }}"


def foreign_tokenizer(folder: Path, cache_dir: Path, marker: Path) -> Path:
    """The builtin tokenizer in ``folder`` with what another's tokenizer folder may hold: an ``auto_map`` naming its
    module (which writes ``marker`` when imported) and a chat template, in tokenizer_config.json and as a file."""
    shutil.copytree(builtin_tokenizer_dir(cache_dir, 4096), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [None, f"{FOREIGN_MODULE}.ForeignTokenizer"]}
    config["chat_template"] = FOREIGN_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text(FOREIGN_TEMPLATE)
    (folder / f"{FOREIGN_MODULE}.py").write_text(
        f"from pathlib import Path\nfrom transformers import PreTrainedTokenizerFast\n\nPath({str(marker)!r}).touch()"
        "\n\n\nclass ForeignTokenizer(PreTrainedTokenizerFast):\n    pass\n"
    )
    return folder


def foreign_exports(cache_dir: Path, tmp_path: Path) -> tuple[Path, DecoderLM, list[Path]]:
    """A foreign tokenizer folder, a 4096-token ALiBi model, and its two exports with that tokenizer: one by
    ``blindheads export --tokenizer PATH``, one from a checkpoint whose ``data.tokenizer`` names the folder."""
    tokenizer = foreign_tokenizer(tmp_path / "foreign", cache_dir, tmp_path / "foreign-code-ran")
    model = tiny_model("alibi", vocab_size=4096)
    ckpt = checkpoint_of(model, tmp_path / "model.ckpt")
    code, _, stderr = in_process(["export", "--ckpt_path", str(ckpt), "--out", str(tmp_path / "by-flag"),
                                  "--tokenizer", str(tokenizer)])  # fmt: skip
    assert code == 0, stderr
    named = torch.load(ckpt, weights_only=False)
    named["datamodule_hyper_parameters"] = {"tokenizer": str(tokenizer)}
    torch.save(named, tmp_path / "named.ckpt")
    return tokenizer, model, [tmp_path / "by-flag", export(tmp_path / "named.ckpt", tmp_path / "by-checkpoint")]


def test_an_export_holds_no_foreign_tokenizer_code_or_template_and_encodes_as_the_tokenizer(cache_dir, tmp_path):
    """An export with a tokenizer whose folder names code of its own (``auto_map``) and a chat template: no file of
    the export names the foreign module or holds the template, the only ``auto_map`` is config.json's (the
    package's two stubs), and the exported tokenizer, a transformers class, encodes as the original one does."""
    tokenizer, _, folders = foreign_exports(cache_dir, tmp_path)
    original = load_tokenizer(str(tokenizer), cache_dir)
    text = f"The pass key is 4. Remember it.{original.eos_token}Here we go."
    for out in folders:
        for file in out.iterdir():
            content = file.read_bytes()
            assert FOREIGN_MODULE.encode() not in content and b"FOREIGN TEMPLATE" not in content, file
            assert b"chat_template" not in content and file.suffix != ".jinja", file
            if file.suffix == ".json" and file.name != "config.json":
                assert b"auto_map" not in content, file
        assert json.loads((out / "config.json").read_text())["auto_map"] == AUTO_MAP
        exported = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
        assert type(exported).__module__.startswith("transformers."), type(exported)
        assert exported(text).input_ids == original(text).input_ids and len(exported) == len(original)
        assert exported.eos_token == original.eos_token and exported.chat_template is None
    assert not (tmp_path / "foreign-code-ran").exists()


@pytest.mark.slow
def test_an_export_with_a_foreign_tokenizer_loads_with_transformers_alone_and_runs_none_of_its_code(
    cache_dir, tmp_path
):
    """Both exports of ``foreign_exports`` loaded with ``trust_remote_code=True`` where blindheads cannot be
    imported: the model gives the checkpoint's logits, the tokenizer is transformers' own class with the original's
    ids, and the foreign module never ran (its marker file is never written)."""
    tokenizer, model, folders = foreign_exports(cache_dir, tmp_path)
    tokens = torch.randint(0, 4096, (2, 24))
    load_alone(tokens, folders, tmp_path)
    expected_ids = load_tokenizer(str(tokenizer), cache_dir)("The grass is green. The sky is blue.").input_ids
    for out in folders:
        logits, _ = torch.load(f"{out}.pt")
        with torch.no_grad():
            torch.testing.assert_close(logits, model(tokens), rtol=0, atol=REMOTE_TOLERANCE)
        module, _, ids = json.loads(Path(f"{out}.tokenizer.json").read_text())
        assert module.startswith("transformers.") and ids == expected_ids, module
    assert not (tmp_path / "foreign-code-ran").exists()


def test_a_tokenizer_that_is_not_plain_data_is_refused_in_one_line(cache_dir, tmp_path):
    """A Python tokenizer with no tokenizer.json (ByT5's) cannot be written as plain data: ``export`` refuses it,
    naming it, and leaves no folder; and a tokenizer whose class changes how it encodes is refused, not flattened."""
    byt5 = tmp_path / "byt5"
    byt5.mkdir()
    (byt5 / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "ByT5Tokenizer", "eos_token": "</s>"}))
    ckpt = checkpoint_of(tiny_model("alibi"), tmp_path / "model.ckpt")
    message = refusal(["export", "--ckpt_path", str(ckpt), "--out", str(tmp_path / "hf"), "--tokenizer", str(byt5)])
    assert message == (
        f"blindheads export: error: tokenizer {byt5} (ByT5Tokenizer) is a Python tokenizer with no tokenizer.json: "
        "an export holds its tokenizer as plain data only (tokenizer.json); give a fast tokenizer's folder"
    )
    assert not (tmp_path / "hf").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]

    class Shouting(PreTrainedTokenizerFast):  # behaviour in Python that tokenizer.json cannot hold
        def __call__(self, text, **kwargs):
            return super().__call__(text.upper(), **kwargs)

    builtin = load_tokenizer("builtin", cache_dir)
    with pytest.raises(ValueError, match=r"^tokenizer shouting \(Shouting\) encodes differently once reduced"):
        plain_tokenizer(Shouting(tokenizer_object=builtin.backend_tokenizer, eos_token="<|endoftext|>"), "shouting")
    assert plain_tokenizer(builtin, "builtin")("Here we go.").input_ids == builtin("Here we go.").input_ids

    class Whole:  # a pre-tokenizer in Python: tokenizer.json cannot hold it
        def pre_tokenize(self, pretokenized):
            pretokenized.split(lambda _, piece: [piece])

    custom = load_tokenizer("builtin", cache_dir)
    custom.backend_tokenizer.pre_tokenizer = pre_tokenizers.PreTokenizer.custom(Whole())
    with pytest.raises(ValueError, match=r"^tokenizer custom \(TokenizersBackend\): its backend cannot be written as "
                       r"tokenizer\.json \(Custom PreTokenizer cannot be serialized\); an export holds"):  # fmt: skip
        plain_tokenizer(custom, "custom")


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


def test_the_shipped_local_task_gives_any_scorer_that_ignores_the_question_exactly_chance():
    """``tiny_choice.jsonl`` asks each choice list twice, once with each choice right: each position is the answer
    equally often, and a rule that picks from the choices alone (a position, the shortest, the first in order) gets
    exactly half the items, the chance its YAML comment and docs/export.md state."""
    rows = [json.loads(line) for line in (REPO / "configs/lm_eval/tiny_choice.jsonl").read_text().splitlines()]
    assert "chance is 0.5" in (REPO / "configs/lm_eval/tiny_choice.yaml").read_text()
    assert {len(row["choices"]) for row in rows} == {2}
    assert Counter(row["label"] for row in rows) == {0: len(rows) // 2, 1: len(rows) // 2}
    blind_rules = [lambda c: 0, lambda c: 1, lambda c: c.index(min(c, key=len)), lambda c: c.index(max(c, key=len)),
                   lambda c: c.index(min(c)), lambda c: c.index(max(c))]  # fmt: skip
    for rule in blind_rules:
        assert sum(rule(row["choices"]) == row["label"] for row in rows) / len(rows) == 0.5


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
