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


@pytest.mark.parametrize("page", ["README.md", "results/README.md"])
@pytest.mark.parametrize("grid", ["recall_by_distance", "in_window"])
def test_the_findings_shown_are_the_ones_the_grid_wrote(page, grid):
    """The verdicts a reader sees are the grids' ``findings.md`` tables, word for word: none typed by hand."""
    written = (REPO / "results" / grid / "findings.md").read_text()
    table = "\n".join(line for line in written.splitlines() if line.startswith("|"))
    assert table.count("\n") >= 6 and table in (REPO / page).read_text()
