"""The training loop itself on different meshes: a parallelism change is a config change
that leaves the trained parameters the same (SGD, bounds from tests/equivalence.py)."""

import jax
import numpy as np
import pytest

from tests.equivalence import assert_same_losses, assert_same_updates, initial_params
from tests.train.test_end_to_end import _experiment, _overrides, reversal_corpus  # noqa: F401

STEPS = 6
pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (fake) devices")


def _train(corpus, workdir, parallel):
    from attnmt.train.loop import Trainer

    overrides = [
        *_overrides(corpus, STEPS),
        "--config.model.dropout_rate=0.1",
        "--config.optim.algorithm=sgd",
        "--config.train.log_every_steps=1",
        "--config.train.memory_preflight=false",
        *parallel,
    ]
    trainer = Trainer(_experiment(overrides), workdir)
    start = jax.device_get(trainer.state.params)
    result = trainer.run()
    return trainer, start, result


@pytest.mark.slow
def test_loop_gives_the_same_parameters_on_two_meshes(reversal_corpus, tmp_path):  # noqa: F811
    data_parallel, start, dp_result = _train(
        reversal_corpus, tmp_path / "dp", ["--config.parallel.data=-1"]
    )
    mixed, mixed_start, mixed_result = _train(
        reversal_corpus,
        tmp_path / "mixed",
        [
            "--config.parallel.data=2",
            "--config.parallel.fsdp=2",
            "--config.parallel.tensor=2",
        ],
    )
    assert dict(mixed.mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    embedding = mixed.state.params["embed"]["embedding"]
    assert "tensor" in str(embedding.sharding.spec) and "fsdp" in str(embedding.sharding.spec)
    # Both start where a fresh run of the config starts, whatever the mesh.
    for ours, theirs, fresh in zip(
        jax.tree_util.tree_leaves(start),
        jax.tree_util.tree_leaves(mixed_start),
        jax.tree_util.tree_leaves(initial_params(data_parallel.experiment)),
        strict=True,
    ):
        np.testing.assert_array_equal(ours, theirs)
        np.testing.assert_array_equal(ours, fresh)
    assert_same_losses([dp_result.last_train["loss"]], [mixed_result.last_train["loss"]])
    assert_same_updates(start, data_parallel.state.params, mixed.state.params, steps=STEPS)
