"""``blindheads fit --help``: every model option described, the position option naming its valid components and
ready-made stacks, and each group's title a whole sentence. In-process: the model's options are added to a parser as
the CLI adds them (``add_class_arguments``), without building the whole fit parser."""

from __future__ import annotations

import inspect
import re

import pytest
from jsonargparse import ArgumentParser

from blindheads.cli.callback_set import KINDS
from blindheads.datamodules.text import TextData
from blindheads.modules.config import DecoderConfig
from blindheads.modules.lm import DecoderLM
from blindheads.modules.position.base import COMPONENTS
from blindheads.packaged import packaged


@pytest.fixture(scope="module")
def model_help() -> str:
    parser = ArgumentParser(prog="blindheads fit")
    parser.add_class_arguments(DecoderLM, "model")
    return parser.format_help()


def option_helps(text: str) -> dict[str, str]:
    """Each ``--model...`` option's help text, joined into one line."""
    helps: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        match = re.match(r"  (--model[\w.]*)(?:[ ,][^\s].*?)?(?:\s{2,}(.*))?$", line)
        if match:
            name = match[1]
            helps[name] = match[2] or ""
        elif name and line.startswith(" " * 24):
            helps[name] = f"{helps[name]} {line.strip()}".strip()
        else:
            name = None
    return helps


def test_every_model_option_has_a_description(model_help):
    helps = option_helps(model_help)
    options = [name for name in helps if name not in ("--model", "--model.decoder")]  # the config-file options
    assert "--model.lr" in options and "--model.decoder.position" in options and len(options) >= 20
    undescribed = [name for name in options if helps[name].startswith("(type:")]
    assert not undescribed, f"options with only a type and default: {undescribed}"


def test_position_help_names_every_component_and_every_ready_made_stack(model_help):
    position = option_helps(model_help)["--model.decoder.position"]
    stacks = sorted(path.stem for path in packaged("configs/position").glob("*.yaml"))
    assert COMPONENTS and stacks
    listed = set(re.findall(r"\w+", position))
    assert not set(COMPONENTS) - listed, f"components missing from the help: {set(COMPONENTS) - listed}"
    assert not set(stacks) - listed, f"stacks missing from the help: {set(stacks) - listed}"


@pytest.mark.parametrize(
    "cls",
    [
        DecoderLM,
        DecoderConfig,
        TextData,
        *(kind for kind in KINDS.values() if kind.__module__.startswith("blindheads")),
    ],
    ids=lambda cls: cls.__name__,
)
def test_group_title_is_a_whole_sentence(cls):
    """jsonargparse titles a group with the docstring's first line: the first paragraph must be that line alone."""
    first_paragraph = inspect.getdoc(cls).split("\n\n")[0]
    assert "\n" not in first_paragraph, f"{cls.__name__}'s help title would be cut: {first_paragraph!r}"
    assert first_paragraph.endswith((".", ")")), first_paragraph


def test_model_group_titles_in_the_help_are_whole(model_help):
    """The titles shown (jsonargparse drops the final full stop) are the whole first paragraphs."""
    titles = {line[:-1] for line in model_help.splitlines() if line and not line.startswith(" ") and line.endswith(":")}
    assert inspect.getdoc(DecoderLM).split("\n\n")[0].removesuffix(".") in titles, titles
