"""Sweep files expand into deterministic runs; the tiny sweep trains locally and is reported."""

import csv
import shlex

import pytest

from attnmt.report import gather, markdown_table
from attnmt.report import main as report_main
from attnmt.variants import TABLE3
from launch.common import LaunchError
from launch.sweep import expand
from tests.launch.helpers import (
    FAST_COMPILE_ENV,
    REPO,
    corpus_overrides,
    dry_run,
    launch,
    shell_commands,
    train_part,
    write_corpus,
)

SWEEPS = REPO / "configs" / "sweeps"


def test_table3_has_every_row_with_its_variant_and_a_fixed_workdir():
    runs = expand(SWEEPS / "table3.py", "/mnt/sweeps/", {"train.seed": "1"})
    assert [run.name for run in runs] == ["base", *TABLE3, "big"]
    c4 = runs[[run.name for run in runs].index("C4")]
    assert c4.config == "configs/wmt14_ende.py:variant=C4"
    assert c4.workdir == "/mnt/sweeps/table3/C4"
    assert c4.overrides["train.seed"] == "1"  # the command line's, added to the row's own
    assert c4.overrides["train.bleu_every_steps"] == 100_000


def test_bad_sweep_files_are_refused(tmp_path):
    cases = {
        "twice.py": 'RUNS = [{"name": "a", "config": "c"}, {"name": "a", "config": "c"}]',
        "typo.py": 'RUNS = [{"name": "a", "config": "c", "overides": {}}]',
        "empty.py": "RUNS = []",
        "spaces.py": 'RUNS = [{"name": "a b", "config": "c"}]',
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(LaunchError):
            expand(tmp_path / name, "root")


def test_sweep_dry_run_on_slurm_submits_each_run():
    flags = "--root /shared/s --launcher slurm --only n1,base --config.data.max_length=8"
    out = dry_run("sweep", str(SWEEPS / "tiny_demo.py"), *shlex.split(flags))
    sbatches = [script for words, script in shell_commands(out) if words == ["sbatch"]]
    assert len(sbatches) == 2
    for name, script in zip(["base", "n1"], sbatches, strict=True):
        (srun,) = [shlex.split(line) for line in script.splitlines() if line.startswith("srun")]
        train = train_part(srun)
        workdir = f"/shared/s/tiny_demo/{name}"
        assert train[:5] == ["train", "--config", "configs/tiny.py", "--workdir", workdir]
        assert train[-1] == "--config.data.max_length=8"
        assert ("--config.model.num_layers=1" in train) == (name == "n1")


@pytest.mark.slow
def test_tiny_sweep_trains_locally_and_report_tabulates_it(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    root = tmp_path / "sweeps"
    sweep = [str(SWEEPS / "tiny_demo.py"), "--root", str(root), "--launcher", "local"]
    overrides = corpus_overrides(corpus)
    result = launch("sweep", *sweep, *overrides, env=FAST_COMPILE_ENV, timeout=600)
    assert result.returncode == 0, result.stderr
    names = ["base", "dff128", "n1"]
    for name in names:
        workdir = root / "tiny_demo" / name
        assert (workdir / "logs" / "process_0.log").stat().st_size > 0
        assert (workdir / "checkpoints" / "10").is_dir()

    summaries = gather(str(root))
    assert [s.name for s in summaries] == [f"tiny_demo/{name}" for name in names]
    assert all(s.steps == 10 and s.dev["perplexity"] > 1 for s in summaries)
    assert [s.section("model")["d_ff"] for s in summaries] == [64, 128, 64]
    assert [s.section("model")["num_layers"] for s in summaries] == [2, 2, 1]
    assert len(markdown_table(summaries).splitlines()) == 2 + 3

    table = tmp_path / "table3.csv"
    assert report_main([str(root / "tiny_demo"), "--csv", str(table)]) == 0
    rows = list(csv.DictReader(table.open()))
    assert [row["run"] for row in rows] == names
    assert all(float(row["dev_loss"]) > 0 and int(row["params"]) > 0 for row in rows)


@pytest.mark.slow
def test_local_launcher_reports_a_failed_process(tmp_path):
    workdir = tmp_path / "run"
    result = launch("local", "--config", "configs/no_such_config.py", "--workdir", str(workdir))
    assert result.returncode == 2  # attnmt's own code for a config error
    assert "no_such_config.py" in (workdir / "logs" / "process_0.log").read_text()
