"""Bad training input through `attnmt train`: one message naming the file, line or dataset,
exit code 2, no traceback, and nothing written that a fixed rerun would trip over."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnmt.cli.main import main
from attnmt.train.assemble import build_trainer
from tests.helpers import TINY_CONFIG, corpus_paths, tiny_experiment

GOOD = ["a b c", "d e", "f g h a", "b c d e f"] * 10


def write(path: Path, lines: list[str] | bytes) -> Path:
    if isinstance(lines, bytes):
        path.write_bytes(lines)
    else:
        path.write_text("".join(f"{line}\n" for line in lines))
    return path


def overrides(corpus: Path, *extra: str) -> list[str]:
    return [
        *corpus_paths(corpus),
        "--config.data.max_length=16",
        "--config.model.vocab_size=32",
        "--config.train.eval_every_steps=0",
        "--config.train.memory_preflight=false",
        *extra,
    ]


def train_fails(tmp_path: Path, capsys, *extra: str) -> str:
    """Runs `attnmt train` in-process; returns stderr after checking code 2, no traceback."""
    args = ["train", "--config", str(TINY_CONFIG), "--workdir", str(tmp_path / "run")]
    code = main([*args, *overrides(tmp_path, *extra)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("attnmt train: error: ")]
    assert len(errors) == 1, err
    return errors[0].removeprefix("attnmt train: error: ")


def test_line_counts_differ(tmp_path, capsys):
    src = write(tmp_path / "train.src", GOOD)
    tgt = write(tmp_path / "train.tgt", GOOD[:-3])
    assert train_fails(tmp_path, capsys) == (
        f"parallel files differ in line count: {src} has 40 lines, {tgt} has 37 lines"
    )


def test_invalid_utf8_names_file_and_line(tmp_path, capsys):
    write(tmp_path / "train.src", GOOD)
    tgt = write(tmp_path / "train.tgt", "\n".join(GOOD[:5]).encode() + b"\nbad \xff byte\n")
    assert train_fails(tmp_path, capsys) == (
        f"{tgt}:6: invalid UTF-8 (byte 0xff at line 6); convert the file to UTF-8"
    )


def test_empty_file(tmp_path, capsys):
    src = write(tmp_path / "train.src", b"")
    write(tmp_path / "train.tgt", GOOD)
    assert train_fails(tmp_path, capsys) == f"{src}: file is empty"


def test_missing_file(tmp_path, capsys):
    write(tmp_path / "train.src", GOOD)
    assert train_fails(tmp_path, capsys) == f"{tmp_path / 'train.tgt'}: file not found"


def test_missing_evaluation_split(tmp_path, capsys):
    write(tmp_path / "train.src", GOOD)
    write(tmp_path / "train.tgt", GOOD)
    message = train_fails(tmp_path, capsys, "--config.train.eval_every_steps=10")
    assert message == f"{tmp_path / 'dev.src'}: file not found"


def test_only_blank_lines(tmp_path, capsys):
    write(tmp_path / "train.src", ["", "  ", ""])
    write(tmp_path / "train.tgt", ["", "", "\t"])
    message = train_fails(tmp_path, capsys)
    assert message == "cannot train a vocabulary: no non-empty sentences were given"


def test_every_pair_too_long(tmp_path, capsys):
    long = [" ".join("abcdefgh" * 3)] * 5
    write(tmp_path / "train.src", long)
    write(tmp_path / "train.tgt", long)
    assert train_fails(tmp_path, capsys) == (
        "no usable sentence pairs in split 'train': kept 0 of 5 pairs (5 longer than "
        "data.max_length=16 tokens, 0 with an empty side)"
    )


def test_unknown_tfds_dataset(tmp_path, capsys):
    pytest.importorskip("tensorflow_datasets")
    message = train_fails(
        tmp_path,
        capsys,
        "--config.data.source=tfds",
        "--config.data.tfds_name=no_such_dataset_xyz/de-en",
        f"--config.data.data_dir={tmp_path / 'tfds'}",
    )
    assert message.startswith(
        f"tfds dataset 'no_such_dataset_xyz/de-en' (split 'train') is not available in "
        f"{tmp_path / 'tfds'}: Dataset no_such_dataset_xyz not found"
    )


def test_long_and_empty_pairs_are_counted_skipped_and_logged(tmp_path, caplog):
    long = " ".join("abcdefgh" * 3)  # 24 letters: at least 24 tokens, over max_length=16
    src = [*GOOD, *[long] * 7, *["a b"] * 3]
    tgt = [*GOOD, *["c d"] * 7, *[""] * 3]  # the last three have an empty target
    write(tmp_path / "train.src", src)
    write(tmp_path / "train.tgt", tgt)
    experiment = tiny_experiment(overrides(tmp_path))
    with caplog.at_level(logging.INFO, logger="attnmt.train"):
        trainer = build_trainer(experiment, tmp_path / "run")
    assert (
        "training pairs 'train': kept 40 of 50 pairs (7 longer than data.max_length=16 tokens, "
        "3 with an empty side)" in caplog.text
    )
    assert len(trainer.train_batches.corpus) == 40


def test_the_real_command_prints_one_line_and_exits_2(tmp_path):
    write(tmp_path / "train.src", GOOD)
    command = [sys.executable, "-m", "attnmt.cli.main", "train", "--config"]
    command += [str(TINY_CONFIG), "--workdir", str(tmp_path / "run")]
    done = subprocess.run(
        command + overrides(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"attnmt train: error: {tmp_path / 'train.tgt'}: file not found"
    )
