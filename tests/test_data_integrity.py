"""The data a run reads is the data it was given: whole-file fingerprints, a builtin corpus that cannot shift its
held-out split, long documents, and cache folders and batch sizes refused in one line."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.data import WORDS, document_text, make_datamodule, resume_state, write_fineweb_parquet
from support.runs import refusal, tiny_run_args

from blindheads.datamodules.builtin_corpus import builtin_corpus_dir
from blindheads.datamodules.cache import MARK
from blindheads.datamodules.sources import stream_documents
from blindheads.datamodules.tokenizer import builtin_tokenizer_dir
from blindheads.datamodules.windows import TokenWindows


@pytest.fixture
def own_cache(cache_dir, tmp_path, monkeypatch):
    """A cache with the session's builtin tokenizer, whose builtin corpus is 40 short documents (built in
    milliseconds instead of parsing the standard library)."""
    cache = tmp_path / "cache"
    shutil.copytree(builtin_tokenizer_dir(cache_dir, 4096), builtin_tokenizer_dir(cache, 4096))
    documents = [(f"doc/{n}", f"document {n:02d} says the river flows past the old mill. " * 20) for n in range(40)]
    monkeypatch.setattr("blindheads.datamodules.builtin_corpus.builtin_documents", lambda: documents)
    return cache


def split_texts(cache) -> tuple[list[str], list[str]]:
    """The training and held-out texts of the builtin source, as a run reads them."""
    dm = make_datamodule(cache)
    return tuple(
        [text for path in files for text in pq.read_table(path)["text"].to_pylist()]
        for files in (dm.files.train, dm.files.validation)
    )


@pytest.mark.parametrize(
    "shard, damage",
    [(7, "lost its shard"), (2, "lost its shard"), (3, "holds a changed shard")],
    ids=["held-out shard deleted", "training shard deleted", "same-size edit"],
)
def test_a_damaged_builtin_corpus_is_rebuilt_with_the_same_split(own_cache, shard, damage, caplog):
    before = split_texts(own_cache)
    path = builtin_corpus_dir(own_cache) / f"shard-{shard:05d}.parquet"
    if damage == "lost its shard":
        path.unlink()
    else:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 1
        path.write_bytes(data)
    assert split_texts(own_cache) == before
    assert f"{damage} {path.name}: rebuilding it (the same documents and split)" in caplog.text


def test_a_damaged_corpus_folder_the_project_did_not_make_is_left_alone(own_cache):
    split_texts(own_cache)
    folder = builtin_corpus_dir(own_cache)
    (folder / MARK).unlink()  # a folder of that name the project did not make
    (folder / "shard-00002.parquet").unlink()
    kept = sorted(p.name for p in folder.iterdir())
    with pytest.raises(ValueError) as refused:
        split_texts(own_cache)
    assert str(refused.value) == (
        f"{folder} lost its shard shard-00002.parquet, and it was not made by blindheads (no {MARK} in it), so it "
        "is left alone: move or delete it to rebuild the builtin corpus there, or choose another --data.cache_dir"
    )
    assert sorted(p.name for p in folder.iterdir()) == kept


@pytest.mark.parametrize("where", ["cache_dir", "tokenizer folder"])
def test_a_file_where_a_cache_folder_belongs_is_named(own_cache, tmp_path, where):
    if where == "cache_dir":
        cache = tmp_path / "a-file"
        cache.write_text("")
        culprit = cache
    else:
        cache = own_cache
        culprit = builtin_tokenizer_dir(cache, 4096)
        shutil.rmtree(culprit)
        culprit.write_text("")
    message = refusal(["fit", *tiny_run_args(tmp_path / "run", cache)])
    assert message == (
        f"blindheads fit: error: {culprit} is a file, expected a directory for the builtin tokenizer: move or "
        "delete it, or choose another --data.cache_dir"
    )


def files_with_a_big_one(directory: Path) -> list[str]:
    """Five small parquet files, the second replaced by 4 MB of uncompressed text (beyond the first and last MiB
    that fingerprints used to hash)."""
    files = [str(p) for p in write_fineweb_parquet(directory, num_files=5, docs_per_file=20)]
    rng = random.Random(1)
    texts = [document_text(n, rng) * 30 for n in range(600)]
    pq.write_table(pa.table({"text": texts}), files[1], compression="none", use_dictionary=False)
    assert os.path.getsize(files[1]) > 2_000_000 + 2**20
    return files


def edit_a_letter_at(path: str, offset: int) -> None:
    """Change the first letter at or after ``offset`` to another letter: same size, valid parquet."""
    data = bytearray(Path(path).read_bytes())
    while not chr(data[offset]).isalpha():
        offset += 1
    data[offset] = ord("q" if data[offset] != ord("q") else "z")
    Path(path).write_bytes(data)


def test_a_same_size_edit_in_the_middle_of_a_file_is_refused_on_resume(cache_dir, tmp_path):
    files = files_with_a_big_one(tmp_path / "d")
    state = resume_state(cache_dir, files)
    edit_a_letter_at(files[1], 2_000_000)
    with pytest.raises(ValueError) as error:
        make_datamodule(cache_dir, files).load_state_dict(state)
    assert str(error.value) == (
        "the data changed since the checkpoint: train files: changed (size or contents) ['train-00001.parquet']. "
        "Resuming would re-read or skip documents; restore the data, or pass --data.accept_data_change true to go on"
    )


def ends_only_entry(path: str) -> dict:
    """A file as checkpoints before whole-file hashes described it: the SHA-256 of its first and last MiB."""
    data = Path(path).read_bytes()
    ends = data[: 2**20] + (data[max(2**20, len(data) - 2**20) :] if len(data) > 2**20 else b"")
    return {"name": os.path.basename(path), "size": len(data), "sha256_ends": hashlib.sha256(ends).hexdigest()[:16]}


def test_a_checkpoint_that_hashed_only_file_ends_is_compared_by_them_and_says_so(cache_dir, tmp_path, caplog):
    files = files_with_a_big_one(tmp_path / "d")
    state = resume_state(cache_dir, files)
    state["data"] = {
        **state["data"],
        "train": [ends_only_entry(f) for f in files[:-1]],
        "validation": [ends_only_entry(files[-1])],
    }
    make_datamodule(cache_dir, files).load_state_dict(state)  # the same data resumes
    assert "hashes only the first and last MiB of each file (written before whole-file hashes)" in caplog.text
    edit_a_letter_at(files[1], 0)  # within the first MiB: the older hash sees it
    with pytest.raises(ValueError, match=r"train files: changed \(size or contents\) \['train-00001.parquet'\]"):
        make_datamodule(cache_dir, files).load_state_dict(state)


class LongestText:
    """A tokenizer that remembers the longest text it was asked to encode."""

    def __init__(self, tokenizer):
        self.tokenizer, self.longest = tokenizer, 0

    def encode_batch_fast(self, texts, **kwargs):
        self.longest = max(self.longest, *map(len, texts))
        return self.tokenizer.encode_batch_fast(texts, **kwargs)


def test_a_long_document_is_tokenized_in_pieces_to_the_same_tokens(cache_dir, tmp_path, monkeypatch):
    """A 100 MB document once took a worker down; here the piece limit is lowered to 1,000 characters and the long
    document is 200 times that (with runs of spaces and newlines, where a careless cut would change tokens)."""
    monkeypatch.setattr("blindheads.datamodules.encoding.PIECE_CHARS", 1000)
    rng = random.Random(2)
    long = " ".join(rng.choice([*WORDS, "\n\n", "  ", "42."]) for _ in range(50_000))[:200_000]
    texts = [document_text(0, rng), long, document_text(2, rng)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"text": [document_text(3, rng)]}), tmp_path / "b.parquet")
    dm = make_datamodule(cache_dir, [str(tmp_path / "*.parquet")], seq_len=16)
    tokenizer = LongestText(dm.tokenizer.backend_tokenizer)
    eos = dm.tokenizer.eos_token_id
    windows = TokenWindows(stream_documents(dm.files.train, "parquet", "text"), tokenizer, eos, 16, repeat=False)
    stream = [window["input_ids"] for window in windows]
    tokens = [*stream[0].tolist(), *(t for w in stream[1:] for t in w[1:].tolist())]
    expected = [t for text in texts for t in (*dm.tokenizer(text, add_special_tokens=False).input_ids, eos)]
    assert tokens == expected[: len(tokens)] and len(expected) - len(tokens) < 16
    assert tokenizer.longest <= 1000


def test_a_batch_whose_logits_cannot_fit_is_refused_before_the_first_step(cache_dir, tmp_path, monkeypatch):
    """--data.batch_size 20000 was killed by the kernel on a 23 GiB machine (a GPU would print a long traceback)."""
    monkeypatch.setattr("blindheads.datamodules.batch_memory.free_bytes", lambda device: 16 * 2**30)
    message = refusal(["fit", *tiny_run_args(tmp_path, cache_dir, **{"--data.batch_size": "20000"})])
    assert message == (
        "blindheads fit: error: --data.batch_size 20000 cannot fit: the loss alone needs 39.1 GiB (20000 windows x 64 "
        "positions x 4096 vocabulary entries x 8 bytes) and cpu has 16.0 GiB free: at most 8192 windows could fit, "
        "fewer with the model's activations"
    )


def test_a_process_that_leaves_a_loader_mid_stream_still_exits():
    """Workers ignore SIGTERM (training stops them itself); one left running by a loader abandoned mid-stream must
    not keep the process from exiting, as Python's exit clean-up would wait for it forever."""
    script = (
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "from blindheads.datamodules.text import _leave_interrupts_to_the_main_process\n"
        "loader = DataLoader(range(10**6), batch_size=2, num_workers=2, "
        "worker_init_fn=_leave_interrupts_to_the_main_process)\n"
        "iterator = iter(loader)\n"
        "next(iterator)\n"
        "print('abandoned', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "abandoned", done.stderr[-2000:]
