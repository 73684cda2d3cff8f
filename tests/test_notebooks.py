"""Every notebook runs top to bottom on tiny artifacts made here, and produces the tables it promises."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from matplotlib.figure import Figure
from nbclient import NotebookClient
from support.runs import REPO, copy_run, run_cli, tiny_run_args

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def execute(name: str, parameters: dict, workdir: Path) -> nbformat.NotebookNode:
    """Run a notebook with a cell setting ``parameters`` after its ``parameters`` cell, as papermill does."""
    book = nbformat.read(REPO / "notebooks" / name, as_version=4)
    index = next(i for i, c in enumerate(book.cells) if "parameters" in c.metadata.get("tags", []))
    assignments = "\n".join(f"{key} = {value!r}" for key, value in parameters.items())
    book.cells.insert(index + 1, nbformat.v4.new_code_cell(assignments))
    NotebookClient(book, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}).execute()
    return book


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_committed_without_outputs(path):
    book = nbformat.read(path, as_version=4)
    code = [c for c in book.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert any("parameters" in c.metadata.get("tags", []) for c in code)


def test_blindness_theory_notebook(tmp_path):
    execute("01_blindness_theory.ipynb", {"heads": 8, "context": 1024, "output_dir": str(tmp_path)}, tmp_path)
    distances = pd.read_csv(tmp_path / "blind_distances.csv")
    assert len(distances) == 18 * 4 * 2 * 8  # ALiBi-family setups in configs/position x dtypes x thresholds x heads
    alibi = distances.query("setup == 'alibi' and dtype == 'float32' and threshold == 'normal'")
    assert alibi["blind_distance"].iloc[0] == pytest.approx(87.3365 / 0.5, rel=1e-4)
    clamped = distances[distances["setup"].str.contains("clamp")]
    refused = clamped["refused"].notna()  # float16 at its normal threshold leaves no room for a floor at 1024 tokens
    assert (refused == ((clamped["dtype"] == "float16") & (clamped["threshold"] == "normal"))).all()
    assert clamped[refused]["blind_distance"].isna().all()
    assert (clamped[~refused].query("setup == 'clamp'")["blind_distance"] == float("inf")).all()
    shares = pd.read_csv(tmp_path / "underflow_vs_length.csv")
    alibi_shares = shares.query("setup == 'alibi'")["all_pairs"]
    assert alibi_shares.is_monotonic_increasing and alibi_shares.iloc[-1] > 0.5
    measured = pd.read_csv(tmp_path / "measured_tau.csv").set_index("dtype")
    assert measured.loc["float32", "measured_eager"] == pytest.approx(
        measured.loc["float32", "tau_subnormal"], abs=0.01
    )
    assert measured.loc["float32", "measured_eager_flushing"] == pytest.approx(
        measured.loc["float32", "tau_normal"], abs=0.01
    )
    check = pd.read_csv(tmp_path / "theory_vs_measurement.csv")
    assert len(check) >= 3 and (check["measured_first_zero"] == check["predicted_first_zero"]).all()


@pytest.mark.slow
def test_published_models_notebook_probes_a_tiny_model_when_given_none(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setenv("BLINDHEADS_CACHE", str(cache_dir))
    execute("02_published_models.ipynb", {"output_dir": str(tmp_path), "lengths": [128, 512]}, tmp_path)
    table = pd.read_csv(tmp_path / "probe_table.csv")
    assert list(table["length"]) == [128, 512] and table["architecture"].eq("bloom").all()
    longest = table.iloc[-1]
    assert 0 < longest["measured_zero_share"] <= longest["predicted_zero_share_normal"] + 0.02
    assert longest["predicted_zero_share_subnormal"] < longest["predicted_zero_share_normal"]


@pytest.mark.slow
def test_training_runs_notebook_compares_experiments(trained_run, tmp_path, cache_dir):
    runs = tmp_path / "runs"
    copy_run(trained_run, runs)  # alibi/run
    args = tiny_run_args(runs, cache_dir, evaluations=True, **{"--model.decoder.position": "nope",
                         "--trainer.logger.init_args.name": "nope", "--trainer.logger.init_args.version": "run"})  # fmt: skip
    result = run_cli(["fit", *args])
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = {f"test/recall/distance{f}x/{part}": value for f, d in ((0.5, 32), (2, 128))
               for part, value in (("distance", d), ("exact", f / 4), ("baseline", 0.1), ("exact_zero_free", f / 4))}  # fmt: skip
    (runs / "alibi" / "run" / "results.json").write_text(json.dumps({"metrics": metrics}))  # as test writes it
    results = tmp_path / "results" / "laptop"  # as blindheads grid writes it
    results.mkdir(parents=True)
    (results / "summary.md").write_text("| setup | seeds |\n|---|---|\n| alibi | 2 |\n")
    Figure(figsize=(1, 1)).savefig(results / "retrieval_auc.png")
    recall = tmp_path / "results" / "recall_by_distance"  # a record with no summary.md, as the grid can write one
    recall.mkdir()
    (recall / "recall_by_distance.md").write_text("| setup | 8x (512) |\n|---|---|\n| alibi | 0.30 |\n")
    Figure(figsize=(1, 1)).savefig(recall / "recall_by_distance.png")
    (tmp_path / "results" / "mine").mkdir()  # a folder of a kind the notebook does not know: named with its files
    (tmp_path / "results" / "mine" / "notes.csv").write_text("a,b\n1,2\n")
    parameters = {"runs_dir": str(runs), "results_dir": str(tmp_path / "results"), "output_dir": str(tmp_path / "out")}
    book = execute("03_training_runs.ipynb", parameters, tmp_path)
    outputs = [o for c in book.cells if c.cell_type == "code" for o in c.outputs]
    markdown = [o.get("data", {}).get("text/markdown", "") for o in outputs]
    text = "".join(o.get("text", "") for o in outputs)
    assert any("| alibi | 2 |" in m for m in markdown) and any("| alibi | 0.30 |" in m for m in markdown)
    headings = [m for m in markdown if m.startswith("### ")]  # COMMANDS' order (the findings first), unknown ones last
    assert headings == ["### recall_by_distance", "### laptop", "### mine"]
    (committed,) = [c for c in book.cells if "COMMANDS" in c.source]
    assert sum("image/png" in o.get("data", {}) for o in committed.outputs) == 2  # both folders' figures
    assert "no " in text and "conjecture/summary.md" in text and "mine/ also holds: notes.csv" in text
    table = pd.read_csv(tmp_path / "out" / "comparison.csv").set_index("experiment")
    assert sorted(table.index) == ["alibi", "nope"]
    assert (table["step"] == 20).all() and table["val_loss"].between(0, 20).all()
    assert (table["passkey_samples_out_of_domain"] == 12).all() and (table["needle_samples_out_of_domain"] == 12).all()
    assert table["passkey_auc_out_of_domain"].between(0, 1).all()
    recall = pd.read_csv(tmp_path / "out" / "recall_by_distance.csv")  # the tested run alone, each of its points
    assert list(recall["setup"]) == ["alibi/run"] * 2 and list(recall["exact"]) == [0.125, 0.5]
    assert list(recall["window"]) == [64, 64] and "exact_capped" not in recall  # what it did not measure: left out
    assert "passkey_auc_in_domain" not in table or table["passkey_auc_in_domain"].notna().any()
    underflow = pd.read_csv(tmp_path / "out" / "underflow_per_head.csv")
    assert set(underflow["run"]) == {"alibi/run", "nope/run"} and set(underflow["head"]) == {0, 1, 2, 3}


def test_the_notebook_names_the_commands_that_wrote_the_committed_results():
    """03's COMMANDS, one per folder under results/, each as that folder records it (``results.json``, else its
    table's ``- command:`` line), less what does not change the results: ``--hours`` (a part's limit), ``--parallel``
    and where the runs were kept."""
    book = nbformat.read(REPO / "notebooks/03_training_runs.ipynb", as_version=4)
    (cell,) = [c for c in book.cells if "COMMANDS = {" in c.source]
    (assign,) = [n for n in ast.parse(cell.source).body if isinstance(n, ast.Assign) and n.targets[0].id == "COMMANDS"]
    commands = ast.literal_eval(assign.value)
    recorded = {}
    for folder in sorted(p for p in (REPO / "results").iterdir() if p.is_dir()):
        if (folder / "results.json").exists():
            command = json.loads((folder / "results.json").read_text())["command"]
        else:
            (command,) = {
                m for t in folder.glob("*.md") for m in re.findall(r"^- command: `(.+)`$", t.read_text(), re.M)
            }
        command = re.sub(r" --(hours|parallel) \S+", "", command)
        recorded[folder.name] = re.sub(r"\S*/(runs/)", r"\1", command).strip()
    assert commands == recorded


def test_the_demos_printed_commands_work_as_printed(monkeypatch):
    """`make demo` prints commands for a shell where .venv is not activated: they must name the venv's binaries."""
    from blindheads.evaluation.report import run_report

    makefile = (Path(__file__).parents[1] / "Makefile").read_text()
    printed = [line for line in makefile.splitlines() if line.strip().startswith("@echo")]
    assert printed and all("$(VENV)/bin/" in line for line in printed if "activate" in line)
    monkeypatch.chdir(REPO)
    (line,) = [line for line in run_report({}, "runs/demo") if line.startswith("TensorBoard")]
    command = line.removeprefix("TensorBoard: ").removesuffix(" --logdir runs/demo")
    # relative to the checkout where the venv is inside it, absolute where it lives elsewhere
    assert (REPO / command).resolve() == (Path(sys.executable).parent / "tensorboard").resolve(), line


def test_the_report_says_why_measured_blind_distances_pass_the_predictions():
    """The tiny run's head 0 at 512 tokens: blind from 353-355 tokens in its weights, predicted 343.3 (materialized)
    and 349.3 (fused) from the bias alone; with q = 0 the two agree (test_evaluation's monitor test)."""
    from blindheads.evaluation.report import run_report

    measured = {"test/blind_distance/layer0/head0": 355.0, "test/blind_distance/layer1/head0": 353.0}
    predicted = {"test/blind_distance_predicted/materialized/head0": 343.3,
                 "test/blind_distance_predicted/fused/head0": 349.3}  # fmt: skip
    lines = run_report({**measured, **predicted})
    assert "  head 0: 353-355 / 343.3" in lines
    (why,) = [line for line in lines if "q.k" in line]
    assert "q.k included" in why and "the bias alone" in why
    assert not any("q.k" in line for line in run_report(predicted)), "no measurement, nothing to explain"


def test_the_reports_recall_table_shows_the_best_constant_answer_beside_recall():
    from blindheads.evaluation.report import run_report

    point = {"distance": 64.0, "length": 80.0, "exact": 0.25, "blind": 0.0, "failed_blind": 0.0,
             "failed_reachable": 0.75}  # fmt: skip
    old = run_report({f"test/recall/distance1x/{part}": value for part, value in point.items()})
    assert not any(line.lstrip().startswith("best constant") for line in old), "a record without it: no row"
    lines = run_report({f"test/recall/distance1x/{part}": value for part, value in {**point, "baseline": 0.25}.items()})
    assert "  best constant          0.25" in lines and "  episode length           80" in lines, lines


def test_the_report_names_the_heads_that_carry_recall_where_they_go_blind_and_what_removing_zeros_changes():
    """Two carriers (cost >= CARRIES), one blind from 256 tokens; the zero-free re-score at 4x and 8x, where float64
    leaves no zero, is +0.00 and +0.02: the line cites the larger, and the report ends with the next command."""
    from blindheads.evaluation.report import NEXT, run_report

    metrics = {
        "test/recall/heads/layer0/head0/ablation_cost": 0.4,
        "test/recall/heads/layer0/head0/blind_by": 256.0,
        "test/recall/heads/layer0/head0/exact_at_blind_by": 0.5,
        "test/recall/heads/layer1/head3/ablation_cost": 0.1,
        "test/recall/heads/layer1/head2/ablation_cost": 0.01,
    }
    for factor, exact, zero_free in ((1, 0.9, 0.9), (4, 0.5, 0.5), (8, 0.3, 0.32)):
        point = f"test/recall/distance{factor}x"
        metrics.update({f"{point}/distance": 64.0 * factor, f"{point}/exact": exact, f"{point}/zeros": 0.25,
                        f"{point}/exact_zero_free": zero_free, f"{point}/zeros_zero_free": 0.0})  # fmt: skip
    lines = run_report(metrics)
    carriers = lines[lines.index(next(line for line in lines if line.startswith("heads that carry"))) :]
    assert carriers[1:3] == ["  l0h0: cost 0.40, exactly blind from 256 tokens (recall there 0.50)",
                             "  l1h3: cost 0.10, not exactly blind at any distance measured"]  # fmt: skip
    assert carriers[3].startswith("  where a carrier is blind (4x, 8x), removing the exact zeros (float64) changes "
                                  "recall by at most +0.02 (8x)")  # fmt: skip
    assert lines[-1].endswith(NEXT) and "  no exact zeros         0.90    0.50    0.32" in lines, lines


def test_notebook_paths_are_the_repositorys_wherever_jupyter_starts(tmp_path, monkeypatch):
    """Started from notebooks/ (or anywhere), runs_dir="runs" still means the repository's runs/; a folder with no
    runs is an error, not an empty table."""
    from blindheads.analysis.paths import from_repository

    monkeypatch.chdir(tmp_path)
    assert from_repository("runs") == REPO / "runs" and from_repository(tmp_path) == tmp_path
    with pytest.raises(Exception, match=f"no TensorBoard runs under {REPO}/runs/no-such-experiment"):
        execute(
            "03_training_runs.ipynb",
            {"runs_dir": "runs/no-such-experiment", "output_dir": str(tmp_path)},
            REPO / "notebooks",
        )


def test_the_run_table_marks_crashed_and_incomplete_runs(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from blindheads.analysis.runs import comparison_table

    def run(name: str, steps: int, checkpoint: bool, tested: bool = False) -> None:
        directory = tmp_path / "alibi" / name
        with SummaryWriter(directory) as writer:
            for step in range(steps):
                writer.add_scalar("train/loss", 3.0, step)
        (directory / "config.yaml").write_text("trainer:\n  max_steps: 10\n")
        if checkpoint:
            (directory / "checkpoints").mkdir()
            (directory / "checkpoints/last.ckpt").write_bytes(b"")
        if tested:
            (directory / "results.json").write_text('{"metrics": {}}')

    run("crashed", 3, checkpoint=False)
    run("stopped", 6, checkpoint=True)
    run("done", 10, checkpoint=True)
    run("tested", 10, checkpoint=True, tested=True)
    status = comparison_table(tmp_path).set_index("version")["status"].to_dict()
    assert status == {
        "crashed": "no checkpoint: stopped before its first one",
        "done": "trained",
        "stopped": "incomplete: 6 of 10 steps logged (resume with --ckpt_path last)",
        "tested": "tested",
    }
