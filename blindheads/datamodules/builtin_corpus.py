"""An offline English corpus assembled from text every Python installation ships: the standard library's
docstrings (read with ``ast``, nothing is imported) and the language reference topics of ``pydoc_data``.

The corpus is the same on every machine with the same Python version. It is written once, atomically, as parquet
shards in FineWeb-Edu's ``text``/``id`` columns, so the builtin source is read by the same code as local files.
"""

from __future__ import annotations

import ast
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SKIPPED_PACKAGES = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo"}
MIN_CHARS = 400


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
    """The corpus as ``num_shards`` parquet files (documents dealt round-robin); written once, atomically."""
    target = builtin_corpus_dir(cache_dir)
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        documents = builtin_documents()
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
        for shard in range(num_shards):
            ids, texts = zip(*documents[shard::num_shards])
            table = pa.table({"text": list(texts), "id": list(ids)})
            pq.write_table(table, staging / f"shard-{shard:05d}.parquet")
        try:
            os.rename(staging, target)
        except OSError:  # another process finished first: its corpus is the same
            shutil.rmtree(staging, ignore_errors=True)
    return sorted(target.glob("*.parquet"))
