"""A run saved on 8 devices resumes on 4 (and one saved on 4 on 8): restored into the new
sharding, the data order continues identically and the losses match the uninterrupted run."""

import jax
import numpy as np
import pytest

from tests.train.test_end_to_end import _experiment, _overrides, reversal_corpus  # noqa: F401

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (fake) devices")


def _run(corpus, workdir, steps, devices):
    from attnmt.train.loop import Trainer

    overrides = [
        *_overrides(corpus, steps),
        "--config.train.memory_preflight=false",
        "--config.train.checkpoint_every_steps=4",
        "--config.train.log_every_steps=1",
        f"--config.parallel.num_devices={devices}",
        "--config.parallel.fsdp=2",
    ]
    trainer = Trainer(_experiment(overrides), workdir)
    data_state = trainer.train_batches.get_state()
    trainer.run()
    return trainer, data_state


@pytest.mark.slow
@pytest.mark.parametrize("first, second", [(8, 4), (4, 8)])
def test_resume_on_a_different_device_count(reversal_corpus, tmp_path, first, second):  # noqa: F811
    reference, _ = _run(reversal_corpus, tmp_path / "ref", 8, first)
    _run(reversal_corpus, tmp_path / "moved", 4, first)
    resumed, data_state = _run(reversal_corpus, tmp_path / "moved", 8, second)
    assert resumed.mesh.size == second and data_state["index"] > 0
    assert abs(resumed._last_train["loss"] - reference._last_train["loss"]) <= 1e-5 * abs(
        reference._last_train["loss"]
    )
    for a, b in zip(
        jax.tree_util.tree_leaves(reference.state.params),
        jax.tree_util.tree_leaves(resumed.state.params),
        strict=True,
    ):
        a, b = np.asarray(a), np.asarray(b)
        assert np.max(np.abs(a - b)) <= 1e-5 * max(np.max(np.abs(a)), 1e-3)
