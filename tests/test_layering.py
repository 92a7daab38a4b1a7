"""The package's layers (issue 15): imports point from teaching down to the kernels, never back up, and every
list of variants comes from the registry.

    teaching, exercises  ->  measure, bench, record  ->  models  ->  kernels, functional, distributed  ->  runtime,
    validate, reference
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "flashattn"
LAYERS = {  # module path prefix -> layer (a module may import its own layer and those below)
    "flashattn.runtime": 0, "flashattn.validate": 0, "flashattn.reference": 0,
    "flashattn.kernels": 1, "flashattn.functional": 1, "flashattn.distributed": 1,
    "flashattn.masking": 1, "flashattn.masking_gluon": 1, "flashattn.ops": 1,
    "flashattn.models": 2,
    "flashattn.measure": 3, "flashattn.bench": 3, "flashattn.record": 3,
    "flashattn.teaching": 4, "flashattn.exercises": 4,
}


def layer(module: str) -> int | None:
    match = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len, default=None)
    return None if match is None else LAYERS[match]


def imports(path: Path, module: str) -> set[str]:
    """Every flashattn module ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                parts = module.split(".")[: len(module.split(".")) - node.level + (path.name == "__init__.py")]
                base = ".".join(parts + ([base] if base else []))
            found |= {f"{base}.{a.name}" for a in node.names} | {base}
    return {name for name in found if name.startswith("flashattn")}


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name not in ("__init__.py", "__main__.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    module = ".".join(("flashattn", *path.relative_to(PACKAGE).with_suffix("").parts))
    own = layer(module)
    assert own is not None, f"{module} is in no layer: add it to LAYERS"
    upward = sorted(name for name in imports(path, module) if (layer(name) or 0) > own)
    assert not upward, f"{module} (layer {own}) imports from a higher layer: {upward}"


def test_lists_of_variants_come_from_the_registry():
    """No module outside the kernels spells out the course's variant names as a list (the registry does)."""
    spelled = ("v2_kt_view", "v2_padded")  # any hand-written list of variants names these two
    offenders = []
    for path in MODULES:
        if path.parent.name == "kernels":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                values = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                if set(spelled) <= values:
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not offenders, f"hand-written lists of variants: {offenders}"
