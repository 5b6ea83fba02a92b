"""GPU benchmark, prepared to run as one short script: base and big training step time and
MFU in bfloat16, and beam decoding speed. Exits 0 with a message where there is no GPU.

    python bench/gpu.py --json gpu.json               # about 5 minutes on one H100/H200
    python bench/gpu.py --parts train --models big
    python bench/gpu.py --smoke                        # a minute: proves it runs

Training: the paper's batches of about 25,000 source + 25,000 target tokens (--shape,
default 384x64 = 24,576 per side, random full rows), the project's jitted train_step in
bfloat16 compute with float32 parameters (train_throughput.time_attnmt). MFU is useful
FLOP/s (the formula of train_throughput.py) over the bfloat16 matmul ceiling measured here
(matmul_ceiling.py on 4096..8192 squares), and also over the datasheet peak when known
(--peak-tflops; 989 dense bfloat16 TFLOP/s is assumed for H100/H200 SXM).
Decoding: decode_speed.py's forced-length workload (random weights, every output exactly
--out-len tokens) with the base model, beam 4 and greedy.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

import common

# Dense bfloat16 tensor-core peaks from the vendors' datasheets, TFLOP/s.
DATASHEET_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}


def gpu_present() -> bool:
    try:
        import jax
    except ImportError:
        print("skipping the GPU benchmark: jax is not installed", file=sys.stderr)
        return False
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def datasheet_peak(device_kind: str) -> float | None:
    for name, tflops in DATASHEET_BF16_TFLOPS.items():
        if name in device_kind:
            return tflops
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=common.str_list, default=["train", "decode"])
    parser.add_argument("--models", type=common.str_list, default=["base", "big"])
    parser.add_argument("--shape", type=common.parse_shape, default=(384, 64), help="BxL")
    parser.add_argument("--min-steps", type=int, default=10)
    parser.add_argument("--min-seconds", type=float, default=15.0)
    parser.add_argument("--ceiling-sizes", type=common.int_list, default=[4096, 8192])
    parser.add_argument("--peak-tflops", type=float, help="datasheet bf16 peak (default by GPU)")
    parser.add_argument("--sentences", type=int, default=1024, help="decode: forced workload")
    parser.add_argument("--decode-batch", type=int, default=128)
    parser.add_argument("--src-len", type=int, default=32)
    parser.add_argument("--out-len", type=int, default=30)
    parser.add_argument("--beams", type=common.int_list, default=[4, 1])
    parser.add_argument(
        "--any-device",
        action="store_true",
        help="run even without a GPU (to test this script on a CPU; use with --smoke)",
    )
    common.add_output_args(parser)
    args = parser.parse_args()
    if args.smoke:
        args.shape, args.min_steps, args.min_seconds = (16, 32), 2, 0.0
        args.ceiling_sizes, args.sentences, args.decode_batch = [512], 16, 16
        args.models, args.out_len = ["base"], 8

    if not args.any_device and not gpu_present():
        print("no GPU found: skipping the GPU benchmark (nothing measured)")
        return

    import decode_speed
    import jax
    import matmul_ceiling
    import train_throughput

    info = common.machine_info()
    common.print_machine(info)
    device_kind = jax.devices()[0].device_kind
    peak = args.peak_tflops or datasheet_peak(device_kind)

    rows: list[dict[str, Any]] = []
    ceiling = matmul_ceiling.jax_ceiling("bfloat16", args.ceiling_sizes, 0.2 if args.smoke else 1.0)
    print(f"\nbfloat16 matmul ceiling: {ceiling:,.0f} GFLOP/s on {device_kind}\n")
    rows.append({"part": "ceiling", "dtype": "bfloat16", "ceiling_gflops": ceiling})

    if "train" in args.parts:
        train_rows = []
        for model in args.models:
            name = "wmt14_ende" if model == "base" else f"wmt14_ende_{model}"
            workload = train_throughput.build_workload(
                name, "bfloat16", data="random", shape=args.shape
            )
            row = train_throughput.time_attnmt(
                workload,
                min_steps=args.min_steps,
                min_seconds=args.min_seconds,
                warmup=2,
                ceiling_gflops=ceiling,
            )
            row["model"] = model
            if peak:
                row["mfu_datasheet"] = row["gflops"] / (peak * 1e3)
            print(f"  {model}: {row['step_ms']:.1f} ms/step", file=sys.stderr)
            train_rows.append({"part": "train", **row})
        columns = ["model", "dtype", "data", "compile_s", "step_ms", "tgt_tok_per_s", "gflops"]
        print(common.markdown_table(train_rows, [*columns, "mfu", "padded_mfu", "mfu_datasheet"]))
        rows += train_rows

    if "decode" in args.parts:
        experiment = common.load_experiment("wmt14_ende")
        config = dataclasses.replace(experiment.model, dtype="bfloat16")
        decode_rows = decode_speed.forced_rows(
            config,
            sentences=args.sentences,
            src_len=args.src_len,
            out_len=args.out_len,
            batch=args.decode_batch,
            beams=args.beams,
            max_len_offset=experiment.decode.max_len_offset,
            alpha=experiment.decode.alpha,
            repeats=1 if args.smoke else 2,
            peer=False,
        )
        print()
        print(common.markdown_table(decode_rows, decode_speed.COLUMNS))
        rows += [{"part": "decode", "model": "base", **row} for row in decode_rows]
    common.append_json(args.json, "gpu", args, rows)


if __name__ == "__main__":
    main()
