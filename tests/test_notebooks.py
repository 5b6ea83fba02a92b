"""The attention notebook runs headless start to finish, shows its figures, and is kept in
git as a paired jupytext .py plus an output-free .ipynb that say the same thing."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
jupytext = pytest.importorskip("jupytext")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "attention.ipynb"
SCRIPT = REPO / "notebooks" / "attention.py"


def test_notebook_runs_and_shows_figures(monkeypatch, tmp_path):
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("matplotlib")
    # The kernel inherits this environment: the random model, not someone's run.
    for name in ("ATTNMT_WORKDIR", "ATTNMT_SENTENCE", "ATTNMT_TRANSLATION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ATTNMT_FIGURES_DIR", str(tmp_path))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # "python3" is found among the installed kernelspecs, or else is ipykernel's own spec
    # for this interpreter; jupyter_client starts it with sys.executable either way.
    client = nbclient.NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(REPO)}},
    )
    client.execute()
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    errors = [output for output in outputs if output.output_type == "error"]
    assert errors == [], [f"{e.ename}: {e.evalue}" for e in errors]
    images = [output for output in outputs if "image/png" in output.get("data", {})]
    assert len(images) >= 5
    assert (tmp_path / "index.md").exists()  # the last cell wrote its files there


def test_committed_notebook_has_no_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)


def test_notebook_and_script_are_in_sync():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    script = jupytext.read(SCRIPT)
    assert notebook.metadata["jupytext"]["formats"] == "ipynb,py:percent"
    assert [(c.cell_type, c.source) for c in notebook.cells] == [
        (c.cell_type, c.source) for c in script.cells
    ]
