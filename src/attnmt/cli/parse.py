"""`attnmt parse` (one bracketed tree per input line) and F1 for `attnmt evaluate` on a
parsing run (data.source == "treebank")."""

from __future__ import annotations

import argparse
import sys

from attnmt.cli.arguments import (
    Overrides,
    add_decode_arguments,
    decode_config,
    decoded_tag,
    load_runs,
)
from attnmt.errors import ConfigError, DataError
from attnmt.storage import as_path


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "parse", help="constituency trees for tokenized sentences (a parsing run, §6.3)"
    )
    add_decode_arguments(parser)
    parser.add_argument("--input", default=None, help="one tokenized sentence per line (stdin)")
    parser.add_argument("--output", default=None, help="one bracketed tree per line (stdout)")
    parser.set_defaults(handler=run_parse)


def _parsing_run(args: argparse.Namespace):
    from attnmt.decode.sharded import join_job

    processes = join_job()  # several processes parse together, on all their devices
    if processes > 1 and (args.average_last or args.ema):
        flag = "--average-last" if args.average_last else "--ema"
        raise ConfigError(f"{flag} with {processes} processes: run `attnmt average` first")
    if processes > 1 and args.command == "parse" and not args.input:
        raise ConfigError(f"--input is needed when {processes} processes parse (each reads it)")
    if args.ensemble:
        raise ConfigError(
            f"attnmt {args.command} on a parsing run takes one model: drop --ensemble"
        )
    run = load_runs(args)[0]
    if run.experiment.data.source != "treebank":
        raise ConfigError(
            f"{args.workdir} was trained on data.source={run.experiment.data.source!r}, not a "
            "treebank: use attnmt translate"
        )
    return run


def run_parse(args: argparse.Namespace, overrides: Overrides) -> int:
    from attnmt.decode.parsing import bracketed_lines, parse_sentences, parsing_translator
    from attnmt.decode.sharded import writes_outputs

    run = _parsing_run(args)
    translator = parsing_translator(run, decode_config(run, args, overrides))
    try:
        source = (
            as_path(args.input, "--input").read_bytes() if args.input else sys.stdin.buffer.read()
        )
    except OSError as error:
        raise DataError(f"--input {args.input}: {error.strerror}") from None
    # As for translate: undecodable bytes become U+FFFD and only "\n" ends a line.
    lines = source.decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    data = run.experiment.data
    trees = parse_sentences(translator, lines, data.treebank_pos, data.treebank_leaves)
    text = "".join(line + "\n" for line in bracketed_lines(trees))
    if not writes_outputs():
        return 0
    if args.output:
        as_path(args.output, "--output").write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def evaluate_parsing(args: argparse.Namespace, overrides: Overrides, split: str) -> int:
    from attnmt.decode.parsing import evaluate_parse_split
    from attnmt.decode.sharded import writes_outputs
    from attnmt.metrics import MetricsSink

    run = _parsing_run(args)
    decode = decode_config(run, args, overrides)
    workdir = as_path(args.workdir, "--workdir")
    tag = decoded_tag(args)
    scores = evaluate_parse_split(run, split, decode, workdir / "decodes", tag)
    if writes_outputs():
        print(scores.format())
    sink = MetricsSink(workdir, enabled=writes_outputs())
    sink.write(f"parse_{split}{tag.replace('-', '_')}", run.step, scores.scalars())
    sink.close()
    return 0
