"""A run saved on 8 devices resumes on 4 (and one saved on 4 on 8): restored into the new
sharding, the data order and the dropout masks continue identically, and the losses and
parameters match the uninterrupted run (SGD, bounds from tests/equivalence.py)."""

import jax
import pytest

from tests.equivalence import assert_same_losses, assert_same_updates, initial_params
from tests.train.test_end_to_end import _experiment, _overrides, reversal_corpus  # noqa: F401

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (fake) devices")
STEPS = 8


def _run(corpus, workdir, steps, devices, rng="threefry"):
    from attnmt.train.loop import Trainer

    overrides = [
        *_overrides(corpus, steps),
        "--config.model.dropout_rate=0.3",  # the masks must follow the run across meshes
        f"--config.train.dropout_rng={rng}",
        "--config.optim.algorithm=sgd",
        "--config.train.memory_preflight=false",
        "--config.train.checkpoint_every_steps=4",
        "--config.train.log_every_steps=1",
        f"--config.parallel.num_devices={devices}",
        "--config.parallel.fsdp=2",
    ]
    trainer = Trainer(_experiment(overrides), workdir)
    data_state = trainer.train_batches.get_state()
    result = trainer.run()
    return trainer, data_state, result


@pytest.mark.slow
@pytest.mark.parametrize("first, second", [(8, 4), (4, 8)])
def test_resume_on_a_different_device_count(reversal_corpus, tmp_path, first, second):  # noqa: F811
    reference, _, reference_result = _run(reversal_corpus, tmp_path / "ref", STEPS, first)
    _run(reversal_corpus, tmp_path / "moved", STEPS // 2, first)
    resumed, data_state, result = _run(reversal_corpus, tmp_path / "moved", STEPS, second)
    assert resumed.mesh.size == second and data_state["index"] > 0
    assert_same_losses([reference_result.last_train["loss"]], [result.last_train["loss"]])
    start = initial_params(reference.experiment)
    assert_same_updates(start, reference.state.params, resumed.state.params, steps=STEPS)
