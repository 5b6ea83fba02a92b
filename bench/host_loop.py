"""The training loop's host work per update, and what it costs against the bare step.

    python bench/host_loop.py --json host_loop.json
    python bench/host_loop.py --smoke

(a) Host milliseconds per update at the paper's base batch (25k + 25k tokens, the bucket
shapes of configs/wmt14_ende.py:variant=base) on a synthetic corpus of WMT-like lengths
(generated directly as token arrays: no tokenizer): drawing the batch (gather), splitting
it into micro-batches, the log's figures (tokens, FLOPs, padding), placing it on the
device (put_batch, the call's own time), and the wait on attnmt.train.prefetch's queue
when its thread keeps up (the consumer sleeps a simulated device step between batches).
Medians over --updates updates.

(b) On this machine's CPU, the real Trainer (attnmt.train.assemble.build_trainer on a
synthetic text corpus, one bucket shape, logging every 100 updates) against the bare
jitted train step dispatched back to back on the same device-resident batches, with a
model sized so one step takes 5-20 ms here: updates/s of both and their ratio (goal
≥ 0.97), medians of --repeats runs.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common
import jax
import numpy as np

from attnmt.config.parallel import ParallelConfig
from attnmt.data.pipeline import BatchIterator, TokenizedCorpus, split_batch
from attnmt.parallel.mesh import make_mesh
from attnmt.parallel.sharding import put_batch
from attnmt.train.assemble import build_trainer
from attnmt.train.inputs import batch_plan
from attnmt.train.loop import BatchFigures
from attnmt.train.prefetch import Prefetcher

COLUMNS_A = ["part", "median_ms", "p90_ms"]
COLUMNS_B = ["run", "updates_per_s", "step_ms", "repeats"]


def synthetic_corpus(pairs: int, max_length: int, seed: int = 0) -> TokenizedCorpus:
    """WMT-like lengths: source log-normal around 25 tokens (EOS included), target about
    1.05× it; tokens uniform over a 37k vocabulary."""
    rng = np.random.default_rng(seed)
    src = np.clip(np.round(rng.lognormal(np.log(25), 0.55, pairs)), 2, max_length).astype(int)
    ratio = rng.normal(1.05, 0.15, pairs)
    tgt = np.clip(np.round(src * ratio), 2, max_length).astype(int)
    sides = []
    for lengths in (src, tgt):
        tokens = rng.integers(4, 37_000, int(lengths.sum()), dtype=np.int32)
        sides += [tokens, np.concatenate([[0], np.cumsum(lengths)])]
    return TokenizedCorpus(*sides)


def _ms(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "median_ms": 1e3 * statistics.median(ordered),
        "p90_ms": 1e3 * ordered[int(0.9 * (len(ordered) - 1))],
    }


def _clocked(fn: Callable[[], Any], into: list[float]) -> Any:
    start = time.perf_counter()
    result = fn()
    into.append(time.perf_counter() - start)
    return result


def host_parts(pairs: int, updates: int, device_ms: float) -> list[dict[str, Any]]:
    """(a): the host's parts of one update, median over `updates` updates."""
    experiment = common.load_experiment("wmt14_ende")
    plan = batch_plan(experiment, 1, 1)
    mesh = make_mesh(ParallelConfig(data=1), jax.devices()[:1])
    corpus = synthetic_corpus(pairs, experiment.data.max_length)
    batches = BatchIterator(corpus, plan.update_shapes, seed=0)
    next(batches)  # plans the epoch (once per epoch, not per update)
    parts: dict[str, list[float]] = {k: [] for k in ("gather", "split", "window", "put_batch")}
    for _ in range(updates):
        batch = _clocked(lambda: next(batches), parts["gather"])
        rows = plan.process_micro_rows(len(batch["src_tokens"]))
        micro = _clocked(
            lambda b=batch, r=rows: split_batch(b, plan.accumulation_steps, r), parts["split"]
        )
        _clocked(lambda b=batch: BatchFigures.of(b, experiment.model), parts["window"])
        placed = _clocked(lambda m=micro: [put_batch(b, mesh) for b in m], parts["put_batch"])
        jax.block_until_ready(placed)
    rows_out = [{"part": name, **_ms(seconds)} for name, seconds in parts.items()]
    sequential = [sum(x) for x in zip(*parts.values(), strict=True)]
    rows_out.append({"part": "all four, on the loop's thread (before)", **_ms(sequential)})

    def prepare(batch: dict[str, Any]) -> Any:  # what Trainer._prepare does on the thread
        rows = plan.process_micro_rows(len(batch["src_tokens"]))
        micro = split_batch(batch, plan.accumulation_steps, rows)
        return [put_batch(b, mesh) for b in micro], BatchFigures.of(batch, experiment.model)

    waits = _queue_waits(batches, prepare, updates, device_ms)
    part = f"left on the loop's thread: the queue's next() (step {device_ms} ms)"
    rows_out.append({"part": part, **_ms(waits)})
    return rows_out


def _queue_waits(
    batches: BatchIterator, prepare: Callable[[Any], Any], updates: int, device_ms: float
) -> list[float]:
    """Time of next() on the prefetcher's queue while the consumer 'computes' device_ms."""
    waits: list[float] = []
    with Prefetcher(batches, prepare, depth=2) as feed:
        next(feed)
        for _ in range(updates):
            time.sleep(device_ms / 1e3)
            _clocked(lambda: next(feed), waits)
    return waits


def _write_text_corpus(folder: Path, pairs: int) -> Path:
    """train.{src,tgt} of random 6-26-word lines over 8 letters (one bucket at length 32)."""
    rng = np.random.default_rng(0)
    lines = [
        " ".join("abcdefgh"[i] for i in rng.integers(0, 8, n)) for n in rng.integers(6, 27, pairs)
    ]
    (folder / "train.src").write_text("\n".join(lines) + "\n")
    (folder / "train.tgt").write_text("\n".join(line[::-1] for line in lines) + "\n")
    return folder


def _cpu_overrides(folder: Path, updates: int, width: int) -> list[str]:
    return [
        f"data.src_path={folder}/{{split}}.src",
        f"data.tgt_path={folder}/{{split}}.tgt",
        "data.eval_split=",
        "data.max_length=32",
        "data.min_bucket_length=32",  # one bucket shape: one compiled step
        "data.tokens_per_batch=1024",
        "model.vocab_size=64",
        f"model.d_model={width}",
        f"model.d_ff={4 * width}",
        "model.num_heads=4",
        f"model.d_k={width // 4}",
        f"model.d_v={width // 4}",
        f"train.num_steps={updates}",
        "train.log_every_steps=100" if updates >= 200 else f"train.log_every_steps={updates}",
        "train.eval_every_steps=0",
        "train.checkpoint_every_steps=0",
        "train.checkpoint_every_minutes=600",
        "train.memory_preflight=false",
        "train.test_at_end=false",
        "parallel.num_devices=1",
    ]


def trainer_rate(folder: Path, overrides: list[str]) -> float:
    """Updates/s of Trainer.run() over its last log window (compiles excluded)."""
    experiment = common.load_experiment("tiny", overrides)
    with tempfile.TemporaryDirectory() as workdir:
        result = build_trainer(experiment, Path(workdir) / "run").run()
    return 1.0 / result.last_train["step_time"]


def bare_rate(overrides: list[str], updates: int) -> float:
    """Updates/s of the jitted train step dispatched back to back on resident batches."""
    experiment = common.load_experiment("tiny", overrides)
    with tempfile.TemporaryDirectory() as workdir:
        trainer = build_trainer(experiment, Path(workdir) / "run")
        resident = [put_batch(next(trainer.train_batches), trainer.mesh) for _ in range(16)]
        step, state = trainer.program.train_step, trainer.state
        for batch in resident[:3]:  # compile and warm up
            state, _ = step(state, batch)
        jax.block_until_ready(state)
        start = time.perf_counter()
        for index in range(updates):
            state, metrics = step(state, resident[index % len(resident)])
        jax.block_until_ready((state, metrics))
        return updates / (time.perf_counter() - start)


def loop_against_bare(updates: int, repeats: int, width: int) -> list[dict[str, Any]]:
    """(b): the Trainer against the bare step, medians of `repeats` runs each."""
    with tempfile.TemporaryDirectory() as folder:
        corpus = _write_text_corpus(Path(folder), 4000)
        overrides = _cpu_overrides(corpus, updates, width)
        rates: dict[str, list[float]] = {"bare": [], "trainer": []}
        for _ in range(repeats):
            rates["bare"].append(bare_rate(overrides, 100 if updates >= 200 else updates))
            rates["trainer"].append(trainer_rate(corpus, overrides))
    rows = []
    for name in ("bare", "trainer"):
        rate = statistics.median(rates[name])
        rows.append(
            {"run": name, "updates_per_s": rate, "step_ms": 1e3 / rate, "repeats": rates[name]}
        )
    ratio = rows[1]["updates_per_s"] / rows[0]["updates_per_s"]
    rows.append({"run": "trainer / bare (goal ≥ 0.97)", "updates_per_s": ratio})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2_000_000, help="(a) synthetic pairs")
    parser.add_argument("--updates", type=int, default=200, help="(a) updates timed")
    parser.add_argument("--device-ms", type=float, default=5.0, help="(a) simulated step")
    parser.add_argument("--loop-updates", type=int, default=400, help="(b) updates a run")
    parser.add_argument("--repeats", type=int, default=3, help="(b) runs of each")
    parser.add_argument("--width", type=int, default=128, help="(b) model.d_model (d_ff 4x)")
    common.add_output_args(parser)
    args = parser.parse_args()
    if args.smoke:
        args.pairs, args.updates, args.loop_updates, args.repeats = 20_000, 5, 4, 1
        args.width = 32
    info = common.machine_info()
    common.print_machine(info)
    common.warn_if_busy(info)
    with contextlib.redirect_stdout(sys.stderr):  # the trainer's progress bar
        parts = host_parts(args.pairs, args.updates, args.device_ms)
        loop = loop_against_bare(args.loop_updates, args.repeats, args.width)
    print("(a) host work per update, base batch (25k + 25k tokens)\n")
    print(common.markdown_table(parts, COLUMNS_A))
    print("\n(b) the Trainer against the bare step on this CPU\n")
    print(common.markdown_table(loop, COLUMNS_B))
    common.append_json(args.json, "host_loop", args, [*parts, *loop])


if __name__ == "__main__":
    main()
