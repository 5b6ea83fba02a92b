"""A tiny model learns a synthetic reversal task, checkpoints, and evaluates with BLEU."""

import json
import re
import time

import jax
import numpy as np
import pytest
import sacrebleu

from attnmt.checkpoint.manager import CheckpointManager
from attnmt.cli.main import main
from attnmt.common import PAD_ID
from attnmt.train.assemble import build_trainer
from tests.equivalence import assert_same_losses, assert_same_updates
from tests.helpers import TINY_CONFIG, reversal_overrides, tiny_experiment


@pytest.mark.slow
def test_train_learns_checkpoints_and_evaluates(reversal_corpus, tmp_path, capsys):
    # Resuming is proven bit for bit, through the real command, in test_resilience.py.
    workdir = tmp_path / "run"
    trainer = build_trainer(tiny_experiment(reversal_overrides(reversal_corpus, 120)), workdir)
    initial = trainer.evaluate()
    result = trainer.run()
    assert result.step == 120
    final = trainer.evaluate()
    assert final["nll"] < 0.4 * initial["nll"], (initial, final)

    steps = CheckpointManager(workdir).all_steps()
    assert steps == [60, 120]
    assert (workdir / "vocab.model").exists()
    assert json.loads((workdir / "config.json").read_text())["model"]["vocab_size"] == 32

    # `attnmt evaluate` on the averaged checkpoints: its own hypotheses file, one line per
    # sentence, and a printed BLEU equal to sacrebleu's on that file.
    capsys.readouterr()
    for average in ("0", "2"):
        argv = ["evaluate", "--workdir", str(workdir), "--split", "dev", "--beam", "2"]
        assert main([*argv, "--average-last", average]) == 0
    out = capsys.readouterr().out
    plain = workdir / "decodes" / "dev-step120-beam2.tgt"
    averaged = workdir / "decodes" / "dev-step120-avg2-beam2.tgt"
    references = (reversal_corpus / "dev.tgt").read_text().splitlines()
    printed = [float(x) for x in re.findall(r"sacreBLEU\s+([0-9.]+)", out)]
    assert len(printed) == 2
    for path, score in zip((plain, averaged), printed, strict=True):
        hypotheses = path.read_text().splitlines()
        assert len(hypotheses) == len(references) == 64
        expected = sacrebleu.corpus_bleu(hypotheses, [references]).score
        assert score == pytest.approx(expected, abs=0.006)


def test_cli_refuses_a_bad_key_without_traceback(capsys):
    code = main(["params", "--config", str(TINY_CONFIG), "--config.model.d_ff=0"])
    assert code == 2
    assert "model.d_ff" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "evaluate", "average"])
@pytest.mark.parametrize(
    ("workdir", "said"),
    [
        ("gs:/bucket/run", "lost a slash; write gs://bucket/run"),  # what pathlib makes of it
        ("ftp://host/run", "unsupported URL scheme ftp://"),
        ("gs://", "names no bucket"),
    ],
)
def test_cli_refuses_workdirs_that_cannot_work_before_writing_anything(
    command, workdir, said, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    argv = [command, "--workdir", workdir]
    if command == "train":
        argv += ["--config", str(TINY_CONFIG)]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()  # argparse: usage, then one line
    errors = [line for line in err if "error:" in line]
    assert errors == [err[-1]] and err[-1].startswith(f"attnmt {command}: error:"), err
    assert repr(workdir) in err[-1] and said in err[-1]
    assert list(tmp_path.iterdir()) == []  # no local "gs:" folder was created


def matmul_count_train_flops(model, src_len: int, tgt_len: int) -> int:
    """Training FLOPs of one sentence pair, matmul by matmul: 2·m·k·n for each [m,k]×[k,n]
    product the Transformer computes for s real source and t real target positions (the
    decoder reads BOS + t−1 tokens), a causal query seeing only itself and earlier keys;
    backward = two forwards. An exact integer (no float rounding)."""
    s, t = src_len, tgt_len
    d, ff, h, dk, dv = model.d_model, model.d_ff, model.num_heads, model.d_k, model.d_v

    def mm(m: int, k: int, n: int) -> int:
        return 2 * m * k * n

    def projections(queries: int, keys: int) -> int:  # W^Q; W^K, W^V; W^O
        q = mm(queries, d, h * dk)
        return q + mm(keys, d, h * dk) + mm(keys, d, h * dv) + mm(queries, h * dv, d)

    def ffn(n: int) -> int:
        return mm(n, d, ff) + mm(n, ff, d)

    encoder = projections(s, s) + h * (mm(s, dk, s) + mm(s, s, dv)) + ffn(s)
    causal = sum(h * (mm(1, dk, i) + mm(1, i, dv)) for i in range(1, t + 1))  # query i: i keys
    cross = projections(t, s) + h * (mm(t, dk, s) + mm(t, s, dv))
    decoder = projections(t, t) + causal + cross + ffn(t)
    output = mm(t, d, model.vocab_size)  # the shared embedding as output layer
    return 3 * (model.num_layers * (encoder + decoder) + output)


class _RecordingBatches:
    """The trainer's batch iterator, keeping a copy of every batch it hands out."""

    def __init__(self, inner):
        self.inner, self.batches = inner, []

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self.inner)
        self.batches.append({key: np.array(value) for key, value in batch.items()})
        return batch

    def __getattr__(self, name):  # get_state / set_state for the checkpoint
        return getattr(self.inner, name)


def test_logs_model_flops_and_mfu_and_writes_a_profile(reversal_corpus, tmp_path):
    """The last log window's model TFLOP/s and MFU against an independent count: the
    matmul FLOPs of the very batches the window trained on (counted here, shape by shape),
    over the window's wall-clock time (its logged step time × its updates, within the
    measured run) and the peak the run was told, times the devices the mesh spans."""
    peak_tflops = 0.002
    overrides = [
        *reversal_overrides(reversal_corpus, 6),
        "--config.data.max_length=8",  # one bucket shape: one compile
        "--config.parallel.num_devices=2",  # a mesh over 2 of the 8 devices
        "--config.train.eval_every_steps=0",
        "--config.train.memory_preflight=false",
        "--config.train.xla_backend_optimization_level=0",
        "--config.train.log_every_steps=3",
        f"--config.train.peak_tflops_per_device={peak_tflops}",
        "--config.train.profile_first_step=2",
        "--config.train.profile_num_steps=2",
    ]
    experiment = tiny_experiment(overrides)
    trainer = build_trainer(experiment, tmp_path / "run")
    recorder = _RecordingBatches(trainer.train_batches)
    trainer.train_batches = recorder
    started = time.monotonic()
    result = trainer.run()
    measured = time.monotonic() - started
    logged = result.last_train
    assert result.step == 6 and len(recorder.batches) == 6
    window = recorder.batches[3:]  # updates 4-6: the last log line's

    flops = tokens = 0
    for batch in window:
        assert "src_segments" not in batch  # unpacked rows: one example per row
        src_lengths = (batch["src_tokens"] != PAD_ID).sum(axis=1).tolist()
        tgt_lengths = (batch["tgt_tokens"] != PAD_ID).sum(axis=1).tolist()
        for s, t in zip(src_lengths, tgt_lengths, strict=True):
            if s or t:  # an all-PAD filler row is no example
                flops += matmul_count_train_flops(experiment.model, s, t)
        tokens += sum(tgt_lengths)
    elapsed = logged["step_time"] * len(window)
    assert 0 < elapsed < measured
    devices = trainer.mesh.devices.size
    assert devices == 2 < jax.device_count()  # the idle devices are no part of the run's peak
    peak = peak_tflops * 1e12 * devices
    assert logged["target_tokens"] == tokens
    assert logged["tokens_per_second"] == pytest.approx(tokens / elapsed, rel=1e-9)
    assert logged["model_tflops_per_second"] == pytest.approx(flops / elapsed / 1e12, rel=1e-9)
    assert logged["mfu"] == pytest.approx(flops / (elapsed * peak), rel=1e-9)
    traces = list((tmp_path / "run" / "profile").rglob("*.xplane.pb"))
    assert traces, "no jax.profiler trace written"


def test_scanned_layers_train_checkpoint_average_and_evaluate(reversal_corpus, tmp_path, capsys):
    overrides = [
        *reversal_overrides(reversal_corpus, 60),
        "--config.model.scan_layers=true",
        "--config.train.checkpoint_every_steps=30",
        # BLEU during training decodes the trainer's own (stacked) parameters.
        "--config.train.bleu_every_steps=60",
        "--config.train.bleu_max_sentences=8",
    ]
    workdir = tmp_path / "run"
    trainer = build_trainer(tiny_experiment(overrides), workdir)
    initial = trainer.evaluate()
    trainer.run()
    assert trainer.evaluate()["nll"] < 0.7 * initial["nll"]
    assert list((workdir / "tensorboard" / "bleu").glob("events.out.tfevents.*"))
    argv = ["evaluate", "--workdir", str(workdir), "--split", "dev", "--beam", "2"]
    assert main([*argv, "--average-last", "2", "--xla-opt-level", "1"]) == 0
    hypotheses = (workdir / "decodes" / "dev-step60-avg2-beam2.tgt").read_text().splitlines()
    assert len(hypotheses) == 64 and any(hypotheses)


def test_backend_optimization_level_keeps_the_math(reversal_corpus, tmp_path):
    """Another XLA optimisation level may fuse and order float ops differently: SGD runs
        agree within the rounding bounds of tests/equivalence.py. Level 3 is XLA's default (what
        a user's run compiles with), held here to level 1. (The rest of the suite compiles at level
    0, where even the initial parameters' rounding differs from level 3: every test there
    compares with references or with runs compiled alike.)"""
    runs = []
    for level in ("3", "1"):
        overrides = [
            *reversal_overrides(reversal_corpus, 4),
            "--config.optim.algorithm=sgd",
            "--config.train.eval_every_steps=0",
            "--config.train.log_every_steps=4",
            f"--config.train.xla_backend_optimization_level={level}",
        ]
        trainer = build_trainer(tiny_experiment(overrides), tmp_path / f"run{level}")
        start = jax.device_get(trainer.state.params)
        runs.append((start, trainer.run().last_train["loss"], trainer.state.params))
    (start, loss, params), (other_start, other_loss, other_params) = runs
    assert all(
        np.array_equal(a, b)
        for a, b in zip(
            jax.tree_util.tree_leaves(start), jax.tree_util.tree_leaves(other_start), strict=True
        )
    )
    assert_same_losses([loss], [other_loss])
    assert_same_updates(start, params, other_params, steps=4)


@pytest.mark.parametrize("section", ["train", "decode"])
def test_bad_backend_optimization_level_names_the_key(section, capsys):
    argv = ["params", "--config", str(TINY_CONFIG)]
    assert main([*argv, f"--config.{section}.xla_backend_optimization_level=7"]) == 2
    assert f"{section}.xla_backend_optimization_level" in capsys.readouterr().err


def test_packed_rows_train_and_evaluate_with_little_padding(reversal_corpus, tmp_path):
    overrides = [*reversal_overrides(reversal_corpus, 60), "--config.data.pack_length=16"]
    trainer = build_trainer(tiny_experiment(overrides), tmp_path / "run")
    ((rows, length),) = trainer.plan.update_shapes  # one compiled shape
    assert length == 16 and rows * length <= 512  # configs/tiny.py: 512 tokens per batch
    initial = trainer.evaluate()
    result = trainer.run()
    assert trainer.evaluate()["nll"] < 0.7 * initial["nll"], (initial, trainer.evaluate())
    # Pairs of 3-6 tokens per side fill rows of 16 to within a few tokens.
    assert result.last_train["padding_fraction"] < 0.25


def test_shorter_source_rows_train_on_the_step_the_preflight_compiled(
    reversal_corpus, tmp_path, caplog
):
    """data.pack_source_length: source arrays of their own width through training and
    validation; the memory pre-flight compiles exactly the step that runs (jit compiles
    nothing more); sources longer than the row are left out, and the log says how many."""
    overrides = [
        *reversal_overrides(reversal_corpus, 60),
        "--config.data.pack_length=16",
        "--config.data.pack_source_length=5",  # the reversal pairs have 3-6 tokens a side
    ]
    with caplog.at_level("WARNING", logger="attnmt.train"):
        trainer = build_trainer(tiny_experiment(overrides), tmp_path / "run")
    corpus = trainer.train_batches.corpus
    too_long = int((corpus.src_lengths > 5).sum())
    assert 0 < too_long < len(corpus)
    assert f"{too_long} of {len(corpus)} pairs have a source longer than" in caplog.text
    assert trainer.train_batches.examples_per_epoch == len(corpus) - too_long
    initial = trainer.evaluate()
    trainer.run()
    assert trainer.evaluate()["nll"] < 0.7 * initial["nll"], (initial, trainer.evaluate())
    ((rows, length),) = trainer.plan.update_shapes
    (signature,) = trainer.program.train_step._compiled  # the pre-flight's executable
    # (state, batch) flattened: the batch's six arrays come last, in sorted key order.
    batch_shapes = [shape for shape, _ in signature[1][-6:]]
    assert batch_shapes == [(rows, 5)] * 3 + [(rows, 16)] * 3 and length == 16
    assert trainer.program.train_step._jitted._cache_size() == 0  # nothing compiled again


def test_cli_train_ends_by_printing_the_test_bleu(reversal_corpus, tmp_path, capsys):
    """The README's first command ends with the score: train.test_at_end decodes the test
    split with the newest checkpoint and prints what `attnmt evaluate` prints."""
    (reversal_corpus / "test.src").write_text((reversal_corpus / "dev.src").read_text())
    (reversal_corpus / "test.tgt").write_text((reversal_corpus / "dev.tgt").read_text())
    workdir = tmp_path / "run"
    argv = ["train", "--config", str(TINY_CONFIG), "--workdir", str(workdir)]
    overrides = reversal_overrides(reversal_corpus, 30)
    assert main([*argv, *overrides, "--config.decode.beam_size=2"]) == 0
    out = capsys.readouterr().out
    assert "stopped at step 30" in out
    (printed,) = (float(x) for x in re.findall(r"sacreBLEU\s+([0-9.]+)", out))
    hypotheses = (workdir / "decodes" / "test-step30-beam2.tgt").read_text().splitlines()
    references = (reversal_corpus / "test.tgt").read_text().splitlines()
    assert printed == pytest.approx(
        sacrebleu.corpus_bleu(hypotheses, [references]).score, abs=0.006
    )
    assert "tokenized BLEU" in out

    (reversal_corpus / "test.src").unlink()  # a corpus without a test split: said, not fatal
    assert main([*argv, *reversal_overrides(reversal_corpus, 30)]) == 0
    assert "no test BLEU" in capsys.readouterr().out


def _resumed_run_ends_where_one_run_does(overrides, tmp_path):
    """One run of 60 updates that learns, and one stopped after 25 and resumed, end on the
    same parameters bit for bit; returns the one run."""
    overrides = [*overrides, "--config.train.checkpoint_every_steps=25"]
    one_run = build_trainer(tiny_experiment(overrides), tmp_path / "one")
    initial = one_run.evaluate()
    one_run.run()
    assert one_run.evaluate()["nll"] < 0.8 * initial["nll"]
    stopped = build_trainer(
        tiny_experiment([*overrides, "--config.train.num_steps=25"]), tmp_path / "two"
    )
    assert stopped.run().step == 25
    resumed = build_trainer(tiny_experiment(overrides), tmp_path / "two")
    assert resumed.run().step == 60
    leaves = jax.tree_util.tree_leaves
    for got, want in zip(leaves(resumed.state.params), leaves(one_run.state.params), strict=True):
        assert np.array_equal(np.asarray(got), np.asarray(want))
    return one_run


def test_bpe_and_early_dropout_resumed_mid_run_end_bit_for_bit_where_one_run_does(
    reversal_corpus, tmp_path
):
    """data.subword_dropout: each epoch segmented anew on the input thread; and
    train.early_dropout_*: dropout 0 for 40 updates, then 0.3. Stopped after 25 updates
    (inside an epoch, before the switch) and resumed, the run ends on the parameters of one
    run: the resumed part crosses epochs and holds the switch, at the same update. (One run
    for both: each alone costs as much, and either going wrong breaks the equality.)"""
    overrides = [
        *reversal_overrides(reversal_corpus, 60),
        "--config.data.pack_length=16",
        "--config.data.subword_dropout=0.3",
        "--config.model.dropout_rate=0.3",
        "--config.train.early_dropout_steps=40",
        "--config.train.early_dropout_rate=0.0",
    ]
    one_run = _resumed_run_ends_where_one_run_does(overrides, tmp_path)
    assert one_run.train_batches.epoch >= 2  # the resumed part crosses epochs


@pytest.mark.parametrize("accumulated", [False, True], ids=["fused", "accumulated"])
def test_early_dropout_runs_without_dropout_until_its_step(reversal_corpus, tmp_path, accumulated):
    """Dropout 0 for the first 12 updates, then 0.3: with SGD (updates linear in the
    gradient, tests/equivalence.py) the first 12 are those of a run without dropout, and
    the run of 16 is not; both through the fused step and through gradient accumulation
    (train.max_tokens_per_device, where the loop hands the step to each micro-batch). Each
    run is 16 updates with a checkpoint at 12, read back for the first comparison."""

    def sgd_run(name, *extra):
        overrides = [
            *reversal_overrides(reversal_corpus, 16),
            "--config.optim.algorithm=sgd",
            "--config.train.eval_every_steps=0",
            "--config.train.checkpoint_every_steps=12",
            "--config.parallel.num_devices=1",  # 512 tokens on one device: 8 rows of 64
            *(["--config.train.max_tokens_per_device=128"] if accumulated else []),
            *extra,
        ]
        trainer = build_trainer(tiny_experiment(overrides), tmp_path / name)
        assert trainer.accumulation_steps == (4 if accumulated else 1)
        start = jax.device_get(trainer.state.params)
        trainer.run()
        at_12 = CheckpointManager(tmp_path / name).restore_params(12, trainer.state.params)
        return start, jax.device_get(at_12), jax.device_get(trainer.state.params)

    phased = (
        "--config.model.dropout_rate=0.3",
        "--config.train.early_dropout_steps=12",
        "--config.train.early_dropout_rate=0.0",
    )
    start, without_12, without_16 = sgd_run("without")
    phased_start, early_12, phased_16 = sgd_run("phased", *phased)
    leaves = jax.tree_util.tree_leaves
    assert all(map(np.array_equal, leaves(start), leaves(phased_start)))  # one seed, one start
    assert_same_updates(start, without_12, early_12, steps=12)
    # The comparison tells dropout apart: four updates at 0.3 are enough to fail it.
    with pytest.raises(AssertionError):  # after update 12 the rate is 0.3
        assert_same_updates(start, without_16, phased_16, steps=16)
