"""pyproject.toml and environment.yml list the same dependencies; notebooks carry no outputs."""

import json
import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pyproject_requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += extra
    return {r.replace(" ", "") for r in reqs}


def _environment_pip_requirements() -> set[str]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    reqs = set()
    for line in lines[start + 1:]:
        m = re.match(r"^\s+-\s+(.+?)\s*$", line)
        if not m:
            break
        if not m.group(1).startswith("-e"):
            reqs.add(m.group(1).replace(" ", ""))
    return reqs


def test_environment_yml_matches_pyproject():
    py, env = _pyproject_requirements(), _environment_pip_requirements()
    assert py == env, f"only in pyproject: {sorted(py - env)}; only in environment.yml: {sorted(env - py)}"
    assert "-e .[lab,test]" in (ROOT / "environment.yml").read_text()


def test_requirement_parser_sees_every_package():
    names = {_name(r) for r in _pyproject_requirements()}
    for expected in ("torch", "triton", "numpy", "matplotlib", "ipywidgets", "jupyterlab", "pytest", "pytest-xdist",
                     "nbmake", "hypothesis", "ruff"):
        assert expected in names


def test_notebooks_have_no_outputs():
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks, "no notebooks found"
    for path in notebooks:
        nb = json.loads(path.read_text())
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] == "code":
                assert not cell.get("outputs"), f"{path.name} cell {i} has outputs: strip them"
                assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"


def test_notebooks_are_numbered_and_import_the_package():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert re.match(r"^\d\d[a-z]?_[a-z0-9_]+\.ipynb$", path.name), path.name
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        source = "".join("".join(c["source"]) for c in cells)
        assert "import flashattn" in source, f"{path.name} does not import the package"
        assert "sys.path" not in source, f"{path.name} edits sys.path"
        for i, cell in enumerate(cells):  # kernels come from flashattn; exercise stubs and their solutions excepted
            text = "".join(cell["source"])
            exercise = "TODO" in text or "solution" in cell.get("metadata", {}).get("tags", [])
            assert "@triton.jit" not in text or exercise, f"{path.name} code cell {i} pastes a kernel: import it"


def test_readme_opens_with_the_two_commands_and_ci_uses_the_test_one():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", readme, flags=re.S)
    assert blocks and "make lab" in blocks[0] and "make test" in blocks[0]
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_gpu_parts_split_whole_files_evenly_and_always_alike():
    from conftest import split_files

    weights = {"tests/a.py": 300.0, "tests/b.py": 200.0, "tests/c.py": 150.0, "tests/d.py": 100.0, "tests/e.py": 50.0}
    parts = split_files(weights, 2)
    assert sorted(f for part in parts for f in part) == sorted(weights)  # every file once
    assert [sum(weights[f] for f in part) for part in parts] == [400.0, 400.0]
    assert split_files(dict(reversed(weights.items())), 2) == parts  # the order of collection does not matter


def test_xdist_workers_are_pinned_to_their_own_gpu(monkeypatch):
    import conftest

    for worker, visible, expected in (("gw0", "0,1", "0"), ("gw1", "0,1", "1"), ("gw2", "3,5", "3"), ("gw1", "7", "7")):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        conftest._pin_xdist_worker_to_a_gpu()
        assert conftest.os.environ["CUDA_VISIBLE_DEVICES"] == expected
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    conftest._pin_xdist_worker_to_a_gpu()  # not a worker: every GPU stays visible
    assert conftest.os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_the_readme_names_every_module_of_the_package():
    """README.md's package section is kept against the tree: every module file is named in it (by its file name,
    under its folder's entry), and it names no module that is gone."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## The package"):readme.index("Adding a variant")]
    tree = section[section.index("```") + 3:section.index("```", section.index("```") + 3)]
    package = ROOT / "flashattn"
    subpackages = sorted(p.parent.name for p in package.glob("*/__init__.py"))
    missing = [f for f in subpackages if f"  {f}/" not in tree]
    assert not missing, f"README.md's package section has no entry for {missing}"
    starts = sorted((tree.index(f"  {f}/"), f) for f in subpackages)
    folders = {"": tree[:starts[0][0]] + "".join(  # the top-level modules are listed before and between folders
        line for line in tree.splitlines(True) if re.match(r"^  [a-z_]+\.py", line))}
    for i, (start, folder) in enumerate(starts):
        folders[folder] = tree[start:starts[i + 1][0] if i + 1 < len(starts) else len(tree)]
    named = set(re.findall(r"\b([a-z_0-9]+\.py)\b", tree))
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] in ("exercises",) or rel.name == "__init__.py" or "measurements" in rel.parts:
            continue  # described by their folder's entry
        folder = rel.parts[0] if len(rel.parts) > 1 else ""
        assert rel.name in folders[folder], f"README.md's package section does not name flashattn/{rel}"
    existing = {p.name for p in package.rglob("*.py")}
    assert named <= existing, f"README.md names modules that do not exist: {sorted(named - existing)}"
