"""The benchmarks refuse a config whose loss they would not build, naming the key, before
they touch data or compile anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_train_throughput_refuses_words_as_one_class(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "train_throughput.py"),
            "--configs",
            "configs/wsj_parsing.py:variant=sample",
            "--override",
            "train.word_leaves_as_one_class=True",
            "--data-workdir",
            str(tmp_path / "data"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert "configs/wsj_parsing.py:variant=sample" in last
    assert "train.word_leaves_as_one_class=True" in last and "Traceback" not in done.stderr
    assert not (tmp_path / "data").exists()
