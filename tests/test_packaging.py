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
    for expected in ("torch", "triton", "numpy", "matplotlib", "ipywidgets", "jupyterlab", "pytest", "nbmake",
                     "hypothesis", "ruff"):
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
        assert re.match(r"^\d\d_[a-z0-9_]+\.ipynb$", path.name), path.name
        cells = json.loads(path.read_text())["cells"]
        source = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        assert "import flashattn" in source, f"{path.name} does not import the package"
        assert "sys.path" not in source, f"{path.name} edits sys.path"
        assert "@triton.jit" not in source, f"{path.name} pastes a kernel: import it from flashattn"


def test_readme_opens_with_the_two_commands_and_ci_uses_the_test_one():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", readme, flags=re.S)
    assert blocks and "make lab" in blocks[0] and "make test" in blocks[0]
    assert "make test" in (ROOT / ".ci" / "run").read_text()
