"""Two real processes (2 CPU devices each, gloo, coordinator on 127.0.0.1) prepare one
token cache together: each shard is written exactly once, by process shard mod 2, and
each process then gathers exactly its rows of every planned global batch, disjoint from
the other's (ATTNMT_TOKEN_CACHE_DEBUG records both)."""

from __future__ import annotations

import json
import sys

import pytest

from attnmt.config import Experiment
from attnmt.data import token_cache
from attnmt.data.pipeline import BatchIterator
from attnmt.storage import as_path
from attnmt.train.inputs import batch_plan
from tests.helpers import token_cache_gathers, token_cache_writes
from tests.parallel.jobs import CORPUS_PAIRS, job_env, run_job, train_args, write_corpus

SHARD_PAIRS = 32  # 160 pairs: 5 shards, 3 for process 0 and 2 for process 1
STEPS = 4


@pytest.mark.slow
def test_two_processes_write_each_shard_once_and_read_only_their_rows(tmp_path, monkeypatch):
    corpus, cache, debug = write_corpus(tmp_path / "corpus"), tmp_path / "cache", tmp_path / "debug"
    debug.mkdir()
    argv = train_args(
        corpus, tmp_path / "run", STEPS,
        f"--config.data.cache_dir={cache}", f"--config.data.cache_shard_pairs={SHARD_PAIRS}",
    )  # fmt: skip
    env = job_env(tmp_path / "jax_cache", **{token_cache.DEBUG_ENV: str(debug)})
    for code, out in run_job(
        [sys.executable, "-m", "attnmt.cli.main", *argv], tmp_path / "job", env
    ):
        assert code == 0, out[-3000:]
    assert sorted(token_cache_writes(debug)) == [(shard, shard % 2) for shard in range(5)]

    # The global batches as one process plans them, over the same cache, all rows.
    (folder,) = cache.iterdir()
    monkeypatch.setenv(token_cache.DEBUG_ENV, str(tmp_path))
    whole, stats = token_cache.open_cache(as_path(folder))
    assert stats.total == CORPUS_PAIRS
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    experiment = Experiment.from_mapping(config)
    shapes = batch_plan(experiment, batch_shards=4, processes=2).update_shapes
    planned = BatchIterator(whole, shapes, seed=experiment.train.seed)
    mine = [token_cache_gathers(debug, process) for process in (0, 1)]
    assert len(mine[0]) == len(mine[1]) >= STEPS  # the loop may draw ahead of its steps
    for first, second in zip(*mine, strict=True):
        next(planned)
        (batch,) = token_cache_gathers(tmp_path, 0)[-1:]
        rows = len(batch) // 2
        assert first == batch[:rows] and second == batch[rows:]
        assert not {i for i in first if i >= 0} & {i for i in second if i >= 0}
