"""One code path from 1 to 8 devices: the same steps give the same loss and parameters on
any mesh, and FSDP really shards parameters and optimizer state.

The runs compared use SGD and the bounds of tests/equivalence.py, which says why."""

import dataclasses

import jax
import numpy as np
import pytest

from attnmt.checkpoint.ema_state import find_ema_params
from attnmt.common import EOS_ID, PAD_ID
from attnmt.config.data import DataConfig
from attnmt.config.experiment import Experiment
from attnmt.config.parallel import ParallelConfig
from attnmt.config.train import OptimConfig
from attnmt.data.pipeline import BatchIterator, TokenizedCorpus
from attnmt.parallel.mesh import make_mesh, mesh_shape
from attnmt.parallel.sharding import bytes_per_device, put_batch
from attnmt.train.program import build_program
from tests.equivalence import assert_same_losses, assert_same_updates
from tests.helpers import tiny_model

CONFIG = tiny_model(vocab_size=32, d_model=32, d_ff=64, num_heads=4, num_layers=1, dropout_rate=0.1)
pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (fake) devices")


STEPS = 3
PACK_LENGTH = 16


def _batches(count=STEPS, rows=16, length=8):
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(count):
        batch = {}
        for name in ("src_tokens", "tgt_tokens"):
            tokens = rng.integers(4, 32, size=(rows, length)).astype(np.int32)
            for row, n in enumerate(rng.integers(2, length + 1, size=rows)):
                tokens[row, n - 1], tokens[row, n:] = EOS_ID, PAD_ID
            batch[name] = tokens
        batches.append(batch)
    return batches


def _packed_batches(count=STEPS, rows=16, length=PACK_LENGTH):
    """Batches of several examples per row (data.pack_length), with segment ids and positions."""
    rng = np.random.default_rng(1)
    sides = []
    for _ in range(2):
        lengths = rng.integers(2, 8, size=200)
        tokens = [np.r_[rng.integers(4, 32, size=n - 1), EOS_ID] for n in lengths]
        sides += [np.concatenate(tokens), np.r_[0, np.cumsum(lengths)]]
    iterator = BatchIterator(TokenizedCorpus(*sides), [(rows, length)], seed=0, pack=True)
    return [next(iterator) for _ in range(count)]


def _program(
    parallel: ParallelConfig, devices, algorithm: str = "sgd", packed: bool = False, ema: float = 0
):
    experiment = dataclasses.replace(
        Experiment.from_mapping({}),
        model=CONFIG,
        optim=OptimConfig(algorithm=algorithm, warmup_steps=4, ema_decay=ema),
    )
    if packed:
        data = DataConfig(max_length=PACK_LENGTH, pack_length=PACK_LENGTH)
        experiment = dataclasses.replace(experiment, data=data)
    return build_program(experiment, make_mesh(parallel, devices))


def _run(parallel: ParallelConfig, devices, packed: bool = False):
    program = _program(parallel, devices, packed=packed)
    state = program.init_state()
    losses, initial = [], jax.device_get(state.params)
    for batch in _packed_batches() if packed else _batches():
        state, metrics = program.train_step(state, put_batch(batch, program.mesh))
        losses.append(float(metrics["loss"]))
    return initial, state, losses


@pytest.fixture(scope="module")
def single_device():
    return _run(ParallelConfig(data=1), jax.devices()[:1])


@pytest.mark.parametrize(
    "parallel",
    [
        ParallelConfig(data=8),
        ParallelConfig(data=1, fsdp=8),
        ParallelConfig(data=4, tensor=2),
        ParallelConfig(data=2, fsdp=2, tensor=2),
        ParallelConfig(data=1, fsdp=2, tensor=4),
    ],
    ids=["dp8", "fsdp8", "dp4-tp2", "2x2x2", "fsdp2-tp4"],
)
def test_same_losses_and_parameters_on_any_mesh(single_device, parallel):
    initial, reference_state, reference_losses = single_device
    same_start, state, losses = _run(parallel, jax.devices()[:8])
    # Initialisation draws the same bits on any mesh.
    leaves = jax.tree_util.tree_leaves
    for a, b in zip(leaves(initial), leaves(same_start), strict=True):
        np.testing.assert_array_equal(a, b)
    assert_same_losses(reference_losses, losses)
    assert_same_updates(initial, reference_state.params, state.params, steps=STEPS)


@pytest.mark.parametrize(
    "parallel",
    [ParallelConfig(data=8), ParallelConfig(data=2, fsdp=2, tensor=2)],
    ids=["dp8", "2x2x2"],
)
def test_packed_batches_give_the_same_steps_on_any_mesh(parallel):
    """Segment ids and positions are sharded with the tokens: rows split over devices
    compute what one device computes."""
    initial, reference_state, reference_losses = _run(
        ParallelConfig(data=1), jax.devices()[:1], packed=True
    )
    _, state, losses = _run(parallel, jax.devices()[:8], packed=True)
    assert_same_losses(reference_losses, losses)
    assert_same_updates(initial, reference_state.params, state.params, steps=STEPS)


def test_fsdp_holds_an_eighth_of_the_state_per_device():
    def held(parallel):
        # The state as created; every step returns it in the same shardings (out_shardings).
        state = _program(parallel, jax.devices()[:8], algorithm="adam").init_state()  # 2 moments
        return bytes_per_device((state.params, state.opt_state))

    replicated_bytes = held(ParallelConfig(data=8))
    fsdp_bytes = held(ParallelConfig(data=1, fsdp=8))
    assert len(set(replicated_bytes.values())) == 1
    ratio = max(fsdp_bytes.values()) / max(replicated_bytes.values())
    # Every matrix has an embed axis split 8 ways; only small bias vectors over mlp stay whole.
    assert 1 / 8 <= ratio < 0.15, ratio


@pytest.mark.parametrize(
    "parallel", [ParallelConfig(data=1, fsdp=8), ParallelConfig(data=2, fsdp=2, tensor=2)]
)
def test_the_moving_average_is_sharded_as_the_parameters(parallel):
    program = _program(parallel, jax.devices()[:8], algorithm="adam", ema=0.99)
    state = program.init_state()
    state, _ = program.train_step(state, put_batch(_batches(1)[0], program.mesh))
    average = find_ema_params(state.opt_state)
    leaves = jax.tree_util.tree_leaves
    for param, mean in zip(leaves(state.params), leaves(average), strict=True):
        assert mean.sharding.is_equivalent_to(param.sharding, param.ndim), (param.shape,)
        assert mean.shape == param.shape


def test_mesh_sizes_resolve_and_refuse_bad_products():
    assert mesh_shape(ParallelConfig(data=-1, fsdp=2, tensor=2), 8) == (2, 2, 2)
    assert mesh_shape(ParallelConfig(data=1, fsdp=-1), 8) == (1, 8, 1)
    from attnmt.errors import ConfigError

    with pytest.raises(ConfigError, match="parallel"):
        mesh_shape(ParallelConfig(data=3), 8)
    with pytest.raises(ConfigError, match="parallel"):
        mesh_shape(ParallelConfig(data=-1, fsdp=3), 8)
