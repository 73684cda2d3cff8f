"""The suite's own shape: test modules import shared code from ``support`` only, never from one another."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in the file (function-level imports included), by full name."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_test_module_imports_another_and_support_imports_no_test():
    sources = [*TESTS.glob("*.py"), *(TESTS / "support").glob("*.py")]
    local = {path.stem for path in TESTS.glob("*.py")}  # test modules and conftest: importable as top-level names
    found = {
        f"{path.relative_to(TESTS)} imports {name}"
        for path in sources
        for name in imported_modules(path)
        if name.split(".")[0] in local
    }
    assert len(sources) > 40 and "test_datamodule" in local  # the scan sees the suite
    assert not found, "shared test code belongs in tests/support/: " + "; ".join(sorted(found))


def test_the_scan_finds_an_import_of_a_test_module(tmp_path):
    module = tmp_path / "test_example.py"
    module.write_text("def f():\n    from test_datamodule import take\nimport support.runs\n")
    assert imported_modules(module) == {"test_datamodule", "support.runs"}
