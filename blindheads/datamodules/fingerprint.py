"""What a checkpoint's stream position refers to: the files, their order and contents, and how they are cut.

A resume restores "document n of stream k"; that only means the same thing if the file list, the files themselves,
the shuffle seed, the held-out split, the tokenizer and the window length are the same. The fingerprint records
them (name, size and the SHA-256 of each whole local file; remote files by path) so a resume can name what changed
instead of silently re-reading or skipping documents. Hashing costs about 2.5 s per GiB of local data (measured on
2 shared cores, files in the page cache), once per process: a file's hash is kept while its size and mtime stay.

Checkpoints written before whole-file hashes recorded a hash of each file's first and last MiB (``sha256_ends``);
they are compared by that older hash, which cannot see a change elsewhere in a file.
"""

from __future__ import annotations

import functools
import hashlib
import os
from typing import Any

CHUNK = 2**20  # bytes read at a time while hashing
ENDS = 2**20  # bytes hashed at each end of a file by the older scheme


def sha256_of(path: str | os.PathLike) -> str:
    """The SHA-256 of the whole file, read in chunks (memory stays small for any file size)."""
    stat = os.stat(path)
    return _sha256(os.fspath(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4096)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _sha256_ends(path: str, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        digest.update(file.read(ENDS))
        if size > ENDS:
            file.seek(max(ENDS, size - ENDS))
            digest.update(file.read(ENDS))
    return digest.hexdigest()[:16]


def _describe(path: str, ends_only: bool) -> dict[str, Any]:
    if "://" in path or not os.path.exists(path):
        return {"name": path}
    size = os.path.getsize(path)
    described = {"name": os.path.basename(path), "size": size}
    if ends_only:
        return {**described, "sha256_ends": _sha256_ends(path, size)}
    return {**described, "sha256": sha256_of(path)}


def fingerprint(
    train: tuple[str, ...], validation: tuple[str, ...], *, ends_only: bool = False, **settings: Any
) -> dict[str, Any]:
    """The training and held-out files (in order) and the settings that decide how they become windows;
    ``ends_only``: hashed as checkpoints before whole-file hashes were, to compare with one of them."""
    return {
        "train": [_describe(f, ends_only) for f in train],
        "validation": [_describe(f, ends_only) for f in validation],
        **settings,
    }


def hashes_ends_only(recorded: dict[str, Any]) -> bool:
    """Whether a checkpoint's fingerprint hashed only each file's first and last MiB (the older scheme)."""
    return any("sha256_ends" in f for split in ("train", "validation") for f in recorded.get(split, []))


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What changed between the checkpoint's data and this run's, one phrase each; empty when nothing did."""
    found = []
    for split in ("train", "validation"):
        before, after = old.get(split, []), new.get(split, [])
        if before == after:
            continue
        names_before, names_after = [f["name"] for f in before], [f["name"] for f in after]
        added = [n for n in names_after if n not in names_before]
        removed = [n for n in names_before if n not in names_after]
        changed = [a["name"] for a in after for b in before if a["name"] == b["name"] and a != b]
        moved = not (added or removed) and names_before != names_after
        parts = [
            f"added {added}" * bool(added),
            f"removed {removed}" * bool(removed),
            f"changed (size or contents) {changed}" * bool(changed),
            "reordered" * moved,
        ]
        found.append(f"{split} files: " + ", ".join(p for p in parts if p))
    for key in sorted((set(old) | set(new)) - {"train", "validation"}):
        if old.get(key) != new.get(key):
            found.append(f"{key}: {old.get(key)!r} -> {new.get(key)!r}")
    return found


def data_changed(changed: list[str]) -> str:
    """The one-line refusal of a resume into changed data (``changed``: ``differences``' phrases)."""
    return (
        f"the data changed since the checkpoint: {'; '.join(changed)}. Resuming would re-read or skip documents; "
        "restore the data, or pass --data.accept_data_change true to go on"
    )


def accepted_change(changed: list[str]) -> str:
    """The warning of a resume into changed data that ``accept_data_change`` lets go on."""
    return (
        f"resuming into changed data (accept_data_change): {'; '.join(changed)}. The restored position counts "
        "documents of the old file list, so documents may be read twice or never, and a changed held-out split may "
        "have been trained on: this run is not the uninterrupted run"
    )
