"""What a checkpoint's stream position refers to: the files, their order and contents, and how they are cut.

A resume restores "document n of stream k"; that only means the same thing if the file list, the files themselves,
the shuffle seed, the held-out split, the tokenizer and the window length are the same. The fingerprint records them
cheaply (name, size and a hash of each local file's first and last MiB; remote files by path) so a resume can
name what changed instead of silently re-reading or skipping documents.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

SAMPLE = 2**20  # bytes hashed at each end of a local file


def _describe(path: str) -> dict[str, Any]:
    if "://" in path or not os.path.exists(path):
        return {"name": path}
    size = os.path.getsize(path)
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        digest.update(file.read(SAMPLE))
        if size > SAMPLE:
            file.seek(max(SAMPLE, size - SAMPLE))
            digest.update(file.read(SAMPLE))
    return {"name": os.path.basename(path), "size": size, "sha256_ends": digest.hexdigest()[:16]}


def fingerprint(train: tuple[str, ...], validation: tuple[str, ...], **settings: Any) -> dict[str, Any]:
    """The training and held-out files (in order) and the settings that decide how they become windows."""
    return {"train": [_describe(f) for f in train], "validation": [_describe(f) for f in validation], **settings}


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
