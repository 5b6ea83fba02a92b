"""The training loop on different meshes: a parallelism change is a config change. A run
saved on 8 devices resumes on 4, and one saved on 4 resumes on 8 with tensor parallelism
added: restored into the new shardings, the data order and the dropout masks continue
identically, and the losses and parameters match the uninterrupted run (SGD, bounds from
tests/equivalence.py; another mesh sums in another order, so not bit for bit)."""

import jax
import numpy as np
import pytest

from tests.equivalence import assert_same_losses, assert_same_updates, initial_params
from tests.helpers import reversal_overrides, tiny_experiment, write_reversal_corpus

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (fake) devices")
STEPS = 8
DATA_FSDP = ["--config.parallel.data=-1", "--config.parallel.fsdp=2"]
MIXED = ["--config.parallel.data=2", "--config.parallel.fsdp=2", "--config.parallel.tensor=2"]


def _run(corpus, workdir, steps, devices, parallel, dropout):
    from attnmt.train.assemble import build_trainer

    overrides = [
        *reversal_overrides(corpus, steps),
        f"--config.model.dropout_rate={dropout}",
        "--config.optim.algorithm=sgd",
        "--config.train.memory_preflight=false",
        "--config.train.eval_every_steps=0",
        "--config.train.checkpoint_every_steps=4",
        "--config.train.log_every_steps=1",
        f"--config.parallel.num_devices={devices}",
        *parallel,
    ]
    trainer = build_trainer(tiny_experiment(overrides), workdir)
    data_state = trainer.train_batches.get_state()
    start = jax.device_get(trainer.state.params)
    result = trainer.run()
    return trainer, data_state, start, result


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_reversal_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, corpus):
    """What the resumed runs must match: STEPS updates on 8 devices (data × fsdp), never
    stopped, for each dropout rate used below."""
    runs = {}
    for dropout in (0.0, 0.3):
        workdir = tmp_path_factory.mktemp("ref")
        trainer, _, start, result = _run(corpus, workdir, STEPS, 8, DATA_FSDP, dropout)
        # It starts where any new run of the config starts, whatever the mesh.
        fresh = initial_params(trainer.experiment)
        leaves = jax.tree_util.tree_leaves
        assert all(np.array_equal(a, b) for a, b in zip(leaves(start), leaves(fresh), strict=True))
        runs[dropout] = trainer, start, result
    return runs


@pytest.mark.slow
@pytest.mark.parametrize(
    "first, second, dropout",
    [
        # Dropout masks must follow the run onto the new mesh (threefry keys).
        ((8, DATA_FSDP), (4, DATA_FSDP), 0.3),
        # Tensor parallelism added on resume. Without dropout: with it (0.3) the two runs
        # were measured to differ by 9e-4 of the update's norm after 8 steps, 30× more than
        # without tensor parallelism; the cause is not found yet, so that case is not
        # claimed here (README "Resume on another device count").
        ((4, DATA_FSDP), (8, MIXED), 0.0),
    ],
    ids=["8-to-4-dropout", "4-to-8-with-tensor"],
)
def test_resume_on_another_mesh(corpus, uninterrupted, tmp_path, first, second, dropout):
    reference, start, reference_result = uninterrupted[dropout]
    _run(corpus, tmp_path, STEPS // 2, *first, dropout)
    resumed, data_state, _, result = _run(corpus, tmp_path, STEPS, *second, dropout)
    assert resumed.mesh.size == second[0] and data_state["index"] > 0
    if second[1] == MIXED:
        assert dict(resumed.mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
        spec = str(resumed.state.params["embed"]["embedding"].sharding.spec)
        assert "tensor" in spec and "fsdp" in spec
    assert_same_losses([reference_result.last_train["loss"]], [result.last_train["loss"]])
    assert_same_updates(start, reference.state.params, resumed.state.params, steps=STEPS)
