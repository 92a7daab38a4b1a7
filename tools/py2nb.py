"""Build a notebook from a percent-format script (authoring aid; the .ipynb is what is committed).

    python tools/py2nb.py source.py notebooks/NN_name.ipynb

Cell markers: ``# %%`` code, ``# %% [markdown]`` markdown (each line starts with ``# ``),
``# %% [solution]`` a code cell shown collapsed in JupyterLab (a worked solution).
Outputs are empty; the kernel is the environment's ``python3``.
"""

import sys

import nbformat


def convert(text: str):
    cells, kind, lines = [], None, []

    def flush():
        if kind is None:
            return
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in body.splitlines())
            cells.append(nbformat.v4.new_markdown_cell(body))
        else:
            cell = nbformat.v4.new_code_cell(body)
            if kind == "solution":
                cell.metadata["jupyter"] = {"source_hidden": True}
                cell.metadata["tags"] = ["solution"]
            cells.append(cell)

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            tag = line[4:].strip()
            kind = {"[markdown]": "markdown", "[solution]": "solution"}.get(tag, "code")
            lines = []
        else:
            lines.append(line)
    flush()
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):  # stable ids keep diffs small
        cell["id"] = f"cell-{i:02d}"
    return nb


if __name__ == "__main__":
    src, dst = sys.argv[1], sys.argv[2]
    nbformat.write(convert(open(src).read()), dst)
    print(f"wrote {dst}")
