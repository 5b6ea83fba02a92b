"""Shared helpers of the benchmark scripts: timing, machine facts, FLOP counts, output.

Nothing here imports torch or transformers: scripts that compare against them import them
lazily, so the JAX-only benchmarks run on a machine that has neither.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnmt.model.flops import (  # re-exported for the bench scripts
    batch_train_flops,
    forward_flops,
    forward_flops_parts,
    nonpad_lengths,
    train_flops,
)

__all__ = [
    "batch_train_flops",
    "forward_flops",
    "forward_flops_parts",
    "nonpad_lengths",
    "train_flops",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"

# The configs the benchmarks know by a short name, as `--config` specs of the CLI.
CONFIG_SPECS = {
    "tiny": "configs/tiny.py",
    "multi30k": "configs/multi30k.py",
    "wmt14_ende": "configs/wmt14_ende.py:variant=base",
    "wmt14_ende_big": "configs/wmt14_ende.py:variant=big",
}
# The recipe trains pre-norm; benchmarks time the paper's post-norm block, which is what the
# Marian peer computes (pre-norm adds two LayerNorms: no matmul FLOPs, no new shapes). They
# also keep the recipe's shape before session 14 (d_ff 1,024, 2,048 tokens per update), so
# BENCHMARKS.md's figures stay comparable across sessions.
DEFAULT_OVERRIDES = {
    "multi30k": ("model.norm_position=post", "model.d_ff=1024", "data.tokens_per_batch=2048")
}


# --------------------------------------------------------------------------- configs / data


def load_experiment(name: str, overrides: Sequence[str] = ()) -> Any:
    """An `Experiment` from a short name (CONFIG_SPECS) or a `path.py[:arg]` spec, with
    overrides written "model.num_layers=2" (after the name's DEFAULT_OVERRIDES)."""
    from attnmt.config import load_experiment as load

    overrides = (*DEFAULT_OVERRIDES.get(name, ()), *overrides)
    spec = CONFIG_SPECS.get(name, name)
    path, sep, arg = spec.partition(":")
    if not Path(path).is_absolute():
        path = str(REPO_ROOT / path)
    # The library reads overrides as the CLI writes them, with its --config. prefix.
    experiment = load(path + sep + arg, [f"--config.{item}" for item in overrides])
    if experiment.train.word_leaves_as_one_class:
        # The benchmarks build their steps without the vocabulary's word classes: they would
        # time (and count FLOPs of) another loss than the one the config trains.
        raise SystemExit(
            f"{spec}: train.word_leaves_as_one_class=True is not what the benchmarks build "
            "(their steps use the plain loss); drop it with "
            "--override train.word_leaves_as_one_class=False"
        )
    return experiment


def default_multi30k_dir() -> str | None:
    """$ATTNMT_MULTI30K_DIR, else the shared copy beside the checkout, else None."""
    env = os.environ.get("ATTNMT_MULTI30K_DIR")
    if env:
        return env
    shared = REPO_ROOT.parent / "shared" / "data" / "multi30k"
    return (
        str(shared) if (shared / "train.en").exists() or (shared / "train.en.gz").exists() else None
    )


def multi30k_corpus(experiment: Any, data_dir: str | None, workdir: str | None) -> tuple[Any, Any]:
    """(TokenizedCorpus of the training split, Tokenizer) for a Multi30K experiment.

    The vocabulary is trained by the project's own `ensure_vocab` into `workdir` (a fresh
    temporary folder when None, so a benchmark never touches a training run's files); pass
    the same `--data-workdir` again to reuse the vocabulary and the tokenized cache.
    """
    from attnmt.data.prepare import ensure_vocab, tokenized_split, vocab_path

    folder = Path(workdir or tempfile.mkdtemp(prefix="attnmt-bench-"))
    data = dataclasses.replace(experiment.data, data_dir=data_dir or experiment.data.data_dir)
    tokenizer = ensure_vocab(data, experiment.model.vocab_size, folder)
    corpus, _ = tokenized_split(data, vocab_path(data, folder), tokenizer, data.train_split, folder)
    return corpus, tokenizer


def random_batch(
    rng: np.random.Generator, batch: int, length: int, vocab_size: int, fill: float = 1.0
) -> dict[str, np.ndarray]:
    """A [batch, length] source/target pair of random tokens ending in EOS.

    `fill` < 1 draws each row's length uniformly from [fill·length, length] so that some
    padding remains, as in bucketed real data; 1.0 gives full rows (no padding at all).
    """
    from attnmt.common import EOS_ID, NUM_SPECIAL_TOKENS, PAD_ID

    out = {}
    for side in ("src_tokens", "tgt_tokens"):
        tokens = rng.integers(NUM_SPECIAL_TOKENS, vocab_size, size=(batch, length), dtype=np.int32)
        lengths = rng.integers(max(2, int(fill * length)), length + 1, size=batch)
        cols = np.arange(length)[None, :]
        tokens = np.where(cols < lengths[:, None] - 1, tokens, PAD_ID)
        tokens[np.arange(batch), lengths - 1] = EOS_ID
        out[side] = tokens.astype(np.int32)
    return out


def parse_shape(text: str) -> tuple[int, int]:
    """'64x32' → (64, 32): (batch, length)."""
    batch, _, length = text.lower().partition("x")
    try:
        return int(batch), int(length)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected BATCHxLENGTH such as 64x32, got {text!r}"
        ) from None


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def float_list(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def str_list(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


# --------------------------------------------------------------------------- FLOPs

# The accounting lives in attnmt.model.flops (the training loop logs MFU with it).


# --------------------------------------------------------------------------- timing


@dataclasses.dataclass
class Timings:
    """Wall-clock seconds of repeated runs of one thing."""

    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def total(self) -> float:
        return sum(self.seconds)

    @property
    def best(self) -> float:
        return min(self.seconds)

    def spread(self) -> str:
        """min–max, for a quick look at noise."""
        return f"{min(self.seconds) * 1e3:.1f}–{max(self.seconds) * 1e3:.1f}"


def block(tree: Any) -> Any:
    """Waits until every array in `tree` is computed (JAX dispatch is asynchronous)."""
    import jax

    return jax.block_until_ready(tree)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(result, seconds) of one call, waiting for any JAX arrays it returns."""
    start = time.perf_counter()
    result = block(fn())
    return result, time.perf_counter() - start


def repeat(fn: Callable[[], Any], warmup: int, iters: int) -> Timings:
    """Runs `fn` warmup times untimed, then times `iters` calls one by one."""
    for _ in range(warmup):
        block(fn())
    seconds = []
    for _ in range(iters):
        _, elapsed = timed(fn)
        seconds.append(elapsed)
    return Timings(seconds)


def repeat_for(fn: Callable[[], Any], min_seconds: float, min_iters: int = 3) -> Timings:
    """Times calls of `fn` (after one untimed warmup) until `min_seconds` have passed and at
    least `min_iters` calls were made, so fast and slow cases get comparable precision."""
    block(fn())
    seconds: list[float] = []
    while len(seconds) < min_iters or sum(seconds) < min_seconds:
        _, elapsed = timed(fn)
        seconds.append(elapsed)
    return Timings(seconds)


# --------------------------------------------------------------------------- machine facts


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    if shutil.which("lscpu"):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    """What the numbers depend on: CPU, cores, load, accelerator, library versions, date."""
    import jax

    devices = jax.devices()
    info: dict[str, Any] = {
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        # A load average near the core count means another process competes for the CPU
        # and the timings are not to be trusted.
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "jax_backend": jax.default_backend(),
        "devices": f"{len(devices)} x {devices[0].device_kind}",
    }
    for package in ("jax", "jaxlib", "flax", "optax", "numpy", "torch", "transformers"):
        info[package] = _version(package)
    return info


def warn_if_busy(info: dict[str, Any]) -> None:
    cores = info.get("cores") or 1
    if info["jax_backend"] == "cpu" and info["load_avg_1m"] > 0.5 * cores:
        print(
            f"WARNING: load average {info['load_avg_1m']} on {cores} cores before starting: "
            "another process is using the CPU, these timings are contaminated.",
            file=sys.stderr,
        )


def print_machine(info: dict[str, Any]) -> None:
    versions = ", ".join(
        f"{k} {info[k]}" for k in ("jax", "jaxlib", "flax", "torch", "transformers") if info.get(k)
    )
    print(
        f"# {info['date_utc']} UTC · {info['cpu']} · {info['cores']} cores · "
        f"{info['devices']} · load {info['load_avg_1m']} · {versions}\n"
    )


# --------------------------------------------------------------------------- output


def markdown_table(rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> str:
    """A GitHub markdown table of `columns` from `rows` (floats shown with 3 significant
    digits or as integers when large)."""

    def fmt(value: Any) -> str:
        if value is None:
            return "–"
        if isinstance(value, float):
            if value != value:  # NaN
                return "–"
            if abs(value) >= 1000:
                return f"{value:,.0f}"
            return f"{value:.3g}"
        if isinstance(value, int) and abs(value) >= 10_000:
            return f"{value:,}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(fmt(row.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def append_json(
    path: str | None, benchmark: str, args: argparse.Namespace, rows: list[dict]
) -> None:
    """Appends one record {benchmark, machine, args, rows} to a JSON array in `path`."""
    if not path:
        return
    target = Path(path)
    records = json.loads(target.read_text()) if target.exists() and target.stat().st_size else []
    if not isinstance(records, list):
        raise SystemExit(f"{path} does not hold a JSON array; give another --json file")
    records.append(
        {
            "benchmark": benchmark,
            "machine": machine_info(),
            "args": {k: v for k, v in vars(args).items() if k != "json"},
            "rows": rows,
        }
    )
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(records, indent=1, default=str) + "\n")
    os.replace(tmp, target)
    print(f"\nappended {len(rows)} rows to {path}")


def add_output_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", help="append the results to this JSON array")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes and one or two steps: proves the script runs, measures nothing",
    )


def ceiling_from_json(path: str, dtype: str) -> float | None:
    """The best measured JAX GFLOP/s for `dtype` in a matmul_ceiling.py --json file."""
    records = json.loads(Path(path).read_text())
    best = None
    for record in records:
        if record.get("benchmark") != "matmul_ceiling":
            continue
        for row in record["rows"]:
            if row.get("framework") == "jax" and row.get("dtype") == dtype:
                best = max(best or 0.0, row["gflops"])
    return best
