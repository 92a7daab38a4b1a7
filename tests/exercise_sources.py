"""The exercises' stubs and worked solutions, read from the notebooks where the learner sees them, and mutated copies.

A worked solution lives in a notebook cell tagged ``solution``, the stub in a code cell before it
(``definitions`` finds each function by name in the notebook's code cells).

Triton reads the source of every ``@triton.jit`` function from a file, so a solution (or a mutant of it)
is written to a module file and imported from there (``load``).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# flashattn first: it sets TRITON_INTERPRET before Triton is imported when there is no GPU
HEADER = ("import flashattn  # noqa: F401\n\nimport math  # noqa: F401\n\nimport torch  # noqa: F401\n"
          "import triton  # noqa: F401\nimport triton.language as tl  # noqa: F401\n\n\n")


def code_cells(notebook: str) -> list[str]:
    """The code cells (solutions included) of notebooks/<notebook>.ipynb."""
    nb = json.loads((ROOT / "notebooks" / f"{notebook}.ipynb").read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def definitions(notebook: str, names: tuple[str, ...]) -> str:
    """The source of the top-level functions ``names`` (decorators included), each from the first cell
    that defines it."""
    found = {}
    for cell in code_cells(notebook):
        try:
            tree = ast.parse(cell)
        except SyntaxError:
            continue
        lines = cell.splitlines()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in names and node.name not in found:
                first = min([d.lineno for d in node.decorator_list] + [node.lineno])
                found[node.name] = "\n".join(lines[first - 1:node.end_lineno])
    missing = [n for n in names if n not in found]
    if missing:
        raise LookupError(f"{notebook}: no cell defines {', '.join(missing)}")
    return "\n\n\n".join(found[n] for n in names) + "\n"


def load(source: str, directory: Path, module_name: str):
    """Write HEADER + source to ``directory/module_name.py`` and import it."""
    path = Path(directory) / f"{module_name}.py"
    path.write_text(HEADER + source)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def mutate(source: str, old, new) -> str:
    """Replace the one occurrence of ``old`` by ``new`` (or of each in a tuple, in turn); a mutation whose
    text is missing or ambiguous is an error in the table, never a mutant that changes nothing."""
    olds, news = (old, new) if isinstance(old, tuple) else ((old,), (new,))
    for o, n in zip(olds, news, strict=True):
        count = source.count(o)
        if count != 1:
            raise ValueError(f"the mutation expects exactly one {o!r} in the solution, found {count}")
        source = source.replace(o, n)
    return source
