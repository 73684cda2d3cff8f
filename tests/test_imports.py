"""The package's floors: a module imports only from its own floor or lower ones, and no two parts import each other
(directly or round a loop). An arrow back up would make a low part load the CLI or the experiments with it, and a
loop makes what imports first decide what works."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "blindheads"

# Lowest first. A part is a top-level module or a subpackage of blindheads.
FLOORS = [
    {
        "blindheads",
        "atomic",
        "disk",
        "packaged",
        "running",
        "signals",
        "arguments",
        "numerics",
        "prompt_texts",
        "prompt_layout",
    },  # nothing of the project below them
    {"locks", "modules"},
    {"blindness"},
    {"datamodules"},
    {"checkpoints"},
    {"export"},  # the Hugging Face folders: read back by the lm-eval adapter and the probes
    {"evaluation"},
    {"analysis", "callbacks", "runs"},
    {"experiments", "probes"},
    {"cli", "__main__"},
]


def part(module: str) -> str:
    """``blindheads.cli.lightning`` -> ``cli``; ``blindheads`` -> ``blindheads`` (the package's ``__init__``)."""
    names = module.split(".")
    return names[1] if len(names) > 1 else names[0]


def import_graph(package: Path = PACKAGE) -> dict[tuple[str, str], set[str]]:
    """Each arrow (part, a part one of its modules imports, anywhere in the file: inside functions too) -> the files
    that draw it."""
    arrows: dict[tuple[str, str], set[str]] = {}
    for path in package.rglob("*.py"):
        source = part(".".join(path.relative_to(package.parent).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "blindheads":
                modules = [f"blindheads.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules = [node.module]
            else:
                continue
            for target in (part(m) for m in modules if m == "blindheads" or m.startswith("blindheads.")):
                arrows.setdefault((source, target), set()).add(path.name)
    return {arrow: files for arrow, files in arrows.items() if arrow[0] != arrow[1]}


def floor(name: str) -> int:
    return next(i for i, parts in enumerate(FLOORS) if name in parts)


def test_every_part_is_on_a_floor_and_imports_only_its_floor_or_lower():
    arrows = import_graph()
    unplaced = sorted({name for arrow in arrows for name in arrow} - set().union(*FLOORS))
    assert not unplaced, f"put each of {unplaced} on a floor in FLOORS"
    up = [
        f"{source} -> {target} ({', '.join(sorted(files))})"
        for (source, target), files in arrows.items()
        if floor(target) > floor(source)
    ]
    assert not up, "imports from a higher floor: " + "; ".join(up)


def loop_in(arrows) -> list[str] | None:
    """Parts that import each other round a loop, first one last too; None where there is no loop."""
    graph: dict[str, set[str]] = {}
    for source, target in arrows:
        graph.setdefault(source, set()).add(target)
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as error:
        return error.args[1]
    return None


def test_no_parts_import_each_other_round_a_loop():
    loop = loop_in(set(import_graph()))
    assert loop is None, f"parts that import each other: {' -> '.join(loop)}"


def test_the_graph_sees_imports_inside_functions_and_their_loops(tmp_path):
    """A lazy import (inside a function) draws an arrow like any other, so a loop through one is found."""
    package = tmp_path / "blindheads"
    (package / "low").mkdir(parents=True)
    (package / "low" / "a.py").write_text("def f():\n    from blindheads.high import b\n")
    (package / "high.py").write_text("import blindheads.low.a\n")
    assert import_graph(package) == {("low", "high"): {"a.py"}, ("high", "low"): {"high.py"}}
    assert set(loop_in(import_graph(package))) == {"low", "high"}
