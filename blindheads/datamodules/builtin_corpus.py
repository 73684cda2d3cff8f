"""An offline English corpus assembled from text every Python installation ships: the standard library's
docstrings (read with ``ast``, nothing is imported) and the language reference topics of ``pydoc_data``.

The corpus is the same on every machine with the same Python version. It is written once, atomically, as parquet
shards in FineWeb-Edu's ``text``/``id`` columns, so the builtin source is read by the same code as local files.
The last shard is held out, so a shard lost from the cache would shift the split onto trained text: a manifest
records every shard's size and hash, and a missing or changed shard rebuilds the whole corpus (logged).
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from blindheads.datamodules.cache import cache_folder, check_made, mark
from blindheads.datamodules.fingerprint import sha256_of

log = logging.getLogger(__name__)

SKIPPED_PACKAGES = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo"}
MIN_CHARS = 400
MANIFEST = "manifest.json"


def _module_text(path: Path) -> str:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return ""
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docstrings = (ast.get_docstring(node) for node in ast.walk(tree) if isinstance(node, kinds))
    return "\n\n".join(doc for doc in docstrings if doc)


def builtin_documents() -> list[tuple[str, str]]:
    """``(id, text)`` pairs in a fixed order: one per standard-library module, one per pydoc topic."""
    from pydoc_data.topics import topics

    root = Path(sysconfig.get_paths()["stdlib"])
    documents = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if SKIPPED_PACKAGES & set(relative.parts[:-1]) or relative.name.startswith("test_"):
            continue
        text = _module_text(path)
        if len(text) >= MIN_CHARS:
            documents.append((f"stdlib/{relative.as_posix()}", text))
    documents += [(f"pydoc/{name}", text) for name, text in sorted(topics.items()) if len(text) >= MIN_CHARS]
    return documents


def builtin_corpus_dir(cache_dir: str | Path) -> Path:
    return Path(cache_dir) / f"builtin-corpus-py{sys.version_info.major}.{sys.version_info.minor}"


def write_builtin_corpus(cache_dir: str | Path, num_shards: int = 8) -> list[Path]:
    """The corpus as ``num_shards`` parquet files (documents dealt round-robin), in the manifest's order; written
    once, atomically, and rebuilt whole when a shard is missing or changed."""
    target = cache_folder(builtin_corpus_dir(cache_dir), "the builtin corpus")
    damage = _damage(target)
    if damage:
        if target.exists():
            check_made(target, "the builtin corpus", damage)  # anyone's folder is never moved aside and removed
            log.warning(f"the builtin corpus in {target} {damage}: rebuilding it (the same documents and split)")
        _build(target, num_shards)
    return [target / name for name in json.loads((target / MANIFEST).read_text())]


def _damage(target: Path) -> str | None:
    """What is wrong with the corpus in ``target`` (``None``: every shard the manifest lists is there, unchanged)."""
    try:
        manifest = json.loads((target / MANIFEST).read_text())
    except (OSError, ValueError):
        return "has no readable manifest (written by an older version, or damaged)" if target.exists() else "is missing"
    for name, recorded in manifest.items():
        path = target / name
        if not path.is_file():
            return f"lost its shard {name}"
        if sha256_of(path) != recorded:
            return f"holds a changed shard {name}"
    return None


def _build(target: Path, num_shards: int) -> None:
    """Write the shards and their manifest in a staging folder, then move it into place; a damaged corpus is moved
    aside first. Processes that rebuild at once write the same files: the first to finish wins."""
    target.parent.mkdir(parents=True, exist_ok=True)
    documents = builtin_documents()
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    manifest = {}
    for shard in range(num_shards):
        ids, texts = zip(*documents[shard::num_shards])
        name = f"shard-{shard:05d}.parquet"
        pq.write_table(pa.table({"text": list(texts), "id": list(ids)}), staging / name)
        manifest[name] = sha256_of(staging / name)
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
    mark(staging)
    damaged = Path(tempfile.mkdtemp(dir=target.parent, prefix=".damaged-"))
    with contextlib.suppress(FileNotFoundError):  # nothing there, or another process moved it first
        os.rename(target, damaged / target.name)
    try:
        os.rename(staging, target)
    except OSError:  # another process finished first: its corpus is the same
        shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(damaged, ignore_errors=True)
