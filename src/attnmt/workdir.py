"""What a training workdir holds, and loading it for inference (translate, evaluate,
attention maps): its config, vocabulary and parameters. Nothing of training is imported or
read: the optimizer state in the checkpoint (twice the parameters with Adam) stays on disk.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax

from attnmt.checkpoint.manager import CheckpointManager, checkpoint_dir
from attnmt.config.experiment import Experiment
from attnmt.config.model import ModelConfig
from attnmt.data.pair_tokenizer import PairTokenizer
from attnmt.data.prepare import vocab_path
from attnmt.data.tokenizer import Tokenizer
from attnmt.errors import CheckpointError
from attnmt.model.param_count import abstract_params
from attnmt.storage import Path, as_path


@dataclasses.dataclass(frozen=True)
class LoadedRun:
    experiment: Experiment
    tokenizer: Tokenizer | PairTokenizer
    params: Any
    step: int
    workdir: Path


def abstract_params_on_one_device(model: ModelConfig) -> Any:
    """Shapes and dtypes of the parameters, placed on this process's first device.

    Naming the placement lets Orbax restore a checkpoint written on any mesh or number of
    processes (inference needs no sharding).
    """
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree_util.tree_map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device),
        abstract_params(model),
    )


def load_tokenizer(experiment: Experiment, workdir: Path) -> Tokenizer | PairTokenizer:
    """The run's vocabulary: its shared sentencepiece model, or an imported pair of them."""
    path = vocab_path(experiment.data, workdir)
    if experiment.data.vocab_kind == "pair":
        return PairTokenizer(path.parent, experiment.model.decoder_start_id)
    return Tokenizer.load(path)


def load_run(workdir: str | os.PathLike, step: int | str | None = None) -> LoadedRun:
    """Config, vocabulary and parameters of a workdir's newest (or given) checkpoint
    (a local folder or one in a bucket). `step="best"`: the best step train.keep_best_by
    kept (a step number given as text is read as that number)."""
    workdir = as_path(workdir, "--workdir")
    experiment, params, chosen = _restore(workdir, step, with_params=True)
    tokenizer = load_tokenizer(experiment, workdir)
    return LoadedRun(experiment, tokenizer, params, chosen, workdir)


def load_experiment(workdir: str | os.PathLike, step: int | str | None = None) -> Experiment:
    """The config a workdir's newest (or given) checkpoint was trained with, reading
    none of its arrays."""
    return _restore(as_path(workdir, "--workdir"), step, with_params=False)[0]


def _restore(
    workdir: Path, step: int | str | None, with_params: bool
) -> tuple[Experiment, Any, int]:
    directory = checkpoint_dir(workdir)
    if not as_path(directory).is_dir():  # checked first: opening a manager creates the folder
        raise CheckpointError(f"no checkpoint in {directory}: train first, or check --workdir")
    manager = CheckpointManager(workdir)
    try:
        steps_present = manager.all_steps()
        if not steps_present:
            raise CheckpointError(
                f"no checkpoint in {manager.directory}: train first, or check --workdir"
            )
        chosen = _chosen_step(manager, steps_present, step)
        if chosen not in steps_present:
            raise CheckpointError(
                f"no checkpoint for step {chosen} in {manager.directory}; present: {steps_present}"
            )
        experiment = Experiment.from_mapping(manager.restore_config(chosen))
        params = None
        if with_params:
            params = manager.restore_params(chosen, abstract_params_on_one_device(experiment.model))
    finally:
        manager.close()
    return experiment, params, chosen


def _chosen_step(manager: CheckpointManager, present: list[int], step: int | str | None) -> int:
    if step is None:
        return present[-1]
    if isinstance(step, int):
        return step
    if step.strip().isdigit():
        return int(step)
    if step != "best":
        raise CheckpointError(f"--step must be a step number or 'best', got {step!r}")
    return manager.best_step()
