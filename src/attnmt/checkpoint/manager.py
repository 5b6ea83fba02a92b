"""Orbax checkpoints of {train state, data-iterator position, config} in one step folder.

Orbax writes each step into `<step>.orbax-checkpoint-tmp` and renames it when complete (in
a bucket, where renaming is not atomic, it writes `<step>/commit_success.txt` last), so a
save interrupted mid-write is never listed as a step; saving is asynchronous, so training
goes on while the arrays are written. A step whose files are later damaged is detected on
restore: the newest readable step is used instead, and the damaged one is moved aside.

With `keep_best_by`, a save that is a new best carries its metric (Orbax writes it as the
step's `metrics` item), and rotation keeps the `keep_best` best of those beside the last K.
Only new bests carry one, so those are the most recent improvements: the steps leading up
to the best, which `attnmt average --best N` averages.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from attnmt.errors import CheckpointError
from attnmt.storage import as_path, copy_file, is_remote

log = logging.getLogger(__name__)

ITEMS = ("state", "data", "config")
COMMIT_MARKER = "commit_success.txt"  # in a bucket, the object whose presence finishes a step
UNREADABLE_SUFFIX = "-unreadable"  # <workdir>/checkpoints-unreadable/<step>: set aside
# train.keep_best_by -> whether lower ("min") or higher ("max") values are better.
BEST_MODES = {"loss": "min", "bleu": "max", "f1": "max"}


class UnreadableCheckpointError(CheckpointError):
    """A checkpoint's files are missing or damaged (as opposed to holding another model)."""


def checkpoint_dir(workdir: str | os.PathLike) -> str:
    path = as_path(workdir, "--workdir")
    if is_remote(path):  # Orbax and TensorStore write gs://… (any epath URL) themselves
        return os.fspath(path / "checkpoints")
    return str(Path(os.fspath(path)).absolute() / "checkpoints")


def _handlers() -> dict[str, ocp.CheckpointHandler]:
    # Registered up front (not only on first save/restore) so a step's metadata can be read
    # before any restore: that is how a damaged step is told apart from another model's.
    return {
        "state": ocp.StandardCheckpointHandler(),
        "data": ocp.JsonCheckpointHandler(),
        "config": ocp.JsonCheckpointHandler(),
    }


class _BestSaved:
    """Orbax preservation policy: the `n` best steps saved with a metric (best = lowest
    `sign * metric`, the earlier of equal values, as CheckpointManager.ranked orders them).

    Orbax's BestN keeps every step, with a metric or not, while there are no more than n
    steps in all, so the first n steps of a run would all stay until the (n+1)th save."""

    def __init__(self, metric: Callable[[dict], float], sign: float, n: int) -> None:
        self.metric, self.sign, self.n = metric, sign, n

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> list[bool]:
        scored = [info for info in checkpoints if info.metrics is not None]
        scored.sort(key=lambda info: (self.sign * self.metric(info.metrics), info.step))
        kept = {info.step for info in scored[: self.n]}
        return [info.step in kept for info in checkpoints]


def _options(
    keep: int, asynchronous: bool, clean_up_unfinished: bool, keep_best_by: str, keep_best: int
) -> ocp.CheckpointManagerOptions:
    common = dict(
        enable_async_checkpointing=asynchronous,
        create=True,
        cleanup_tmp_directories=clean_up_unfinished,
    )
    if not keep_best_by:
        return ocp.CheckpointManagerOptions(max_to_keep=keep, **common)
    mode = BEST_MODES[keep_best_by]

    def metric(metrics: dict) -> float:
        # A step ranked by the other metric (the key changed on resume) ranks last.
        worst = float("inf") if mode == "min" else float("-inf")
        return float(metrics.get(keep_best_by, worst))

    policies = ocp.checkpoint_managers
    # The last `keep` steps, or the `keep_best` best of the steps saved with a metric (only
    # new bests are, so they are also the newest of them). best_fn makes Orbax write the
    # metrics, and read every step's back when a resumed run reopens the folder, so the
    # ranking survives a restart.
    sign = 1.0 if mode == "min" else -1.0
    keep_policy = policies.AnyPreservationPolicy(
        [policies.LatestN(n=keep), _BestSaved(metric, sign, keep_best)]
    )
    return ocp.CheckpointManagerOptions(
        best_fn=metric, best_mode=mode, preservation_policy=keep_policy, **common
    )


def partial_reader(directory: str) -> ocp.CheckpointManager:
    """A read-only manager whose train-state item can be restored in part (the parameters
    without the optimizer state): only the PyTree handler allows that, and it reads what the
    Standard one writes."""
    handlers: dict[str, ocp.CheckpointHandler] = {"state": ocp.PyTreeCheckpointHandler()}
    handlers.update({item: ocp.JsonCheckpointHandler() for item in ITEMS if item != "state"})
    return ocp.CheckpointManager(
        directory, item_handlers=handlers, options=ocp.CheckpointManagerOptions(read_only=True)
    )


def _first_line(error: BaseException, limit: int = 300) -> str:
    """Orbax/TensorStore errors can span pages (whole specs); the first line says what."""
    text = str(error).strip().split("\n", 1)[0] or type(error).__name__
    return text if len(text) <= limit else text[:limit] + "…"


def _arrays(tree: Any) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Path -> (shape, dtype) of every array; dataclasses, namedtuples and dicts alike."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
        jax.tree_util.keystr(path, simple=True, separator="/"): (
            tuple(leaf.shape),
            np.dtype(leaf.dtype),
        )
        for path, leaf in leaves
    }


def _describe(array: tuple[tuple[int, ...], np.dtype] | None) -> str:
    return "nothing" if array is None else f"{array[1].name}{list(array[0])}"


def _files(folder: epath.Path) -> Iterator[epath.Path]:
    for child in folder.iterdir():
        if child.is_dir():
            yield from _files(child)
        else:
            yield child


def _move_folder(source: epath.Path, destination: epath.Path) -> None:
    """`source.rename(destination)`, in a bucket too. A bucket has no folders to rename (and
    epath refuses a destination whose parent holds no object yet), so there every object is
    copied first; then the step's commit marker is deleted, so that the step stops counting
    at once, then the rest."""
    if not is_remote(source):
        source.rename(destination)
        return
    prefix = len(os.fspath(source)) + 1
    for file in list(_files(source)):
        copy_file(file, destination / os.fspath(file)[prefix:])
    marker = source / COMMIT_MARKER
    if marker.exists():
        marker.unlink()
    source.rmtree()


class CheckpointManager:
    """Keep-last-K checkpoints in `<workdir>/checkpoints/<step>/{state,data,config}`, and
    with `keep_best_by` ("loss" or "bleu") also the `keep_best` best steps saved with that
    metric.

    `clean_up_unfinished` deletes the temporary folders of saves that a killed process left
    behind; only the process that writes checkpoints (the trainer) should ask for it, since
    a reader would delete a save in progress.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        keep: int = 20,
        asynchronous: bool = True,
        clean_up_unfinished: bool = False,
        keep_best_by: str = "",
        keep_best: int = 1,
    ) -> None:
        if keep_best_by and keep_best_by not in BEST_MODES:
            raise ValueError(f"keep_best_by must be one of {sorted(BEST_MODES)}")
        if keep_best < 1:
            raise ValueError(f"keep_best must be ≥ 1, got {keep_best}")
        self.keep_best_by = keep_best_by
        options = _options(keep, asynchronous, clean_up_unfinished, keep_best_by, keep_best)
        self.directory = checkpoint_dir(workdir)
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_handlers=_handlers()
        )

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def best(self) -> tuple[int, float] | None:
        """(step, value) of the best step saved with a metric; None if there is none.

        Read from the steps' own metrics, so any reader (`--step best`) finds it: by
        `keep_best_by`, or else by the one metric the steps carry."""
        ranked = self.ranked()
        return ranked[0] if ranked else None

    def best_step(self) -> int:
        """The step `--step best` names; refused, saying how one is kept, when none is."""
        best = self.best()
        if best is None:
            raise CheckpointError(
                f"no best checkpoint in {self.directory}: it is kept by runs trained with "
                "train.keep_best_by (loss, bleu or f1) once they have evaluated"
            )
        return best[0]

    def ranked(self) -> list[tuple[int, float]]:
        """(step, value) of every step saved with a metric, best first (as `best`)."""
        names = [self.keep_best_by] if self.keep_best_by else list(BEST_MODES)
        found: dict[str, list[tuple[int, float]]] = {}
        for step in self.all_steps():
            metrics = self._manager.metrics(step)
            for name in names:
                if isinstance(metrics, dict) and name in metrics:
                    found.setdefault(name, []).append((step, float(metrics[name])))
        if len(found) > 1:
            raise CheckpointError(
                f"checkpoints in {self.directory} are ranked by both {' and '.join(found)}"
            )
        if not found:
            return []
        name, ranked = next(iter(found.items()))
        sign = 1.0 if BEST_MODES[name] == "min" else -1.0
        # The earliest of equal values first: a later equal one is no improvement.
        return sorted(ranked, key=lambda pair: (sign * pair[1], pair[0]))

    def save(
        self, step: int, state: Any, data_state: dict, config: dict, metric: float | None = None
    ) -> None:
        """Starts an asynchronous save; returns once the arrays are copied off the devices.

        The host copy is what makes it safe for the next step to donate `state`'s buffers.
        `metric`: the step's `keep_best_by` value, given when it is a new best.
        """
        if metric is not None and not self.keep_best_by:
            raise ValueError("a metric is saved only by a manager with keep_best_by")
        metrics = None if metric is None else {self.keep_best_by: float(metric)}
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                data=ocp.args.JsonSave(data_state),
                config=ocp.args.JsonSave(config),
            ),
            metrics=metrics,
            force=True,
        )

    def _check_matches(self, step: int, abstract_state: Any, only: str = "") -> None:
        """Compares the saved arrays' paths, shapes and dtypes with the model's, from metadata
        alone: a mismatch is the user's config (CheckpointError), not damaged files. With
        `only`, just the saved arrays whose path starts with it are compared."""
        where = f"{self.directory}/{step}"
        try:
            tree = getattr(self._manager.item_metadata(step).state, "tree", None)
        except Exception as error:  # any failure to read metadata means damaged files
            raise UnreadableCheckpointError(
                f"checkpoint {where} is unreadable: {_first_line(error)}"
            ) from error
        if not isinstance(tree, dict):
            raise UnreadableCheckpointError(f"checkpoint {where} is unreadable: no train state")
        saved, wanted = _arrays(tree), _arrays(abstract_state)
        saved = {name: array for name, array in saved.items() if name.startswith(only)}
        differences = [
            f"{name}: saved {_describe(saved.get(name))}, model has {_describe(wanted.get(name))}"
            # Parameters first: the optimizer moments repeat the same differences.
            for name in sorted(saved.keys() | wanted.keys(), key=lambda n: (n[:7] != "params/", n))
            if saved.get(name) != wanted.get(name)
        ]
        if differences:
            shown = "; ".join(differences[:3])
            more = f" (and {len(differences) - 3} more)" if len(differences) > 3 else ""
            raise CheckpointError(
                f"checkpoint {where} does not match this model (different config?): {shown}{more}"
            )

    def holds_params_only(self, step: int) -> bool:
        """Whether step `step` saved parameters without any training state (an imported
        model, attnmt.interop): training starts from them with a fresh optimizer."""
        try:
            tree = getattr(self._manager.item_metadata(step).state, "tree", None)
        except Exception:  # damaged: restore_latest reports it
            return False
        return isinstance(tree, dict) and set(tree) == {"params"}

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict, dict]:
        """Restores step `step` into the structure/shardings of `abstract_state`.

        Raises CheckpointError if the step holds another model's arrays, and its subclass
        UnreadableCheckpointError if its files are missing or damaged.
        """
        self._check_matches(step, abstract_state)
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, abstract_state)
        try:
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract),
                    data=ocp.args.JsonRestore(),
                    config=ocp.args.JsonRestore(),
                ),
            )
        except Exception as error:  # the structure matched, so the files are at fault
            raise UnreadableCheckpointError(
                f"checkpoint {self.directory}/{step} is unreadable: {_first_line(error)}"
            ) from error
        if not isinstance(restored.data, dict) or not isinstance(restored.config, dict):
            raise UnreadableCheckpointError(
                f"checkpoint {self.directory}/{step} is unreadable: data or config missing"
            )
        return restored.state, restored.data, restored.config

    def restore_params(self, step: int, abstract_params: Any) -> Any:
        """The parameters of step `step` alone, into `abstract_params`' shapes and shardings.

        Inference needs nothing else: the optimizer state (twice the parameters with Adam)
        is never read. Errors as for `restore`.
        """
        self._check_matches(step, {"params": abstract_params}, only="params/")
        target = {
            "params": jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, abstract_params)
        }
        reader = partial_reader(self.directory)
        try:
            restored = reader.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.PyTreeRestore(
                        item=target,
                        restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                        partial_restore=True,
                    )
                ),
            )
        except Exception as error:  # the structure matched, so the files are at fault
            raise UnreadableCheckpointError(
                f"checkpoint {self.directory}/{step} is unreadable: {_first_line(error)}"
            ) from error
        finally:
            reader.close()
        return restored.state["params"]

    def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict, dict] | None:
        """The newest readable checkpoint (state, data position and config of one step).

        Unreadable newer steps are skipped with a warning naming them and the step used,
        and moved to `<workdir>/checkpoints-unreadable/` so the resumed run can write those
        step numbers again. None if there is no checkpoint; CheckpointError if there are
        some but none is readable, or they hold another model.
        """
        steps = self.all_steps()
        unreadable: list[tuple[int, str]] = []
        for step in reversed(steps):
            try:
                state, data, config = self.restore(step, abstract_state)
            except UnreadableCheckpointError as error:
                log.warning("%s", error)
                unreadable.append((step, str(error)))
                continue
            if unreadable:
                moved_to = self._set_aside([s for s, _ in unreadable])
                log.warning(
                    "checkpoint step %s in %s is unreadable; restored step %d instead (with "
                    "its data position); moved the unreadable one(s) to %s",
                    ", ".join(str(s) for s, _ in unreadable),
                    self.directory,
                    step,
                    moved_to,
                )
            return step, state, data, config
        if unreadable:
            raise CheckpointError(
                f"none of the {len(steps)} checkpoints in {self.directory} is readable "
                f"(newest: {unreadable[0][1]}); move the folder away to start over"
            )
        return None

    def _set_aside(self, steps: list[int]) -> str:
        """Moves damaged step folders out of Orbax's sight (never deletes them)."""
        target = epath.Path(self.directory + UNREADABLE_SUFFIX)
        if jax.process_index() == 0:
            target.mkdir(parents=True, exist_ok=True)
            for step in steps:
                destination, copy = target / str(step), 1
                while destination.exists():
                    destination, copy = target / f"{step}.{copy}", copy + 1
                _move_folder(epath.Path(self.directory) / str(step), destination)
        self._manager.reload()
        return str(target)

    def restore_config(self, step: int | None = None) -> dict:
        """The config saved with a checkpoint (newest by default), without its arrays."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        try:
            restored = self._manager.restore(
                step, args=ocp.args.Composite(config=ocp.args.JsonRestore())
            )
        except Exception as error:
            raise UnreadableCheckpointError(
                f"checkpoint {self.directory}/{step} has no readable config: {_first_line(error)}"
            ) from error
        return restored.config

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
