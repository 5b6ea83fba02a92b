"""bench/gpu.py cannot rot: `--smoke` runs every part on the CPU, and its JSON holds each
part with sane numbers; the trainer's figures are the ones its own log lines printed."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu.py"
PARTS = ["ceiling", "train", "long", "trainer", "packed", "decode"]


def environment(tmp_path: Path) -> dict[str, str]:
    # Its own compilation cache: the suite's shared one would hand the trainer its steps.
    return {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": str(tmp_path)}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("bench_gpu")
    out = folder / "tmp.json"
    out.write_text(json.dumps([{"benchmark": "earlier"}]))  # kept: the file is an array
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(out)],
        env=environment(folder / "cache"),
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    written = [line.split(":")[0] for line in done.stderr.splitlines() if "rows written" in line]
    assert written == PARTS  # the file was rewritten after each part, in order
    records = json.loads(out.read_text())
    assert records[0] == {"benchmark": "earlier"} and len(records) == 2
    return records[1]


def rows(record: dict, part: str) -> list[dict]:
    found = [row for row in record["rows"] if row["part"] == part]
    assert found, part
    return found


def test_every_part_is_recorded_with_positive_figures(smoke: dict) -> None:
    assert smoke["benchmark"] == "gpu" and smoke["parts"] == PARTS
    assert smoke["machine"]["jax_backend"] == "cpu"
    assert rows(smoke, "ceiling")[0]["ceiling_gflops"] > 0
    shapes = {row["part"]: row["shape"] for row in smoke["rows"] if "shape" in row}
    assert shapes == {"train": "8x16", "long": "4x32"}  # the 256-token point, shrunk
    for part in ("train", "long", "trainer", "packed"):
        for row in rows(smoke, part):
            for key in ("step_ms", "tgt_tok_per_s", "gflops", "mfu"):
                assert 0 < row[key] < float("inf"), (part, key, row[key])
            assert row["mfu"] < 1.5, (part, row["mfu"])  # of the ceiling measured just before
            memory = row["peak_memory_bytes"]  # a CPU reports none; a GPU a positive count
            assert memory is None or memory > 0
    for row in rows(smoke, "decode"):
        assert row["sent_per_s"] > 0 and row["beam"] == 2


LINE = re.compile(r"\[train\] step (\d+) .*\btokens_per_second=([0-9.e+-]+) .*\bmfu=([0-9.e+-]+)")


def test_the_trainer_figures_are_its_own_log_lines(smoke: dict) -> None:
    trainer, packed = rows(smoke, "trainer")[0], rows(smoke, "packed")[0]
    assert (trainer["data"], packed["data"]) == ("buckets", "packed 64")
    for row in (trainer, packed):
        parsed = [LINE.search(line) for line in row["log_lines"]]
        assert all(parsed), row["log_lines"]
        steps = [int(m.group(1)) for m in parsed]
        assert steps == [2, 4] and row["steps"] == 4  # 4 updates, a line every 2
        after_first = parsed[1:]  # the first window holds the compiles
        tokens = statistics.median(float(m.group(2)) for m in after_first)
        assert row["tgt_tok_per_s"] == pytest.approx(tokens, rel=1e-12)
        mfu = statistics.median(float(m.group(3)) for m in after_first)
        assert row["mfu"] == pytest.approx(mfu, rel=1e-12)


def test_without_a_gpu_it_measures_nothing(tmp_path: Path) -> None:
    out = tmp_path / "none.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        env=environment(tmp_path / "cache"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no GPU found" in done.stdout and not out.exists()
