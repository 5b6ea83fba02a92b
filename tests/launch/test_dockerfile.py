"""The Dockerfile without a Docker daemon: its instructions read back, the install step run
for each ACCELERATOR with a stand-in `python` that records what pip would be asked, and the
files it copies built into a wheel.

Nothing here builds the image (no daemon in CI); what it proves is that every file the
build copies exists and is not hidden by .dockerignore, that each build argument asks pip for
this project plus the right jax wheel, and that the copied files alone make an installable
attnmt with its `attnmt` entry point.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.launch.helpers import REPO

EXPECTED_JAX = {"cpu": "jax", "cuda": "jax[cuda12]", "tpu": "jax[tpu]"}


def instructions(path: Path = REPO / "Dockerfile") -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: comments dropped, `\\` continuations joined."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        result.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return result


def build_args() -> dict[str, str]:
    """ARG NAME=default of the build stage (after FROM)."""
    seen_from = False
    args = {}
    for keyword, rest in instructions():
        seen_from = seen_from or keyword == "FROM"
        if keyword == "ARG" and seen_from:
            name, _, default = rest.partition("=")
            args[name] = default
    return args


def copies() -> list[tuple[list[str], str]]:
    return [
        (words[:-1], words[-1]) for k, r in instructions() if k == "COPY" for words in [r.split()]
    ]


def ignored(relative: str) -> bool:
    """Whether .dockerignore excludes `relative` or a folder above it (the patterns used
    here are plain names and globs, which fnmatch reads as Docker does)."""
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = Path(relative).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatch(prefix, pattern.removeprefix("**/"))
        or fnmatch.fnmatch(Path(prefix).name, pattern.removeprefix("**/"))
        for pattern in patterns
        for prefix in prefixes
    )


def stage_context(target: Path) -> Path:
    """The files the build copies, laid out as in the image's working directory."""
    for sources, destination in copies():
        place = target / destination
        for source in sources:
            origin = REPO / source
            if origin.is_dir():
                ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
                shutil.copytree(origin, place, dirs_exist_ok=True, ignore=ignore)
            else:
                place.mkdir(parents=True, exist_ok=True)
                shutil.copy(origin, place / origin.name)
    return target


def test_every_copied_file_exists_and_reaches_the_build_context():
    assert copies(), "the Dockerfile copies nothing"
    for sources, _ in copies():
        for source in sources:
            assert (REPO / source).exists(), source
            assert not ignored(source.rstrip("/")), f".dockerignore hides {source}"
    # What must stay out of the image (runs, environments, data) does.
    assert all(ignored(path) for path in ("runs/ende", ".venv/bin", ".git/HEAD", "data/x"))
    assert not ignored("src/attnmt/cli/main.py")


def test_the_image_runs_attnmt_from_a_folder_that_holds_configs():
    steps = instructions()
    assert steps[0][0] in ("ARG", "FROM")
    assert build_args()["ACCELERATOR"] == "cpu"
    (entrypoint,) = [json.loads(rest) for keyword, rest in steps if keyword == "ENTRYPOINT"]
    assert entrypoint == ["attnmt"]  # the console script (its wheel entry point: below)
    (workdir,) = [rest for keyword, rest in steps if keyword == "WORKDIR"]
    assert (["configs/"], "configs/") in copies()  # relative to WORKDIR: <workdir>/configs
    assert workdir.startswith("/")


def _install_step() -> str:
    (run,) = [rest for keyword, rest in instructions() if keyword == "RUN"]
    return run


@pytest.mark.parametrize("accelerator", [*EXPECTED_JAX, "rocm"])
def test_each_accelerator_installs_the_project_and_its_jax(tmp_path, accelerator):
    context = stage_context(tmp_path / "context")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    record = tmp_path / "pip.json"
    # A stand-in python: records its argv as JSON instead of installing anything.
    stub = stubs / "python"
    stub.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"json.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n"
    )
    stub.chmod(0o755)
    env = {
        "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}",
        "ACCELERATOR": accelerator,
        "EXTRAS": build_args()["EXTRAS"],
    }
    result = subprocess.run(
        ["sh", "-c", _install_step()],
        cwd=context,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if accelerator == "rocm":
        assert result.returncode == 2 and not record.exists()
        assert "unknown ACCELERATOR 'rocm'" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    argv = json.loads(record.read_text())
    assert argv == ["-m", "pip", "install", ".[tfds,gcs]", EXPECTED_JAX[accelerator]]


def test_the_copied_files_alone_build_attnmt_with_its_entry_point(tmp_path):
    context = stage_context(tmp_path / "context")
    wheels = tmp_path / "wheels"
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--wheel-dir",
        str(wheels),
        ".",
    ]
    result = subprocess.run(command, cwd=context, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{shlex.join(command)}\n{result.stderr}"
    (wheel,) = wheels.glob("attnmt-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        text = archive.read(entry_points).decode()
    assert "attnmt/cli/main.py" in names and "attnmt/model/flops.py" in names
    assert "attnmt = attnmt.cli.main:main" in text
