"""How long an asynchronous checkpoint save stops the training loop.

    python bench/checkpoint_stall.py                     # the Multi30K model
    python bench/checkpoint_stall.py --config tiny --saves 10

`CheckpointManager.save` returns once the train state is copied off the devices; the
files are written in the background while training goes on. The stall is the time spent
inside `save()`. Each save here starts after the previous one has finished writing (as
with checkpoints minutes apart), and one train step runs between saves so that the state
is a fresh, donated output as in the loop. The first save also creates folders and
handlers, so it is reported apart from the steady ones.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import common
import jax
import numpy as np

from attnmt.checkpoint.manager import CheckpointManager
from attnmt.config.parallel import ParallelConfig
from attnmt.parallel.memory import format_bytes, tree_bytes
from attnmt.parallel.mesh import make_mesh
from attnmt.parallel.sharding import put_batch
from attnmt.train.program import build_program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="multi30k", help="tiny, multi30k, … or path.py[:arg]")
    parser.add_argument("--saves", type=int, default=6, help="saves timed (the first apart)")
    parser.add_argument("--shape", type=common.parse_shape, default=(32, 64), help="batch×length")
    args = parser.parse_args()

    experiment = common.load_experiment(args.config)
    mesh = make_mesh(ParallelConfig(data=1), jax.devices()[:1])
    program = build_program(experiment, mesh)
    batch_size, length = args.shape
    rng = np.random.default_rng(0)
    tokens = rng.integers(4, experiment.model.vocab_size, (batch_size, length), dtype=np.int32)
    batch = put_batch({"src_tokens": tokens, "tgt_tokens": tokens}, mesh)
    state = program.init_state()
    train_step = program.train_step
    state, _ = train_step(state, batch)  # compile outside the timings
    common.block(state)
    print(f"{args.config}: train state {format_bytes(tree_bytes(state))} on {jax.devices()[0]}")

    stalls, writes = [], []
    with tempfile.TemporaryDirectory() as workdir:
        manager = CheckpointManager(workdir, keep=2)
        for index in range(args.saves):
            state, _ = train_step(state, batch)
            common.block(state)
            start = time.perf_counter()
            manager.save(index + 1, state, {"epoch": 0, "index": index, "seed": 0}, {})
            saved = time.perf_counter()
            manager.wait()
            stalls.append(saved - start)
            writes.append(time.perf_counter() - saved)
        manager.close()
    print(f"first save: save() blocked {1000 * stalls[0]:.0f} ms")
    steady, written = stalls[1:] or stalls, writes[1:] or writes
    median = 1000 * statistics.median(steady)
    print(
        f"steady saves ({len(steady)}): save() blocked median {median:.0f} ms (min "
        f"{1000 * min(steady):.0f}, max {1000 * max(steady):.0f}); the background write "
        f"then took median {1000 * statistics.median(written):.0f} ms"
    )


if __name__ == "__main__":
    main()
