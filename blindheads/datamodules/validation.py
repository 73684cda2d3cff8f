"""Every local data file is checked before training reads it, and every document where it is read.

A data file must be a regular file, not empty: a FIFO would block the first read forever and a device such as
``/dev/zero`` (or a link to one, whatever its name) would never end, so each is refused by what ``stat`` says of the
file a path resolves to, before anything opens it.

``datasets`` casts a later file's integer ``text`` column to strings, ends an empty file silently and names no file
on bad UTF-8, so errors found there would be silent or nameless. Each local file is therefore read here first:
parquet by its footer (schema, row count, null counts; no text is read), json lines and text in full (they have no
schema to trust). Errors name the file, the row or byte offset, and what was expected. Remote (``hf://``) files are
left to the per-document check in ``TokenWindows``.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import stat
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq


class DataFileError(ValueError):
    """A data file that cannot be trained on, with its path and the place inside it."""


def check_files(files: tuple[str, ...], format: str, text_column: str) -> None:
    """Raise ``DataFileError`` for the first local file that is no regular file (``check_regular``), then for the
    first that is empty, unreadable or holds a non-string text."""
    check = {"parquet": _check_parquet, "json": _check_json, "text": _check_text}[format]
    local = [path for path in files if "://" not in path]
    for path in local:  # every file's kind before any file's contents: a pipe is named before gigabytes are read
        check_regular(path)
    for path in local:
        try:
            check(path, text_column)
        except OSError as error:  # a directory, a symlink loop, a file deleted since it was listed, no permission
            raise DataFileError(f"{path}: cannot be read ({error.strerror or error})") from None


KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def check_regular(path: str) -> None:
    """Refuse, before it is opened, a data file that is not a regular file (as the path resolves: a link is followed)
    or that is empty: reading a FIFO blocks until a writer comes, a device never ends, and a size of 0 bytes is no
    document (or a kernel file whose size says nothing of what reading it yields)."""
    try:
        status = os.stat(path)
    except OSError as error:  # missing since it was listed, a symlink loop, no permission on a folder
        raise DataFileError(f"{path}: cannot be read ({error.strerror or error})") from None
    if not stat.S_ISREG(status.st_mode):
        kind = next(
            (name for test, name in KINDS if test(status.st_mode)), f"of file type {stat.S_IFMT(status.st_mode):o}"
        )
        what = f"a link to {os.path.realpath(path)}, {kind}" if os.path.islink(path) else kind
        raise DataFileError(
            f"{path}: is {what}, not a regular file; data files must be regular files (reading a pipe or a device "
            "would block or never end)"
        )
    if status.st_size == 0:
        raise DataFileError(f"{path}: holds no documents (0 bytes)")


def _open(path: str) -> io.BufferedIOBase:
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _check_parquet(path: str, column: str) -> None:
    try:
        metadata = pq.ParquetFile(path).metadata
    except (OSError, pa.ArrowException) as error:
        raise DataFileError(f"{path}: not a readable parquet file ({error})") from None
    schema = metadata.schema.to_arrow_schema()
    if column not in schema.names:
        raise DataFileError(f"{path}: text column {column!r} not found; columns: {schema.names}")
    kind = schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataFileError(f"{path}: column {column!r} has type {kind}, expected string (datasets would cast it)")
    if metadata.num_rows == 0:
        raise DataFileError(f"{path}: holds no documents")
    index, first_row, blank = schema.get_field_index(column), 0, True
    for group in range(metadata.num_row_groups):
        statistics = metadata.row_group(group).column(index).statistics
        has_text = statistics is None or not statistics.has_min_max or str(statistics.max).strip()
        blank = blank and not has_text
        if statistics is not None and statistics.has_null_count and statistics.null_count:
            raise DataFileError(
                f"{path}: {statistics.null_count} documents without text (null {column!r}) in rows "
                f"{first_row}..{first_row + metadata.row_group(group).num_rows - 1}, expected a string in every row"
            )
        first_row += metadata.row_group(group).num_rows
    if blank:  # the largest text of every row group is empty or whitespace: so is every text
        raise DataFileError(f"{path}: every document's {column!r} is empty or whitespace: nothing to train on")


def _check_json(path: str, column: str) -> None:
    """JSON lines (one object per line), or one JSON array of objects."""
    with _open(path) as file:
        is_array = file.read(4096).lstrip().startswith(b"[")
    records = _json_array(path) if is_array else _json_lines(path)
    empty, blank = True, True
    for place, record in records:
        empty = False
        value = record.get(column) if isinstance(record, dict) else None
        if not isinstance(value, str):
            found = (
                f"{type(value).__name__} {value!r}"[:60] if isinstance(record, dict) and column in record else "none"
            )
            raise DataFileError(f"{path}: {place} has {column!r}: {found}, expected a string")
        blank = blank and not value.strip()
    if empty:
        raise DataFileError(f"{path}: holds no documents")
    if blank:
        raise DataFileError(f"{path}: every document's {column!r} is empty or whitespace: nothing to train on")


def _json_lines(path: str) -> Iterator[tuple[str, object]]:
    for number, line in _lines(path):
        if line.strip():
            try:
                yield f"line {number}", json.loads(line)
            except json.JSONDecodeError as error:
                raise DataFileError(f"{path}: line {number} is not JSON ({error.msg})") from None


def _json_array(path: str) -> Iterator[tuple[str, object]]:
    text = "".join(line for _, line in _lines(path))
    try:
        records = json.loads(text)
    except json.JSONDecodeError as error:
        raise DataFileError(f"{path}: invalid JSON at character {error.pos} ({error.msg})") from None
    return ((f"element {index}", record) for index, record in enumerate(records))


def _check_text(path: str, column: str) -> None:
    """A text file is one document (``sample_by="document"``); it must be non-empty UTF-8."""
    blank = True
    for _, line in _lines(path):  # every line: bad bytes anywhere are an error
        blank = blank and not line.strip()
    if blank:
        raise DataFileError(f"{path}: holds no documents")


def _lines(path: str) -> Iterator[tuple[int, str]]:
    """The file's lines decoded as UTF-8, numbered from 1; bad bytes are named by their offset."""
    offset = 0
    with _open(path) as file:
        for number, raw in enumerate(file, 1):
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as error:
                where = "uncompressed byte" if path.endswith(".gz") else "byte"
                raise DataFileError(
                    f"{path}: invalid UTF-8 at {where} offset {offset + error.start} (line {number}), expected UTF-8 text"
                ) from None
            offset += len(raw)
