"""Data files that cannot hang a fit or fill its memory: a file that is no regular file (a FIFO, a device, a socket,
a link to one), or one of 0 bytes, is refused before anything reads it; a file both trained on and held out is refused
by where it is, not by how its path is spelled."""

from __future__ import annotations

import os
import signal
import socket

import pytest
from support.data import make_datamodule, write_fineweb_parquet
from support.runs import refusal, tiny_run_args

REGULAR_ONLY = (
    "not a regular file; data files must be regular files (reading a pipe or a device would block or never end)"
)


@pytest.fixture
def texts(tmp_path):
    """Two good text files (one document each)."""
    paths = [tmp_path / "a.txt", tmp_path / "b.txt"]
    for path in paths:
        path.write_text("the river flows past the old mill. " * 50)
    return [str(p) for p in paths]


def test_a_fifo_as_a_data_file_is_one_line_not_a_fit_that_waits_forever(cache_dir, tmp_path, texts):
    """Opening a FIFO waits for a writer: the fit hung at its first read of the data."""
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    runs = tmp_path / "runs"
    files = f"[{texts[0]},{fifo},{texts[1]}]"
    previous = signal.signal(signal.SIGALRM, waited)
    signal.alarm(60)  # should the fit open the FIFO, the wait is interrupted (and the test fails)
    try:
        message = refusal(["fit", *tiny_run_args(runs, cache_dir), "--data.source", "files", "--data.files", files])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert message == f"blindheads fit: error: {fifo}: is a FIFO (named pipe), {REGULAR_ONLY}"
    assert not (runs / "alibi").exists(), "refused before a run directory was made"


def waited(signum, frame) -> None:
    raise TimeoutError("the fit waited 60 s on the FIFO")


def kind_of_file(tmp_path, kind: str) -> tuple[str, str]:
    """A data file named ``bad.txt`` of ``kind``, and what the refusal says it is."""
    path = tmp_path / "bad.txt"
    if kind == "link to a device":  # to /dev/zero, read as text, it grew to 7.4 GB of memory in 20 s; /dev/null is
        path.symlink_to("/dev/null")  # refused as it is, and would end (as no documents) should the check go
        return str(path), "is a link to /dev/null, a character device, " + REGULAR_ONLY
    if kind == "socket":
        listening = socket.socket(socket.AF_UNIX)
        listening.bind(str(path))
        listening.close()  # the socket file stays
        return str(path), "is a socket, " + REGULAR_ONLY
    if kind == "directory":
        path.mkdir()
        return str(path), "is a directory, " + REGULAR_ONLY
    if kind == "kernel file":  # regular, of size 0, and reading it yields text: its size says nothing
        path.symlink_to("/proc/self/status")
        return str(path), "holds no documents (0 bytes)"
    path.write_bytes(b"")
    return str(path), "holds no documents (0 bytes)"


@pytest.mark.parametrize("kind", ["link to a device", "socket", "directory", "kernel file", "empty"])
def test_a_data_file_that_is_no_regular_file_with_contents_is_named_with_what_it_is(cache_dir, tmp_path, texts, kind):
    bad, what = kind_of_file(tmp_path, kind)
    with pytest.raises(ValueError) as error:
        make_datamodule(cache_dir, [texts[0], bad, texts[1]])
    assert str(error.value) == f"{bad}: {what}"


def test_a_file_given_for_training_and_validation_is_refused_naming_it(cache_dir, tmp_path, texts):
    """``datasets`` said ``Empty 'data_files': '[]'`` for the same file in both, naming no file; a link to a held-out
    file, or the held-out last file listed again, would have been trained on."""
    link = tmp_path / "link.txt"
    link.symlink_to(texts[1])
    both = "given for both training and validation (as the same file after resolving links): a held-out file"
    for files, validation in (([texts[0]], [texts[0]]), ([texts[0], str(link)], [texts[1]]), (texts + texts, None)):
        with pytest.raises(ValueError) as error:
            make_datamodule(cache_dir, files, validation_files=validation)
        named = texts[0] if validation == [texts[0]] else str(link) if validation else texts[1]
        assert str(error.value).startswith(f"data file(s) {named} {both} must not be trained on; "), error.value


def test_a_glob_of_data_files_leaves_out_the_held_out_ones_but_not_all_of_them(cache_dir, tmp_path):
    """Held-out files a glob of ``data.files`` matches are not trained on; holding out every one is refused."""
    shards = [str(p) for p in write_fineweb_parquet(tmp_path, num_files=3, docs_per_file=20)]
    dm = make_datamodule(cache_dir, [str(tmp_path / "*.parquet")], validation_files=shards[1:2])
    assert (dm.files.train, dm.files.validation) == ((shards[0], shards[2]), (shards[1],))
    with pytest.raises(ValueError) as error:
        make_datamodule(cache_dir, [str(tmp_path / "*.parquet")], validation_files=[str(tmp_path / "*.parquet")])
    assert str(error.value) == (
        f"data.validation_files holds out every file of data.files ({', '.join(shards)}): nothing is left to train "
        "on; give other data.validation_files"
    )
