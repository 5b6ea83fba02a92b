"""The attention notebook's install cell where attnmt is missing (Colab): it installs from
the source ATTNMT_SOURCE names (a git URL or a checkout folder) and otherwise stops with the
command to run; it never asks the package index for a package called attnmt.

The cell's own code (read from the committed .ipynb) runs in `python -S`, which has no
site-packages, so neither attnmt nor matplotlib can be found; a stand-in subprocess.run
records what pip would be asked instead of running it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "attention.ipynb"
RECORDER = """
import json, subprocess
def _record(argv, **kwargs):
    with open({log!r}, "a") as log:
        log.write(json.dumps(argv) + "\\n")
    return subprocess.CompletedProcess(argv, 0)
subprocess.run = _record
"""


def install_cell() -> str:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    (cell,) = [
        c for c in cells if c["cell_type"] == "code" and "ATTNMT_SOURCE" in "".join(c["source"])
    ]
    return "".join(cell["source"])


def run_cell(tmp_path: Path, source: str | None) -> tuple[subprocess.CompletedProcess, list]:
    log = tmp_path / "pip.jsonl"
    script = tmp_path / "cell.py"
    script.write_text(RECORDER.format(log=str(log)) + install_cell())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ATTNMT_SOURCE")}
    if source is not None:
        env["ATTNMT_SOURCE"] = source
    result = subprocess.run(
        [sys.executable, "-S", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, calls


def _asks_the_index_for_attnmt(argv: list[str]) -> bool:
    """A requirement naming attnmt without a URL (attnmt, attnmt[viz], attnmt==1): what pip
    would look up on the index. Options and paths are not requirements."""
    for arg in argv[argv.index("install") + 1 :]:
        if arg.startswith("-") or "/" in arg.split(" @ ")[0]:
            continue
        try:
            requirement = Requirement(arg)
        except InvalidRequirement:
            continue
        if requirement.name.lower() == "attnmt" and requirement.url is None:
            return True
    return False


def test_the_check_tells_a_name_from_a_source():
    for bare in ("attnmt", "attnmt[viz]", "attnmt==0.1", "ATTNMT[viz]>=0"):
        assert _asks_the_index_for_attnmt(["pip", "install", "--quiet", bare])
    for source in ("attnmt[viz] @ git+https://x/a.git", "/x/attnmt[viz]", "matplotlib"):
        assert not _asks_the_index_for_attnmt(["pip", "install", source])


def test_without_a_source_it_stops_with_the_command_and_installs_nothing(tmp_path):
    result, calls = run_cell(tmp_path, None)
    assert result.returncode == 1, result.stderr
    assert calls == []
    assert '%pip install "attnmt[viz] @ git+' in result.stdout
    assert "ATTNMT_SOURCE" in result.stdout


@pytest.mark.parametrize(
    ("source", "requirement"),
    [
        (
            "https://example.org/me/attnmt.git",
            "attnmt[viz] @ git+https://example.org/me/attnmt.git",
        ),
        ("git+https://example.org/a.git@v1", "attnmt[viz] @ git+https://example.org/a.git@v1"),
    ],
)
def test_a_git_url_is_installed_from_that_url(tmp_path, source, requirement):
    result, calls = run_cell(tmp_path, source)
    assert result.returncode == 0, result.stderr
    assert calls == [[sys.executable, "-m", "pip", "install", "--quiet", requirement]]
    assert not _asks_the_index_for_attnmt(calls[0])


def test_a_checkout_folder_is_installed_by_its_path(tmp_path):
    checkout = tmp_path / "my checkout"
    checkout.mkdir()
    (checkout / "pyproject.toml").write_text('[project]\nname = "attnmt"\n')
    result, calls = run_cell(tmp_path, str(checkout))
    assert result.returncode == 0, result.stderr
    assert calls == [[sys.executable, "-m", "pip", "install", "--quiet", f"{checkout}[viz]"]]
    assert not _asks_the_index_for_attnmt(calls[0])


def test_a_folder_without_a_checkout_is_refused(tmp_path):
    # "attnmt" as a folder name that is not there: it must not fall through to the index.
    result, calls = run_cell(tmp_path, "attnmt")
    assert result.returncode != 0 and calls == []
    assert "no attnmt checkout" in result.stderr
