"""Training throughput: compile time, steady step time, target tokens/s and MFU per config.

    python bench/train_throughput.py --ceiling-json results.json --json results.json
    python bench/train_throughput.py --configs multi30k --dtypes float32,bfloat16
    python bench/train_throughput.py --smoke

Configs: tiny, multi30k, wmt14_ende (the base model, vocab 37k), wmt14_ende_big, or any
`path.py[:arg]`. Multi30K runs on real training batches (its own bucketed shapes, the
vocabulary trained by `ensure_vocab` into --data-workdir); every other config runs on
random batches of one fixed (batch, length) shape (--shape, full rows unless --fill < 1).

What is timed is the project's own jitted `train_step` (forward, backward, Adam update,
donated state), compiled ahead of time per batch shape. Batches are on the device before
the clock starts, and every step is waited for, so step times exclude input work.

FLOPs (`common.forward_flops`, the formula in BENCHMARKS.md): matmul FLOPs of the model for
the real (non-PAD) tokens only, one multiply-add = 2 FLOPs. Per source token and encoder
layer 2·(params of Q, K, V, output and FFN matrices) + 2·s·h·(d_k + d_v) for scores and
values over the s real keys; per target token and decoder layer 2·(self Q, K, V, output,
cross Q, output, FFN params) + 2·h·(d_k + d_v)·(j causal keys + s source keys); cross-
attention keys/values 2·d·h·(d_k + d_v) per source token and decoder layer; the shared
output projection 2·V·d per target token. Training = 3 × forward (backward = 2 forwards).
MFU = useful FLOP/s ÷ the measured matmul ceiling of the same dtype (matmul_ceiling.py).
"padded MFU" counts every padded position and the full (unmasked) score matrices instead:
what the hardware computed, so the gap between the two is the cost of padding and masking.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from typing import Any

import common
import jax
import numpy as np

from attnmt.config.parallel import ParallelConfig
from attnmt.config.xla import compiler_options
from attnmt.data.pipeline import BatchIterator
from attnmt.parallel.mesh import make_mesh
from attnmt.train.inputs import batch_plan, packing_options
from attnmt.train.program import PlainSteps, build_program

DEFAULT_SHAPES = {"tiny": (16, 32), "wmt14_ende": (64, 32), "wmt14_ende_big": (64, 32)}
FALLBACK_SHAPE = (64, 32)


@dataclasses.dataclass
class Workload:
    """A model and the batches it is timed on (numpy, host side)."""

    config_name: str
    experiment: Any  # attnmt.config.experiment.Experiment, compute dtype already set
    batches: list[dict[str, np.ndarray]]
    data: str  # how the batches were made, for the table

    @property
    def model(self) -> Any:
        return self.experiment.model


def with_dtype(experiment: Any, dtype: str) -> Any:
    return dataclasses.replace(experiment, model=dataclasses.replace(experiment.model, dtype=dtype))


def multi30k_batches(
    experiment: Any, count: int, data_dir: str | None, data_workdir: str | None, seed: int = 0
) -> list[dict[str, np.ndarray]]:
    """The first `count` training batches of the config's own iterator: its length buckets,
    or its one packed shape with data.pack_length."""
    corpus, _ = common.multi30k_corpus(experiment, data_dir, data_workdir)
    shapes = batch_plan(experiment, batch_shards=1, processes=1).update_shapes
    iterator = BatchIterator(corpus, shapes, seed=seed, **packing_options(experiment))
    return list(itertools.islice(iterator, count))


def build_workload(
    config_name: str,
    dtype: str,
    *,
    data: str = "auto",
    shape: tuple[int, int] | None = None,
    fill: float = 1.0,
    pool: int = 32,
    data_dir: str | None = None,
    data_workdir: str | None = None,
    overrides: tuple[str, ...] = (),
    seed: int = 0,
) -> Workload:
    """Model config + batches. data: "auto" (real Multi30K batches for a Multi30K config
    when the corpus is present, random otherwise), "multi30k" or "random"."""
    experiment = with_dtype(common.load_experiment(config_name, overrides), dtype)
    data_dir = data_dir or common.default_multi30k_dir()
    is_multi30k = experiment.data.source == "multi30k"
    if data == "auto":
        data = "multi30k" if is_multi30k and data_dir else "random"
        if is_multi30k and not data_dir:
            print(
                "no local Multi30K copy (set ATTNMT_MULTI30K_DIR): using random batches",
                file=sys.stderr,
            )
    if data == "multi30k":
        batches = multi30k_batches(experiment, pool, data_dir, data_workdir, seed)
        return Workload(config_name, experiment, batches, f"Multi30K train, {pool} batches")
    batch, length = shape or DEFAULT_SHAPES.get(config_name, FALLBACK_SHAPE)
    rng = np.random.default_rng(seed)
    vocab = experiment.model.vocab_size
    # A few different random batches of one shape: one compile, realistic token ids.
    batches = _random_batches(rng, 4, batch, length, vocab, fill)
    fill_note = "" if fill >= 1 else f", fill ≥{fill:g}"
    return Workload(config_name, experiment, batches, f"random {batch}x{length}{fill_note}")


def workload_from_args(args: argparse.Namespace, config_name: str, dtype: str) -> Workload:
    """build_workload with the options of add_workload_args."""
    return build_workload(
        config_name,
        dtype,
        data=args.data,
        shape=args.shape,
        fill=args.fill,
        pool=args.pool,
        data_dir=args.data_dir,
        data_workdir=args.data_workdir,
        overrides=tuple(args.override),
    )


def _random_batches(
    rng: np.random.Generator, count: int, batch: int, length: int, vocab: int, fill: float
) -> list[dict[str, np.ndarray]]:
    return [common.random_batch(rng, batch, length, vocab, fill) for _ in range(count)]


def _shape_key(batch: dict[str, np.ndarray]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return batch["src_tokens"].shape, batch["tgt_tokens"].shape


def plain_steps(experiment: Any) -> PlainSteps:
    """The experiment's training-program steps unjitted (`TrainProgram.plain`: its model,
    optimizer, schedule, label smoothing and dropout RNG), which the benchmarks jit and
    compile per shape themselves, on one device."""
    return build_program(experiment, make_mesh(ParallelConfig(data=1), jax.devices()[:1])).plain


def _step_and_state(experiment: Any, first: Any, seed: int) -> tuple[Any, Any, float]:
    """(the program's train step jitted with the state donated, a new state created from
    `seed`, the seconds that creation took)."""
    plain = plain_steps(experiment)
    options = compiler_options(experiment.train.xla_backend_optimization_level)
    step_fn = jax.jit(plain.train_step, donate_argnums=(0,), compiler_options=options)
    create = jax.jit(plain.create_state, compiler_options=options)
    start = time.perf_counter()
    state = common.block(create(jax.random.PRNGKey(seed), first))
    return step_fn, state, time.perf_counter() - start


def _batch_counts(model: Any, host: dict[str, np.ndarray]) -> tuple[float, float, float]:
    """(non-PAD target tokens, useful FLOPs, padded FLOPs) of one training step on `host`."""
    useful, padded = common.batch_train_flops(model, host)
    return float(common.nonpad_lengths(host["tgt_tokens"]).sum()), useful, padded


def _compile_per_shape(
    step_fn: Any, state: Any, device_batches: list[Any]
) -> tuple[dict[Any, Any], list[float]]:
    """Ahead-of-time compilation per batch shape, so compile time is measured apart from
    running: (compiled step per shape key, seconds of each compile in first-seen order)."""
    compiled: dict[Any, Any] = {}
    compile_seconds: list[float] = []
    for batch in device_batches:
        key = _shape_key(batch)
        if key in compiled:
            continue
        start = time.perf_counter()
        compiled[key] = step_fn.lower(state, batch).compile()
        compile_seconds.append(time.perf_counter() - start)
    return compiled, compile_seconds


def _rates(tokens: float, useful: float, padded: float, total: float) -> dict[str, float]:
    return {
        "tgt_tok_per_s": tokens / total,
        "gflops": useful / total / 1e9,
        "padded_gflops": padded / total / 1e9,
    }


def _warm_up(
    run: Any, state: Any, device_batches: list[Any], cycle: Any, warmup: int
) -> tuple[Any, Any, float]:
    """The first step (it also allocates buffers and warms caches: reported, not averaged),
    then `warmup` untimed steps on the next batches of `cycle`: (state, metrics, seconds of
    the first step)."""
    start = time.perf_counter()
    state, metrics = common.block(run(state, device_batches[next(cycle)]))
    first_step = time.perf_counter() - start
    for _ in range(warmup):
        state, metrics = common.block(run(state, device_batches[next(cycle)]))
    return state, metrics, first_step


def _mfu(row: dict[str, Any], ceiling_gflops: float) -> dict[str, float]:
    return {
        "ceiling_gflops": ceiling_gflops,
        "mfu": row["gflops"] / ceiling_gflops,
        "padded_mfu": row["padded_gflops"] / ceiling_gflops,
    }


def time_attnmt(
    workload: Workload,
    *,
    min_steps: int = 10,
    min_seconds: float = 30.0,
    warmup: int = 2,
    ceiling_gflops: float | None = None,
    seed: int = 0,
    max_seconds: float = 600.0,
) -> dict[str, Any]:
    """Compiles the train step for every batch shape, then times steps over the batches
    (cycled) until both `min_steps` and `min_seconds` are reached, or `max_seconds` have
    been timed over at least two steps."""
    experiment = workload.experiment
    step_fn, state, init_seconds = _step_and_state(experiment, workload.batches[0], seed)
    device_batches = [jax.device_put(b) for b in workload.batches]

    compiled, compile_seconds = _compile_per_shape(step_fn, state, device_batches)

    def run(state: Any, batch: Any) -> tuple[Any, Any]:
        return compiled[_shape_key(batch)](state, batch)

    cycle = itertools.cycle(range(len(device_batches)))
    state, metrics, first_step = _warm_up(run, state, device_batches, cycle, warmup)

    seconds: list[float] = []
    useful = padded = tokens = 0.0
    while keep_timing(seconds, min_steps, min_seconds, max_seconds):
        index = next(cycle)
        start = time.perf_counter()
        state, metrics = common.block(run(state, device_batches[index]))
        seconds.append(time.perf_counter() - start)
        t, u, p = _batch_counts(experiment.model, workload.batches[index])
        tokens, useful, padded = tokens + t, useful + u, padded + p
    if not np.isfinite(float(metrics["loss"])):
        print(f"WARNING: {workload.config_name}: non-finite loss", file=sys.stderr)

    total = sum(seconds)
    timings = common.Timings(seconds)
    row: dict[str, Any] = {
        "impl": "attnmt",
        "config": workload.config_name,
        "dtype": experiment.model.dtype,
        "data": workload.data,
        "shapes": len(compiled),
        "init_s": init_seconds,
        "compile_s": compile_seconds[0],
        "compile_all_s": sum(compile_seconds),
        "first_step_s": first_step,
        "steps": len(seconds),
        "step_ms": timings.median * 1e3,
        "step_ms_range": timings.spread(),
        **_rates(tokens, useful, padded, total),
    }
    if ceiling_gflops:
        row |= _mfu(row, ceiling_gflops)
    return row


def keep_timing(
    seconds: list[float], min_steps: int, min_seconds: float, max_seconds: float
) -> bool:
    """Whether to time another step: until both minimums are met, unless a very slow case
    has already run past `max_seconds` (two steps at least, so a median exists)."""
    if len(seconds) >= 2 and sum(seconds) >= max_seconds:
        return False
    return len(seconds) < min_steps or sum(seconds) < min_seconds


def resolve_ceilings(args: argparse.Namespace, dtypes: list[str]) -> dict[str, float | None]:
    """GFLOP/s per dtype: from --ceiling-gflops, from --ceiling-json, or measured now."""
    import matmul_ceiling

    given: dict[str, float | None] = {}
    for item in args.ceiling_gflops or []:
        dtype, _, value = item.partition("=")
        given[dtype] = float(value)
    for dtype in dtypes:
        if dtype in given:
            continue
        if args.ceiling_json:
            given[dtype] = common.ceiling_from_json(args.ceiling_json, dtype)
        if given.get(dtype) is None and not args.no_mfu:
            sizes = [256] if args.smoke else [1024, 2048]
            print(f"measuring the {dtype} matmul ceiling (n={sizes})…", file=sys.stderr)
            given[dtype] = matmul_ceiling.jax_ceiling(dtype, sizes, 0.05 if args.smoke else 1.0)
    return given


COLUMNS = [
    "config",
    "dtype",
    "data",
    "init_s",
    "compile_s",
    "compile_all_s",
    "step_ms",
    "tgt_tok_per_s",
    "gflops",
    "mfu",
    "padded_mfu",
]


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """Flags shared with peer_marian.py, which times the same workloads."""
    parser.add_argument(
        "--configs",
        type=common.str_list,
        default=["tiny", "multi30k", "wmt14_ende"],
        help="comma-separated: tiny, multi30k, wmt14_ende, wmt14_ende_big or path.py[:arg]",
    )
    parser.add_argument(
        "--dtypes", type=common.str_list, default=["float32"], help="float32,bfloat16"
    )
    parser.add_argument(
        "--data", choices=["auto", "multi30k", "random"], default="auto", help="batch source"
    )
    parser.add_argument(
        "--shape", type=common.parse_shape, help="BxL of random batches (default per config)"
    )
    parser.add_argument("--fill", type=float, default=1.0, help="random rows: min length fraction")
    parser.add_argument("--pool", type=int, default=32, help="distinct Multi30K batches cycled")
    parser.add_argument("--min-steps", type=int, default=10)
    parser.add_argument("--min-seconds", type=float, default=30.0, help="timed per row")
    parser.add_argument(
        "--max-seconds", type=float, default=120.0, help="stop a slow row after this (≥2 steps)"
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--data-dir", help="Multi30K folder (default: $ATTNMT_MULTI30K_DIR, shared/)"
    )
    parser.add_argument(
        "--data-workdir", help="keeps the benchmark vocabulary (default: a temp dir)"
    )
    parser.add_argument(
        "--override", action="append", default=[], help="--override model.num_layers=2 (repeatable)"
    )


def apply_smoke(args: argparse.Namespace) -> None:
    args.min_steps, args.min_seconds, args.warmup, args.pool = 2, 0.0, 1, 2
    args.override = [*args.override, "model.num_layers=1"]
    if args.shape is None:
        args.shape = (8, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_args(parser)
    parser.add_argument("--ceiling-json", help="matmul_ceiling.py --json output for MFU")
    parser.add_argument(
        "--ceiling-gflops",
        type=common.str_list,
        help="float32=120,bfloat16=60: the MFU denominators, instead of measuring them",
    )
    parser.add_argument("--no-mfu", action="store_true")
    common.add_output_args(parser)
    args = parser.parse_args()
    if args.smoke:
        apply_smoke(args)

    info = common.machine_info()
    common.print_machine(info)
    common.warn_if_busy(info)
    ceilings = resolve_ceilings(args, args.dtypes)
    rows = []
    for config_name in args.configs:
        for dtype in args.dtypes:
            workload = workload_from_args(args, config_name, dtype)
            row = time_attnmt(
                workload,
                min_steps=args.min_steps,
                min_seconds=args.min_seconds,
                warmup=args.warmup,
                ceiling_gflops=ceilings.get(dtype),
                max_seconds=args.max_seconds,
            )
            print(f"  {config_name} {dtype}: {row['step_ms']:.1f} ms/step", file=sys.stderr)
            rows.append(row)
    print(common.markdown_table(rows, COLUMNS))
    common.append_json(args.json, "train_throughput", args, rows)


if __name__ == "__main__":
    main()
