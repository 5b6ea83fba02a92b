"""Expected training time and cost of a WMT'14 run on a named slice, from the FLOPs formula.

    python bench/pod_cost.py                                  # base + big, every slice below
    python bench/pod_cost.py --configs configs/wmt14_ende.py:variant=big --slices v4-32 \
        --mfu 0.3 --price-per-chip-hour 3.22
    python bench/pod_cost.py --smoke

An estimate, not a measurement: nothing is timed. One update trains on the config's
`data.tokens_per_batch` real tokens per side (the paper's ≈25,000 + 25,000), split into
sentences of `--mean-length` tokens on both sides; its FLOPs are `attnmt.model.flops
.train_flops` (what MFU in the training logs counts: real tokens only, forward + backward).
The run is `train.num_steps` updates (§5.2: base 100k, big 300k), so

    hours = num_steps × FLOPs per update / (chips × peak FLOP/s per chip × MFU) / 3600
    cost  = hours × chips × price per chip-hour

Padding, input pipeline stalls, checkpoints and evaluation are all inside MFU (an MFU of
useful FLOPs). Peaks are the dense bfloat16 datasheet figures; prices are assumptions that
change (pass --price-per-chip-hour); see docs/REPRODUCING.md for the figures this printed.
The last rows turn the paper's own training times (8 P100s: base 12 hours, big 3.5 days,
§5.2) into the MFU they imply under this formula, as a check on its scale.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

import common  # bench/ is on sys.path when a script in it runs
import numpy as np


@dataclasses.dataclass(frozen=True)
class Slice:
    chips: int
    peak_tflops: float  # dense bfloat16 per chip (float32 for the P100 row)
    price_per_chip_hour: float  # assumed on-demand US list price, USD; 0 = not priced
    note: str


SLICES = {
    "v4-32": Slice(16, 275.0, 3.22, "Cloud TPU v4, 16 chips (32 TensorCores), 4 hosts"),
    "v5e-16": Slice(16, 197.0, 1.20, "Cloud TPU v5e (v5litepod-16), 16 chips, 4 hosts"),
    "8xH100": Slice(8, 989.0, 11.06, "one a3-highgpu-8g node, H100 SXM"),
}
# The paper's hardware (§5.2): 8 NVIDIA P100s; 9.5 TFLOP/s float32 is the figure its
# Table 2 used for a P100's sustained single precision.
PAPER = Slice(8, 9.5, 0.0, "the paper's 8 P100 GPUs")
PAPER_HOURS = {"base": 12.0, "big": 3.5 * 24}
DEFAULT_CONFIGS = ("configs/wmt14_ende.py:variant=base", "configs/wmt14_ende.py:variant=big")


def update_flops(experiment, mean_length: float) -> float:
    """Training FLOPs of one update: tokens_per_batch tokens per side in sentences of
    `mean_length` tokens (source and target alike)."""
    one = np.array([mean_length], np.float64)
    per_sentence = common.train_flops(experiment.model, one, one)
    return per_sentence * experiment.data.tokens_per_batch / mean_length


def estimate(
    flops: float, steps: int, hardware: Slice, mfu: float, price: float | None
) -> dict[str, float]:
    seconds = steps * flops / (hardware.chips * hardware.peak_tflops * 1e12 * mfu)
    hours = seconds / 3600
    per_chip_hour = hardware.price_per_chip_hour if price is None else price
    return {"hours": hours, "cost": hours * hardware.chips * per_chip_hour}


def rows(args: argparse.Namespace) -> list[dict[str, str]]:
    table = []
    for spec in args.configs:
        experiment = common.load_experiment(spec, args.override)
        flops = update_flops(experiment, args.mean_length)
        steps = experiment.train.num_steps
        total = flops * steps
        for name in args.slices:
            hardware = SLICES[name]
            result = estimate(flops, steps, hardware, args.mfu, args.price_per_chip_hour)
            price = args.price_per_chip_hour or hardware.price_per_chip_hour
            table.append(
                {
                    "config": spec,
                    "steps": f"{steps:,}",
                    "TFLOP per update": f"{flops / 1e12:.2f}",
                    "total EFLOP": f"{total / 1e18:.2f}",
                    "slice": name,
                    "MFU": f"{args.mfu:.0%}",
                    "hours": f"{result['hours']:.2f}",
                    "USD": f"{result['cost']:,.0f} at ${price:.2f}/chip-h",
                }
            )
        variant = spec.rpartition("variant=")[2]
        if variant in PAPER_HOURS:
            implied = total / (PAPER_HOURS[variant] * 3600 * PAPER.chips * PAPER.peak_tflops * 1e12)
            table.append(
                {
                    "config": spec,
                    "steps": f"{steps:,}",
                    "TFLOP per update": f"{flops / 1e12:.2f}",
                    "total EFLOP": f"{total / 1e18:.2f}",
                    "slice": "8xP100 (paper)",
                    "MFU": f"{implied:.0%} implied",
                    "hours": f"{PAPER_HOURS[variant]:.0f} (§5.2)",
                    "USD": "",
                }
            )
    return table


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS))
    parser.add_argument("--override", action="append", default=[], help="section.key=value")
    parser.add_argument("--slices", nargs="+", choices=sorted(SLICES), default=list(SLICES))
    parser.add_argument("--mfu", type=float, default=0.3, help="useful-FLOPs utilisation")
    parser.add_argument(
        "--mean-length",
        type=float,
        default=28.0,
        help="tokens per sentence, both sides (WMT'14 En-De with 37k BPE: ≈28, assumed)",
    )
    parser.add_argument(
        "--price-per-chip-hour", type=float, default=None, help="USD; default: SLICES' figure"
    )
    parser.add_argument("--smoke", action="store_true", help="base on one slice only")
    args = parser.parse_args(argv)
    if not 0 < args.mfu <= 1 or args.mean_length <= 0:
        parser.error("--mfu must be in (0, 1] and --mean-length positive")
    if args.smoke:
        args.configs, args.slices = args.configs[:1], args.slices[:1]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    table = rows(args)
    print(common.markdown_table(table, list(table[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
