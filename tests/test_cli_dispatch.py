"""The ``blindheads`` command answers at once: the dispatcher names each command's module and imports it only when
that command runs, so ``--help`` loads no torch and the calculator none of Lightning and its company. What a command
loads is read from ``sys.modules`` of a fresh interpreter (the process's imports are what is tested)."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from blindheads.cli import COMMANDS, LISTED, help_text

PACKAGE = Path(__file__).resolve().parents[1] / "blindheads"
HEAVY = ("torch", "lightning", "datasets", "transformers", "tensorboard", "torchmetrics", "pandas", "matplotlib")
# Runs the command in this interpreter, then writes which of HEAVY it loaded as the last line of stderr.
LOADED = """
import json, sys
from blindheads.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(name for name in {heavy} if name in sys.modules)), file=sys.stderr)
"""


def loaded_by(*argv: str) -> set[str]:
    result = subprocess.run([sys.executable, "-c", LOADED.format(heavy=HEAVY), *argv], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    return set(json.loads(result.stderr.strip().splitlines()[-1]))


def test_help_loads_none_of_the_heavy_packages():
    assert loaded_by("--help") == set()


def test_an_unknown_command_loads_none_of_the_heavy_packages():
    assert loaded_by("no-such-command") == set()


def test_the_calculator_loads_torch_but_not_lightning_or_the_data_packages():
    loaded = loaded_by("blindness", "--heads", "16", "--context", "2048")
    assert "torch" in loaded
    assert not loaded & {"lightning", "datasets", "transformers", "tensorboard", "torchmetrics"}, loaded


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_names_a_function_of_its_own_module_in_the_cli_package(name):
    """One rule for all: ``blindheads.cli.MODULE:FUNCTION``, found without importing it."""
    command = COMMANDS[name]
    module, _, function = command.target.partition(":")
    assert module.startswith("blindheads.cli.") and command.module == module
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, f"{name}: no module {module}"
    defined = {node.name for node in ast.parse(Path(spec.origin).read_text()).body if isinstance(node, ast.FunctionDef)}
    assert function in defined, f"{name}: {module} defines no {function}"


def test_help_lists_each_public_command_once_in_aligned_columns_and_hides_internal_ones():
    lines = help_text().splitlines()
    listed = [line for line in lines if line.startswith("  ")]
    assert [line.split()[0] for line in listed] == LISTED
    assert "conjecture-arm" in COMMANDS and "conjecture-arm" not in LISTED
    assert "conjecture-arm" not in help_text()
    columns = {len(line) - len(line[2:].split(" ", 1)[1].lstrip()) for line in listed}
    assert len(columns) == 1, "summaries start in one column"
