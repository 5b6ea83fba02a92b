"""`attnmt train`, `attnmt params` and `attnmt vocab`: the commands that read a config file.

Training code is imported inside `train` alone, so the other commands never load it.
"""

from __future__ import annotations

import argparse

from attnmt.cli.arguments import Overrides, add_config_argument, experiment, storage_path
from attnmt.cli.translate import score_and_log
from attnmt.errors import DataError


def add_command(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser("train", help="train, or resume the run in --workdir")
    add_config_argument(train)
    train.add_argument(
        "--workdir", required=True, type=storage_path, help="checkpoints, logs, vocabulary"
    )
    train.set_defaults(handler=run_train)

    params = commands.add_parser("params", help="parameter count with a per-module breakdown")
    add_config_argument(params)
    params.add_argument("--depth", type=int, default=2, help="module nesting depth shown")
    params.add_argument(
        "--table3", action="store_true", help="count every Table-3 variant of the config file"
    )
    params.set_defaults(handler=run_params)

    vocab = commands.add_parser("vocab", help="train the shared sentencepiece vocabulary")
    add_config_argument(vocab)
    vocab.add_argument("--workdir", required=True, type=storage_path)
    vocab.set_defaults(handler=run_vocab)


def run_train(args: argparse.Namespace, overrides: Overrides) -> int:
    chosen = experiment(args, overrides)
    from attnmt.parallel.backend import check_backend
    from attnmt.parallel.distributed import initialize
    from attnmt.train.assemble import train
    from attnmt.train.compile_cache import enable as enable_compilation_cache

    accelerator = chosen.parallel.accelerator
    initialize(accelerator=accelerator)  # joins a multi-process job described by the environment
    check_backend(accelerator)  # logs the backend and devices; stops on the wrong one
    enable_compilation_cache(chosen, args.workdir)  # before the first compile of a step

    result = train(chosen, args.workdir)
    print(f"stopped at step {result.step}: {result.stopped_because}", flush=True)
    if result.exit_code == 0 and chosen.train.test_at_end:
        _score_test_split(args.workdir)
    return result.exit_code  # 143 after SIGTERM: a scheduler should restart (and resume) it


def _score_test_split(workdir: str) -> None:
    """What the run achieved: its newest checkpoint's BLEU on the test split, as
    `attnmt evaluate --split test` prints it (train.test_at_end), or with optim.ema_decay
    its moving average's (`--ema`). Every process of the job
    decodes its rows of each batch; process 0 prints and writes."""
    from attnmt.decode.sharded import writes_outputs
    from attnmt.storage import as_path
    from attnmt.workdir import load_experiment, load_run

    experiment = load_experiment(workdir)  # the config alone: which params to load follows
    data = experiment.data
    if not data.test_split or data.source == "treebank":
        return
    scored, tag = workdir, ""
    if experiment.optim.ema_decay > 0:  # the average is what the run is for
        from jax.experimental import multihost_utils

        from attnmt.checkpoint.average import ema_checkpoint

        if writes_outputs():  # one writer; every process then loads what it wrote
            ema_checkpoint(workdir, overwrite=True)
        multihost_utils.sync_global_devices("attnmt moving average written")
        scored, tag = as_path(workdir, "--workdir") / "ema", "-ema"
    run = load_run(scored)
    try:
        score_and_log([run], data.test_split, run.experiment.decode, workdir, tag)
    except DataError as error:  # e.g. a corpus of files with no test split
        if writes_outputs():
            print(f"no test BLEU: {error}")


def run_params(args: argparse.Namespace, overrides: Overrides) -> int:
    from attnmt.model.param_count import count_parameters, format_breakdown

    if args.table3:
        return _print_table3(args, overrides)
    counts = count_parameters(experiment(args, overrides).model)
    print(format_breakdown(counts, depth=args.depth))
    return 0


def _print_table3(args: argparse.Namespace, overrides: Overrides) -> int:
    """Markdown table: every variant of the config file, the paper's count and ours."""
    from attnmt.config.variants import TABLE3, TABLE3_PAPER_PARAMS_M
    from attnmt.model.param_count import count_parameters

    path = args.config.partition(":")[0]
    print("| variant | paper (M) | attnmt | attnmt (M) |")
    print("|---|---|---|---|")
    for name in ["base", *TABLE3, "big"]:
        variant_args = argparse.Namespace(config=f"{path}:variant={name}")
        total = count_parameters(experiment(variant_args, overrides).model)["total"]
        paper = TABLE3_PAPER_PARAMS_M.get(name)
        paper_text = f"{paper:g}" if paper is not None else "—"
        print(f"| {name} | {paper_text} | {total:,} | {total / 1e6:.1f} |")
    return 0


def run_vocab(args: argparse.Namespace, overrides: Overrides) -> int:
    chosen = experiment(args, overrides)
    from attnmt.data.prepare import ensure_vocab, vocab_path
    from attnmt.storage import as_path

    workdir = as_path(args.workdir, "--workdir")
    tokenizer = ensure_vocab(chosen.data, chosen.model.vocab_size, workdir)
    path = vocab_path(chosen.data, workdir)
    print(f"vocabulary of {tokenizer.vocab_size} tokens at {path}")
    return 0
