"""Every notebook in notebooks/ executes (jupytext + nbclient) at small sizes.

Sizes are passed through environment variables the notebooks read
(``DCJAX_NB_MODEL``, ``DCJAX_NB_MODELS``, ``DCJAX_NB_FRAMES``, ``DCJAX_NB_WIDTH``).
"""

from __future__ import annotations

import os
import pathlib

import pytest

jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.py"))
SMALL = {
    "DCJAX_NB_MODEL": "dave",
    "DCJAX_NB_MODELS": "dave",
    "DCJAX_NB_FRAMES": "4",
    "DCJAX_NB_WIDTH": "0.25",
}


def test_there_are_three_notebooks():
    names = [p.name for p in NOTEBOOKS]
    assert len(names) == 3, names
    assert any("quickstart" in n for n in names) and any("alexnet" in n for n in names)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, tmp_path, monkeypatch):
    for key, value in SMALL.items():
        monkeypatch.setenv(key, value)
    nb = jupytext.read(path)
    assert nb.cells and any(c.cell_type == "markdown" for c in nb.cells)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]  # fmt: skip
    assert not errors
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code_cells)
    images = [o for c in code_cells for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]  # fmt: skip
    assert images, "the notebook should draw something"
    assert os.environ["DCJAX_NB_FRAMES"] == "4"
