"""The persistent compilation cache of `attnmt train` (`train.compilation_cache_dir`).

A run compiles its train step once per batch shape (13 length buckets for WMT) and its
eval steps, lazily, in the middle of training. Without a cache every preempted and resumed
run pays all of that again. With one, JAX stores each compiled executable in a folder and
the next process with the same program, compiler flags and devices loads it instead.

Where the folder is by default: inside the workdir, `<workdir>/compilation_cache`, not
beside it. JAX runs whatever executables the folder holds (its documentation: "the
compilation cache is considered trusted"), and the workdir is the one place a run is sure
to own and to be able to write; the folder above it may be /tmp or a bucket prefix that
others write to, or a bucket root. The case that matters most, the same command restarted
after a preemption, uses the same workdir. Runs of a sweep share a cache by naming one
folder (`--config.train.compilation_cache_dir=gs://bucket/sweep/compilation_cache`);
entries are keyed by the whole program, so sharing never hands a run another's executable.
"""

from __future__ import annotations

import logging

import jax

from attnmt.config.experiment import Experiment
from attnmt.storage import as_path

log = logging.getLogger("attnmt.train")

DEFAULT_FOLDER = "compilation_cache"  # inside the workdir
DISABLED = ("off", "none")
_JAX_DIR = "jax_compilation_cache_dir"


def cache_dir(setting: str, workdir: str, already_set: str | None = None) -> str | None:
    """The folder `setting` (`train.compilation_cache_dir`) names: None when it is "off" or
    "none"; the folder or URL itself; for "", `already_set` (JAX_COMPILATION_CACHE_DIR or an
    earlier jax.config.update: the environment's choice is kept), else the workdir's."""
    if setting.strip().lower() in DISABLED:
        return None
    if setting:
        return setting
    if already_set:
        return already_set
    return str(as_path(workdir, "--workdir") / DEFAULT_FOLDER)


def enable(experiment: Experiment, workdir: str) -> str | None:
    """Points JAX's persistent cache at the run's folder (or turns it off) and returns the
    folder. Call once per process before anything is compiled: JAX opens its cache at the
    first compile and never looks at the setting again."""
    already_set = jax.config.values.get(_JAX_DIR) or None
    folder = cache_dir(experiment.train.compilation_cache_dir, workdir, already_set)
    if _opened_elsewhere(folder, already_set):
        log.warning(
            "the compilation cache was opened before train.compilation_cache_dir was read: "
            "this process keeps using %s, not %s",
            already_set,
            folder,
        )
    if folder is None:
        jax.config.update("jax_enable_compilation_cache", False)
        log.info("persistent compilation cache: off")
        return None
    as_path(folder, "train.compilation_cache_dir")  # a bad URL is refused before any compile
    jax.config.update(_JAX_DIR, folder)
    # Compiles shorter than JAX's threshold (jax_persistent_cache_min_compile_time_secs,
    # 1 s unless JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS says otherwise) are not stored:
    # recompiling those is cheaper than a round trip to a bucket.
    log.info("persistent compilation cache: %s", folder)
    return folder


def _opened_elsewhere(folder: str | None, already_set: str | None) -> bool:
    """Whether JAX has already opened a cache other than `folder` (then the new setting has
    no effect in this process). Reads JAX's private state; False where it has none."""
    from jax._src import compilation_cache

    opened = getattr(compilation_cache, "_cache_initialized", False)
    return bool(opened and already_set and folder != already_set)
