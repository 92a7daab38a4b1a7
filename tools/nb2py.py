"""Write a notebook as a percent-format script, the inverse of ``py2nb.py`` (authoring aid).

    python tools/nb2py.py notebooks/NN_name.ipynb source.py      # edit source.py, then:
    python tools/py2nb.py source.py notebooks/NN_name.ipynb

Markdown cells become ``# %% [markdown]`` blocks with every line commented, code cells ``# %%``,
and collapsed worked solutions (tagged ``solution``) ``# %% [solution]``. Outputs are dropped.
"""

import sys

import nbformat


def convert(nb) -> str:
    blocks = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            body = "\n".join(("# " + line) if line else "#" for line in cell.source.splitlines())
            blocks.append("# %% [markdown]\n" + body)
        elif cell.cell_type == "code":
            tag = " [solution]" if "solution" in cell.metadata.get("tags", []) else ""
            blocks.append(f"# %%{tag}\n" + cell.source)
    return "\n\n".join(blocks) + "\n"


if __name__ == "__main__":
    src, dst = sys.argv[1], sys.argv[2]
    with open(dst, "w") as f:
        f.write(convert(nbformat.read(src, as_version=4)))
    print(f"wrote {dst}")
