"""The FineWeb-Edu DataModule: the same token windows, in the same order, for every run of a config."""

from __future__ import annotations

import atexit
import logging
import multiprocessing
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import lightning as L
import torch
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerFast

from blindheads.datamodules.batch_memory import check_batch_fits
from blindheads.datamodules.fingerprint import (
    accepted_change,
    data_changed,
    differences,
    fingerprint,
    hashes_ends_only,
)
from blindheads.datamodules.retrieval_mix import EpisodeWriter, RetrievalMix
from blindheads.datamodules.sources import SOURCES, DataFiles, data_files, stream_documents
from blindheads.datamodules.task_format import TaskFormat, TaskWriter
from blindheads.datamodules.tokenizer import default_cache_dir, load_tokenizer, padded_vocab_size
from blindheads.datamodules.windows import TokenWindows, collate_windows
from blindheads.running import running
from blindheads.signals import ignore_stops

log = logging.getLogger(__name__)


class TextData(L.LightningDataModule):
    """The data: token windows of ``seq_len + 1`` tokens from the Hub, local files or the builtin corpus.

    Token windows of ``seq_len + 1`` tokens from FineWeb-Edu (``source="hub"``), local files (``"files"``) or the
    offline builtin corpus (``"builtin"``).

    The order is fixed by the files, ``shuffle_files_seed`` (``None``: no shuffling), the world size and
    ``num_workers``: the same config on the same world size and worker count gives the same windows on any machine.
    Validation uses the first ``val_windows`` windows of the held-out file(s), which training never reads.
    The data position of every rank is saved in checkpoints and restored on resume. ``retrieval_mix`` inserts
    retrieval episodes into the training documents (see ``retrieval_mix.py``); ``task_format`` instead makes every
    training window passkey and needle sequences in the evaluation's own format (see ``task_format.py``); validation
    text stays natural.
    """

    def __init__(
        self,
        source: str = "hub",
        files: list[str] | str | None = None,
        validation_files: list[str] | str | None = None,
        hub_name: str = "HuggingFaceFW/fineweb-edu",
        hub_config: str = "sample-100BT",
        text_column: str = "text",
        tokenizer: str = "HuggingFaceTB/SmolLM-135M",
        builtin_vocab_size: int = 4096,
        seq_len: int = 2048,
        batch_size: int = 8,
        num_workers: int = 2,
        val_windows: int = 64,
        shuffle_files_seed: int | None = None,
        cache_dir: str | None = None,
        accept_data_change: bool = False,
        retrieval_mix: RetrievalMix | None = None,
        task_format: TaskFormat | None = None,
    ) -> None:
        super().__init__()
        if source not in SOURCES:
            raise ValueError(f"unknown data source {source!r}; valid: {', '.join(SOURCES)}")
        for name, value in (("seq_len", seq_len), ("batch_size", batch_size), ("val_windows", val_windows)):
            if value < 1:
                raise ValueError(f"data.{name} must be >= 1, got {value}")
        if retrieval_mix is not None and task_format is not None:
            raise ValueError("data.retrieval_mix and data.task_format both write the training stream: null one")
        if num_workers < 0:
            raise ValueError(f"data.num_workers must be >= 0, got {num_workers}")
        self.save_hyperparameters()
        files, validation_files = ([f] if isinstance(f, str) else f for f in (files, validation_files))  # one path
        self.source, self.files_arg, self.validation_files = source, files, validation_files
        self.hub_name, self.hub_config, self.text_column = hub_name, hub_config, text_column
        self.tokenizer_name, self.builtin_vocab_size = tokenizer, builtin_vocab_size
        self.seq_len, self.batch_size, self.num_workers, self.val_windows = (
            seq_len,
            batch_size,
            num_workers,
            val_windows,
        )
        self.shuffle_files_seed, self.accept_data_change = shuffle_files_seed, accept_data_change
        self.retrieval_mix, self.task_format = retrieval_mix, task_format
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.tokenizer: PreTrainedTokenizerFast | None = None  # loaded in setup, with the files
        self.files: DataFiles | None = None
        self._resume: dict[str, Any] | None = None  # this rank's stream positions, once consumed or restored
        self._validation: torch.Tensor | None = None
        self._heldout: torch.Tensor | None = None
        self._documents: dict[str, Any] = {}
        self._fingerprint: dict[str, Any] | None = None

    # --- setup -----------------------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Build the builtin corpus and tokenizer once per node, before any rank reads them."""
        self._resolve_files()
        load_tokenizer(self.tokenizer_name, self.cache_dir, self.builtin_vocab_size)

    def _resolve_files(self) -> DataFiles:
        return data_files(
            self.source,
            self.files_arg,
            self.validation_files,
            self.hub_name,
            self.hub_config,
            self.cache_dir,
            self.shuffle_files_seed,
        )

    def setup(self, stage: str | None = None) -> None:
        if self.files is None:
            self.files = self._resolve_files()
            self.tokenizer = load_tokenizer(self.tokenizer_name, self.cache_dir, self.builtin_vocab_size)
            self._documents = {
                split: stream_documents(files, self.files.format, self.text_column)
                for split, files in (("train", self.files.train), ("validation", self.files.validation))
            }
        if stage == "fit" and self.trainer is not None:
            check_batch_fits(self.batch_size, self.seq_len, self.vocab_size, self.trainer.strategy.root_device)

    @property
    def vocab_size(self) -> int:
        """The tokenizer's vocabulary, rounded up to a multiple of 64 (faster matrix multiplies)."""
        return padded_vocab_size(
            self.tokenizer or load_tokenizer(self.tokenizer_name, self.cache_dir, self.builtin_vocab_size)
        )

    def _rank_and_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _windows(self, split: str, *, repeat: bool, resume: dict | None) -> TokenWindows:
        rank, world = self._rank_and_world() if split == "train" else (0, 1)
        assert self.tokenizer is not None  # callers run setup first
        return TokenWindows(
            self._documents[split],
            self.tokenizer.backend_tokenizer,
            self.tokenizer.eos_token_id,
            self.seq_len,
            self.text_column,
            rank=rank,
            world_size=world,
            repeat=repeat,
            resume=resume,
            episodes=self._episode_writer() if split == "train" else None,
            files=getattr(self.files, split),
        )

    def _episode_writer(self) -> EpisodeWriter | TaskWriter | None:
        """Retrieval episodes or task sequences for the training stream (validation and held-out text stay natural)."""
        assert self.tokenizer is not None  # callers run setup first
        if self.task_format is not None:
            streams = self._rank_and_world()[1] * max(self.num_workers, 1)
            return TaskWriter(self.task_format, self.tokenizer, self.seq_len, streams)
        if self.retrieval_mix is None:
            return None
        return EpisodeWriter(self.retrieval_mix, self.tokenizer.backend_tokenizer, self.seq_len)

    # --- loaders ---------------------------------------------------------------------------------------------
    def train_dataloader(self) -> DataLoader:
        self.setup()
        windows = self._windows("train", repeat=True, resume=self._resume)
        return DataLoader(
            windows,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            collate_fn=collate_windows,
            persistent_workers=False,
            pin_memory=torch.cuda.is_available(),
            worker_init_fn=_leave_interrupts_to_the_main_process,
        )

    def validation_windows(self) -> torch.Tensor:
        """The fixed held-out windows, identical on every rank and run: shape (val_windows, seq_len + 1)."""
        self.setup()
        assert self.files is not None  # resolved in setup
        if self._validation is None:
            windows = []
            for item in self._windows("validation", repeat=False, resume=None):
                windows.append(item["input_ids"])
                if len(windows) == self.val_windows:
                    break
            if len(windows) < self.val_windows:
                raise ValueError(
                    f"the held-out file(s) {list(self.files.validation)} hold {len(windows)} windows of "
                    f"{self.seq_len + 1} tokens, fewer than data.val_windows={self.val_windows}"
                )
            self._validation = torch.stack(windows)
        return self._validation

    def heldout_tokens(self, count: int) -> torch.Tensor:
        """The first ``count`` tokens of the held-out stream (repeated if it is shorter): needle haystacks, measurement
        batches and long-context losses, identical on every rank and run."""
        self.setup()
        if self._heldout is None or len(self._heldout) < count:
            windows: list[torch.Tensor] = []
            total = 0
            for item in self._windows("validation", repeat=True, resume=None):
                window = item["input_ids"] if not windows else item["input_ids"][1:]
                windows.append(window)
                total += len(window)
                if total >= count:
                    break
            self._heldout = torch.cat(windows)
        return self._heldout[:count]

    def heldout_windows(self, count: int, length: int) -> torch.Tensor:
        """``count`` consecutive held-out windows of ``length + 1`` tokens: underflow measurements, long-context losses."""
        return self.heldout_tokens(count * (length + 1)).view(count, length + 1)

    def val_dataloader(self) -> DataLoader:
        # A map-style dataset: under DDP, Lightning's distributed sampler gives each rank its share.
        return DataLoader(self.validation_windows(), batch_size=self.batch_size)  # type: ignore[arg-type]  # a Tensor is a map-style dataset

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    # --- position tracking and exact resume ------------------------------------------------------------------
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Training batches carry their stream position: record it as consumed, hand the model the tokens."""
        if isinstance(batch, dict) and "state" in batch:
            num_streams = max(self.num_workers, 1)
            resume = self._resume or {"next_stream": 0, "streams": {}}
            self._resume = {
                "next_stream": (batch["stream"] + 1) % num_streams,
                "streams": {**resume["streams"], batch["stream"]: batch["state"]},
            }
            return batch["input_ids"]
        return batch

    def state_dict(self) -> dict[str, Any]:
        """Every rank's position (Lightning saves only rank 0's datamodule state, so gather them all here)."""
        _rank, world = self._rank_and_world()
        positions = [self._resume]
        if world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            positions = [None] * world
            torch.distributed.all_gather_object(positions, self._resume)
        accumulate = self.trainer.accumulate_grad_batches if self.trainer is not None else 1
        return {"world_size": world, "num_workers": self.num_workers, "batch_size": self.batch_size,
                "accumulate_grad_batches": accumulate, "ranks": positions, "data": self.fingerprint()}  # fmt: skip

    def fingerprint(self) -> dict[str, Any]:
        """The data this run reads (taken once per run: checkpoints reuse it)."""
        if self._fingerprint is None:
            self._fingerprint = self._take_fingerprint()
        return self._fingerprint

    def _take_fingerprint(self, ends_only: bool = False) -> dict[str, Any]:
        """``ends_only``: hashed as checkpoints before whole-file hashes were, to compare with one of them."""
        files = self.files or self._resolve_files()
        return fingerprint(
            files.train,
            files.validation,
            ends_only=ends_only,
            shuffle_files_seed=self.shuffle_files_seed,
            tokenizer=self.tokenizer_name,
            seq_len=self.seq_len,
            text_column=self.text_column,
            retrieval_mix=asdict(self.retrieval_mix) if self.retrieval_mix else None,
            # recorded only when set, so checkpoints from before it existed still match
            **({"task_format": asdict(self.task_format)} if self.task_format else {}),
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the training streams (only ``fit`` reads them: ``validate``/``test`` of a checkpoint may run on
        any world size)."""
        if self.trainer is not None and self.trainer.state.fn != "fit":
            return
        rank, world = self._rank_and_world()
        if (state["world_size"], state["num_workers"]) != (world, self.num_workers):
            raise ValueError(
                f"the checkpoint's data order is for world size {state['world_size']} and "
                f"{state['num_workers']} workers, this run has {world} and {self.num_workers}: resume on "
                f"{state['world_size']} processes (devices x nodes) with --data.num_workers {state['num_workers']}"
            )
        accumulate = self.trainer.accumulate_grad_batches if self.trainer is not None else 1
        before = (state.get("batch_size", self.batch_size), state.get("accumulate_grad_batches", accumulate))
        if before != (self.batch_size, accumulate):
            raise ValueError(
                f"the checkpoint trained with --data.batch_size {before[0]} and --trainer.accumulate_grad_batches "
                f"{before[1]}, this run has {self.batch_size} and {accumulate}: every later step would differ from "
                "the uninterrupted run's. Resume with the checkpoint's values, or start a new run without --ckpt_path"
            )
        self._check_data(state.get("data"))
        self._resume = state["ranks"][rank]

    def _check_data(self, recorded: dict[str, Any] | None) -> None:
        """Refuse to resume a stream position into data that changed, unless ``accept_data_change`` says so."""
        if recorded is None:
            log.warning(
                "the checkpoint records no data fingerprint (written before they existed): a change in "
                "the data since cannot be detected"
            )
            return
        ends_only = hashes_ends_only(recorded)
        if ends_only:
            log.warning(
                "the checkpoint's data fingerprint hashes only the first and last MiB of each file (written before "
                "whole-file hashes): a change elsewhere in a file cannot be detected on this resume; its next "
                "checkpoint records whole-file hashes"
            )
        changed = differences(recorded, self._take_fingerprint(ends_only=True) if ends_only else self.fingerprint())
        if not changed:
            return
        if not self.accept_data_change:
            raise ValueError(data_changed(changed))
        log.warning(accepted_change(changed))


def _leave_interrupts_to_the_main_process(worker_id: int) -> None:
    """Workers ignore Ctrl-C, SIGTERM and SIGHUP: training saves and stops at a step boundary, then shuts them down.
    (A worker left running when the main process exits, by a loader abandoned mid-stream, is killed at exit by
    ``_kill_workers_left_at_exit``: Python's own clean-up would send it the SIGTERM it ignores, and wait forever.)"""
    ignore_stops()


def _kill_workers_left_at_exit() -> None:
    """Run at interpreter exit before multiprocessing's clean-up (handlers run last-registered first): daemonic
    children, the DataLoader workers, would otherwise be sent SIGTERM, which they ignore, and joined forever."""
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()


atexit.register(_kill_workers_left_at_exit)


def datamodule_of(trainer: L.Trainer) -> TextData:
    """The data module ``trainer`` runs with, as the project's own (its tokenizer, windows and held-out text): what
    every evaluation callback reads. Lightning sets it at run time (``running``)."""
    return cast(TextData, running(trainer).datamodule)
