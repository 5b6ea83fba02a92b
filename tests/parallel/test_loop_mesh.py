"""The training loop itself on different meshes: a parallelism change is a config change
that leaves the trained parameters the same."""

import jax
import numpy as np
import pytest

from tests.train.test_end_to_end import _experiment, _overrides, reversal_corpus  # noqa: F401

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (fake) devices")


def _train(corpus, workdir, parallel):
    from attnmt.train.loop import Trainer

    overrides = [
        *_overrides(corpus, 6),
        "--config.model.dropout_rate=0.1",
        "--config.train.memory_preflight=false",
        *parallel,
    ]
    trainer = Trainer(_experiment(overrides), workdir)
    trainer.run()
    return trainer


@pytest.mark.slow
def test_loop_gives_the_same_parameters_on_two_meshes(reversal_corpus, tmp_path):  # noqa: F811
    data_parallel = _train(reversal_corpus, tmp_path / "dp", ["--config.parallel.data=-1"])
    mixed = _train(
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
    for a, b in zip(
        jax.tree_util.tree_leaves(data_parallel.state.params),
        jax.tree_util.tree_leaves(mixed.state.params),
        strict=True,
    ):
        a, b = np.asarray(a), np.asarray(b)
        assert np.max(np.abs(a - b)) <= 1e-5 * max(np.max(np.abs(a)), 1e-3)
