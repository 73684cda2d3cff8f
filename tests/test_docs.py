"""The docs stay true: every relative link resolves, every config file they name exists, and every ``blindheads``
command line in them parses."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest
from support.runs import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "results/README.md",
         REPO / "benchmarks/README.md"]  # fmt: skip
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
CONFIG = re.compile(r"configs/[\w/.-]+\.yaml")
FENCE = re.compile(r"```(?:bash|console)?\n(.*?)```", re.S)
INLINE = re.compile(r"`(blindheads [^`]+)`")


def commands(page: Path) -> list[str]:
    """The ``blindheads ...`` command lines of the page's code blocks (continuations joined); synopses with
    placeholders (``PATH``, ``<...>``, ``[...]``, ``$s``) are left out."""
    found = []
    for block in FENCE.findall(page.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip().removeprefix("$ ")
            if line.startswith("blindheads "):
                found.append(line)
    return [c for c in found if not re.search(r"[$<\[|]|\.\.\.|[A-Z]{3,}", c)]


def mentions(page: Path) -> list[str]:
    """The subcommand of every ``blindheads X ...`` in inline code."""
    names = [m.split()[1] for m in INLINE.findall(page.read_text()) if len(m.split()) > 1]
    return [name for name in names if not name.isupper()]  # COMMAND: a placeholder


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve_and_named_configs_exist(page):
    text = page.read_text()
    for target in LINK.findall(text):
        if "://" not in target and not target.startswith("mailto:"):
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"
    for config in CONFIG.findall(text):
        assert (REPO / config).exists() or (page.parent / config).exists(), f"{page.name}: no {config}"


def _parse(argv: list[str]) -> None:
    name, rest = argv[0], argv[1:]
    if name in ("fit", "validate", "test"):
        from blindheads.cli.lightning import build_cli

        with pytest.raises(SystemExit) as exit:  # --print_config prints the composed config and exits
            build_cli([name, *rest, "--print_config"])
        assert exit.value.code in (0, None), argv
        return
    if name == "lm_eval":  # lm-evaluation-harness's own parser
        return
    from blindheads.cli import COMMANDS  # each command's module holds its options (parse_args)

    importlib.import_module(COMMANDS[name].module).parse_args(rest)


DOC_COMMANDS = [(page, command) for page in PAGES for command in commands(page)]


@pytest.mark.parametrize("page, command", DOC_COMMANDS, ids=[c for _, c in DOC_COMMANDS])
def test_every_command_in_the_docs_parses(page, command, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    _parse(shlex.split(command)[1:])


def test_the_docs_name_commands_at_all_and_only_real_subcommands():
    from blindheads.cli import COMMANDS

    assert len(DOC_COMMANDS) >= 10
    for page in PAGES:
        unknown = [name for name in mentions(page) if name not in COMMANDS and not name.startswith("-")]
        assert not unknown, f"{page.name} names subcommands that do not exist: {unknown}"


def findings_table(grid: str) -> str:
    """The table of a grid's generated ``findings.md``."""
    written = (REPO / "results" / grid / "findings.md").read_text()
    return "\n".join(line for line in written.splitlines() if line.startswith("|"))


def section(page: Path, title: str) -> str:
    """The text under ``## title`` up to the next ``## `` heading."""
    text = page.read_text()
    assert f"\n## {title}\n" in text, f"{page.name} has no section {title!r}"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("grid", ["recall_by_distance", "in_window"])
def test_the_findings_shown_are_the_ones_the_grid_wrote(grid):
    """The verdicts a reader sees are the grids' ``findings.md``: results/README.md holds each table word for word
    (none typed by hand), and the README links each grid's file and gives one short line per finding it judges."""
    table = findings_table(grid)
    assert table.count("\n") >= 6 and table in (REPO / "results/README.md").read_text()
    decides = section(REPO / "README.md", "What the grid decides")
    assert f"](results/{grid}/findings.md)" in decides
    numbers = re.findall(r"^\| (\d+)\. ", table, re.M)
    lines = [line for line in decides.splitlines() if re.match(r"\d+\. ", line)]
    assert [line.split(".")[0] for line in lines] == numbers, lines
    assert all(len(line) <= 120 for line in lines), [line for line in lines if len(line) > 120]


def test_the_readme_is_a_front_page():
    """At most 200 lines, no table cell over 300 characters; the long reading lives in results/README.md."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    cells = [cell for line in lines if line.startswith("|") for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
    assert cells and max(map(len, cells)) <= 300, max(cells, key=len)
