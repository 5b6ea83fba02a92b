"""Memory pre-flight: the estimate against independent counts, and refusal with a fake limit."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from attnmt.config import Experiment
from attnmt.errors import ConfigError
from attnmt.model.param_count import count_parameters
from attnmt.parallel.memory import device_memory_limit
from attnmt.train.assemble import build_trainer
from attnmt.train.loop import Trainer
from attnmt.train.preflight import estimate_train_memory, memory_preflight
from tests.helpers import corpus_paths, tiny_experiment


def _experiment(corpus: Path, *overrides: str) -> Experiment:
    return tiny_experiment(
        [
            *corpus_paths(corpus),
            "--config.data.max_length=16",
            "--config.data.tokens_per_batch=256",
            "--config.model.vocab_size=32",
            "--config.model.num_layers=1",  # the checks do not depend on depth; compiles do
            "--config.train.eval_every_steps=0",
            *overrides,
        ]
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    lines = [
        " ".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 12))) for _ in range(300)
    ]
    (root / "train.src").write_text("\n".join(lines) + "\n")
    (root / "train.tgt").write_text("\n".join(line[::-1] for line in lines) + "\n")
    return root


@pytest.fixture(scope="module")
def trainer(corpus, tmp_path_factory) -> Trainer:
    experiment = _experiment(corpus, "--config.train.memory_preflight=false")
    # The switch is honoured: even a 1-byte limit is not checked.
    return build_trainer(experiment, tmp_path_factory.mktemp("run"), memory_limit_bytes=1)


def run_preflight(trainer: Trainer, limit: int | None):
    return memory_preflight(trainer.program, trainer.shapes, trainer.accumulation_steps, limit)


def test_estimate_counts_the_state_and_at_least_the_logits(trainer):
    estimate = run_preflight(trainer, limit=None)
    model = trainer.experiment.model
    params = count_parameters(model)["total"]
    # float32 parameters and two Adam moments; four int32 scalars (step, skip count, and the
    # update counts of Adam and of the schedule); a uint32[2] key.
    assert estimate.state_bytes == 3 * 4 * params + 4 * 4 + 2 * 4
    assert estimate.shape == max(trainer.shapes, key=lambda s: s[1])
    batch, length = estimate.shape
    # The float32 logits [batch, length, vocab] must exist at once (and their gradient).
    assert estimate.other_bytes >= batch * length * model.vocab_size * 4


def test_bleu_during_training_leaves_room_for_the_train_state(trainer):
    params = count_parameters(trainer.experiment.model)["total"]
    # The state of the test above, whole on every device of the data-parallel mesh.
    assert trainer.validation.translator._reserved_bytes == 3 * 4 * params + 4 * 4 + 2 * 4


def test_accumulation_also_holds_the_gradient_sums(trainer):
    abstract = trainer.program.abstract_state
    shape = trainer.shapes[-1]
    one = estimate_train_memory(
        trainer.program.train_step, trainer.program.grad_step, abstract, shape, 1
    )
    two = estimate_train_memory(
        trainer.program.train_step, trainer.program.grad_step, abstract, shape, 2
    )
    params = count_parameters(trainer.experiment.model)["total"]
    assert two.state_bytes == one.state_bytes
    assert two.total_bytes >= two.state_bytes + 4 * params + shape[0] * shape[1] * 32 * 4


def test_a_step_that_cannot_fit_is_refused_naming_what_to_change(trainer):
    estimate = run_preflight(trainer, limit=None)
    assert run_preflight(trainer, limit=estimate.total_bytes) == estimate
    with pytest.raises(ConfigError) as info:
        run_preflight(trainer, limit=estimate.total_bytes - 1)
    message = str(info.value)
    for key in ("data.tokens_per_batch (now 256;", "train.grad_accum_steps (now 1;"):
        assert key in message
    assert "model.d_model=32" in message and "may fit" in message
    assert "train.memory_preflight=false" in message
    with pytest.raises(ConfigError, match="Adam moments alone do not fit"):
        run_preflight(trainer, limit=estimate.state_bytes - 1)


def test_the_trainer_refuses_before_any_step(corpus, tmp_path):
    with pytest.raises(ConfigError, match="memory pre-flight: one training step"):
        build_trainer(_experiment(corpus), tmp_path, memory_limit_bytes=100_000)
    assert not list((tmp_path / "checkpoints").glob("[0-9]*"))


def test_cpu_devices_share_the_host_memory(trainer, monkeypatch):
    """Every CPU device of the mesh draws on one host memory: a host that holds one step
    but not one per device is refused."""
    from attnmt.train import preflight

    devices = list(trainer.program.mesh.devices.flat)
    assert len(devices) > 1, "the suite runs on several fake CPU devices"
    estimate = run_preflight(trainer, limit=1 << 50)
    host = estimate.total_bytes * len(devices) - 1  # one byte short of a step per device
    monkeypatch.setattr(preflight, "device_memory_limit", lambda device: (host, "host"))
    with pytest.raises(ConfigError, match=f"shared by {len(devices)} CPU devices"):
        run_preflight(trainer, limit=None)
    monkeypatch.setattr(preflight, "device_memory_limit", lambda device: (host + 1, "host"))
    assert run_preflight(trainer, limit=None) == estimate


def test_cpu_limit_is_at_most_the_physical_memory():
    limit, where = device_memory_limit()
    assert where == "host memory (CPU)" and limit is not None and limit > 0
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        total_kib = int(meminfo.read_text().split("MemTotal:")[1].split()[0])
        assert limit <= total_kib * 1024


def _longest_batch(trainer):
    """A batch of the longest bucket's shape (the one the pre-flight compiles), on the mesh."""
    import numpy as np

    from attnmt.parallel.sharding import put_batch

    shape = max(trainer.shapes, key=lambda s: (s[1], s[0] * s[1]))
    tokens = np.full(shape, 5, np.int32)
    return tokens, put_batch({"src_tokens": tokens, "tgt_tokens": tokens}, trainer.mesh)


def _count_compiles() -> list[float]:
    """A list that grows by one for every XLA backend compile from now on. The suite's
    persistent compilation cache (tests/conftest.py) is turned off for the rest of this
    process's tests: a compile served from it would not be counted."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # forget that this process already chose to use it
    compiles: list[float] = []

    def count(event, seconds, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(count)
    return compiles


def test_training_runs_the_step_the_preflight_compiled(corpus, tmp_path):
    """The pre-flight's compile of the longest bucket's step is the one training runs: a
    step on that shape compiles nothing more (jax.jit alone would compile it again)."""
    import jax

    from attnmt.parallel.sharding import put_batch

    trainer = build_trainer(_experiment(corpus), tmp_path / "run")  # pre-flight on (default)
    tokens, batch = _longest_batch(trainer)
    compiles = _count_compiles()
    state, _ = trainer.program.train_step(trainer.state, batch)
    jax.block_until_ready(state)
    other = put_batch({"src_tokens": tokens[:, :-1], "tgt_tokens": tokens[:, :-1]}, trainer.mesh)
    trainer.program.train_step(state, other)  # another shape: compiled now (the check can fail)
    assert len(compiles) == 1


def test_the_preflight_checks_the_micro_batch_the_batch_plan_accumulates(corpus, tmp_path):
    """train.max_tokens_per_device splits the update into micro-batches (grad_accum_steps
    stays 1): the pre-flight analyses and compiles the gradient step on the micro-batch,
    which training then runs without compiling it again."""
    import jax

    experiment = _experiment(
        corpus, "--config.train.max_tokens_per_device=64", "--config.parallel.num_devices=1"
    )
    trainer = build_trainer(experiment, tmp_path / "run")
    assert trainer.accumulation_steps == 4  # 256 tokens per update, 64 per micro-batch
    assert max(batch * length for batch, length in trainer.shapes) <= 64
    _, batch = _longest_batch(trainer)
    compiles = _count_compiles()
    state = trainer.state
    grads, _ = trainer.program.grad_step(state.params, batch, state.dropout_rng, state.step)
    jax.block_until_ready(grads)
    assert compiles == []
