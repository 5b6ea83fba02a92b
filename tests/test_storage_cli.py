"""The inputs that must stay local, refused through the command line (README: "Workdirs in
a bucket"): a `--config` file in a bucket (it is imported as Python), a treebank's
`data.data_dir` in a bucket (read with a local folder walk), and `attnmt import` /
`attnmt export` to or from a bucket (Hugging Face's and CTranslate2's own code write plain
files). Each ends with exit code 2 and one `attnmt <command>: error:` line naming the flag
or key and the URL, with no traceback, before anything is written: no workdir, and no local
folder named `gs:` (what pathlib makes of `gs://b/x`) in the current directory.

No emulator is needed: nothing may reach the bucket.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attnmt.cli.main import main
from tests.helpers import CONFIGS


def refused(argv: list[str], capsys, cwd: Path) -> str:
    """Runs `attnmt argv` in the empty folder `cwd`, asserts exit code 2 without a traceback
    and nothing written there; its error line."""
    try:
        code = main(argv)
    except SystemExit as exit_info:  # argparse refuses a flag's value itself
        code = exit_info.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err, err
    errors = [line for line in err.strip().splitlines() if "error:" in line]
    assert len(errors) == 1, err
    assert errors[0].startswith(f"attnmt {argv[0]}: error: "), err
    assert sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*")) == [], errors[0]
    return errors[0]


@pytest.fixture
def cwd(tmp_path, monkeypatch) -> Path:
    """An empty current directory."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("command", ["train", "vocab", "params"])
def test_a_config_file_in_a_bucket_is_refused(command, cwd, capsys):
    spec = "gs://b/configs/wmt14_ende.py:variant=big"  # the colon of gs:// is not the arg's
    argv = [command, "--config", spec]
    if command != "params":
        argv += ["--workdir", "run"]
    line = refused(argv, capsys, cwd)
    assert f"config file {spec!r} must be a local file (it is imported as Python)" in line


def test_a_treebank_in_a_bucket_is_refused_before_the_workdir_is_written(cwd, capsys):
    argv = ["train", "--config", f"{CONFIGS / 'wsj_parsing.py'}:variant=sample"]
    argv += ["--config.data.data_dir=gs://b/treebank/wsj", "--workdir", "run"]
    line = refused(argv, capsys, cwd)
    assert "data.data_dir must be a local path, got 'gs://b/treebank/wsj'" in line


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["import", "opus-mt-en-de", "--workdir", "gs://b/runs/opus"], "--workdir"),
        (["import", "gs://b/opus-mt-en-de", "--workdir", "run"], "hf_dir"),
        (["export", "--workdir", "gs://b/runs/opus", "--format", "hf", "--out", "hf"], "--workdir"),
        (["export", "--workdir", "run", "--format", "hf", "--out", "gs://b/hf"], "--out"),
        (["export", "--workdir", "run", "--format", "ctranslate2", "--out", "gs://b/c"], "--out"),
    ],
    ids=["import-into", "import-from", "export-from", "export-hf-into", "export-ct2-into"],
)
def test_import_and_export_refuse_a_bucket(argv, flag, cwd, capsys):
    (url,) = [word for word in argv if word.startswith("gs://")]
    line = refused(argv, capsys, cwd)
    assert flag in line and f"must be a local path, got {url!r}" in line, line


@pytest.mark.parametrize(
    "argv",
    [
        ["translate", "--workdir", "typo", "--input", "in.txt"],
        ["evaluate", "--workdir", "typo"],
        ["export", "--workdir", "typo", "--format", "hf", "--out", "hf"],
    ],
    ids=["translate", "evaluate", "export"],
)
def test_commands_that_read_a_workdir_create_none(argv, cwd, capsys):
    """A mistyped --workdir is reported, and not made into an empty run folder."""
    line = refused(argv, capsys, cwd)
    assert f"no checkpoint in {cwd / 'typo' / 'checkpoints'}: train first" in line, line
