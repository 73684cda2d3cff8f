"""RULER's needle tasks (``configs/lm_eval/ruler_niah_*``): built offline at short lengths with an export's tokenizer,
and run end to end by ``blindheads lm_eval`` on an exported tiny checkpoint with no network."""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import sys
from pathlib import Path

import pytest
import torch
import yaml
from support.runs import REPO, in_process

from blindheads.datamodules.tokenizer import builtin_tokenizer_dir
from blindheads.export.directory import export
from blindheads.modules import DecoderConfig
from blindheads.modules.config import SIZES
from blindheads.modules.lm import DecoderLM

TASKS = REPO / "configs/lm_eval"
TASK_FILES = ["ruler_niah_single_1", "ruler_niah_multikey_2", "ruler_niah_multikey_3"]
BINS = ["0-20", "20-40", "40-60", "60-80", "80-100"]


def ruler_utils():
    """``configs/lm_eval/ruler_niah_utils.py`` as the harness loads it: a file beside the task files, no package."""
    spec = importlib.util.spec_from_file_location("ruler_niah_utils_under_test", TASKS / "ruler_niah_utils.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def task_file(name: str) -> dict:
    """A task file with its ``include`` merged in (local keys win, as lm-eval merges them); ``!function`` kept as
    its text."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    config = yaml.load((TASKS / f"{name}.yaml").read_text(), Loader=Loader)  # a SafeLoader
    if "include" in config:
        return {**task_file(Path(config.pop("include")).stem), **config}
    return config


@pytest.fixture(scope="module")
def exported(cache_dir, tmp_path_factory) -> Path:
    """A tiny untrained ALiBi checkpoint with the builtin tokenizer, exported as ``blindheads export`` writes it."""
    torch.manual_seed(0)
    config = DecoderConfig(**{**SIZES["tiny"].__dict__, "vocab_size": 4096, "position": "alibi", "attention": "sdpa"})
    model = DecoderLM(config).eval()
    folder = tmp_path_factory.mktemp("ruler-export")
    torch.save({"hyper_parameters": dict(model.hparams), "state_dict": model.state_dict()}, folder / "tiny.ckpt")
    return export(folder / "tiny.ckpt", folder / "hf", tokenizer=str(builtin_tokenizer_dir(cache_dir, 4096)))


@pytest.fixture
def no_network(monkeypatch) -> list:
    """Every internet connection or name look-up tried, each refused: a test asserts the list stays empty."""
    tried: list = []

    def refuse(what):
        def refused(*args, **kwargs):
            tried.append((what, args[1:2] if what == "connect" else args[:1]))
            raise OSError(f"no network in this test ({what})")

        return refused

    real_connect = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            return refuse("connect")(self, address)
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect)
    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    return tried


def test_samples_fit_their_length_hold_their_needle_and_repeat(exported, no_network):
    """Each task's prompts take its export tokenizer's tokens up to the length, less the room left to generation,
    hold the answer once and ask for its key; lengths interleave (``--limit`` keeps each); one seed, one set."""
    utils = ruler_utils()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(exported)
    for name, lengths, room in [
        ("niah_single_1", [256, 512], 32),
        ("niah_multikey_2", [256, 512], 32),
        ("niah_multikey_3", [512, 1024], 64),
    ]:
        make = getattr(utils, name)
        rows = list(
            make(export_dir=str(exported), max_seq_lengths=lengths, num_samples=6, tokens_to_generate=room)["test"]
        )
        assert [row["max_length"] for row in rows] == lengths * 6, name
        for row in rows:
            used = len(tokenizer(row["input"]).input_ids) + room
            assert used == row["length"] <= row["max_length"], name
            assert used > row["max_length"] * 0.75, (name, used)  # as much haystack as fits
            (answer,) = row["outputs"]
            assert row["input"].count(answer) == 1, name
            key = row["gen_prefix"].removeprefix("The special magic ").split(" for ")[1].split(" mentioned")[0]
            assert row["input"].count(f"for {key} is: ") == 1, name  # no other needle has the asked key
            assert f"for {key} is: {answer}." in row["input"] and row["input"].endswith(
                f"for {key} mentioned in the provided text?"
            )
            assert 0 <= row["depth"] < 1
        again = list(
            make(export_dir=str(exported), max_seq_lengths=lengths, num_samples=6, tokens_to_generate=room)["test"]
        )
        assert again == rows, name
    assert not no_network
    assert "wonderwords" not in sys.modules and "lm_eval.tasks.ruler.prepare_niah" not in sys.modules


def test_task_files_declare_every_length_by_depth_and_leave_generation_its_room(exported):
    utils = ruler_utils()
    for name in TASK_FILES:
        config = task_file(name)
        declared = [entry["metric"] for entry in config["metric_list"]]
        assert declared == [key for n in utils.LENGTHS for key in (str(n), *(f"{n}_depth_{b}" for b in BINS))], name
        assert config["dataset_kwargs"]["tokens_to_generate"] == config["generation_kwargs"]["max_gen_toks"], name
        assert set(config["metadata"]["max_seq_lengths"]) <= set(utils.LENGTHS), name
        assert config["custom_dataset"] == f"ruler_niah_utils.{name.removeprefix('ruler_')}"
    assert task_file("ruler_niah")["task"] == TASK_FILES
    assert [utils.depth_label(d) for d in (0.0, 0.19, 0.2, 0.5, 0.8, 0.99)] == [
        "0-20", "0-20", "20-40", "40-60", "80-100", "80-100",
    ]  # fmt: skip
    doc = {"max_length": 512, "depth": 0.25, "outputs": ["1234567"]}
    assert utils.process_results(doc, [" 1234567. And"]) == {"512": 1.0, "512_depth_20-40": 1.0}
    assert utils.process_results(doc, [" 7654321"]) == {"512": 0.0, "512_depth_20-40": 0.0}
    with pytest.raises(ValueError, match=r"max_seq_lengths \[300\] are not declared metrics; choose from \[256, "):
        utils.niah_single_1(export_dir=str(exported), max_seq_lengths=[256, 300])
    with pytest.raises(ValueError, match=r"ruler_niah_multikey_3: no prompt fits max_seq_length=256 \("):
        utils.niah_multikey_3(export_dir=str(exported), max_seq_lengths=[256], tokens_to_generate=64)


def test_the_adapter_reads_an_export_folder_as_its_checkpoint(exported, no_network):
    """``--model_args export_dir=DIR``: the folder's model (the checkpoint's logits) and tokenizer; a checkpoint as
    well is refused."""
    from blindheads.evaluation.lm_eval_adapter import BlindheadsLM

    adapter = BlindheadsLM(export_dir=str(exported), max_length=512)
    checkpoint = torch.load(exported.parent / "tiny.ckpt", weights_only=True)
    model = DecoderLM(DecoderConfig(**checkpoint["hyper_parameters"]["decoder"].__dict__)).eval()
    model.load_state_dict(checkpoint["state_dict"])
    tokens = torch.tensor([adapter.tok_encode("One of the special magic numbers for calm-river is: 1234567.")])
    with torch.no_grad():
        torch.testing.assert_close(adapter.decoder(tokens), model(tokens), rtol=0, atol=0)
    assert adapter.max_length == 512 and adapter.eot_token_id == adapter.tokenizer.eos_token_id is not None
    with pytest.raises(ValueError, match=r"ckpt_path=PATH \(a checkpoint\) or export_dir=DIR \(an export\), not both"):
        BlindheadsLM(ckpt_path=str(exported.parent / "tiny.ckpt"), export_dir=str(exported))
    assert not no_network


def test_blindheads_lm_eval_runs_ruler_on_an_export_offline(exported, no_network, tmp_path):
    """The command docs/export.md shows, at one tiny length: a recall in [0, 1] for the length and for each depth
    fifth its needles fell in, each the share of generations holding the answer; no connection tried."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is the fastest on a shared machine
    try:
        code, out, err = in_process(
            ["lm_eval", "--model", "blindheads", "--model_args", f"export_dir={exported},max_length=512",
             "--tasks", "ruler_niah_single_1", "--include_path", str(TASKS),
             "--metadata", json.dumps({"max_seq_lengths": [256], "num_samples": 3}),
             "--output_path", str(tmp_path / "results"), "--log_samples"]
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert code == 0, err[-3000:]
    (results_file,) = (tmp_path / "results").rglob("results_*.json")
    (samples_file,) = (tmp_path / "results").rglob("samples_ruler_niah_single_1_*.jsonl")
    scores = json.loads(results_file.read_text())["results"]["ruler_niah_single_1"]
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    assert len(samples) == 3 and {s["doc"]["max_length"] for s in samples} == {256}
    found = [float(s["doc"]["outputs"][0] in s["resps"][0][0]) for s in samples]
    assert 0 <= scores["256,none"] <= 1 and scores["256,none"] == pytest.approx(sum(found) / len(found))
    utils = ruler_utils()
    cells = {f"256_depth_{utils.depth_label(s['doc']['depth'])}" for s in samples}
    assert {key.split(",")[0] for key in scores if key.startswith("256_depth") and "stderr" not in key} == cells
    assert all(0 <= scores[f"{cell},none"] <= 1 for cell in cells)
    assert "|ruler_niah_single_1|" in out and re.search(r"\|\s*256\s*\|", out)
    assert not no_network
    assert "wonderwords" not in sys.modules and "lm_eval.tasks.ruler.prepare_niah" not in sys.modules
