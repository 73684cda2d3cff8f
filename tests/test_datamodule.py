"""The FineWeb-Edu DataModule: fixed order, disjoint and complete sharding, exact resume, packing, bad input."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from support.data import MARKER, make_datamodule, resume_state, take, write_fineweb_parquet
from torch.utils.data import DataLoader

from blindheads.datamodules.sources import stream_documents
from blindheads.datamodules.windows import TokenWindows, collate_windows


@pytest.fixture
def parquet_files(tmp_path):
    return [str(p) for p in write_fineweb_parquet(tmp_path / "fineweb", num_files=9, docs_per_file=40)]


def test_same_config_same_windows(cache_dir, parquet_files):
    first = take(make_datamodule(cache_dir, parquet_files, num_workers=2), 20)
    second = take(make_datamodule(cache_dir, parquet_files, num_workers=2), 20)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert first[0].shape == (4, 33) and first[0].dtype == torch.long


def test_builtin_source_is_deterministic_and_holds_out_a_file(cache_dir):
    dm = make_datamodule(cache_dir)
    assert len(dm.files.train) == 7 and len(dm.files.validation) == 1
    assert dm.files.validation[0] not in dm.files.train
    assert torch.equal(take(dm, 3)[2], take(make_datamodule(cache_dir), 3)[2])
    assert dm.validation_windows().shape == (4, 33)


def stream_token_lists(dm, rank, world, num_workers):
    """Each stream's whole token sequence for one pass (windows overlap by one token)."""
    windows = TokenWindows(
        stream_documents(dm.files.train, dm.files.format, "text"),
        dm.tokenizer.backend_tokenizer,
        dm.tokenizer.eos_token_id,
        dm.seq_len,
        rank=rank,
        world_size=world,
        repeat=False,
    )
    loader = DataLoader(windows, batch_size=1, num_workers=num_workers, collate_fn=collate_windows)
    streams: dict[int, list[int]] = {}
    for batch in loader:
        tokens = batch["input_ids"][0].tolist()
        previous = streams.setdefault(batch["stream"], [])
        assert not previous or previous[-1] == tokens[0], "consecutive windows share one token"
        previous.extend(tokens if not previous else tokens[1:])
    return streams


@pytest.mark.parametrize("num_files", [9, 3], ids=["files-per-stream", "fewer-files-than-streams"])
def test_two_ranks_two_workers_cover_every_document_once(cache_dir, tmp_path, num_files):
    files = [
        str(p) for p in write_fineweb_parquet(tmp_path / "f", num_files=num_files, docs_per_file=120 // (num_files - 1))
    ]
    dm = make_datamodule(cache_dir, files, seq_len=8)
    seen = Counter()
    for rank in range(2):
        streams = stream_token_lists(dm, rank, world=2, num_workers=2)
        assert len(streams) == 2
        for tokens in streams.values():
            numbers = MARKER.findall(dm.tokenizer.decode(tokens))
            assert numbers, "every stream gets documents"
            seen.update(numbers)
    train_docs = {f"{n:05d}" for n in range(120 // (num_files - 1) * (num_files - 1))}
    assert set(seen) == train_docs, "together the streams cover every training document"
    assert max(seen.values()) == 1, "no document is read twice"


def test_packing_keeps_every_token(cache_dir, parquet_files):
    dm = make_datamodule(cache_dir, parquet_files, seq_len=16)
    (tokens,) = stream_token_lists(dm, 0, 1, 0).values()
    texts = [row["text"] for row in stream_documents(dm.files.train, "parquet", "text")]
    expected = []
    for text in texts:
        expected += [*dm.tokenizer(text, add_special_tokens=False).input_ids, dm.tokenizer.eos_token_id]
    tail = (len(expected) - 1) % 16
    assert tokens == expected[: len(expected) - tail], "the stream is the documents, EOS-separated, minus a short tail"
    assert tail < 16


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_is_exact_twice(cache_dir, tmp_path, num_workers):
    """Stop after batch 7, resume; stop the resumed run after 9 more, resume again: the windows equal an
    uninterrupted run's, across document batches (64 documents) and epoch boundaries (about 31 batches)."""
    parquet_files = [str(p) for p in write_fineweb_parquet(tmp_path, num_files=9, docs_per_file=20)]
    uninterrupted = take(make_datamodule(cache_dir, parquet_files, num_workers=num_workers, seq_len=64), 60)
    first = make_datamodule(cache_dir, parquet_files, num_workers=num_workers, seq_len=64)
    take(first, 7)
    second = make_datamodule(cache_dir, parquet_files, num_workers=num_workers, seq_len=64)
    second.load_state_dict(first.state_dict())
    resumed = take(second, 9)
    third = make_datamodule(cache_dir, parquet_files, num_workers=num_workers, seq_len=64)
    third.load_state_dict(second.state_dict())
    resumed += take(third, 44)
    assert len(resumed) == 53
    for step, (a, b) in enumerate(zip(uninterrupted[7:], resumed), start=7):
        assert torch.equal(a, b), f"batch {step} differs after resuming"
    assert third.state_dict()["ranks"][0]["streams"][0]["epoch"] >= 1, "the test crossed an epoch"


def test_resume_refuses_another_world_size(cache_dir, parquet_files):
    dm = make_datamodule(cache_dir, parquet_files)
    take(dm, 2)
    state = dm.state_dict()
    with pytest.raises(ValueError, match="world size 1 and 0 workers, this run has 1 and 2"):
        make_datamodule(cache_dir, parquet_files, num_workers=2).load_state_dict(state)


def test_validation_never_overlaps_training(cache_dir, parquet_files):
    dm = make_datamodule(cache_dir, parquet_files, val_windows=8, seq_len=16)
    validation = MARKER.findall(dm.tokenizer.decode(dm.validation_windows().flatten().tolist()))
    (train_tokens,) = stream_token_lists(dm, 0, 1, 0).values()
    training = MARKER.findall(dm.tokenizer.decode(train_tokens))
    assert validation and not set(validation) & set(training)
    assert torch.equal(
        dm.validation_windows(),
        make_datamodule(cache_dir, parquet_files, val_windows=8, seq_len=16).validation_windows(),
    )


def test_jsonl_and_txt_sources_use_the_same_path(cache_dir, tmp_path):
    for i in range(2):
        (tmp_path / f"d{i}.jsonl").write_text(
            "\n".join(f'{{"text": "doc {i}{j:04d} begins. the sky is blue."}}' for j in range(200))
        )
        (tmp_path / f"d{i}.txt").write_text(" ".join(["the river flows past the old mill."] * 400))
    for pattern in ("*.jsonl", "*.txt"):
        dm = make_datamodule(cache_dir, [str(tmp_path / pattern)], seq_len=16)
        assert take(dm, 1)[0].shape == (4, 17)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            {"source": "files", "files": ["/no/such/*.parquet"]},
            FileNotFoundError,
            "no files match '/no/such/\\*.parquet'",
        ),
        ({"source": "files", "files": []}, ValueError, "needs at least one path"),
        ({"source": "ftp"}, ValueError, "valid: hub, files, builtin"),
        ({"seq_len": 0}, ValueError, "seq_len must be >= 1"),
        (
            {"text_column": "content"},
            ValueError,
            "train-00000.parquet: text column 'content' not found; columns: \\['text', 'id', 'dump'",
        ),
        ({"tokenizer": "/no/such/tokenizer"}, ValueError, "cannot load tokenizer '/no/such/tokenizer'"),
    ],
)
def test_bad_input_fails_clearly(cache_dir, parquet_files, kwargs, error, message):
    with pytest.raises(error, match=message):
        make_datamodule(cache_dir, **{"files": parquet_files, **kwargs})


def test_a_single_file_needs_a_validation_file(cache_dir, parquet_files):
    with pytest.raises(ValueError, match="held out for validation"):
        make_datamodule(cache_dir, parquet_files[:1])
    dm = make_datamodule(cache_dir, parquet_files[:1], validation_files=parquet_files[1:2])
    assert dm.files.train == (parquet_files[0],)


def test_an_empty_source_is_an_error_not_a_silent_epoch(cache_dir, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for i in range(2):
        pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / f"empty-{i}.parquet")
    with pytest.raises(ValueError, match="empty-0.parquet: holds no documents"):
        make_datamodule(cache_dir, [str(tmp_path / "*.parquet")])
    for i in range(2):
        pq.write_table(pa.table({"text": ["only one document"]}), tmp_path / f"one-{i}.parquet")
    dm = make_datamodule(cache_dir, [str(tmp_path / "one-*.parquet")])
    windows = TokenWindows(
        dm._documents["train"], dm.tokenizer.backend_tokenizer, dm.tokenizer.eos_token_id, 8, rank=1, world_size=2
    )  # one training document, two ranks: rank 1 has none
    with pytest.raises(ValueError, match="got no documents"):
        next(iter(windows))


def test_unreachable_hub_fails_clearly(cache_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("datasets.config.HF_HUB_OFFLINE", True)
    with pytest.raises((ConnectionError, ValueError), match="fineweb-edu"):
        make_datamodule(cache_dir, source="hub")


def test_one_path_given_as_a_string_is_a_one_element_list(cache_dir, parquet_files):
    glob = str(Path(parquet_files[0]).parent / "*.parquet")
    as_string = take(make_datamodule(cache_dir, glob), 3)
    as_list = take(make_datamodule(cache_dir, [glob]), 3)
    assert all(torch.equal(a, b) for a, b in zip(as_string, as_list))


@pytest.mark.parametrize(
    "change, message",
    [
        ("insert", "train files: added ['extra.parquet']"),
        ("remove", "train files: removed ['train-00003.parquet']"),
        ("truncate", "train files: changed (size or contents) ['train-00000.parquet']"),
        ("append", "validation files: added ['zz-extra.parquet'], removed ['train-00008.parquet']"),
        ("seed", "shuffle_files_seed: None -> 7"),
    ],
)
def test_resume_refuses_changed_data_and_names_the_change(cache_dir, tmp_path, change, message):
    files = [str(p) for p in write_fineweb_parquet(tmp_path / "d", num_files=9, docs_per_file=20)]
    state = resume_state(cache_dir, files)
    kwargs = {}
    if change == "insert":
        (extra,) = write_fineweb_parquet(tmp_path / "x", num_files=1, docs_per_file=5, seed=3)
        files = [*files[:4], str(extra.rename(tmp_path / "d" / "extra.parquet")), *files[4:]]
    elif change == "remove":
        files = files[:3] + files[4:]
    elif change == "truncate":  # the current file rewritten with half its documents
        (shorter,) = write_fineweb_parquet(tmp_path / "x", num_files=1, docs_per_file=10)
        shorter.replace(files[0])
    elif change == "append":
        (extra,) = write_fineweb_parquet(tmp_path / "x", num_files=1, docs_per_file=5, seed=3)
        files = [*files, str(extra.rename(tmp_path / "d" / "zz-extra.parquet"))]
    else:
        kwargs["shuffle_files_seed"] = 7
    with pytest.raises(ValueError, match="the data changed since the checkpoint") as error:
        make_datamodule(cache_dir, files, **kwargs).load_state_dict(state)
    assert message in str(error.value) and "--data.accept_data_change true" in str(error.value)


def test_accepting_a_data_change_says_what_it_costs(cache_dir, tmp_path, caplog):
    files = [str(p) for p in write_fineweb_parquet(tmp_path / "d", num_files=9, docs_per_file=20)]
    state = resume_state(cache_dir, files)
    resumed = make_datamodule(cache_dir, files[:3] + files[4:], accept_data_change=True)
    resumed.load_state_dict(state)
    assert "resuming into changed data (accept_data_change): train files: removed" in caplog.text
    assert "documents may be read twice or never" in caplog.text
    unchanged = make_datamodule(cache_dir, files)
    unchanged.load_state_dict(state)  # the same data resumes without a word


def _write_bad_file(directory: Path, kind: str) -> tuple[str, str]:
    """A later file with one defect, and the message naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if kind == "integer parquet":
        path = directory / "z.parquet"
        pq.write_table(pa.table({"text": [1, 2, 3]}), path)
        return str(path), "z.parquet: column 'text' has type int64, expected string"
    if kind == "null parquet":
        path = directory / "z.parquet"
        pq.write_table(pa.table({"text": ["fine", None, "fine"]}), path)
        return str(path), "z.parquet: 1 documents without text .* rows 0..2"
    if kind in ("blank parquet", "spaces parquet"):
        path = directory / "z.parquet"
        pq.write_table(pa.table({"text": ["" if kind == "blank parquet" else "  \n "] * 100}), path)
        return str(path), "z.parquet: every document's 'text' is empty or whitespace: nothing to train on"
    path = directory / "z.jsonl"
    if kind == "directory jsonl":
        path.mkdir()
        return str(path), "z.jsonl: is a directory, not a regular file"
    if kind == "symlink loop jsonl":
        path.symlink_to(path)
        return str(path), "z.jsonl: cannot be read \\(Too many levels of symbolic links\\)"
    path.write_bytes(
        {
            "empty jsonl": b"",
            "integer jsonl": b'{"text": "fine"}\n\n{"text": 5}\n',
            "missing jsonl": b'{"text": "fine"}\n{"body": "x"}\n',
            "bad utf-8 jsonl": b'{"text": "fine"}\n{"text": "bad \xff"}\n',
            "bad json": b'{"text": "fine"}\n{"text": \n',
            "blank jsonl": b'{"text": ""}\n{"text": "  "}\n',
        }[kind]
    )
    return str(path), {
        "empty jsonl": "z.jsonl: holds no documents \\(0 bytes\\)",
        "integer jsonl": "z.jsonl: line 3 has 'text': int 5, expected a string",
        "missing jsonl": "z.jsonl: line 2 has 'text': none, expected a string",
        "bad utf-8 jsonl": "z.jsonl: invalid UTF-8 at byte offset 31 \\(line 2\\)",
        "bad json": "z.jsonl: line 2 is not JSON",
        "blank jsonl": "z.jsonl: every document's 'text' is empty or whitespace",
    }[kind]


@pytest.mark.parametrize(
    "kind",
    [
        "integer parquet",
        "null parquet",
        "empty jsonl",
        "integer jsonl",
        "missing jsonl",
        "bad utf-8 jsonl",
        "bad json",
        "blank parquet",
        "spaces parquet",
        "blank jsonl",
        "directory jsonl",
        "symlink loop jsonl",
    ],
)
def test_a_bad_later_file_is_named_before_training_reads_it(cache_dir, tmp_path, kind):
    """datasets would cast integers to strings, end an empty file silently, or raise naming no file."""
    good = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"] if "json" in kind else write_fineweb_parquet(tmp_path, 2, 5)
    for path in good if "json" in kind else []:
        path.write_text('{"text": "a good document"}\n')
    bad, message = _write_bad_file(tmp_path, kind)
    with pytest.raises(ValueError, match=message):
        make_datamodule(cache_dir, [str(good[0]), bad, str(good[1])])


def test_bad_utf8_in_a_text_file_is_named_with_its_offset(cache_dir, tmp_path):
    (tmp_path / "a.txt").write_text("a fine document\n")
    (tmp_path / "b.txt").write_bytes(b"fine line\nbad \xfe here\n")
    with pytest.raises(ValueError, match="b.txt: invalid UTF-8 at byte offset 14 \\(line 2\\)"):
        make_datamodule(cache_dir, [str(tmp_path / "*.txt")])


def test_a_non_string_document_in_a_stream_names_its_position(cache_dir, parquet_files):
    """Remote files are not checked before reading: the per-document check names the stream position."""
    import datasets

    dm = make_datamodule(cache_dir, parquet_files)
    documents = datasets.IterableDataset.from_generator(lambda: iter([{"text": "fine"}] * 70 + [{"text": None}]))
    windows = TokenWindows(documents, dm.tokenizer.backend_tokenizer, dm.tokenizer.eos_token_id, 8, repeat=False)
    with pytest.raises(ValueError, match="document 6 after stream position shard 0, row 64 has text NoneType None"):
        list(windows)


def test_resume_refuses_another_batch_and_names_both(cache_dir, parquet_files):
    dm = make_datamodule(cache_dir, parquet_files)
    take(dm, 2)
    state = dm.state_dict()
    with pytest.raises(ValueError, match=r"checkpoint trained with --data.batch_size 4 .* this run has 8 and 1"):
        make_datamodule(cache_dir, parquet_files, batch_size=8).load_state_dict(state)
    with pytest.raises(ValueError, match=r"resume on 1 processes \(devices x nodes\) with --data.num_workers 0"):
        make_datamodule(cache_dir, parquet_files, num_workers=2).load_state_dict(state)


@pytest.mark.slow
def test_a_truncated_cached_tokenizer_is_rebuilt_or_named(tmp_path):
    from blindheads.datamodules.tokenizer import builtin_tokenizer_dir, load_tokenizer

    good = load_tokenizer("builtin", tmp_path, 512)
    cached = builtin_tokenizer_dir(tmp_path, 512) / "tokenizer.json"
    cached.write_text(cached.read_text()[:2000])  # a copy killed mid-write
    rebuilt = load_tokenizer("builtin", tmp_path, 512)
    assert rebuilt("The grass is green.").input_ids == good("The grass is green.").input_ids
    local = tmp_path / "mine"
    good.save_pretrained(local)
    (local / "tokenizer.json").write_text("{")
    with pytest.raises(ValueError, match=r"tokenizer '.*mine': the files in .*mine cannot be read .* delete them"):
        load_tokenizer(str(local), tmp_path, 512)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_file_deleted_while_training_reads_it_is_named(cache_dir, parquet_files, num_workers):
    """The stream reads its files in order: one deleted after training started fails when the stream reaches it,
    naming the file (from a worker too, once the CLI unwraps the worker's traceback)."""
    from blindheads.cli import one_line

    dm = make_datamodule(cache_dir, parquet_files, num_workers=num_workers)
    batches = iter(dm.train_dataloader())
    next(batches)
    Path(parquet_files[5]).unlink()
    with pytest.raises(ValueError) as error:
        for _ in range(10_000):
            next(batches)
    assert one_line(error.value) == (
        f"data file {parquet_files[5]} was deleted or moved while training read it: restore it, then resume with "
        "--ckpt_path last"
    )
