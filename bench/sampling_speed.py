"""Sampling speed: sentences/s of one sample per source sentence, for each truncation.

    python bench/sampling_speed.py --workdir runs/m30k/ema --json results.json
    python bench/sampling_speed.py --workdir runs/m30k --samplers topp0.9,eps0.02

The split's source sentences (data.test_split, or --split) are sampled through
`Translator` as `attnmt translate --sample` does: one untimed pass compiles every bucket
shape, then the best of --repeats timed passes is kept. Samplers: `plain` (temperature 1),
`topkK`, `toppP` (nucleus), `epsE` (epsilon sampling).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

import common

from attnmt.decode.translate import Translator


def sampler_settings(name: str) -> dict[str, Any]:
    """The decode keys of a sampler's name."""
    for prefix, key, kind in (
        ("topk", "top_k", int),
        ("topp", "top_p", float),
        ("eps", "epsilon", float),
    ):
        if name.startswith(prefix):
            return {key: kind(name[len(prefix) :])}
    if name == "plain":
        return {}
    raise SystemExit(f"unknown sampler {name!r}: plain, topkK, toppP, epsE")


def sample_split(workdir: str, split: str, samplers: list[str], repeats: int) -> list[dict]:
    from attnmt.data.prepare import load_split
    from attnmt.workdir import load_run

    run = load_run(workdir)
    data = run.experiment.data
    split = split or data.test_split
    sources = [src for src, _ in load_split(data, split, as_trained=False)]
    rows = []
    for name in samplers:
        decode = dataclasses.replace(run.experiment.decode, sample=True, **sampler_settings(name))
        translator = Translator.from_runs([run], decode)
        start = time.perf_counter()
        translator.translate(sources)  # compiles every bucket shape on the way
        first_pass = time.perf_counter() - start
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            translator.translate(sources)
            seconds.append(time.perf_counter() - start)
        best = min(seconds)
        rows.append(
            {
                "sampler": name,
                "sentences": len(sources),
                "first_pass_s": first_pass,
                "best_s": best,
                "sentences_per_s": len(sources) / best,
            }
        )
        print(common.markdown_table(rows[-1:], list(rows[-1])), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, help="a trained (or averaged) workdir")
    parser.add_argument("--split", default="", help="default: the run's data.test_split")
    parser.add_argument(
        "--samplers",
        type=common.str_list,
        default=["plain", "topk20", "topp0.9", "eps0.02"],
    )
    parser.add_argument("--repeats", type=int, default=2, help="timed passes (best is kept)")
    common.add_output_args(parser)
    args = parser.parse_args()
    info = common.machine_info()
    common.print_machine(info)
    common.warn_if_busy(info)
    rows = sample_split(args.workdir, args.split, args.samplers, args.repeats)
    print()
    print(common.markdown_table(rows, list(rows[0])))
    common.append_json(args.json, "sampling_speed", args, rows)


if __name__ == "__main__":
    main()
