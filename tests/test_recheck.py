"""blindheads recheck: greedy decoding with a string match (``evaluation/greedy.py``) against the teacher-forced
scorer, and a tested run's recall re-evaluated on fresh episodes."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
import yaml
from support.data import builtin_data
from support.runs import TINY_TESTED_RUN, copy_run, refusal, run_cli
from torch import nn

from blindheads.callbacks.episode_recall import EpisodeRecall
from blindheads.cli.recheck import within
from blindheads.cli.tested_run import run_config
from blindheads.datamodules.retrieval_mix import EpisodeWriter, RetrievalMix
from blindheads.evaluation.greedy import greedy_samples, matches
from blindheads.evaluation.recall import recall_samples
from blindheads.evaluation.scoring import score_samples


class Scripted(nn.Module):
    """A decoder whose argmax we choose: after a prompt it registers it continues with that prompt's script (read
    from the tokens it is given, as a decoder would), and everywhere else predicts EOS."""

    def __init__(self, scripts: dict[tuple[int, ...], list[int]], vocab_size: int, eos: int) -> None:
        super().__init__()
        self.scripts, self.vocab_size, self.eos = scripts, vocab_size, eos
        self.lm_head = nn.Identity()
        self.anchor = nn.Parameter(torch.zeros(()))  # gives the scorer and greedy a device to read

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(*tokens.shape, self.vocab_size)
        out[..., self.eos] = 1.0
        for row, sequence in enumerate(tokens.tolist()):
            for prompt, script in self.scripts.items():
                start = len(prompt)
                if tuple(sequence[:start]) != prompt:
                    continue
                for k, token in enumerate(script):  # the position predicting script[k], where the script was followed
                    at = start - 1 + k
                    if at < len(sequence) and sequence[start : start + k] == script[:k]:
                        out[row, at] = 0.0
                        out[row, at, token] = 1.0
        return out

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.hidden_states(tokens))


def test_the_string_match_needs_the_value_then_no_digit():
    assert matches(" 5", "5") and matches(" 5.", "5") and matches("5 7", "5") and matches(" 5<|endoftext|>", "5")
    assert not matches(" 57", "5") and not matches(" 6", "5") and not matches(" ", "5") and not matches("", "5")
    assert matches(" 42,", "42") and not matches(" 4", "42") and not matches(" 420", "42")


def test_greedy_and_the_teacher_forced_scorer_give_the_same_verdict_on_every_episode(cache_dir):
    """On the same episodes, argmax decoding is the teacher-forced verdict by construction: right answers followed
    by a full stop, by a space and another number, or by EOS are right for both; a wrong value, no answer, and the
    right value continued by another digit (``57`` for ``5``) are wrong for both."""
    data = builtin_data(cache_dir, 64, 2, 2)
    data.setup()
    tokenizer = data.tokenizer
    writer = EpisodeWriter(RetrievalMix(facts=1, value_digits=(1, 2), min_gap=4, max_gap=16),
                           tokenizer.backend_tokenizer, 64)  # fmt: skip
    episodes = recall_samples(writer, data.heldout_tokens(4096).tolist(), tokenizer.eos_token_id, 64, 12, distance=40)
    samples = [e.sample for e in episodes]
    assert {len(s.answer_tokens) for s in samples} != {1}, "some values take several tokens (a space, the digits)"

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False).input_ids

    (stop,), (digit,), (spaced,) = encode("."), encode("7"), encode(" 7")
    kinds = ["stop", "another digit", "wrong value", "space then a number", "nothing", "eos"]
    right = {"stop": True, "another digit": False, "wrong value": False, "space then a number": True,
             "nothing": False, "eos": True}  # fmt: skip
    scripts, expected = {}, []
    for i, sample in enumerate(samples):
        kind, answer = kinds[i % len(kinds)], sample.answer_tokens.tolist()
        wrong = encode(" " + str((int(sample.answer) + 1) % 10 or 1) + sample.answer[1:])
        script = {"stop": [*answer, stop], "another digit": [*answer, digit], "wrong value": [*wrong, stop],
                  "space then a number": [*answer, spaced], "nothing": [], "eos": answer}[kind]  # fmt: skip
        scripts[tuple(sample.tokens[: sample.answer_start].tolist())] = script
        expected.append(right[kind])
    decoder = Scripted(scripts, 4096, tokenizer.eos_token_id)

    greedy = greedy_samples(decoder, tokenizer, samples, batch_size=4)
    scored = score_samples(decoder, tokenizer, samples, batch_size=4)
    assert [g.exact for g in greedy] == [s.exact for s in scored] == expected
    continued = [g for g, kind in zip(greedy, [kinds[i % 6] for i in range(12)]) if kind == "another digit"]
    assert len(continued) == 2 and all(g.generated.strip().startswith(g.sample.answer + "7") for g in continued)


def test_the_bound_is_that_of_two_independent_shares():
    bound, inside = within(0.5, 256, 0.4, 256)
    assert bound == pytest.approx(1.96 * (0.25 / 256 + 0.24 / 256) ** 0.5) == pytest.approx(0.0858, abs=1e-4)
    assert not inside and within(0.45, 256, 0.4, 256)[1]  # 0.1 beyond it, 0.05 within
    assert within(0.0, 256, 0.0, 256) == (0.0, True) and not within(1.0, 256, 0.0, 256)[1]


RECALL = """
trainer:
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {every_n_train_steps: 2, save_last: true, save_top_k: 0}
    - class_path: blindheads.callbacks.episode_recall.EpisodeRecall
      init_args: {every_n_steps: null, gaps: [], distances: [0.5, 2.0], samples: 8}
data:
  retrieval_mix: {rate: 1.0, facts: 1, value_digits: [1, 1], min_gap: 4, max_gap: 16}
"""


@pytest.fixture(scope="module")
def tested_run(tmp_path_factory, cache_dir):
    """A tiny run as the grid makes one (RUNS/SETUP/seedS): a 2-step fit, then test with EpisodeRecall at 0.5x and
    2x the 64-token window, 8 episodes each. Its own config file, apart from configs/ (which the runs do not test)."""
    root = tmp_path_factory.mktemp("recheck")
    (root / "tiny.yaml").write_text(TINY_TESTED_RUN)
    (root / "recall.yaml").write_text(RECALL)
    options = ["--config", str(root / "tiny.yaml"), "--config", str(root / "recall.yaml"), "--data.cache_dir",
               str(cache_dir), "--trainer.logger.init_args.save_dir", str(root / "runs")]  # fmt: skip
    for command in (["fit", *options], ["test", *options, "--ckpt_path", "last"]):
        done = run_cli(command)
        assert done.returncode == 0, done.stderr[-3000:]
    return root / "runs" / "alibi" / "seed3"


def test_the_config_keeps_only_episode_recall_whichever_way_the_run_chose_its_callbacks(tmp_path):
    """A config's callbacks are a ``trainer.callbacks`` list, or the callback set's ``callbacks: use: [...]``: of
    either, only EpisodeRecall is rebuilt, and nothing is logged."""
    run = tmp_path / "alibi" / "seed0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(RECALL + "ckpt_path: null\n")
    config, device = run_config(run, (EpisodeRecall,))
    assert device == "cpu" or torch.cuda.is_available(), "no accelerator named: cuda where there is one"
    assert [c["class_path"].rpartition(".")[2] for c in config["trainer"]["callbacks"]] == ["EpisodeRecall"]
    assert config["trainer"]["logger"] is False and "ckpt_path" not in config
    used = {"use": ["checkpoint", "underflow", "recall"], "recall": {"distances": [0.5, 8.0]}}
    (run / "config.test.yaml").write_text(yaml.safe_dump({"trainer": {"callbacks": []}, "callbacks": used}))
    config, _ = run_config(run, (EpisodeRecall,), "cpu")  # the test's record first: what made results.json
    assert config["callbacks"]["use"] == ["recall"] and config["trainer"]["callbacks"] == []


@pytest.mark.slow
def test_a_tested_run_is_rechecked_on_fresh_episodes_point_by_point(tested_run, tmp_path, capsys):
    from blindheads.cli import main

    results = json.loads((tested_run / "results.json").read_text())
    main(["recheck", str(tested_run), "--out", str(tmp_path / "out")])
    assert "2 of 2 points within sampling error" in capsys.readouterr().out
    table = pd.read_csv(tmp_path / "out" / "recheck.csv")
    assert list(table["point"]) == ["distance0.5x", "distance2x"] and list(table["distance"]) == [32, 128]
    assert (table["episodes"] == 8).all() and (table["committed_episodes"] == 8).all()
    assert (table["run_episode_seed"] == 3).all() and (table["fresh_episode_seed"] == 1003).all()
    assert table["run_set_reproduced"].all(), "the data module rebuilt from config.yaml draws the run's episodes"
    assert table["fresh_set_differs"].all()
    assert not set(table["fresh_episode_set"]) & set(results["episode_sets"].values())
    for row in table.itertuples():
        assert row.committed_exact == results["metrics"][f"test/recall/{row.point}/exact"]
        assert row.difference == pytest.approx(row.greedy_exact - row.committed_exact)
        assert row.within == (abs(row.difference) <= row.bound + 1e-12)
    assert (table["verdicts_differing"] == 0).all(), "greedy and the scorer agree on the fresh episodes"
    markdown = (tmp_path / "out" / "recheck.md").read_text()
    rows = [line for line in markdown.splitlines() if line.startswith("| alibi | seed3 |")]
    assert len(rows) == 2 and "distance0.5x" in rows[0] and "distance2x" in rows[1]
    assert f"recheck {tested_run} --out" in markdown and "alibi/seed3 3 -> 1003" in markdown
    assert "torch " in markdown and "lightning " in markdown


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda run: None, "does not exist"),
        (lambda run: run.mkdir(), "has no config.yaml: not a blindheads run directory"),
        (lambda run: (run.mkdir(), (run / "config.yaml").write_text("trainer:\n  callbacks: []\n")),
         "configures no EpisodeRecall callback"),
        (lambda run: (run.mkdir(), (run / "config.yaml").write_text(RECALL)), "has no results.json: test the run"),
        (lambda run: (run.mkdir(), (run / "config.yaml").write_text(RECALL), (run / "results.json").write_text("{}"),
                      (run / "checkpoints").mkdir(), (run / "checkpoints/last.ckpt").write_text("not a checkpoint")),
         "not a blindheads checkpoint"),
    ],
    ids=["missing", "empty", "no EpisodeRecall", "untested", "bad checkpoint"],
)  # fmt: skip
def test_a_directory_that_is_no_tested_run_is_one_error_line(make, expected, tmp_path):
    run = tmp_path / "alibi" / "seed0"
    run.parent.mkdir()
    make(run)
    message = refusal(["recheck", str(run), "--out", str(tmp_path / "out")])
    assert message.startswith("blindheads recheck: error: ") and expected in message and "\n" not in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "decoder, problem",
    [
        ({"num_heads": 8, "num_kv_heads": 4}, "model.decoder.num_heads: 8 in the config, 4 in the checkpoint; "
         "model.decoder.num_kv_heads: 4 in the config, 2 in the checkpoint"),
        ({"bogus": 1}, "model.decoder.bogus: unknown"),
    ],
    ids=["8 heads for 4-head weights", "an unknown key"],
)  # fmt: skip
def test_a_tested_run_whose_config_was_edited_after_it_is_one_line(trained_run, tmp_path, decoder, problem):
    """config.test.yaml (what recheck rebuilds the run from) edited by hand: refused before anything is built."""
    run = copy_run(trained_run, tmp_path)
    (run / "results.json").write_text(json.dumps({"global_step": 20}))
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"]["decoder"].update(decoder)
    config["callbacks"]["use"].append("recall")
    (run / "config.test.yaml").write_text(yaml.safe_dump(config))
    message = refusal(["recheck", str(run), "--out", str(tmp_path / "out")])
    assert message == (
        f"blindheads recheck: error: {run}: its config's model differs from checkpoints/last.ckpt's ({problem}): "
        "the config was edited after the run; restore it"
    ), message
    assert not (tmp_path / "out").exists()
