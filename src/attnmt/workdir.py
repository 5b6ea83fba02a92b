"""What a training workdir holds, and loading it for inference (translate, evaluate)."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import jax
import numpy as np

from attnmt.checkpoint.manager import CheckpointManager
from attnmt.data.prepare import vocab_path
from attnmt.data.tokenizer import Tokenizer
from attnmt.errors import CheckpointError
from attnmt.experiment import Experiment
from attnmt.model.transformer import Transformer
from attnmt.train import step as steps
from attnmt.train.optim import make_optimizer


@dataclasses.dataclass(frozen=True)
class LoadedRun:
    experiment: Experiment
    tokenizer: Tokenizer
    params: Any
    step: int
    workdir: Path


def abstract_train_state(experiment: Experiment) -> steps.TrainState:
    """Shapes and dtypes of the train state, placed on this process's first device.

    Naming the placement lets Orbax restore a checkpoint written on any mesh or number of
    processes (inference needs no sharding).
    """
    model = Transformer(experiment.model)
    optimizer = make_optimizer(experiment.optim, experiment.model.d_model)
    example = {
        "src_tokens": np.zeros((1, 8), np.int32),
        "tgt_tokens": np.zeros((1, 8), np.int32),
    }
    create = functools.partial(steps.create_train_state, model, optimizer)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree_util.tree_map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device),
        jax.eval_shape(create, jax.random.PRNGKey(0), example),
    )


def load_run(workdir: str | Path, step: int | None = None) -> LoadedRun:
    """Config, vocabulary and parameters of a workdir's newest (or given) checkpoint."""
    workdir = Path(workdir)
    manager = CheckpointManager(workdir)
    steps_present = manager.all_steps()
    if not steps_present:
        raise CheckpointError(
            f"no checkpoint in {manager.directory}: train first, or check --workdir"
        )
    chosen = steps_present[-1] if step is None else step
    if chosen not in steps_present:
        raise CheckpointError(
            f"no checkpoint for step {chosen} in {manager.directory}; present: {steps_present}"
        )
    experiment = Experiment.from_mapping(manager.restore_config(chosen))
    tokenizer_file = vocab_path(experiment.data, workdir)
    tokenizer = Tokenizer.load(tokenizer_file)
    state, _, _ = manager.restore(chosen, abstract_train_state(experiment))
    manager.close()
    return LoadedRun(experiment, tokenizer, state.params, chosen, workdir)
