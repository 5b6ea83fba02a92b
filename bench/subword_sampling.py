"""BPE-dropout's cost (data.subword_dropout): seconds to segment one training epoch of
Multi30K anew, against tokenizing it once with sentencepiece, and how much longer the
sampled segmentations are.

    python bench/subword_sampling.py --json results.json
    python bench/subword_sampling.py --dropouts 0.05,0.1,0.2 --epochs 3
    python bench/subword_sampling.py --smoke

The vocabulary is the recipe's (configs/multi30k.py, 6,000 joint BPE pieces), trained
into --data-workdir (a temporary folder by default). Everything runs on the calling
thread, as a training run segments each epoch on its input thread.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import common
import numpy as np


def _mean_lengths(corpus) -> tuple[float, float]:
    return float(np.mean(corpus.src_lengths)), float(np.mean(corpus.tgt_lengths))


def measure(
    dropouts: list[float], epochs: int, pairs_limit: int, data_dir: str | None, workdir: str | None
) -> list[dict]:
    from attnmt.data.pipeline import TokenizedCorpus
    from attnmt.data.prepare import ensure_vocab, load_split
    from attnmt.data.subword_sampling import EpochCorpora

    experiment = common.load_experiment("configs/multi30k.py")
    data = dataclasses.replace(experiment.data, data_dir=data_dir or experiment.data.data_dir)
    folder = Path(workdir or tempfile.mkdtemp(prefix="attnmt-bench-"))
    tokenizer = ensure_vocab(data, experiment.model.vocab_size, folder)
    pairs = load_split(data, data.train_split)[: pairs_limit or None]
    single = tokenizer.single_threaded()
    start = time.perf_counter()
    standard, _ = TokenizedCorpus.from_pairs(pairs, single, data.max_length)
    rows = [
        {
            "segmentation": "sentencepiece, once (1 thread)",
            "pairs": len(standard),
            "s_per_epoch": time.perf_counter() - start,
            "src_tokens": _mean_lengths(standard)[0],
            "tgt_tokens": _mean_lengths(standard)[1],
        }
    ]
    for dropout in dropouts:
        corpora = EpochCorpora(pairs, single, data.max_length, dropout, seed=0)
        seconds = []
        for epoch in range(epochs):
            start = time.perf_counter()
            corpus = corpora(epoch)
            seconds.append(time.perf_counter() - start)
        src, tgt = _mean_lengths(corpus)
        rows.append(
            {
                "segmentation": f"BPE-dropout {dropout:g}, each epoch",
                "pairs": len(corpus),
                "s_per_epoch": float(np.median(seconds)),
                "src_tokens": src,
                "tgt_tokens": tgt,
            }
        )
    return rows


COLUMNS = ["segmentation", "pairs", "s_per_epoch", "src_tokens", "tgt_tokens"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dropouts", type=common.float_list, default=[0.05, 0.1])
    parser.add_argument("--epochs", type=int, default=3, help="epochs timed (median)")
    parser.add_argument("--pairs", type=int, default=0, help="first N training pairs (0: all)")
    parser.add_argument("--data-dir", default=common.default_multi30k_dir())
    parser.add_argument("--data-workdir", default=None, help="keep the vocabulary here")
    common.add_output_args(parser)
    args = parser.parse_args()
    if args.smoke:
        args.dropouts, args.epochs, args.pairs = [0.1], 1, 500
    if not args.data_dir:
        raise SystemExit("Multi30K not found: set $ATTNMT_MULTI30K_DIR or pass --data-dir")
    info = common.machine_info()
    common.print_machine(info)
    common.warn_if_busy(info)
    rows = measure(args.dropouts, args.epochs, args.pairs, args.data_dir, args.data_workdir)
    print(common.markdown_table(rows, COLUMNS))
    common.append_json(args.json, "subword_sampling", args, rows)


if __name__ == "__main__":
    main()
