"""Every notebook runs top to bottom in a fresh python3 kernel, on CPU, and shows its figures.

The notebooks use the shipped pair in assets/pair when it is there and tiny random-weight
models otherwise, so this test runs on any checkout.
"""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT = 180  # seconds per cell; a whole notebook takes well under a minute on tiny models


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {"quickstart.ipynb", "tree_anatomy.ipynb", "why_the_tree_wins.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path: Path):
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=CELL_TIMEOUT, kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},  # the kernel starts where Jupyter would
    )
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails

    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name} displayed no figure"
