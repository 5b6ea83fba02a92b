"""Checkpoint averaging (§6.1: base models average the last 5 checkpoints, big ones the last 20).

The last K, or the N best steps saved with a validation metric (train.keep_best_by keeps
them: the improvements leading up to the best), which leaves out the worse steps after the
validation curve turns. Only the parameters are averaged; everything else (optimizer state,
step, RNG, data position, config) comes from the newest averaged checkpoint, so the result
is an ordinary workdir that every command reads, and training could even resume from it.

`ema_checkpoint` writes the same kind of workdir from one checkpoint's moving average of the
parameters (optim.ema_decay keeps it in the optimizer state).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from attnmt.checkpoint.ema_state import find_ema_params
from attnmt.checkpoint.manager import CheckpointManager, checkpoint_dir, partial_reader
from attnmt.errors import CheckpointError
from attnmt.storage import Path, as_path, copy_file

log = logging.getLogger(__name__)

# Copied next to the averaged checkpoint so the output is a complete workdir.
WORKDIR_FILES = (
    "config.json",
    "vocab.model",
    "vocab.vocab",
    *("vocab.json", "source.spm", "target.spm"),  # an imported model's (data.vocab_kind=pair)
)


@dataclasses.dataclass(frozen=True)
class AverageResult:
    output_dir: Path
    steps: tuple[int, ...]  # the averaged checkpoint steps, oldest first
    step: int  # the step number written (the newest averaged one)


def _name(path: tuple[Any, ...]) -> str:
    return jax.tree_util.keystr(path, simple=True, separator="/")


def _state_metadata(reader: ocp.CheckpointManager, where: str, step: int) -> Any:
    """The saved state's tree of array metadata (shapes, dtypes); no arrays are loaded."""
    tree = getattr(reader.item_metadata(step).state, "tree", None)  # None: no state item
    if not isinstance(tree, dict) or "params" not in tree:
        raise CheckpointError(f"{where}/{step} holds no train state with params")
    return tree


def _check_shapes(where: str, steps: tuple[int, ...], metadata: dict[int, Any]) -> None:
    """Every step's parameter tree must match the newest's, path for path and shape for shape."""

    def shapes(step: int) -> dict[str, tuple[int, ...]]:
        leaves = jax.tree_util.tree_flatten_with_path(metadata[step]["params"])[0]
        return {_name(path): tuple(leaf.shape) for path, leaf in leaves}

    newest = shapes(steps[-1])
    for step in steps[:-1]:
        other = shapes(step)
        for name in [*newest, *(name for name in other if name not in newest)]:
            old, new = other.get(name, "missing"), newest.get(name, "missing")
            if old != new:
                raise CheckpointError(
                    f"cannot average {where}/{step} with {where}/{steps[-1]}: parameter {name} "
                    f"has shape {old} in step {step} but {new} in step {steps[-1]}"
                )


def _as_numpy(metadata: Any) -> Any:
    return jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)


def _sum_params(
    reader: ocp.CheckpointManager, steps: tuple[int, ...], metadata: dict[int, Any]
) -> dict[str, np.ndarray]:
    """Parameter path -> float64 sum over `steps`, read one checkpoint at a time, so memory
    holds one copy of the parameters plus the sums however many checkpoints are averaged."""
    sums: dict[str, np.ndarray] = {}
    for step in steps:
        params = metadata[step]["params"]
        restored = reader.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(
                    item={"params": params},
                    restore_args={"params": _as_numpy(params)},
                    partial_restore=True,  # skips the optimizer state (2x the params for Adam)
                )
            ),
        )
        for path, leaf in jax.tree_util.tree_flatten_with_path(restored.state["params"])[0]:
            name = _name(path)
            sums[name] = sums.get(name, 0.0) + np.asarray(leaf, np.float64)
    return sums


def _restore_newest(
    reader: ocp.CheckpointManager, workdir: Path, step: int, metadata: Any, abstract: Any
) -> tuple[Any, dict, dict]:
    if abstract is not None:
        source = CheckpointManager(workdir)
        try:
            return source.restore(step, abstract)
        finally:
            source.close()
    # Without a target Orbax rebuilds TrainState and namedtuples as dicts, tuples as lists;
    # that tree saves and restores into a TrainState target all the same. NumPy leaves keep
    # the saved device layout out of it, so any host can average.
    restored = reader.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(restore_args=_as_numpy(metadata)),
            data=ocp.args.JsonRestore(),
            config=ocp.args.JsonRestore(),
        ),
    )
    return restored.state, restored.data, restored.config


def average_checkpoints(
    workdir: str | os.PathLike,
    last: int = 0,
    output_dir: str | os.PathLike | None = None,
    abstract_state: Any | None = None,
    overwrite: bool = False,
    best: int = 0,
) -> AverageResult:
    """Writes a workdir whose one checkpoint holds the mean parameters of the newest `last`
    steps, or with `best` of the `best` best steps saved with a validation metric (whose
    newest is the best step, which the rest of the state then comes from). Default
    output: <workdir>/average-last<K> or <workdir>/average-best<N>."""
    if last and best:
        raise CheckpointError("average the last K or the best N checkpoints, not both")
    workdir = as_path(workdir, "--workdir")
    where = checkpoint_dir(workdir)
    name = f"average-best{best}" if best else f"average-last{last}"
    output = _checked_output(workdir, where, best or last, name, output_dir, overwrite)
    reader = partial_reader(where)
    try:
        steps = _best_steps(workdir, where, best) if best else _last_steps(reader, where, last)
        metadata = {step: _state_metadata(reader, where, step) for step in steps}
        _check_shapes(where, steps, metadata)
        sums = _sum_params(reader, steps, metadata)
        state, data_state, config = _restore_newest(
            reader, workdir, steps[-1], metadata[steps[-1]], abstract_state
        )
    finally:
        reader.close()

    def mean_like(path: tuple[Any, ...], leaf: Any) -> Any:
        value = np.asarray(sums[_name(path)] / len(steps), dtype=leaf.dtype)
        return jax.device_put(value, leaf.sharding) if isinstance(leaf, jax.Array) else value

    if isinstance(state, dict):
        state = {**state, "params": jax.tree_util.tree_map_with_path(mean_like, state["params"])}
    else:
        state = state.replace(params=jax.tree_util.tree_map_with_path(mean_like, state.params))

    _write(output, steps[-1], state, data_state, config)
    _copy_workdir_files(workdir, output)
    log.info("averaged steps %s of %s into %s", list(steps), where, checkpoint_dir(output))
    return AverageResult(output_dir=output, steps=steps, step=steps[-1])


def ema_checkpoint(
    workdir: str | os.PathLike,
    output_dir: str | os.PathLike | None = None,
    abstract_state: Any | None = None,
    overwrite: bool = False,
    step: int | str | None = None,
) -> AverageResult:
    """Writes a workdir whose one checkpoint is the newest step (or `step`: a number, or
    "best", the step train.keep_best_by kept) with its parameters replaced by their moving
    average (optim.ema_decay). Default output: <workdir>/ema."""
    workdir = as_path(workdir, "--workdir")
    where = checkpoint_dir(workdir)
    output = _checked_output(workdir, where, 1, "ema", output_dir, overwrite)
    reader = partial_reader(where)
    try:
        step = _one_step(reader, workdir, where, step)
        metadata = _state_metadata(reader, where, step)
        state, data_state, config = _restore_newest(reader, workdir, step, metadata, abstract_state)
    finally:
        reader.close()
    is_dict = isinstance(state, dict)
    average = find_ema_params(state["opt_state"] if is_dict else state.opt_state)
    if average is None:
        raise CheckpointError(
            f"{where}/{step} holds no moving average of the parameters: train with "
            "optim.ema_decay > 0 (e.g. --config.optim.ema_decay=0.999) to keep one"
        )
    params = state["params"] if is_dict else state.params

    def like(leaf: Any, mean: Any) -> Any:
        if isinstance(leaf, jax.Array):
            return jax.device_put(mean.astype(leaf.dtype), leaf.sharding)
        return np.asarray(mean, dtype=leaf.dtype)

    params = jax.tree_util.tree_map(like, params, average)
    state = {**state, "params": params} if is_dict else state.replace(params=params)
    _write(output, step, state, data_state, config)
    _copy_workdir_files(workdir, output)
    log.info("wrote the moving average of %s/%d into %s", where, step, checkpoint_dir(output))
    return AverageResult(output_dir=output, steps=(step,), step=step)


def _one_step(
    reader: ocp.CheckpointManager, workdir: Path, where: str, step: int | str | None
) -> int:
    """The step asked for: the newest when None; "best" as `--step best` reads it."""
    if step is None:
        return _last_steps(reader, where, 1)[-1]
    if step == "best":
        manager = CheckpointManager(workdir)
        try:
            return manager.best_step()
        finally:
            manager.close()
    step = int(step)
    if step not in reader.all_steps():
        present = ", ".join(str(s) for s in sorted(reader.all_steps())) or "none"
        raise CheckpointError(f"no step {step} in {where} (present: {present})")
    return step


def _copy_workdir_files(workdir: Path, output: Path) -> None:
    for name in WORKDIR_FILES:
        if (workdir / name).is_file():
            copy_file(workdir / name, output / name)


def _last_steps(reader: ocp.CheckpointManager, where: str, last: int) -> tuple[int, ...]:
    """The newest `last` steps, oldest first; all of them (with a warning) if fewer."""
    steps = tuple(sorted(reader.all_steps())[-last:])
    if not steps:
        raise CheckpointError(f"no checkpoint in {where}")
    if len(steps) < last:
        log.warning("only %d checkpoint(s) in %s; averaging all of them", len(steps), where)
    return steps


def _best_steps(workdir: Path, where: str, best: int) -> tuple[int, ...]:
    """The `best` best steps saved with a validation metric, oldest first (the newest of
    them is the best: only new bests carry a metric). Fewer is refused rather than
    averaged: the steps rotation deleted cannot be brought back."""
    manager = CheckpointManager(workdir)  # reads every step's metrics, as `--step best` does
    try:
        ranked = manager.ranked()
    finally:
        manager.close()
    if len(ranked) < best:
        kept = ", ".join(str(step) for step in sorted(step for step, _ in ranked)) or "none"
        raise CheckpointError(
            f"cannot average the best {best}: {where} holds {len(ranked)} step(s) saved as "
            f"a new best (steps: {kept}); train with train.keep_best_by (loss or bleu) and "
            f"train.keep_best_checkpoints ≥ {best} to keep them, or average fewer"
        )
    return tuple(sorted(step for step, _ in ranked[:best]))


def _checked_output(
    workdir: Path,
    where: str,
    count: int,
    name: str,
    output_dir: str | os.PathLike | None,
    overwrite: bool,
) -> Path:
    """The output workdir (`output_dir`, else <workdir>/<name>), once the request is known
    to be sound."""
    if count < 1:
        raise CheckpointError(f"the number of checkpoints to average must be ≥ 1, got {count}")
    if not as_path(where).is_dir():  # checked first: opening a manager would create the folder
        raise CheckpointError(f"no checkpoints folder at {where}")
    output = as_path(output_dir, "--output") if output_dir is not None else workdir / name
    if output.absolute() == workdir.absolute():  # overwrite would delete the sources
        raise CheckpointError(f"the output dir {output} must differ from the workdir {workdir}")
    output_checkpoints = as_path(checkpoint_dir(output))
    if not overwrite and output_checkpoints.is_dir() and any(output_checkpoints.iterdir()):
        raise CheckpointError(f"{output_checkpoints} already holds checkpoints")
    return output


def _write(output: Path, step: int, state: Any, data_state: dict, config: dict) -> None:
    output_checkpoints = as_path(checkpoint_dir(output))
    if output_checkpoints.exists():
        output_checkpoints.rmtree()  # (overwrite) a stale newer step would shadow ours
    writer = CheckpointManager(output)
    try:
        writer.save(step, state, data_state, config)
    finally:
        writer.close()  # waits for the asynchronous save
