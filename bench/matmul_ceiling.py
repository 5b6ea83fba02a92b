"""Measured matmul ceiling: GFLOP/s of one large square matrix product, the MFU denominator.

    python bench/matmul_ceiling.py                      # n = 512…4096, float32 + bfloat16
    python bench/matmul_ceiling.py --smoke
    python bench/matmul_ceiling.py --json results.json  # train_throughput.py --ceiling-json
    python bench/matmul_ceiling.py --shapes 256x256x6000,256x256x1024 --dtypes float32
                                    # M×K by K×N products of a decoder step instead of squares

An n×n by n×n product is 2·n³ FLOPs. Each (n, dtype) is timed (median of calls, after a
warmup that also compiles) for at least --min-seconds. The ceiling is the best median over
n: what this machine's BLAS-like kernels reach on the shapes most favourable to them, so
a model's MFU below it measures the model's own overheads, not the hardware's datasheet.
torch.mm is measured too when torch is installed, to see whether XLA's CPU kernels leave
anything on the table.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import common  # bench/ is on sys.path when a script in it runs

Shape = tuple[int, int, int]  # (M, K, N): an M×K by K×N product, 2·M·K·N FLOPs


def parse_shapes(text: str) -> list[Shape]:
    shapes = []
    for item in common.str_list(text):
        parts = item.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise argparse.ArgumentTypeError(f"--shapes: {item!r} is not MxKxN")
        shapes.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return shapes


def jax_matmul(shape: Shape, dtype: str, min_seconds: float) -> common.Timings:
    import jax
    import jax.numpy as jnp

    m, k, n = shape
    key_a, key_b = jax.random.split(jax.random.PRNGKey(m * k + n))
    a = jax.random.normal(key_a, (m, k), jnp.float32).astype(dtype)
    b = jax.random.normal(key_b, (k, n), jnp.float32).astype(dtype)
    dot = jax.jit(jnp.dot)
    return common.repeat_for(lambda: dot(a, b), min_seconds)


def torch_matmul(shape: Shape, dtype: str, min_seconds: float) -> common.Timings:
    import torch

    m, k, n = shape
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    generator = torch.Generator().manual_seed(m * k + n)
    a = torch.randn(m, k, generator=generator).to(torch_dtype)
    b = torch.randn(k, n, generator=generator).to(torch_dtype)
    with torch.inference_mode():
        # torch runs eagerly and synchronously on the CPU, so returning the result is enough.
        return common.repeat_for(lambda: torch.mm(a, b), min_seconds)


def measure(
    sizes: list[int] | list[Shape],
    dtypes: list[str],
    min_seconds: float,
    frameworks: list[str],
    max_call_seconds: float = 5.0,
) -> list[dict[str, Any]]:
    rows = []
    for framework in frameworks:
        run = jax_matmul if framework == "jax" else torch_matmul
        for dtype in dtypes:
            rate = None  # FLOP/s of the previous size, to foresee hopeless ones
            for size in sorted(sizes):
                shape = size if isinstance(size, tuple) else (size, size, size)
                m, k, n = shape
                flops = 2.0 * m * k * n
                if rate and flops / rate > max_call_seconds:
                    # E.g. torch bfloat16 on a CPU without native bf16 runs at a few
                    # GFLOP/s: n=4096 would take minutes per call and tell nothing new.
                    print(
                        f"  {framework} {dtype} {m}x{k}x{n}: skipped (one call would take about "
                        f"{flops / rate:.3g} s; --max-call-seconds {max_call_seconds:g})",
                        file=sys.stderr,
                    )
                    continue
                timings = run(shape, dtype, min_seconds)
                rate = flops / timings.median
                rows.append(
                    {
                        "framework": framework,
                        "dtype": dtype,
                        "m": m,
                        "k": k,
                        "n": n,
                        "ms": timings.median * 1e3,
                        "gflops": rate / 1e9,
                        "gflops_best": flops / timings.best / 1e9,
                        "calls": len(timings.seconds),
                    }
                )
                print(
                    f"  {framework} {dtype} {m}x{k}x{n}: {rate / 1e9:.1f} GFLOP/s", file=sys.stderr
                )
    return rows


def ceilings(rows: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """Best median GFLOP/s per (framework, dtype)."""
    best: dict[tuple[str, str], float] = {}
    for row in rows:
        key = (row["framework"], row["dtype"])
        best[key] = max(best.get(key, 0.0), row["gflops"])
    return best


def jax_ceiling(dtype: str, sizes: list[int] | None = None, min_seconds: float = 1.0) -> float:
    """Re-measures the JAX ceiling for one dtype (used when no --ceiling-json is given)."""
    rows = measure(sizes or [1024, 2048], [dtype], min_seconds, ["jax"])
    return ceilings(rows)[("jax", dtype)]


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=common.int_list, default=[512, 1024, 2048, 4096])
    parser.add_argument(
        "--shapes", type=parse_shapes, help="MxKxN,… products to time instead of the squares"
    )
    parser.add_argument("--dtypes", type=common.str_list, default=["float32", "bfloat16"])
    parser.add_argument("--min-seconds", type=float, default=2.0, help="timed per (n, dtype)")
    parser.add_argument("--no-torch", action="store_true", help="JAX only")
    parser.add_argument(
        "--max-call-seconds",
        type=float,
        default=5.0,
        help="skip sizes whose one call would take longer, judged from the previous size",
    )
    common.add_output_args(parser)
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.min_seconds = [128, 256], 0.05

    info = common.machine_info()
    common.print_machine(info)
    common.warn_if_busy(info)
    frameworks = ["jax"]
    if not args.no_torch:
        if torch_available():
            frameworks.append("torch")
        else:
            print("torch is not installed: measuring JAX only", file=sys.stderr)
    sizes = args.shapes or args.sizes
    rows = measure(sizes, args.dtypes, args.min_seconds, frameworks, args.max_call_seconds)
    columns = ["framework", "dtype", "m", "k", "n", "ms", "gflops", "gflops_best"]
    print(common.markdown_table(rows, columns))
    print()
    summary = [
        {"framework": f, "dtype": d, "ceiling_gflops": g} for (f, d), g in ceilings(rows).items()
    ]
    print(common.markdown_table(summary, ["framework", "dtype", "ceiling_gflops"]))
    common.append_json(args.json, "matmul_ceiling", args, rows)


if __name__ == "__main__":
    main()
