"""`attnmt translate`, `attnmt evaluate` and `attnmt average`: using a trained run."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys

from attnmt.cli import parse
from attnmt.cli.arguments import (
    Overrides,
    add_decode_arguments,
    checkpoint_step,
    decode_config,
    decoded_tag,
    load_runs,
    storage_path,
)
from attnmt.config.decode import DecodeConfig
from attnmt.config.overrides import only_section
from attnmt.errors import ConfigError, DataError
from attnmt.storage import as_path


def add_command(commands: argparse._SubParsersAction) -> None:
    translate = commands.add_parser("translate", help="translate lines from stdin or --input")
    add_decode_arguments(translate)
    translate.add_argument("--input", default=None, help="default: stdin")
    translate.add_argument("--output", default=None, help="default: stdout")
    translate.add_argument(
        "--sample",
        action="store_const",
        const=True,
        default=None,
        help="sample each translation instead of searching (decode.sample)",
    )
    translate.add_argument("--temperature", type=float, default=None, help="for --sample")
    translate.add_argument("--top-k", type=int, default=None, help="for --sample; 0 = all")
    translate.add_argument(
        "--top-p", type=float, default=None, help="for --sample: nucleus mass, 1 = all"
    )
    translate.add_argument(
        "--epsilon",
        type=float,
        default=None,
        help="for --sample: drop tokens of probability below this (epsilon sampling), 0 = none",
    )
    translate.add_argument("--seed", type=int, default=None, help="for --sample")
    translate.add_argument(
        "--nbest",
        type=int,
        default=None,
        help="write the K best (1 ≤ K ≤ beam) per line: line, rank, score, log-prob, text",
    )
    translate.add_argument(
        "--scores", action="store_true", help="write the 1-best in the --nbest format (K = 1)"
    )
    translate.set_defaults(handler=run_translate)

    evaluate = commands.add_parser("evaluate", help="BLEU on a held-out split")
    add_decode_arguments(evaluate)
    evaluate.add_argument("--split", default=None, help="default: the config's test split")
    evaluate.set_defaults(handler=run_evaluate)
    _add_average_command(commands)


def _add_average_command(commands: argparse._SubParsersAction) -> None:
    average = commands.add_parser(
        "average",
        help="average the last K checkpoints (§6.1), or the N best; or write the moving average",
    )
    average.add_argument("--workdir", required=True, type=storage_path)
    which = average.add_mutually_exclusive_group()
    which.add_argument(
        "--last", type=int, default=None, help="default 5; paper: 5 (base), 20 (big)"
    )
    which.add_argument(
        "--ema",
        action="store_true",
        help="the moving average of the parameters (optim.ema_decay) of the newest "
        "checkpoint, or of --step's",
    )
    which.add_argument(
        "--best",
        type=int,
        default=None,
        help="the N best steps by validation (train.keep_best_by, train.keep_best_checkpoints)",
    )
    average.add_argument(
        "--output",
        type=storage_path,
        default=None,
        help="default <workdir>/average-last<K>, <workdir>/average-best<N> or <workdir>/ema",
    )
    average.add_argument(
        "--step",
        type=checkpoint_step,
        default=None,
        help="with --ema: the checkpoint step whose average to write, or best",
    )
    average.add_argument("--overwrite", action="store_true")
    average.set_defaults(handler=run_average)


def _join_job(args: argparse.Namespace) -> None:
    """Several processes decode together (every device of every process): each reads the
    same --input file; averaging would have them all write the same folder."""
    from attnmt.decode.sharded import join_job

    processes = join_job()
    if processes == 1:
        return
    for flag in ("average_last", "ema"):
        if getattr(args, flag, 0):
            raise ConfigError(
                f"--{flag.replace('_', '-')} with {processes} processes: run `attnmt average` "
                "first (one process), then decode the folder it writes"
            )
    if args.command == "translate" and not args.input:
        raise ConfigError(
            f"--input is needed when {processes} processes translate (each reads the file)"
        )


def run_translate(args: argparse.Namespace, overrides: Overrides) -> int:
    from attnmt.decode.translate import Translator

    _join_job(args)
    runs = load_runs(args)
    decode = decode_config(runs[0], args, overrides)
    translator = Translator.from_runs(runs, decode, nbest=_nbest(args, decode))
    try:
        _translate_files(translator, args)
    except OSError as error:  # a missing input, an unwritable output
        raise DataError(f"{error.filename}: {error.strerror}") from None
    return 0


def _nbest(args: argparse.Namespace, decode: DecodeConfig) -> int:
    """Hypotheses per line to write with scores: --nbest K, --scores 1, else 0 (text only)."""
    if args.nbest is None:
        return 1 if args.scores else 0
    if decode.sample and args.nbest != 1:
        raise ConfigError(f"--nbest {args.nbest}: a sample is one hypothesis; use --nbest 1")
    if not 1 <= args.nbest <= decode.beam_size:
        raise ConfigError(
            f"--nbest {args.nbest} must be between 1 and the beam size {decode.beam_size} "
            "(--beam, decode.beam_size)"
        )
    return args.nbest


def _translate_files(translator, args: argparse.Namespace) -> None:
    with contextlib.ExitStack() as files:
        # Undecodable bytes become U+FFFD instead of stopping the stream mid-file, and only
        # "\n" ends a line (as in training data): universal newlines would split a line at
        # a lone "\r" and shift every later translation by one.
        # Files are opened as bytes through etils (local or in a bucket; its text mode takes
        # no errors= or newline=) and decoded here.
        raw_in = (
            files.enter_context(as_path(args.input, "--input").open("rb")) if args.input else None
        )
        source = files.enter_context(
            io.TextIOWrapper(
                raw_in or sys.stdin.buffer, encoding="utf-8", errors="replace", newline="\n"
            )
        )
        target = files.enter_context(_output(args))
        translator.translate_stream(source, target)


def _output(args: argparse.Namespace) -> io.TextIOWrapper:
    """--output (or stdout) on process 0; nowhere on the others, which decode their rows
    of every batch but write nothing."""
    from attnmt.decode.sharded import writes_outputs

    if not writes_outputs():
        return open(os.devnull, "w", encoding="utf-8")  # the caller closes it
    raw = as_path(args.output, "--output").open("wb") if args.output else None
    return io.TextIOWrapper(raw or sys.stdout.buffer, encoding="utf-8", write_through=True)


def run_evaluate(args: argparse.Namespace, overrides: Overrides) -> int:
    _join_job(args)
    runs = load_runs(args)
    split = args.split or runs[0].experiment.data.test_split
    if split == "test":
        split = runs[0].experiment.data.test_split
    if runs[0].experiment.data.source == "treebank":
        return parse.evaluate_parsing(args, overrides, split)
    # Averaged and ensembled decodes get their own file and TensorBoard series, so they do
    # not overwrite the plain checkpoint's results of the same step.
    tag = decoded_tag(args)
    score_and_log(runs, split, decode_config(runs[0], args, overrides), args.workdir, tag)
    return 0


def score_and_log(runs: list, split: str, decode: DecodeConfig, workdir: str, tag: str) -> None:
    """Decodes and scores `split`, prints the scores, logs them to TensorBoard. Every
    process of a job decodes; process 0 alone writes and prints."""
    from attnmt.decode.evaluation import evaluate_split
    from attnmt.decode.sharded import writes_outputs
    from attnmt.metrics import MetricsSink

    path = as_path(workdir, "--workdir")
    scores = evaluate_split(runs, split, decode, path / "decodes", tag)
    if writes_outputs():
        print(scores.format(), flush=True)
    sink = MetricsSink(path, enabled=writes_outputs())
    sink.write(f"bleu_{split}{tag.replace('-', '_')}", runs[0].step, scores.scalars())
    sink.close()


def run_average(args: argparse.Namespace, overrides: Overrides) -> int:
    from attnmt.checkpoint.average import average_checkpoints

    only_section("average", overrides, None)
    if args.ema:
        from attnmt.checkpoint.average import ema_checkpoint

        result = ema_checkpoint(args.workdir, args.output, overwrite=args.overwrite, step=args.step)
        print(f"wrote the moving average of step {result.step} into {result.output_dir}")
        return 0
    if args.step is not None:
        raise ConfigError("--step goes with --ema (--last and --best choose their own steps)")
    # --last 5 unless --best or --ema is given (argparse keeps them exclusive).
    last = 5 if args.last is None and args.best is None else args.last or 0
    result = average_checkpoints(
        args.workdir, last, args.output, overwrite=args.overwrite, best=args.best or 0
    )
    print(f"averaged steps {list(result.steps)} into {result.output_dir} (step {result.step})")
    return 0
