"""The remote code of an exported model: the package's own modules, copied flat into the model's folder with their
imports made relative, so transformers loads it with ``trust_remote_code=True`` and no blindheads installed.

transformers copies a remote modeling file and the files it imports relatively (``from .name import ...``, one
folder, no subpackages), and refuses a file that imports a package that is not installed. So each module the entry
module needs, directly or not, is written as one file named after its dotted path (``blindheads.modules.decoder``
-> ``blindheads_modules_decoder.py``; a package's ``__init__`` under the package's name), its ``from blindheads.X
import NAMES`` lines made ``from .blindheads_X import NAMES``. Nothing else is changed, so the shipped model is the
package's code, not a second copy; a module whose imports cannot be rewritten so (``import blindheads...``, a module
imported as a name, a relative import) is refused, naming the line.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import blindheads

PACKAGE = "blindheads"
ENTRY = "blindheads.export.modeling"  # BlindheadsConfig and BlindheadsForCausalLM
HEADER = "# {module}, from blindheads {version} (its imports made relative by blindheads.export.remote).\n"


def flat_name(module: str) -> str:
    """The file stem a module is shipped under: its dotted path with dots made underscores."""
    return module.replace(".", "_")


def _is_ours(module: str | None) -> bool:
    return module is not None and module.split(".")[0] == PACKAGE


def relative_imports(source: str, where: str) -> tuple[str, list[str]]:
    """``source`` with each ``from blindheads.X import NAMES`` made ``from .blindheads_X import NAMES``, and the
    modules it imports so. ``where`` names the source in the one-line refusal of an import that cannot be made so."""
    lines = source.split("\n")  # as ast numbers them (str.splitlines also splits at form feeds)
    imported = []
    nodes = [node for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.Import, ast.ImportFrom))]
    for node in sorted(nodes, key=lambda node: (node.lineno, node.col_offset), reverse=True):  # offsets stay valid
        line = f"{where}, line {node.lineno}"
        if isinstance(node, ast.Import):
            if any(_is_ours(alias.name) for alias in node.names):
                raise ValueError(f"{line}: 'import {PACKAGE}...' cannot be shipped; write 'from MODULE import NAMES'")
            continue
        if node.level:
            raise ValueError(f"{line}: a relative import cannot be shipped; import from the absolute module")
        if not _is_ours(node.module):
            continue
        assert node.module is not None  # _is_ours
        target = importlib.import_module(node.module)
        modules = [alias.name for alias in node.names if isinstance(getattr(target, alias.name, None), ModuleType)]
        if modules:
            raise ValueError(f"{line}: imports module {modules[0]} as a name; import the names it needs from it")
        text = lines[node.lineno - 1]
        head = re.compile(rf"from\s+{re.escape(node.module)}(?=\s)").match(text, node.col_offset)
        if head is None:
            raise ValueError(f"{line}: 'from {node.module}' is split over lines; keep it on one")
        lines[node.lineno - 1] = f"{text[: node.col_offset]}from .{flat_name(node.module)}{text[head.end() :]}"
        imported.append(node.module)
    return "\n".join(lines), sorted(set(imported))


def remote_code(entry: str = ENTRY) -> dict[str, str]:
    """File name -> text of ``entry`` and every package module it imports, directly or not, imports made relative."""
    files: dict[str, str] = {}
    shipped: dict[str, str] = {}  # file name -> module, to refuse two modules of one flat name
    todo = [entry]
    while todo:
        module = todo.pop()
        name = f"{flat_name(module)}.py"
        if shipped.setdefault(name, module) != module:
            raise ValueError(f"modules {shipped[name]} and {module} would both be shipped as {name}")
        if name in files:
            continue
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module  # imported by the package itself
        text, imported = relative_imports(Path(spec.origin).read_text(), module)
        files[name] = HEADER.format(module=module, version=blindheads.__version__) + text
        todo.extend(imported)
    return files
