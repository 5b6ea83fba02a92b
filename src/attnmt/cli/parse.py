"""`attnmt parse` (one bracketed tree per input line) and F1 for `attnmt evaluate` on a
parsing run (data.source == "treebank")."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from attnmt.cli.main import _add_decode_arguments, _decode_config, _load_runs
from attnmt.errors import ConfigError, DataError
from attnmt.storage import as_path


def add_parse_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "parse", help="constituency trees for tokenized sentences (a parsing run, §6.3)"
    )
    _add_decode_arguments(parser)
    parser.add_argument("--input", default=None, help="one tokenized sentence per line (stdin)")
    parser.add_argument("--output", default=None, help="one bracketed tree per line (stdout)")
    parser.set_defaults(handler=run_parse)


def _parsing_run(args: argparse.Namespace):
    if args.ensemble:
        raise ConfigError(
            f"attnmt {args.command} on a parsing run takes one model: drop --ensemble"
        )
    run = _load_runs(args)[0]
    if run.experiment.data.source != "treebank":
        raise ConfigError(
            f"{args.workdir} was trained on data.source={run.experiment.data.source!r}, not a "
            "treebank: use attnmt translate"
        )
    return run


def run_parse(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    from attnmt.decode.parsing import bracketed_lines, parse_sentences, parsing_translator

    run = _parsing_run(args)
    translator = parsing_translator(run, _decode_config(run, args, overrides))
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
    if args.output:
        as_path(args.output, "--output").write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def evaluate_parsing(args: argparse.Namespace, overrides: Sequence[str], split: str) -> int:
    from attnmt.decode.parsing import evaluate_parse_split
    from attnmt.train.metrics import MetricsSink

    run = _parsing_run(args)
    decode = _decode_config(run, args, overrides)
    scores = evaluate_parse_split(
        run, split, decode, as_path(args.workdir, "--workdir") / "decodes"
    )
    print(scores.format())
    sink = MetricsSink(args.workdir)
    sink.write(f"parse_{split}", run.step, scores.scalars())
    sink.close()
    return 0
