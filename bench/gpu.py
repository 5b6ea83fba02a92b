"""GPU benchmark, prepared to run as one short script: the bare training step of base and
big, a 256-token point, the real trainer (`attnmt train`, bucketed and packed), and beam
decoding. Exits 0 with a message where there is no GPU; `--smoke` runs it all on any
device at toy sizes (the test suite does, so the script cannot rot).

    python bench/gpu.py --json gpu.json               # ~10 minutes on one H100/H200 (estimate)
    python bench/gpu.py --parts train,trainer --models big
    python bench/gpu.py --smoke --out smoke.json       # seconds on a CPU: proves it runs

Parts, each written to the JSON file as soon as it is done (a run cut short keeps them):
- ceiling: the matmul ceiling of the compute dtype (matmul_ceiling.py on 4096..8192
  squares), the MFU denominator.
- train: the project's jitted train step alone (train_throughput.time_attnmt) on the
  paper's batches of about 25,000 + 25,000 tokens (--shape, default 384x64 = 24,576 per
  side, random full rows), bfloat16 compute with float32 parameters. MFU is useful FLOP/s
  (the formula of train_throughput.py) over the measured ceiling, and over the datasheet
  peak when known (--peak-tflops; 989 dense bfloat16 TFLOP/s is assumed for H100/H200 SXM).
- long: the same step of base on rows of 256 tokens (--long-shape, 96x256: the same
  tokens per side), where attention's share of the work is largest.
- trainer / packed: `attnmt train` itself, --trainer-steps updates of the WMT recipe (base)
  on one device on a synthetic corpus (sentences of 20-34 words), in length buckets and
  packed into rows of --pack-length tokens: target tokens/s and MFU as its own log lines
  report them (the median of the logged windows after the first, which holds the
  compiles), beside the bare step's.
- decode: decode_speed.py's forced-length workload (random weights, every output exactly
  --out-len tokens) with the base model, beam 4 and greedy.
Every part records the device's peak memory (`memory_stats()["peak_bytes_in_use"]` where
the backend reports it: GPU and TPU, not CPU): for the in-process parts the process's peak
so far, for the trainer its own process's peak at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import common
import numpy as np

# Dense bfloat16 tensor-core peaks from the vendors' datasheets, TFLOP/s.
DATASHEET_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}
RECIPE = "configs/wmt14_ende.py:variant=base"
PARTS = ["train", "long", "trainer", "packed", "decode"]
# `attnmt train` as the command line runs it, then the device's memory figures of the same
# process on one line (the trainer's log has none).
TRAINER_DRIVER = """
import json, sys
from attnmt.cli.main import main
code = main(sys.argv[1:])
import jax
try:
    stats = jax.local_devices()[0].memory_stats() or {}
except Exception:
    stats = {}
print("BENCH_DEVICE_MEMORY " + json.dumps({"peak_bytes": stats.get("peak_bytes_in_use")}))
sys.exit(code)
"""
TRAIN_LINE = re.compile(r"\[train\] step (\d+) (.*)$")


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


def peak_memory_bytes() -> int | None:
    """The process's peak device memory so far, where the backend reports it."""
    import jax

    try:
        stats = jax.local_devices()[0].memory_stats()
    except (NotImplementedError, RuntimeError):
        return None
    return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


class Results:
    """This run's record {benchmark, machine, args, parts, rows} in a JSON array (earlier
    records kept), rewritten whole after every part."""

    def __init__(self, path: str | None, args: argparse.Namespace) -> None:
        self.path = Path(path) if path else None
        self.earlier: list[Any] = []
        if self.path and self.path.exists() and self.path.stat().st_size:
            self.earlier = json.loads(self.path.read_text())
            if not isinstance(self.earlier, list):
                raise SystemExit(f"{path} does not hold a JSON array; give another file")
        arguments = {k: v for k, v in vars(args).items() if k != "json"}
        self.record: dict[str, Any] = {
            "benchmark": "gpu",
            "machine": common.machine_info(),
            "args": arguments,
            "parts": [],
            "rows": [],
        }

    def add(self, part: str, rows: list[dict[str, Any]]) -> None:
        self.record["parts"].append(part)
        self.record["rows"] += [{"part": part, **row} for row in rows]
        if not self.path:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps([*self.earlier, self.record], indent=1, default=str) + "\n")
        os.replace(tmp, self.path)
        print(f"{part}: {len(rows)} rows written to {self.path}", file=sys.stderr)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=common.str_list, default=PARTS)
    parser.add_argument("--models", type=common.str_list, default=["base", "big"])
    parser.add_argument("--dtype", default="bfloat16", help="compute dtype of every part")
    parser.add_argument("--shape", type=common.parse_shape, default=(384, 64), help="BxL")
    parser.add_argument("--long-shape", type=common.parse_shape, default=(96, 256))
    parser.add_argument("--min-steps", type=int, default=10)
    parser.add_argument("--min-seconds", type=float, default=15.0)
    parser.add_argument("--ceiling-sizes", type=common.int_list, default=[4096, 8192])
    parser.add_argument("--peak-tflops", type=float, help="datasheet bf16 peak (default by GPU)")
    parser.add_argument("--trainer-steps", type=int, default=200)
    parser.add_argument("--trainer-log-every", type=int, default=25)
    parser.add_argument("--corpus-pairs", type=int, default=50_000)
    parser.add_argument("--sentence-words", type=common.int_list, default=[20, 34], help="min,max")
    parser.add_argument("--pack-length", type=int, default=256)
    parser.add_argument("--sentences", type=int, default=1024, help="decode: forced workload")
    parser.add_argument("--decode-batch", type=int, default=128)
    parser.add_argument("--src-len", type=int, default=32)
    parser.add_argument("--out-len", type=int, default=30)
    parser.add_argument("--beams", type=common.int_list, default=[4, 1])
    parser.add_argument(
        "--any-device",
        action="store_true",
        help="run even without a GPU (to test this script on a CPU; --smoke implies it)",
    )
    common.add_output_args(parser)
    parser.add_argument("--out", dest="json", metavar="FILE", help="the same as --json")
    args = parser.parse_args()
    args.overrides = []  # applied to every model (--smoke: a toy one)
    args.recipe = RECIPE
    if args.smoke:
        apply_smoke(args)
    return args


def apply_smoke(args: argparse.Namespace) -> None:
    """Toy sizes on any device: the runlocal model with one layer, float32 (a CPU has no
    fast bfloat16), a few steps of everything."""
    args.any_device, args.dtype, args.models = True, "float32", ["base"]
    args.recipe = "configs/wmt14_ende.py:variant=base,runlocal=true"
    # No memory pre-flight: it compiles the trainer's step once more.
    args.overrides = ["model.num_layers=1", "model.vocab_size=256", "train.memory_preflight=false"]
    args.shape, args.long_shape, args.min_steps, args.min_seconds = (8, 16), (4, 32), 2, 0.0
    args.ceiling_sizes, args.trainer_steps, args.trainer_log_every = [256], 4, 2
    args.corpus_pairs, args.sentence_words, args.pack_length = 300, [3, 8], 64
    args.sentences, args.decode_batch, args.src_len, args.out_len = 8, 8, 8, 6
    args.beams = [2]


def model_spec(args: argparse.Namespace, model: str) -> str:
    return (
        args.recipe if model == "base" else args.recipe.replace("variant=base", f"variant={model}")
    )


def step_rows(
    args: argparse.Namespace,
    models: list[str],
    shape: tuple[int, int],
    ceiling: float,
    peak: float | None,
) -> list[dict[str, Any]]:
    """The bare train step of each model on random full rows of `shape`."""
    import train_throughput

    rows = []
    for model in models:
        spec, overrides = model_spec(args, model), tuple(args.overrides)
        workload = train_throughput.build_workload(
            spec, args.dtype, data="random", shape=shape, overrides=overrides
        )
        row = train_throughput.time_attnmt(
            workload,
            min_steps=args.min_steps,
            min_seconds=args.min_seconds,
            warmup=2,
            ceiling_gflops=ceiling,
        )
        row.update(
            model=model, shape=f"{shape[0]}x{shape[1]}", peak_memory_bytes=peak_memory_bytes()
        )
        if peak:
            row["mfu_datasheet"] = row["gflops"] / (peak * 1e3)
        print(f"  {model} {row['shape']}: {row['step_ms']:.1f} ms/step", file=sys.stderr)
        rows.append(row)
    return rows


STEP_COLUMNS = ["model", "shape", "dtype", "compile_s", "step_ms", "tgt_tok_per_s", "gflops"]
STEP_COLUMNS += ["mfu", "padded_mfu", "mfu_datasheet", "peak_memory_bytes"]


def write_corpus(folder: Path, pairs: int, words: list[int], seed: int = 0) -> Path:
    """train.{en,de} and dev.{en,de}: sentences of words[0]..words[1] words (20-34 by
    default) from 8,000 made-up word types (Zipf-distributed, as words are), each target
    word a fixed stand-in of its source word. With the recipe's vocabulary that is about 30
    tokens a sentence, near WMT'14's average, in a few length buckets."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    types = sorted({"".join(rng.choice(letters, size=rng.integers(3, 9))) for _ in range(8000)})
    german = [word[::-1] + "en" for word in types]
    weights = 1.0 / np.arange(1, len(types) + 1)
    weights /= weights.sum()
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", pairs), ("dev", 64)):
        lengths = rng.integers(words[0], words[1] + 1, size=count)
        drawn = rng.choice(len(types), size=int(lengths.sum()), p=weights)
        sentences = np.split(drawn, np.cumsum(lengths)[:-1])
        for lang, vocab in (("en", types), ("de", german)):
            lines = (" ".join(vocab[i] for i in sentence) for sentence in sentences)
            (folder / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
    return folder


def trainer_command(
    args: argparse.Namespace, corpus: Path, workdir: Path, packed: bool, ceiling: float
) -> list[str]:
    """`attnmt train` of the recipe on the synthetic corpus, one device, MFU logged against
    the measured ceiling (the bare step's denominator)."""
    config = {
        "data.source": "files",
        "data.src_path": f"{corpus}/{{split}}.{{lang}}",
        "data.tgt_path": f"{corpus}/{{split}}.{{lang}}",
        "data.eval_split": "dev",
        "data.test_split": "dev",
        "data.vocab_max_sentences": 20_000,  # enough for the vocabulary, trained quickly
        "data.pack_length": args.pack_length if packed else 0,
        "model.dtype": args.dtype,
        "parallel.num_devices": 1,
        # The whole update in one step, as the bare step runs it (the recipe accumulates
        # micro-batches of 4,096 tokens, sized for 8 smaller devices).
        "train.max_tokens_per_device": 0,
        "train.num_steps": args.trainer_steps,
        "train.log_every_steps": args.trainer_log_every,
        "train.eval_every_steps": 0,
        "train.test_at_end": False,
        "train.checkpoint_every_steps": 0,
        "train.checkpoint_every_minutes": 10_000.0,  # one checkpoint, at the end
        "train.peak_tflops_per_device": ceiling / 1e3,
    }
    extra = [f"--config.{item}" for item in args.overrides]
    flags = [f"--config.{key}={value}" for key, value in config.items()]
    return [
        sys.executable,
        "-c",
        TRAINER_DRIVER,
        "train",
        "--config",
        args.recipe,
        "--workdir",
        str(workdir),
        *flags,
        *extra,
    ]


def parse_trainer_log(text: str) -> list[dict[str, float]]:
    """The `[train] step N key=value ...` lines of the trainer's log, as numbers."""
    windows = []
    for line in text.splitlines():
        found = TRAIN_LINE.search(line)
        if found:
            pairs = (item.split("=", 1) for item in found.group(2).split())
            numbers = {k: float(v) for k, v in pairs}
            windows.append({"step": float(found.group(1)), **numbers, "line": found.group(0)})
    return windows


def trainer_row(
    args: argparse.Namespace, corpus: Path, packed: bool, ceiling: float, peak: float | None
) -> dict[str, Any]:
    """One `attnmt train` run: its logged throughput after the first window (compiles)."""
    workdir = Path(tempfile.mkdtemp(prefix="attnmt-bench-gpu-"))
    command = trainer_command(args, corpus, workdir, packed, ceiling)
    done = subprocess.run(command, capture_output=True, text=True, cwd=common.REPO_ROOT)
    if done.returncode != 0:
        raise SystemExit(f"attnmt train failed ({done.returncode}):\n{done.stderr[-4000:]}")
    shutil.rmtree(workdir, ignore_errors=True)  # its checkpoint: 0.7 GB for base
    windows = parse_trainer_log(done.stderr)
    steady = windows[1:] or windows
    if not steady:
        raise SystemExit(f"no [train] log line from attnmt train:\n{done.stderr[-4000:]}")
    memory = next(
        (
            json.loads(line.split(" ", 1)[1])
            for line in done.stdout.splitlines()
            if line.startswith("BENCH_DEVICE_MEMORY ")
        ),
        {},
    )

    def median(key: str) -> float:
        return statistics.median(w[key] for w in steady)

    row = {
        "model": "base",
        "data": f"packed {args.pack_length}" if packed else "buckets",
        "dtype": args.dtype,
        "steps": int(windows[-1]["step"]),
        "windows": len(steady),
        "step_ms": median("step_time") * 1e3,
        "tgt_tok_per_s": median("tokens_per_second"),
        "gflops": median("model_tflops_per_second") * 1e3,
        "mfu": median("mfu"),
        "padding_fraction": median("padding_fraction"),
        "loss": windows[-1]["loss"],
        "peak_memory_bytes": memory.get("peak_bytes"),
        "log_lines": [w.pop("line") for w in windows],  # the figures' source
    }
    if peak:
        row["mfu_datasheet"] = row["gflops"] / (peak * 1e3)
    print(f"  attnmt train, {row['data']}: {row['tgt_tok_per_s']:,.0f} tokens/s", file=sys.stderr)
    return row


TRAINER_COLUMNS = ["model", "data", "dtype", "steps", "step_ms", "tgt_tok_per_s", "gflops"]
TRAINER_COLUMNS += ["mfu", "mfu_datasheet", "padding_fraction", "peak_memory_bytes"]


def decode_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    import decode_speed

    experiment = common.load_experiment(args.recipe, args.overrides)
    config = dataclasses.replace(experiment.model, dtype=args.dtype)
    rows = decode_speed.forced_rows(
        config,
        sentences=args.sentences,
        src_len=args.src_len,
        out_len=args.out_len,
        batch=args.decode_batch,
        beams=args.beams,
        max_len_offset=experiment.decode.max_len_offset,
        initial_cache_length=experiment.decode.initial_cache_length,
        alpha=experiment.decode.alpha,
        repeats=1 if args.smoke else 2,
        peer=False,
    )
    print(common.markdown_table(rows, decode_speed.COLUMNS))
    return [{"model": "base", **row, "peak_memory_bytes": peak_memory_bytes()} for row in rows]


def main() -> None:
    args = parse_args()
    if not args.any_device and not gpu_present():
        print("no GPU found: skipping the GPU benchmark (nothing measured)")
        return

    import jax
    import matmul_ceiling

    results = Results(args.json, args)
    common.print_machine(results.record["machine"])
    device_kind = jax.devices()[0].device_kind
    peak = args.peak_tflops or datasheet_peak(device_kind)
    seconds = 0.2 if args.smoke else 1.0
    ceiling = matmul_ceiling.jax_ceiling(args.dtype, args.ceiling_sizes, seconds)
    print(f"\n{args.dtype} matmul ceiling: {ceiling:,.0f} GFLOP/s on {device_kind}\n")
    results.add("ceiling", [{"dtype": args.dtype, "ceiling_gflops": ceiling}])
    if "train" in args.parts:
        results.add("train", step_rows(args, args.models, args.shape, ceiling, peak))
    if "long" in args.parts:
        results.add("long", step_rows(args, ["base"], args.long_shape, ceiling, peak))
    steps = [r for r in results.record["rows"] if r["part"] in ("train", "long")]
    print(common.markdown_table(steps, STEP_COLUMNS))
    corpus = write_corpus(
        Path(tempfile.mkdtemp(prefix="attnmt-bench-corpus-")),
        args.corpus_pairs,
        args.sentence_words,
    )
    for part, packed in (("trainer", False), ("packed", True)):
        if part in args.parts:
            results.add(part, [trainer_row(args, corpus, packed, ceiling, peak)])
    trainer = [r for r in results.record["rows"] if r["part"] in ("trainer", "packed")]
    print(common.markdown_table(trainer, TRAINER_COLUMNS))
    if "decode" in args.parts:
        results.add("decode", decode_rows(args))


if __name__ == "__main__":
    main()
