"""Notebooks (jupytext .py files) run headless from start to end."""

import runpy
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.py"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch, capsys):
    monkeypatch.delenv("ATTNMT_WORKDIR", raising=False)
    runpy.run_path(str(path), run_name="__main__")
    assert "head 0" in capsys.readouterr().out
