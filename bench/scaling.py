"""How training cost scales: with batch tokens, with sequence length, with bucket shapes.

    python bench/scaling.py --json results.json            # all three sweeps
    python bench/scaling.py --sweeps length --config wmt14_ende
    python bench/scaling.py --smoke

batch   step time vs tokens per batch at a fixed length (--batch-length): where the
        per-step overheads (Adam over every parameter, dispatch) stop mattering.
length  step time vs sequence length 64…1024 at a fixed number of tokens per batch
        (--length-tokens), full random rows. The dense matmuls cost the same per token at
        every length; self-attention costs O(n) per token (O(n²·d) per sequence, the
        paper's Table 1), so tokens/s falls once attention's share of the FLOPs (the
        attn_share column, from the same formula as MFU) becomes large.
shapes  compile time vs the number of bucket shapes: the config's own bucketing
        (max_length, tokens_per_batch, min_bucket_length) with several growth factors;
        fewer shapes compile faster but pad more (padding is measured on the Multi30K
        training split when it is available).

Every point times the project's jitted train_step (train_throughput.time_attnmt).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

import common
import jax
import numpy as np
import train_throughput

from attnmt.data.batching import assign_buckets, bucket_shapes


def random_workload(
    experiment: Any, config_name: str, batch: int, length: int, seed: int = 0
) -> train_throughput.Workload:
    rng = np.random.default_rng(seed)
    vocab = experiment.model.vocab_size
    batches = [common.random_batch(rng, batch, length, vocab) for _ in range(2)]
    return train_throughput.Workload(config_name, experiment, batches, f"random {batch}x{length}")


def attention_share(model: Any, length: int) -> float:
    """Fraction of the useful forward FLOPs spent in attention scores and values."""
    parts = common.forward_flops_parts(model, np.array([length]), np.array([length]))
    return parts["attention"] / sum(parts.values())


def point(
    experiment: Any, args: argparse.Namespace, batch: int, length: int, ceiling: float | None
) -> dict[str, Any]:
    workload = random_workload(experiment, args.config, batch, length)
    row = train_throughput.time_attnmt(
        workload,
        min_steps=args.min_steps,
        min_seconds=args.min_seconds,
        warmup=args.warmup,
        ceiling_gflops=ceiling,
    )
    row.update(
        tokens=batch * length,
        batch=batch,
        length=length,
        attn_share=attention_share(experiment.model, length),
        us_per_tok=row["step_ms"] * 1e3 / (batch * length),
    )
    print(f"  {batch}x{length}: {row['step_ms']:.1f} ms/step", file=sys.stderr)
    return row


def batch_sweep(experiment: Any, args: argparse.Namespace, ceiling: float | None) -> list[dict]:
    length = args.batch_length
    return [
        {"sweep": "batch", **point(experiment, args, max(1, tokens // length), length, ceiling)}
        for tokens in args.batch_tokens
    ]


def length_sweep(experiment: Any, args: argparse.Namespace, ceiling: float | None) -> list[dict]:
    rows = []
    for length in args.lengths:
        batch = args.length_tokens // length
        if batch < 1:
            print(f"  skipping length {length}: longer than --length-tokens", file=sys.stderr)
            continue
        rows.append({"sweep": "length", **point(experiment, args, batch, length, ceiling)})
    return rows


def padding_of(
    shapes: list[tuple[int, int]], src_lengths: np.ndarray, tgt_lengths: np.ndarray
) -> float:
    """PAD fraction of the token slots (both sides) when every pair sits in its bucket.

    Ignores the partly filled last batch of each bucket, which costs the same for any
    bucketing of a large corpus.
    """
    buckets = assign_buckets(src_lengths, tgt_lengths, shapes)
    fits = buckets < len(shapes)
    lengths = np.asarray([length for _, length in shapes])[buckets[fits]]
    real = src_lengths[fits].sum() + tgt_lengths[fits].sum()
    return float(1.0 - real / (2.0 * lengths.sum()))


def compile_seconds(experiment: Any, shapes: list[tuple[int, int]]) -> list[float]:
    """Ahead-of-time compile time of the train step for each shape, from a cold cache."""
    jax.clear_caches()  # shapes shared between sweeps must not come from the cache
    plain = train_throughput.plain_steps(experiment)
    step_fn = jax.jit(plain.train_step, donate_argnums=(0,))
    seconds = []
    for batch, length in shapes:
        example = {
            "src_tokens": jax.ShapeDtypeStruct((batch, length), np.int32),
            "tgt_tokens": jax.ShapeDtypeStruct((batch, length), np.int32),
        }
        state = jax.eval_shape(plain.create_state, jax.random.PRNGKey(0), example)
        start = time.perf_counter()
        step_fn.lower(state, example).compile()
        seconds.append(time.perf_counter() - start)
    return seconds


def shapes_sweep(experiment: Any, args: argparse.Namespace) -> list[dict]:
    data = experiment.data
    lengths = None
    data_dir = args.data_dir or common.default_multi30k_dir()
    if experiment.data.source == "multi30k" and data_dir:
        corpus, _ = common.multi30k_corpus(experiment, data_dir, args.data_workdir)
        lengths = (corpus.src_lengths, corpus.tgt_lengths)
    rows = []
    for growth in args.growths:
        shapes = bucket_shapes(
            data.max_length,
            data.tokens_per_batch,
            min_length=data.min_bucket_length,
            growth=growth,
            batch_multiple=data.batch_multiple,
        )
        seconds = compile_seconds(experiment, shapes)
        rows.append(
            {
                "sweep": "shapes",
                "growth": growth,
                "shapes": len(shapes),
                "lengths": " ".join(str(length) for _, length in shapes),
                "compile_all_s": sum(seconds),
                "compile_per_shape_s": sum(seconds) / len(shapes),
                "padding": padding_of(shapes, *lengths) if lengths else None,
            }
        )
        print(f"  growth {growth}: {len(shapes)} shapes, {sum(seconds):.1f} s", file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="multi30k")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--sweeps", type=common.str_list, default=["batch", "length", "shapes"])
    parser.add_argument("--batch-length", type=int, default=32)
    parser.add_argument(
        "--batch-tokens", type=common.int_list, default=[512, 1024, 2048, 4096, 8192]
    )
    parser.add_argument("--lengths", type=common.int_list, default=[64, 128, 256, 512, 1024])
    parser.add_argument("--length-tokens", type=int, default=8192)
    parser.add_argument("--growths", type=common.float_list, default=[4.0, 2.0, 1.5, 1.25, 1.1])
    parser.add_argument("--min-steps", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=10.0, help="timed per point")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--ceiling-gflops", type=float, help="MFU denominator for --dtype")
    parser.add_argument("--ceiling-json", help="matmul_ceiling.py --json output")
    parser.add_argument("--data-dir", help="Multi30K folder, for padding in the shapes sweep")
    parser.add_argument("--data-workdir", help="keeps the benchmark vocabulary")
    parser.add_argument(
        "--override", action="append", default=[], help="model.num_layers=2 (repeatable)"
    )
    common.add_output_args(parser)
    args = parser.parse_args()
    if args.smoke:
        args.batch_tokens, args.batch_length = [128], 16
        args.lengths, args.length_tokens = [16, 32], 128
        args.growths = [4.0, 2.0]
        args.min_steps, args.min_seconds, args.warmup = 2, 0.0, 0
        args.override = [*args.override, "model.num_layers=1"]

    info = common.machine_info()
    common.print_machine(info)
    common.warn_if_busy(info)
    experiment = common.load_experiment(args.config, tuple(args.override))
    experiment = dataclasses.replace(
        experiment, model=dataclasses.replace(experiment.model, dtype=args.dtype)
    )
    ceiling = args.ceiling_gflops
    if ceiling is None and args.ceiling_json:
        ceiling = common.ceiling_from_json(args.ceiling_json, args.dtype)

    rows: list[dict[str, Any]] = []
    timing_columns = ["tokens", "batch", "length", "attn_share", "compile_s", "step_ms"]
    timing_columns += ["us_per_tok", "tgt_tok_per_s", "gflops", "mfu"]
    if "batch" in args.sweeps:
        sweep = batch_sweep(experiment, args, ceiling)
        print(f"\nstep time vs batch tokens (length {args.batch_length})\n")
        print(common.markdown_table(sweep, timing_columns))
        rows += sweep
    if "length" in args.sweeps:
        sweep = length_sweep(experiment, args, ceiling)
        print(f"\nstep time vs length ({args.length_tokens} tokens per batch and side)\n")
        print(common.markdown_table(sweep, timing_columns))
        rows += sweep
    if "shapes" in args.sweeps:
        sweep = shapes_sweep(experiment, args)
        print("\ncompile time vs number of bucket shapes\n")
        columns = ["growth", "shapes", "lengths", "compile_all_s", "compile_per_shape_s"]
        print(common.markdown_table(sweep, [*columns, "padding"]))
        rows += sweep
    common.append_json(args.json, "scaling", args, rows)


if __name__ == "__main__":
    main()
