"""``blindheads grid`` end to end at a few steps: two setups, tested and summarised; a second call resumes."""

from __future__ import annotations

import json
import os
import re
import signal

import lightning as L
import pandas as pd
import pytest
from support.runs import REPO, refusal, run_cli

from blindheads.cli import grid, main
from blindheads.cli.lightning import build_cli
from blindheads.experiments.driver.folders import resume_option
from blindheads.experiments.driver.jobs import Driver
from blindheads.experiments.driver.options import configs
from blindheads.experiments.driver.records import read_json, write_json
from blindheads.experiments.grid.curves import measured_during_training
from blindheads.experiments.grid.setups import position_of, position_setups, setup_files, setup_names
from blindheads.experiments.grid.summary import write_summary
from blindheads.experiments.grid.tables import run_rows
from blindheads.locks import RUN_LOCK


@pytest.mark.slow
def test_a_two_setup_grid_trains_tests_summarises_and_resumes(cache_dir, tmp_path, capsys):
    """The recall-by-distance protocol at 3 steps: summary, tidy table and figure; a killed run is run again, a
    finished one is not; other options are refused, naming the difference. The grid runs in this process (its fits
    and tests in their own)."""
    out = tmp_path / "grid"
    # 8 episodes per distance (EpisodeRecall's samples) instead of 64, measured once during training too
    shrink = ["--data.cache_dir", str(cache_dir), "--trainer.max_steps", "3", "--data.batch_size", "2",
              "--data.val_windows", "2", "--callbacks.recall.samples", "8",
              "--callbacks.recall.every_n_steps", "2"]  # fmt: skip
    protocol = [
        str(REPO / f"configs/experiments/{name}.yaml") for name in ("laptop", "dense_recall", "recall_by_distance")
    ]
    command = ["grid", "--config", *protocol, "--setups", "alibi", "nope",
               "--seeds", "0", "--out", str(out), "--runs", str(tmp_path / "runs"), "--", *shrink]  # fmt: skip
    main(command)
    summary = pd.read_csv(out / "summary.csv", index_col=0)
    assert list(summary.index) == ["alibi", "nope"] and (summary["seeds"] == 1).all()
    assert summary[["loss_1x", "loss_2x", "loss_4x", "loss_8x"]].notna().all().all()
    assert summary.loc["nope", "underflow_1x"] == 0  # no bias, no zero weights
    assert "| alibi | 1 |" in (out / "summary.md").read_text()
    table = pd.read_csv(out / "recall_by_distance.csv")
    assert sorted(set(table["distance"])) == [32, 64, 96, 128, 256, 512] and set(table["window"]) == {64}
    assert (table["exact"] + table["failed_blind"] + table["failed_reachable"]).round(6).eq(1).all()
    for figure in ("loss_by_length.png", "underflow_per_head.png", "recall_by_distance.png"):
        assert (out / figure).stat().st_size > 0
    results = json.loads((out / "results.json").read_text())
    assert results["seeds"] == [0] and results["versions"]["torch"] and len(results["runs"]) == 2
    assert {r["setup"]: r["global_step"] for r in results["runs"]} == {"alibi": 3, "nope": 3}
    assert results["remaining"] == [] and "runs done" not in (out / "summary.md").read_text()
    assert set(results["runs"][0]["curves"]["recall"]["step"]) == {2}, "its recall over training, in its record"
    assert set(pd.read_csv(out / "recall_curves.csv")["setup"]) == {"alibi", "nope"}

    assert json.loads((tmp_path / "runs/alibi/seed0/done.json").read_text()) == results["runs"][0]
    assert json.loads((out / "records/alibi-seed-0.json").read_text())["record"] == results["runs"][0]
    for marker in ("runs/nope/seed0/done.json", "runs/nope/seed0/done.sha256", "runs/nope/seed0/results.json",
                   "grid/records/nope-seed-0.json"):  # fmt: skip
        (tmp_path / marker).unlink()  # as if killed before nope's test ended
    part = command.index("--")
    main([*command[:part], "--hours", "1e-9", *command[part:]])  # a part too short to start a run
    assert json.loads((out / "results.json").read_text())["remaining"] == ["nope seed 0"]
    assert "1 of 2 runs done; the same command runs the rest: nope seed 0." in (out / "summary.md").read_text()
    fit_log = tmp_path / "runs/alibi/seed0.fit.log"
    before = fit_log.stat().st_mtime_ns
    capsys.readouterr()
    main(command)
    assert fit_log.stat().st_mtime_ns == before, "a finished run is not run again"
    printed = capsys.readouterr().out
    assert "nope seed 0: done" in printed and "alibi seed 0: done" not in printed
    rerun_log = (tmp_path / "runs/nope/seed0.fit.log").read_text()
    assert "resuming from" in rerun_log and rerun_log.count("--- blindheads fit, started") == 2, "appended to"

    changed = refusal([*command[: -len(shrink)], *shrink[:3], "4", *shrink[4:]])  # --trainer.max_steps 4
    assert "was made with other options (--trainer.max_steps 3 -> 4)" in changed


def test_unknown_setups_are_refused_with_the_choices_from_any_folder(tmp_path, monkeypatch):
    """Started from another folder, the drivers find the repository's configs (they once listed no valid setup)."""
    monkeypatch.chdir(tmp_path)
    line = refusal(["grid", "--setups", "alibi", "bogus"])
    assert line.startswith(
        "blindheads grid: error: unknown setups ['bogus']; valid: alibi, alibi_gradient_floor, alibi_learnable, alibi_zero_free"
    )
    args = grid.parse_args(["--setups", "sliding_window"])
    assert args.config == [str(REPO / "configs/experiments/laptop.yaml")]
    assert setup_files("sliding_window", args.config) == [
        str(REPO / f"configs/{name}.yaml")
        for name in ("experiments/laptop", "position/sliding_window", "experiments/laptop/sliding_window")
    ]


def test_every_setup_is_one_config_file_and_the_laptop_overlay_adapts_it(cache_dir):
    """The grid knows a setup only by its file in configs/position/; each builds the model its spec says, and
    laptop.yaml's overlay makes the sliding window 128 tokens."""
    laptop = ["configs/experiments/laptop.yaml"]
    assert set(grid.PAPER_SETUPS) <= set(setup_names()) and len(setup_names()) == 25
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)
        for name, spec in position_setups().items():
            files = setup_files(name, laptop)
            shrink = ["--data.cache_dir", str(cache_dir), "--trainer.logger", "false"]
            cli = build_cli([*configs(files), *shrink], run=False)
            assert cli.model.config.position == position_of(files), name
            if name == "sliding_window":
                assert spec == "alibi+sliding_window(1024)" and position_of(files) == "alibi+sliding_window(128)"
                assert files[-1] == "configs/experiments/laptop/sliding_window.yaml"
            else:
                assert position_of(files) == spec and files == [*laptop, f"configs/position/{name}.yaml"]


def test_an_overlay_config_replaces_only_what_it_names(cache_dir, tmp_path):
    """``grid --config laptop.yaml dense_recall.yaml``: the second file overrides the first, key by key."""
    files = ["configs/experiments/laptop.yaml", "configs/experiments/dense_recall.yaml"]
    assert configs(files) == ["--config", files[0], "--config", files[1]]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)
        cli = build_cli([*configs(files), "--data.cache_dir", str(cache_dir), "--trainer.logger", "false"], run=False)
    decoder, data = cli.model.config, cli.datamodule
    assert (decoder.context_length, data.seq_len, data.batch_size) == (64, 64, 64)
    assert (decoder.num_layers, decoder.hidden_size, decoder.num_heads) == (2, 128, 8)  # laptop.yaml's, kept
    mix = data.retrieval_mix
    assert (mix.rate, mix.facts, mix.value_digits, mix.min_gap, mix.max_gap) == (1.0, 1, (1, 1), 4, 16)
    recall = [c for c in cli.trainer.callbacks if type(c).__name__ == "EpisodeRecall"]
    assert len(recall) == 1 and recall[0].gaps == [4, 16] and cli.trainer.max_steps == 400


def test_the_summary_takes_recall_at_the_smallest_and_largest_gap_measured():
    metrics = {"test/recall/gap16/exact": 0.9, "test/recall/gap4/exact": 1.0, "test/loss": 2.5}
    rows = run_rows([{"setup": "alibi", "seed": 0, "metrics": metrics}, {"setup": "nope", "seed": 0, "metrics": {}}])
    assert rows.loc[0, "recall_near"] == 1.0 and rows.loc[0, "recall_far"] == 0.9 and rows.loc[0, "val_loss"] == 2.5
    assert rows.loc[1, ["recall_near", "recall_far"]].isna().all()


def test_recall_and_retrieval_measured_during_training_become_curves_and_figures(tmp_path):
    """A record keeps its run's curves (the committed records carry them without the logs); a record made before
    records kept them is read from its logs under --runs, and a run with neither is named in summary.md."""
    from torch.utils.tensorboard import SummaryWriter

    records = []
    for setup, seed, values in (("alibi", 0, [0.1, 0.9]), ("alibi", 1, [0.2, 1.0]), ("nope", 0, [0.1, 0.5])):
        run_dir = tmp_path / "runs" / setup / f"seed{seed}"
        with SummaryWriter(run_dir) as writer:
            for step, value in zip((50, 100), values):
                writer.add_scalar("recall/gap4/exact", value, step)
                writer.add_scalar("passkey/auc_out_of_domain", value / 2, step)
                writer.add_scalar("test/passkey/auc_out_of_domain", 0.7, step)  # the test's, not training's
                writer.add_scalar("train/loss", 3.0, step)
        record = {"setup": setup, "seed": seed, "metrics": {"test/loss": 3.0}, "wall_s": 1.0}
        if setup == "alibi":  # kept in the record as the grid keeps it, then the logs gone
            record = json.loads(json.dumps({**record, **measured_during_training(run_dir)}))
            for events in run_dir.iterdir():
                events.unlink()
        records.append(record)
    records.append({"setup": "rope", "seed": 0, "metrics": {"test/loss": 3.0}, "wall_s": 1.0})  # no curves anywhere
    write_summary(tmp_path / "out", records, command="blindheads grid", wall_s=1.0, runs_dir=tmp_path / "runs")
    curves = pd.read_csv(tmp_path / "out/recall_curves.csv")
    assert len(curves) == 6 and set(curves["point"]) == {"gap4"}
    alibi = curves[curves["setup"] == "alibi"].groupby("step")["value"].mean()
    assert alibi.to_dict() == pytest.approx({50: 0.15, 100: 0.95})
    assert (tmp_path / "out/recall_over_training.png").stat().st_size > 0
    retrieval = pd.read_csv(tmp_path / "out/retrieval_curves.csv")
    assert len(retrieval) == 6 and set(retrieval["point"]) == {"passkey out"}
    nope = retrieval[retrieval["setup"] == "nope"].set_index("step")["value"]
    assert nope.to_dict() == pytest.approx({50: 0.05, 100: 0.25})
    assert (tmp_path / "out/retrieval_over_training.png").stat().st_size > 0
    summary = (tmp_path / "out/summary.md").read_text()
    assert "retrieval_curves.csv: no curves for rope seed 0" in summary and "alibi seed" not in summary


def test_recall_by_distance_becomes_a_tidy_table_a_markdown_grid_and_a_figure(tmp_path):
    def metrics(exact_near, exact_far, blind_far):
        values = {"test/loss": 3.0, "test/blind_distance_predicted/materialized/head0": 172.8}
        for factor, distance, exact, blind in ((0.5, 32, exact_near, 0.0), (8, 512, exact_far, blind_far)):
            point = f"test/recall/distance{factor:g}x"
            values.update({f"{point}/distance": distance, f"{point}/exact": exact, f"{point}/blind": blind,
                           f"{point}/unreachable": blind, f"{point}/failed_blind": min(blind, 1 - exact),
                           f"{point}/failed_reachable": 1 - exact - min(blind, 1 - exact),
                           f"{point}/weight/layer0/head0": 0.5})  # fmt: skip
        return values

    records = [
        {"setup": "alibi", "seed": 0, "metrics": metrics(1.0, 0.25, 0.0)},
        {"setup": "alibi", "seed": 1, "metrics": metrics(0.9, 0.75, 0.0)},
        {"setup": "robust", "seed": 0, "metrics": metrics(0.1, 0.0, 1.0)},
    ]
    write_summary(tmp_path, records, command="blindheads grid", wall_s=1.0)
    table = pd.read_csv(tmp_path / "recall_by_distance.csv")
    assert list(table.columns) == ["setup", "seed", "factor", "distance", "window", "exact", "blind_share",
                                   "unreachable_share", "failed_blind", "failed_reachable", "baseline",
                                   "constant_answer", "length", "exact_capped", "exact_zero_free",
                                   "exact_floored", "zeros", "zeros_zero_free", "carriers_blind",
                                   "carriers_near_blind", "carriers_reachable"]  # fmt: skip
    assert len(table) == 6 and set(table["window"]) == {64} and set(table["distance"]) == {32, 512}
    robust_far = table[(table["setup"] == "robust") & (table["factor"] == 8)].iloc[0]
    assert robust_far["failed_blind"] == 1 and robust_far["failed_reachable"] == 0
    text = (tmp_path / "recall_by_distance.md").read_text()
    assert "| setup | seeds | 0.5x (32) | 8x (512) |" in text
    assert "| alibi | 2 | 0.95 ± 0.05 (0.00) | 0.50 ± 0.25 (0.00) |" in text
    assert (tmp_path / "recall_by_distance.png").stat().st_size > 0
    assert "passkey_auc_in" not in (tmp_path / "summary.md").read_text(), "a column no run measured is left out"


class CtrlCTheDriver(L.Callback):
    """After the fit's first step, SIGINT to its parent's process group: a terminal's Ctrl-C to the grid driver."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == 1:
            os.killpg(os.getpgid(os.getppid()), signal.SIGINT)


@pytest.mark.slow
def test_an_interrupted_grid_stops_its_runs_saved_in_one_line(cache_dir, tmp_path):
    """Ctrl-C to the driver's process group reaches the fit (in its own group) once, through the driver, which
    waits for it to save last.ckpt and exits in one line with 130, leaving no process behind (SIGTERM, a
    scheduler's pre-emption, takes the same path with 143), and the run queued behind starts nothing; the same
    command resumes from last.ckpt."""
    runs = tmp_path / "runs"
    command = ["grid", "--config", *(str(REPO / f"configs/experiments/{n}.yaml") for n in ("laptop", "dense_recall")),
               "--setups", "alibi", "nope", "--seeds", "0", "--parallel", "1", "--runs", str(runs), "--",
               "--data.cache_dir", str(cache_dir), "--data.batch_size", "2", "--data.val_windows", "2",
               f"--trainer.callbacks+={__name__}.CtrlCTheDriver"]  # fmt: skip
    stopped = run_cli(command, timeout=300)
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    line = "blindheads grid: interrupted: 1 runs saved; rerun the same command to continue"
    assert stopped.stderr.strip() == line, stopped.stderr[-3000:]
    run_dir = runs / "alibi/seed0"
    log = (runs / "alibi/seed0.fit.log").read_text()
    assert "blindheads: SIGINT at step" in log and "Traceback" not in log, "reached the fit once, so it saved"
    assert not (run_dir / RUN_LOCK).exists(), "the fit ended before the driver did"
    assert resume_option(run_dir) == ["--ckpt_path", "last"]
    assert not (runs / "nope/seed0.fit.log").exists(), "the run queued behind it starts nothing"
    assert [p.name for p in (tmp_path / "runs-summary").iterdir()] == ["options.json"], "no summary of half runs"


def test_a_part_too_short_for_any_run_still_writes_a_summary_naming_the_rest(tmp_path, capsys):
    out = tmp_path / "out"
    grid.main(["--setups", "alibi", "nope", "--seeds", "0", "--hours", "1e-9", "--runs", str(tmp_path / "runs"),
               "--out", str(out)])  # fmt: skip
    assert (out / "summary.md").read_text() == (
        "No run is done yet.\n\n0 of 2 runs done; the same command runs the rest: alibi seed 0, nope seed 0.\n"
    )
    assert json.loads((out / "results.json").read_text())["remaining"] == ["alibi seed 0", "nope seed 0"]
    assert "0 of 2 runs done after --hours 1e-09" in capsys.readouterr().out


def test_a_full_disk_under_out_is_one_line_and_the_finished_run_is_kept_once_there_is_room(tmp_path, monkeypatch):
    """The record of a finished run cannot be written to OUT/records (its staging file writes to /dev/full): one
    line naming that file and the command to rerun; rerun with room, the run is not run again and its record is
    kept."""
    launched = []

    def launch(self, command, run_dir):  # the fit and test of a run, as far as the loop can see
        launched.append(command[0])
        write_json(run_dir / "results.json", {"global_step": 3})
        if len(launched) == 2:  # the disk fills as the first test ends
            records.mkdir(parents=True)
            os.symlink("/dev/full", records / f".alibi-seed-0.json.partial-{os.getpid()}")

    monkeypatch.setattr(Driver, "launch", launch)
    out, records = tmp_path / "out", tmp_path / "out/records"
    command = ["grid", "--setups", "alibi", "--seeds", "0", "--runs", str(tmp_path / "runs"), "--out", str(out)]
    message = refusal(command)
    assert re.fullmatch(
        rf"blindheads grid: error: no space left on device writing {records}/alibi-seed-0.json \([\d.]+ [KMGT]?B "
        rf"free on {records}\): free some space, then run the same command again",
        message,
    ), message
    assert launched == ["fit", "test"]
    grid.main(command[1:])
    assert launched == ["fit", "test"], "the finished run is not run again"
    assert read_json(records / "alibi-seed-0.json")["record"]["global_step"] == 3
