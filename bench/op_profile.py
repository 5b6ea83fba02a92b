"""Where the time goes: a jax.profiler trace of train steps or of a beam search, per XLA op.

    python bench/op_profile.py train                       # Multi30K model, a real batch
    python bench/op_profile.py decode --beam 4             # forced-length search, 64 sentences
    python bench/op_profile.py train --config wmt14_ende --top 25 --trace-dir /tmp/trace
    python bench/op_profile.py train --smoke

Runs the workload once untraced (compilation, warmup), then `--steps` times inside
`jax.profiler.trace` and reads the trace's Perfetto JSON back: every XLA:CPU thunk is one
event named after its HLO instruction. The tables give milliseconds per call (one train
step, or one whole search) for the `--top` instructions, each with the JAX operation it
came from (the `op_name` metadata of the compiled HLO), and the same time summed by kind:
matmuls (dots and the fusions built around one), copies and transposes, other fusions
(elementwise, reductions, gathers), sorts/top-k (custom calls). Shares are of the summed
op time, which can exceed the wall time when the runtime runs independent ops concurrently.

The trace directory can also be opened in TensorBoard's profile plugin (xprof).
"""

from __future__ import annotations

import argparse
import collections
import functools
import glob
import gzip
import json
import re
import sys
import tempfile
import time
from typing import Any

import common
import jax
import jax.numpy as jnp

KINDS = (
    ("copy / transpose", re.compile(r"^(copy|transpose|wrapped_transpose|.*copy.*fusion)")),
    ("sort / top-k / custom call", re.compile(r"^(custom-call|sort|topk)")),
)
# A while/cond event spans the ops of its body, which are events of their own.
CONTAINER = re.compile(r"^(while|cond|conditional|call)(\.\d+)?$")
MATMUL = "matmul (dot, or a fusion around one)"
OTHER = "other fusions (elementwise, reductions, gathers)"


def kind_of(op: str, matmul_ops: set[str]) -> str:
    if op in matmul_ops or op.startswith("dot"):
        return MATMUL
    for kind, pattern in KINDS:
        if pattern.match(op):
            return kind
    return OTHER


def matmul_instructions(hlo_text: str) -> set[str]:
    """Fusion instructions whose fused computation contains a dot or convolution.

    XLA:CPU's XNNPACK/YNNPACK fusions wrap dots but also plain elementwise/reduce work, so
    the instruction name alone does not say which is which.
    """
    with_dot, current = set(), None
    for line in hlo_text.splitlines():
        header = re.match(r"^%?([\w.\-]+) \(.*\{$", line)
        if header:
            current = header.group(1)
        elif current and re.search(r"= [^=]*\b(dot|convolution)\(", line):
            with_dot.add(current)
    calls = re.finditer(r"%([\w.\-]+) = [^\n]*?calls=%([\w.\-]+)", hlo_text)
    return {match.group(1) for match in calls if match.group(2) in with_dot}


def op_names(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> the JAX op_name metadata it carries (shortened)."""
    names = {}
    for match in re.finditer(r"%([\w.\-]+) = [^\n]*?op_name=\"([^\"]+)\"", hlo_text):
        names[match.group(1)] = match.group(2).split("/", 1)[-1]
    return names


def read_trace(trace_dir: str) -> list[dict[str, Any]]:
    paths = glob.glob(f"{trace_dir}/**/*perfetto_trace.json.gz", recursive=True)
    if not paths:
        raise SystemExit(f"no perfetto_trace.json.gz under {trace_dir}")
    with gzip.open(sorted(paths)[-1]) as handle:
        data = json.load(handle)
    return data["traceEvents"] if isinstance(data, dict) else data


def op_totals(events: list[dict[str, Any]]) -> collections.Counter:
    """Summed duration (µs) per HLO instruction; runtime, Python and loop events left out."""
    totals: collections.Counter = collections.Counter()
    for event in events:
        name = event.get("name", "")
        if event.get("ph") != "X" or name.startswith(("$", "ThunkExecutor", "Slinky", "Pjit")):
            continue
        args = event.get("args") or {}
        if "hlo_op" not in args or CONTAINER.match(args["hlo_op"]):
            continue
        totals[args["hlo_op"]] += event.get("dur", 0)
    return totals


def summarise(totals: collections.Counter, hlo_text: str, steps: int, top: int) -> str:
    names, matmul_ops = op_names(hlo_text), matmul_instructions(hlo_text)
    total = sum(totals.values()) or 1
    lines = [
        f"summed op time {total / 1e3 / steps:.1f} ms per call (one train step or one search)",
        "",
        "| kind | ms per call | share |",
        "|---|---|---|",
    ]
    by_kind: collections.Counter = collections.Counter()
    for op, micros in totals.items():
        by_kind[kind_of(op, matmul_ops)] += micros
    for kind, micros in by_kind.most_common():
        lines.append(f"| {kind} | {micros / 1e3 / steps:.1f} | {micros / total:.1%} |")
    lines += ["", "| HLO op | kind | ms per call | share | from |", "|---|---|---|---|---|"]
    for op, micros in totals.most_common(top):
        origin = names.get(op, "").replace("|", "/")[:90]
        kind = kind_of(op, matmul_ops).split(" ")[0]
        ms = micros / 1e3 / steps
        lines.append(f"| {op} | {kind} | {ms:.1f} | {micros / total:.1%} | {origin} |")
    return "\n".join(lines)


def train_workload(args: argparse.Namespace) -> tuple[Any, tuple[Any, ...], Any]:
    """(jitted step, initial arguments, how to feed the output back in)."""
    import train_throughput as throughput

    workload = throughput.build_workload(
        args.config, args.dtype, pool=2, overrides=tuple(args.override)
    )
    plain = throughput.plain_steps(workload.experiment)
    batch = jax.device_put(workload.batches[0])
    state = common.block(jax.jit(plain.create_state)(jax.random.PRNGKey(0), batch))
    shapes = {k: v.shape for k, v in workload.batches[0].items()}
    print(f"train step of {args.config} on {workload.data}, batch {shapes}", file=sys.stderr)
    step = jax.jit(plain.train_step, donate_argnums=(0,))
    return step, (state, batch), lambda out, prev: (out[0], prev[1])


def decode_workload(args: argparse.Namespace) -> tuple[Any, tuple[Any, ...], Any]:
    import decode_speed

    experiment = common.load_experiment(args.config, tuple(args.override))
    config = experiment.model
    params = decode_speed.random_params(config)
    sources = decode_speed.random_sources(args.sentences, args.src_len, config.vocab_size)
    sources = jnp.asarray(sources)
    search = functools.partial(
        decode_speed.forced_decode,
        config,
        beam_size=args.beam,
        out_len=args.out_len,
        max_len_offset=experiment.decode.max_len_offset,
        initial_cache_length=experiment.decode.initial_cache_length,
        alpha=experiment.decode.alpha,
    )
    print(
        f"beam {args.beam} search of {args.config}: {args.sentences} sentences of "
        f"{args.src_len} tokens, {args.out_len} out",
        file=sys.stderr,
    )
    return jax.jit(search), (params, sources), lambda out, prev: prev


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["train", "decode"])
    parser.add_argument("--config", default="multi30k")
    parser.add_argument("--dtype", default="float32", help="train: compute dtype")
    parser.add_argument("--override", action="append", default=[], help="model.num_layers=2")
    parser.add_argument("--steps", type=int, default=3, help="traced steps (train) or searches")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--beam", type=int, default=4, help="decode")
    parser.add_argument("--sentences", type=int, default=64, help="decode")
    parser.add_argument("--src-len", type=int, default=24, help="decode")
    parser.add_argument("--out-len", type=int, default=30, help="decode")
    parser.add_argument("--trace-dir", help="keep the trace here (default: a temporary folder)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: proves it runs")
    args = parser.parse_args()
    if args.smoke:
        args.override = [*args.override, "model.num_layers=1"]
        args.steps, args.sentences, args.src_len, args.out_len = 1, 4, 8, 6
        if args.what == "train":
            args.config = "tiny"

    info = common.machine_info()
    common.print_machine(info)
    common.warn_if_busy(info)
    make = train_workload if args.what == "train" else decode_workload
    fn, inputs, feed = make(args)
    compiled = fn.lower(*inputs).compile()
    for _ in range(2):  # warmup: allocation, caches
        inputs = feed(common.block(compiled(*inputs)), inputs)
    trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="attnmt-trace-")
    start = time.perf_counter()
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        for _ in range(args.steps):
            inputs = feed(common.block(compiled(*inputs)), inputs)
    wall = (time.perf_counter() - start) / args.steps
    print(f"wall {wall * 1e3:.1f} ms per call (traced); trace in {trace_dir}")
    totals = op_totals(read_trace(trace_dir))
    print(summarise(totals, compiled.as_text(), args.steps, args.top))


if __name__ == "__main__":
    main()
