"""Orbax checkpoints of {train state, data-iterator position, config} in one step folder.

Orbax writes each step into a temporary folder and renames it when complete, so a save
interrupted mid-write is never listed as a step; saving is asynchronous, so training
goes on while the arrays are written.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from attnmt.errors import CheckpointError

log = logging.getLogger(__name__)

ITEMS = ("state", "data", "config")


def checkpoint_dir(workdir: str | Path) -> str:
    text = str(workdir)
    if "://" in text:  # gs://… and other remote paths are handled by Orbax/etils
        return text.rstrip("/") + "/checkpoints"
    return str(Path(text).absolute() / "checkpoints")


class CheckpointManager:
    """Keep-last-K checkpoints in `<workdir>/checkpoints/<step>/{state,data,config}`."""

    def __init__(self, workdir: str | Path, keep: int = 20, asynchronous: bool = True) -> None:
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            enable_async_checkpointing=asynchronous,
            create=True,
        )
        self.directory = checkpoint_dir(workdir)
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state: Any, data_state: dict, config: dict) -> None:
        """Starts an asynchronous save; returns once the arrays are copied off the devices."""
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                data=ocp.args.JsonSave(data_state),
                config=ocp.args.JsonSave(config),
            ),
            force=True,
        )

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict, dict]:
        """Restores step `step` into the structure/shardings of `abstract_state`."""
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
        except (ValueError, KeyError, TypeError) as error:
            raise CheckpointError(
                f"checkpoint {self.directory}/{step} does not match this model "
                f"(different config?): {error}"
            ) from error
        return restored.state, restored.data, restored.config

    def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict, dict] | None:
        """The newest readable checkpoint; an unreadable newest one falls back to the one
        before it, with a warning naming both."""
        steps = self.all_steps()
        for position in range(len(steps) - 1, -1, -1):
            step = steps[position]
            try:
                return (step, *self.restore(step, abstract_state))
            except CheckpointError:
                raise
            except Exception as error:  # corrupted files: try the previous step
                previous = steps[position - 1] if position > 0 else None
                log.warning(
                    "checkpoint %s/%s is unreadable (%s); falling back to step %s",
                    self.directory,
                    step,
                    error,
                    previous,
                )
        return None

    def restore_config(self, step: int | None = None) -> dict:
        """The config saved with a checkpoint (newest by default), without its arrays."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        restored = self._manager.restore(
            step, args=ocp.args.Composite(config=ocp.args.JsonRestore())
        )
        return restored.config

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
