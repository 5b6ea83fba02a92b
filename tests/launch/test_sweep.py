"""Sweep files expand into deterministic runs; the tiny sweep trains locally and is reported."""

import csv
import math
import re
import runpy
import shlex
from pathlib import Path

import pytest

from attnmt.cli.main import main as attnmt_main
from attnmt.config.variants import TABLE3
from launch.common import LaunchError
from launch.sweep import expand
from tests.helpers import corpus_overrides, write_reversal_corpus
from tests.launch.helpers import (
    FAST_COMPILE_ENV,
    REPO,
    dry_run,
    launch,
    shell_commands,
    train_part,
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


def test_sweep_dry_run_gives_each_run_its_own_overrides():
    out = dry_run("sweep", str(SWEEPS / "tiny_demo.py"), "--root", "/r", "--launcher", "local")
    trains = {}
    for words, _ in shell_commands(out):
        if "train" in words:
            train = train_part(words)
            trains[train[train.index("--workdir") + 1]] = train
    assert sorted(trains) == [f"/r/tiny_demo/{name}" for name in ("base", "dff128", "n1")]
    varied = {"--config.model.d_ff=128", "--config.model.num_layers=1"}
    for workdir, train in trains.items():
        own = {
            "/r/tiny_demo/base": set(),
            "/r/tiny_demo/dff128": {"--config.model.d_ff=128"},
            "/r/tiny_demo/n1": {"--config.model.num_layers=1"},
        }[workdir]
        assert varied & set(train) == own, train
        assert "--config.train.num_steps=10" in train


def paper_parameter_count(
    vocab: int, n: int, d_model: int, d_ff: int, heads: int, d_k: int, d_v: int
) -> int:
    """The Transformer's parameters as §3 describes it, with one embedding matrix shared by
    both inputs and the output layer (§3.4), bias-free attention projections, biased FFN
    layers (§3.3), a LayerNorm (scale and bias) after each sublayer and sinusoidal positions."""
    attention = 2 * d_model * heads * d_k + 2 * heads * d_v * d_model  # W^Q, W^K; W^V, W^O
    ffn = d_model * d_ff + d_ff + d_ff * d_model + d_model
    norm = 2 * d_model
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    return vocab * d_model + n * (encoder_layer + decoder_layer)


def tensorflow_scalars(directory: Path) -> dict[str, dict[int, float]]:
    """tag -> step -> value of a directory's event files, as TensorFlow itself reads them."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    scalars: dict[str, dict[int, float]] = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(str(path)):  # checks each record's CRCs
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    number = float(value.simple_value)
                else:
                    number = float(tf.make_ndarray(value.tensor))
                scalars.setdefault(value.tag, {})[int(event.step)] = number
    return scalars


def checkpoint_parameter_count(step_dir: Path) -> int:
    """The number of model parameters in a checkpoint, from Orbax's own array metadata."""
    import jax
    import orbax.checkpoint as ocp
    from etils import epath

    tree = ocp.PyTreeCheckpointHandler().metadata(epath.Path(step_dir / "state")).tree
    return sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(tree["params"]))


@pytest.mark.slow
def test_tiny_sweep_trains_locally_and_report_tabulates_it(tmp_path, capsys):
    """Two rows of the tiny sweep train locally one after the other, each with its own
    sizes, and learn (dev NLL well below the uniform ln V). `attnmt report` then tabulates
    exactly what each run wrote, read here independently: the dev scalars of its last
    evaluation as TensorFlow reads its event files, the step of its newest checkpoint, and
    the parameters in that checkpoint, which are the paper's count for the row's sizes."""
    corpus = write_reversal_corpus(tmp_path / "corpus", train=300, dev=16)
    root = tmp_path / "sweeps"
    names = ["base", "n1"]  # dff128 differs only in its overrides: the dry run checks them
    sweep = [str(SWEEPS / "tiny_demo.py"), "--root", str(root), "--launcher", "local"]
    sweep += ["--only", "n1,base"]
    # No test split in this corpus: skip the end-of-run test decode (nothing to prove here).
    overrides = [*corpus_overrides(corpus), "--config.train.test_at_end=false"]
    result = launch("sweep", *sweep, *overrides, env=FAST_COMPILE_ENV, timeout=600)
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in (root / "tiny_demo").iterdir()) == names

    # Each row's model: configs/tiny.py, then the sweep row's overrides, then the command's.
    sweep_rows = runpy.run_path(str(SWEEPS / "tiny_demo.py"))["RUNS"]
    rows_of_sweep = {row["name"]: row for row in sweep_rows}
    tiny = runpy.run_path(str(REPO / "configs" / "tiny.py"))["get_config"]()
    vocab = 32  # corpus_overrides
    assert "--config.model.vocab_size=32" in overrides
    expected = {}
    for name in names:
        row = rows_of_sweep[name]["overrides"]
        model = {key: row.get(f"model.{key}", tiny.model[key]) for key in tiny.model}
        steps = row["train.num_steps"]
        workdir = root / "tiny_demo" / name
        assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()) == [steps]
        sizes = [model[k] for k in ("num_layers", "d_model", "d_ff", "num_heads", "d_k", "d_v")]
        params = paper_parameter_count(vocab, *sizes)
        assert checkpoint_parameter_count(workdir / "checkpoints" / str(steps)) == params
        dev = tensorflow_scalars(workdir / "tensorboard" / "eval")
        evaluated = row["train.eval_every_steps"]
        assert sorted(dev["nll"]) == list(range(evaluated, steps + 1, evaluated))
        last = {tag: by_step[steps] for tag, by_step in dev.items()}
        assert last["nll"] < math.log(vocab) - 1.0, (name, last)  # it learned
        assert math.isclose(last["perplexity"], math.exp(last["nll"]), rel_tol=1e-5)
        # The training log printed the same values (to its 4 significant digits).
        log = (workdir / "logs" / "process_0.log").read_text()
        (printed,) = re.findall(rf"\[eval\] step {steps} (.*)", log)
        for tag, text in re.findall(r"(\w+)=(\S+)", printed):
            assert text == f"{last[tag]:.4g}", (tag, text, last[tag])
        expected[name] = (model, steps, params, last)

    capsys.readouterr()
    table = tmp_path / "table3.csv"
    assert attnmt_main(["report", str(root / "tiny_demo"), "--csv", str(table)]) == 0
    printed_rows = capsys.readouterr().out.splitlines()[2:]
    rows = list(csv.DictReader(table.open()))
    assert [row["run"] for row in rows] == names
    for row, line in zip(rows, printed_rows, strict=True):
        model, steps, params, last = expected[row["run"]]
        smoothing = tiny.train.label_smoothing
        assert row == {
            "run": row["run"],
            "workdir": str(root / "tiny_demo" / row["run"]),
            "N": str(model["num_layers"]),
            "d_model": str(model["d_model"]),
            "d_ff": str(model["d_ff"]),
            "h": str(model["num_heads"]),
            "d_k": str(model["d_k"]),
            "d_v": str(model["d_v"]),
            "P_drop": str(model["dropout_rate"]),
            "eps_ls": str(smoothing),
            "positional": model["positional"],
            "steps": str(steps),
            "dev_loss": repr(last["loss"]),
            "dev_ppl": repr(last["perplexity"]),
            "dev_accuracy": repr(last["accuracy"]),
            "dev_bleu": "",  # no BLEU during these runs, and no `attnmt evaluate`
            "test_bleu": "",
            "params": str(params),
        }
        cells = [row["run"], *(str(model[k]) for k in ("num_layers", "d_model", "d_ff"))]
        cells += [str(model[k]) for k in ("num_heads", "d_k", "d_v", "dropout_rate")]
        cells += [str(smoothing), str(steps), f"{last['perplexity']:.2f}", "—"]
        cells.append(f"{params / 1e6:.3g}")
        assert line == "| " + " | ".join(cells) + " |"


@pytest.mark.slow
def test_local_launcher_reports_a_failed_process(tmp_path):
    workdir = tmp_path / "run"
    result = launch("local", "--config", "configs/no_such_config.py", "--workdir", str(workdir))
    assert result.returncode == 2  # attnmt's own code for a config error
    assert "no_such_config.py" in (workdir / "logs" / "process_0.log").read_text()
