"""`attnmt train` on an imported workdir: it starts from the imported parameters (the dev
loss is Hugging Face's), keeps what Hugging Face holds fixed, and once it has written a
checkpoint it resumes from it: 2 updates, then 2 more in a new trainer, end bit-identical
to 4 updates in one run (parameters, Adam moments and count, dropout key, data position)."""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from attnmt.config import load_experiment
from attnmt.config.experiment import Experiment
from attnmt.train.assemble import build_trainer
from attnmt.workdir import load_run
from tests.helpers import EN, sentences, translation, write_word_task_corpus

torch = pytest.importorskip("torch", reason="the interop tests need the [hf] extra")

PAIRS = {"train": sentences(EN, 64, seed=11), "dev": sentences(EN, 16, seed=12)}


def _experiment(workdir: Path, corpus: Path, steps: int, evaluate: bool = False) -> Experiment:
    """What `attnmt train --config configs/finetune.py:workdir=W,steps=N …` trains; with
    evaluation on the dev pairs only where it is looked at (it never changes the state)."""
    return load_experiment(
        f"configs/finetune.py:workdir={workdir},steps={steps}",
        [
            f"--config.data.src_path={corpus}/{{split}}.{{src}}",
            f"--config.data.tgt_path={corpus}/{{split}}.{{tgt}}",
            "--config.data.eval_split=dev",
            "--config.data.tokens_per_batch=512",
            "--config.data.eval_tokens_per_batch=1024",
            "--config.data.max_length=64",
            "--config.data.min_bucket_length=64",  # one compiled shape
            "--config.train.log_every_steps=1",
            "--config.parallel.num_devices=1",
            "--config.train.memory_preflight=false",
            f"--config.train.eval_every_steps={1000 if evaluate else 0}",
            "--config.train.xla_backend_optimization_level=0",
        ],
    )


def _leaves(state) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(jax.device_get(state))]


def test_fine_tuning_starts_from_the_imported_model_and_resumes(hf, imported, tmp_path):
    model, tokenizer = hf
    corpus = write_word_task_corpus(tmp_path, PAIRS)
    run, uninterrupted = tmp_path / "run", tmp_path / "uninterrupted"
    shutil.copytree(imported, run)
    shutil.copytree(imported, uninterrupted)
    assert model.config.dropout > 0  # so the dropout key's continuation is checked too

    first = build_trainer(_experiment(run, corpus, steps=2, evaluate=True), run)
    before = first.evaluate()
    # The imported model's own loss on the dev pairs, by Hugging Face (mean token NLL).
    batch = tokenizer(
        PAIRS["dev"],
        text_target=list(map(translation, PAIRS["dev"])),
        return_tensors="pt",
        padding=True,
    )
    batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
    with torch.no_grad():
        reference = float(model(**batch).loss)
    assert before["tokens"] == int((batch["labels"] >= 0).sum())  # every dev token counted
    assert before["nll"] == pytest.approx(reference, rel=1e-5)
    result = first.run()
    assert result.step == 2 and np.isfinite(result.last_train["loss"])
    tuned, start = load_run(run).params, load_run(imported).params
    assert load_run(run).step == 2
    changed = jax.tree_util.tree_map(lambda a, b: bool(np.any(a != b)), tuned, start)
    assert any(jax.tree_util.tree_leaves(changed))
    # Held fixed, as Hugging Face holds them: the logits bias and the zero pad row.
    np.testing.assert_array_equal(tuned["final_logits_bias"], start["final_logits_bias"])
    assert not np.any(np.asarray(tuned["embed"]["embedding"][0]))

    # The same command asked for 4 updates (here without the evaluation, in both runs):
    # it resumes from step 2, not from the imported parameters of step 0 (still in
    # checkpoints/0), with step 2's data position.
    second = build_trainer(_experiment(run, corpus, steps=4), run)
    assert int(second.state.step) == 2
    assert all(
        np.array_equal(a, b)
        for a, b in zip(_leaves(second.state.params), _leaves(tuned), strict=True)
    )
    assert second.run().step == 4
    reference_run = build_trainer(_experiment(uninterrupted, corpus, steps=4), uninterrupted)
    assert reference_run.run().step == 4
    assert second.train_batches.get_state() == reference_run.train_batches.get_state()
    got, want = _leaves(second.state), _leaves(reference_run.state)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert load_run(run).step == load_run(uninterrupted).step == 4
