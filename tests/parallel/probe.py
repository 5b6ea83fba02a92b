"""`attnmt train` with probes, for the multi-process tests: `python -m tests.parallel.probe
train <args>` runs the real command in this process and records what the tests compare.

Prints `saving step N` for every checkpoint the trainer starts. With ATTNMT_PROBE_DIR set,
process i writes there at exit (a SIGTERM'd run included):

- `process_<i>.npz`: every local shard of the final train state, `<path>@<device id>`
  (parameters, Adam's count/mu/nu, step, dropout key, skip count);
- `process_<i>.json`: `fed` (for each update applied, its step → the SHA-256 of this
  process's rows of the batch and their real target tokens), `position` (the data
  iterator's state at the end), `step`, `written` (every file this process opened for
  writing under the workdir, from Python's audit hook: config.json, event files, vocab)
  and, with ATTNMT_PROBE_COMBINE=1, `combined` (any_process / sum_over_processes /
  any_and_mean of process-dependent values, computed before the first update).

ATTNMT_PROBE_CLOCK=1 replaces the clock that checkpoint and stop decisions read: process
i's advances 1 + 2i seconds per reading, so two processes' clocks disagree.

Two changes only save time: torch is not imported (tensorboardX would, for nothing a
scalar needs) and every process's compiles go to the persistent cache (JAX writes process
0's only).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _workdir(argv: list[str]) -> Path:
    for index, arg in enumerate(argv):
        if arg == "--workdir":
            return Path(argv[index + 1]).absolute()
        if arg.startswith("--workdir="):
            return Path(arg.split("=", 1)[1]).absolute()
    raise SystemExit("probe: no --workdir")


def _record_writes(workdir: Path, written: set[str]) -> None:
    """Adds to `written` every path under `workdir` that Python opens for writing."""
    prefix = str(workdir) + os.sep

    def hook(event: str, args: tuple) -> None:
        if event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path, mode, flags = args
        writing = (mode is not None and any(c in mode for c in "wax+")) or (
            mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS
        )
        if writing:
            full = os.path.abspath(os.fsdecode(path))
            if full.startswith(prefix):
                written.add(full[len(prefix) :])

    sys.addaudithook(hook)


def _digest(batch: dict[str, np.ndarray]) -> str:
    sha = hashlib.sha256()
    for key in sorted(batch):
        array = np.ascontiguousarray(batch[key])
        sha.update(f"{key}{array.dtype}{array.shape}".encode())
        sha.update(array.tobytes())
    return sha.hexdigest()


def _cache_compiles_of_every_process() -> None:
    """Lets every process write its compiles to the persistent compilation cache.

    JAX writes only process 0's, and another process's executables have other cache keys
    (other devices), so without this every launch of a job recompiles on process 1 while
    process 0 waits for it. Test speed only: what a process loads is what it compiled
    before. (A private JAX function; left alone if it is not there.)
    """
    from jax._src import compilation_cache, compiler

    if not hasattr(compiler, "_cache_write") or not hasattr(
        compilation_cache, "put_executable_and_time"
    ):
        return

    def cache_write(cache_key, compile_time_secs, module_name, backend, executable, callbacks):
        if callbacks:  # as JAX: host callbacks cannot be cached
            return
        try:
            compilation_cache.put_executable_and_time(
                cache_key, module_name, executable, backend, int(compile_time_secs)
            )
        except Exception as error:  # as JAX: a failed write is a warning, not an error
            warnings.warn(f"not cached: {module_name}: {error}", stacklevel=1)

    compiler._cache_write = cache_write


def main(argv: list[str]) -> int:
    # tensorboardX imports torch when it can, for nothing a scalar needs: 2.5 s of CPU per
    # process. Marked absent, it writes the same event files.
    sys.modules.setdefault("torch", None)
    import logging

    form = "%(asctime)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True, format=form)
    _cache_compiles_of_every_process()
    from attnmt.checkpoint.manager import CheckpointManager
    from attnmt.cli.main import main as attnmt_main
    from attnmt.parallel.agreement import any_and_mean, any_process, sum_over_processes
    from attnmt.train import loop, prefetch, stopping

    process = int(os.environ.get("ATTNMT_PROCESS_ID", "0"))
    out_dir = os.environ.get("ATTNMT_PROBE_DIR")
    record: dict[str, Any] = {"fed": {}, "position": None, "step": None, "written": []}
    written: set[str] = set()
    _record_writes(_workdir(argv), written)

    if os.environ.get("ATTNMT_PROBE_CLOCK") == "1":

        class Clock:
            now = 0.0

            def monotonic(self) -> float:
                self.now += 1.0 + 2.0 * process
                return self.now

        stopping.time = Clock()

    real_save = CheckpointManager.save

    def save(self, step, *args):
        print(f"saving step {step}", flush=True)
        real_save(self, step, *args)

    CheckpointManager.save = save

    # The batches the loop consumes, in order (the prefetch thread draws ahead of them).
    drawn: list[tuple[str, int]] = []
    real_next = prefetch.Prefetcher.__next__

    def consumed(self):
        item = real_next(self)
        batch = item.value.batch
        drawn.append((_digest(batch), int(np.count_nonzero(batch["tgt_tokens"]))))
        return item

    prefetch.Prefetcher.__next__ = consumed
    real_train_once = loop.Trainer._train_once

    def train_once(self):
        step, skipped = real_train_once(self)
        if not skipped:
            record["fed"][str(step)] = drawn[-1]
        return step, skipped

    loop.Trainer._train_once = train_once
    real_run = loop.Trainer.run

    def run(self):
        if os.environ.get("ATTNMT_PROBE_COMBINE") == "1":
            record["combined"] = {
                "any": any_process([process == 1, False, True]).tolist(),
                "sum": sum_over_processes([process + 1.0, 0.25 * process]).tolist(),
                "any_and_mean": [
                    part.tolist()
                    for part in any_and_mean([process == 0, False], [process + 1.0, 2.0 * process])
                ],
            }
        try:
            return real_run(self)
        finally:
            if out_dir:
                _dump_state(self, Path(out_dir), process, record)

    loop.Trainer.run = run

    def write_record() -> None:  # at exit: the files written after training count too
        if out_dir:
            record["written"] = sorted(written)
            Path(out_dir, f"process_{process}.json").write_text(json.dumps(record))

    atexit.register(write_record)
    return attnmt_main(argv)


def _dump_state(trainer: Any, folder: Path, process: int, record: dict[str, Any]) -> None:
    """Every local shard of the trainer's state, its step and data position."""
    import jax

    record["position"] = trainer.train_batches.get_state()
    record["step"] = int(jax.device_get(trainer.state.step))
    arrays = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(trainer.state)[0]:
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        for shard in leaf.addressable_shards:
            arrays[f"{name}@{shard.device.id}"] = np.asarray(shard.data)
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / f"process_{process}.npz", **arrays)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
