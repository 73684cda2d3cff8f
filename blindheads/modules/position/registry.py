"""Build a position stack from a short spec (``"alibi(wide)+clamp+log_distance"``) or from YAML entries.

Components register themselves under their ``name`` (``base``) when their module is imported; the package's
``__init__`` imports every builtin one (a test checks that none is left out), with plain imports an exported model's
remote code can copy. A YAML entry is a short spec string, ``{name: {kwargs}}``, or
``{class_path: ..., init_args: {...}}``. Facts the model knows (``num_heads``, ``context_length``, the training
``dtype`` and ``threshold`` mode) are passed to every component whose constructor takes them, unless the spec sets
them.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import sys
from typing import Any

from blindheads.modules.position.base import COMPONENTS, PositionComponent, PositionStack, finite_range, not_finite_in

BUILTIN_PACKAGE = "blindheads.modules.position"
POSITION_MODULES = "BLINDHEADS_POSITION_MODULES"  # extra modules a class_path may import, named on purpose

PositionSpec = str | list[str | dict[str, Any]]

_TERM = re.compile(r"^\s*(?P<name>\w+)\s*(?:\((?P<args>.*)\))?\s*$")


def valid_names() -> str:
    return ", ".join(sorted(COMPONENTS))


def _value(text: str) -> Any:
    """A Python literal; ``nan`` and ``inf`` as the floats they name (so a component refuses them as numbers);
    anything else as the text."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        pass
    try:
        return float(text) if text.strip().lstrip("+-").lower() in ("nan", "inf", "infinity") else text
    except ValueError:
        return text


def _split_top_level(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside brackets, so ``alibi([0.5, 0.25])+clamp`` splits in two."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += char in "([{"
        depth -= char in ")]}"
        if char == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def parse_term(term: str) -> tuple[str, list[Any], dict[str, Any]]:
    """``"soft_cap(20, where=before)"`` -> ``("soft_cap", [20], {"where": "before"})``."""
    match = _TERM.match(term)
    if not match:
        raise ValueError(f"cannot parse position component {term!r}; expected NAME or NAME(ARGS)")
    args, kwargs = [], {}
    for arg in _split_top_level(match["args"] or "", ","):
        if not arg.strip():
            continue
        key, eq, value = arg.partition("=")
        if eq and key.strip().isidentifier():
            kwargs[key.strip()] = _value(value.strip())
        else:
            args.append(_value(arg.strip()))
    return match["name"], args, kwargs


def importable_modules() -> list[str]:
    """The modules a ``class_path`` may import: the builtin components' package, the modules named in
    ``BLINDHEADS_POSITION_MODULES`` (comma-separated) and any the program imported itself. A config file, such as
    an exported model's ``config.json`` loaded with ``trust_remote_code``, cannot add to them."""
    named = [m.strip() for m in os.environ.get(POSITION_MODULES, "").split(",") if m.strip()]
    return [BUILTIN_PACKAGE, *named]


def _module_allowed(module: str) -> bool:
    return module in sys.modules or any(module == m or module.startswith(f"{m}.") for m in importable_modules())


def _component_class(name: str) -> type[PositionComponent]:
    if "." in name:
        module, _, attr = name.rpartition(".")
        if not _module_allowed(module):
            raise ValueError(
                f"class_path {name!r}: module {module!r} is not imported and not named in {POSITION_MODULES}; "
                f"position components come from {', '.join(importable_modules())} (set {POSITION_MODULES}={module} "
                "to allow it on purpose)"
            )
        cls = getattr(importlib.import_module(module), attr, None)
        if not (isinstance(cls, type) and issubclass(cls, PositionComponent)):
            raise ValueError(f"class_path {name!r} is not a PositionComponent")
        return cls
    if name not in COMPONENTS:
        raise ValueError(f"unknown position component {name!r}; valid: {valid_names()}")
    return COMPONENTS[name]


def _instantiate(name: str, args: list, kwargs: dict, model_facts: dict[str, Any]) -> PositionComponent:
    cls = _component_class(name)
    accepted = inspect.signature(cls).parameters
    facts = {k: v for k, v in model_facts.items() if k in accepted and k not in kwargs}
    try:
        component = cls(*args, **kwargs, **facts)
    except TypeError as error:
        valid = [p for p in accepted if p not in model_facts]
        raise ValueError(f"bad arguments for position component {name!r}: {error}; it takes {valid}") from None
    check_tensors(component, _term(name, args, kwargs), kwargs.get("dtype", model_facts.get("dtype")))
    return component


def _term(name: str, args: list, kwargs: dict) -> str:
    """``soft_cap(20, where='before')``: an entry as a spec writes it, for refusals."""
    return f"{name}({', '.join([*map(repr, args), *(f'{k}={v!r}' for k, v in kwargs.items())])})"


def check_tensors(component: PositionComponent, term: str, dtype: str | None) -> None:
    """Every number a component holds as a tensor (slopes, learned tables, MLP weights) finite in float32 and in
    the training ``dtype`` (``not_finite_in``), whatever option made it: ``t5_buckets(init_std=1e38)`` draws a table
    with entries beyond float32's range, which no single option's check sees."""
    tensors = [*component.named_parameters(), *component.named_buffers()]
    for label, tensor in tensors:
        if tensor.is_floating_point() and not tensor.is_meta and (where := not_finite_in(tensor, dtype)) is not None:
            raise ValueError(f"position component {term}: its {label} is not finite in {finite_range(where)}; "
                             "give it smaller values")  # fmt: skip


def _entries(spec: PositionSpec) -> list[tuple[str, list, dict]]:
    if isinstance(spec, str):
        return [parse_term(term) for term in _split_top_level(spec, "+")]
    entries = []
    for item in spec:
        if isinstance(item, str):
            entries.extend(_entries(item))
        elif isinstance(item, dict) and "class_path" in item:
            entries.append((item["class_path"], [], dict(item.get("init_args") or {})))
        elif isinstance(item, dict) and len(item) == 1:
            ((name, kwargs),) = item.items()
            entries.append((name, [], dict(kwargs or {})))
        else:
            raise ValueError(f"cannot read position entry {item!r}; use 'NAME(ARGS)', {{NAME: {{...}}}} or class_path")
    return entries


def builtin_names(spec: PositionSpec) -> PositionSpec:
    """``spec`` with each ``class_path`` entry written ``{name: init_args}``, the form that names no module (an
    exported model's remote code holds copies of the builtin components, not this package); a component from
    elsewhere is refused, as that code cannot hold it."""
    if isinstance(spec, str):
        return spec
    entries: list[str | dict[str, Any]] = []
    for item in spec:
        if isinstance(item, dict) and "class_path" in item:
            cls = _component_class(item["class_path"])
            if not cls.__module__.startswith(f"{BUILTIN_PACKAGE}.") or COMPONENTS.get(cls.name) is not cls:
                raise ValueError(
                    f"position component {item['class_path']!r} is not a builtin ({valid_names()}): a model "
                    "exported with remote code can hold only those"
                )
            item = {cls.name: dict(item.get("init_args") or {})}
        entries.append(item)
    return entries


def build_position(
    spec: PositionSpec, num_heads: int, context_length: int, dtype: str = "bfloat16", threshold: str = "normal"
) -> PositionStack:
    """The position stack for ``spec``, for a model with ``num_heads`` heads trained on ``context_length`` tokens
    with attention in ``dtype`` on kernels of the given ``threshold`` mode."""
    facts = {"num_heads": num_heads, "context_length": context_length, "dtype": dtype, "threshold": threshold}
    entries = _entries(spec)
    names = [name for name, _, _ in entries]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"position spec {spec!r} names {', '.join(twice)} twice; a stack takes each component once")
    components = [_instantiate(name, args, kwargs, facts) for name, args, kwargs in entries]
    if not components:
        raise ValueError(f"empty position spec {spec!r}; valid components: {valid_names()}")
    return PositionStack(components, num_heads)
