"""The `attnmt` command: thin wrappers that read flags and call the library."""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
from collections.abc import Sequence

from attnmt.errors import ConfigError, DataError, UserError
from attnmt.overrides import OVERRIDE_PREFIX, split_overrides


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        required=True,
        help="config file, optionally with an argument: configs/wmt14_ende.py:variant=big",
    )


def _experiment(args: argparse.Namespace, overrides: Sequence[str]):
    from attnmt.cli.config_file import apply_command_line_overrides, load_config_file
    from attnmt.experiment import Experiment

    config = load_config_file(args.config)
    apply_command_line_overrides(config, overrides)
    return Experiment.from_mapping(config)


def _cmd_train(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    experiment = _experiment(args, overrides)
    from attnmt.parallel.distributed import initialize
    from attnmt.train.assemble import train

    initialize()  # joins a multi-process job described by the environment, if any

    result = train(experiment, args.workdir)
    print(f"stopped at step {result.step}: {result.stopped_because}", flush=True)
    if result.exit_code == 0 and experiment.train.test_at_end:
        _score_test_split(args.workdir)
    return result.exit_code  # 143 after SIGTERM: a scheduler should restart (and resume) it


def _score_test_split(workdir: str) -> None:
    """What the run achieved: its newest checkpoint's BLEU on the test split, as
    `attnmt evaluate --split test` prints it (train.test_at_end)."""
    import jax

    from attnmt.workdir import load_run

    if jax.process_count() > 1:
        print("test BLEU: run `attnmt evaluate --workdir ... --split test` (one process)")
        return
    run = load_run(workdir)
    data = run.experiment.data
    if not data.test_split or data.source == "treebank":
        return
    try:
        _score_and_log([run], data.test_split, run.experiment.decode, workdir, "")
    except DataError as error:  # e.g. a corpus of files with no test split
        print(f"no test BLEU: {error}")


def _cmd_params(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    from attnmt.model.param_count import count_parameters, format_breakdown

    if args.table3:
        return _print_table3(args, overrides)
    experiment = _experiment(args, overrides)
    counts = count_parameters(experiment.model)
    print(format_breakdown(counts, depth=args.depth))
    return 0


def _print_table3(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    """Markdown table: every variant of the config file, the paper's count and ours."""
    from attnmt.model.param_count import count_parameters
    from attnmt.variants import TABLE3, TABLE3_PAPER_PARAMS_M

    path = args.config.partition(":")[0]
    print("| variant | paper (M) | attnmt | attnmt (M) |")
    print("|---|---|---|---|")
    for name in ["base", *TABLE3, "big"]:
        variant_args = argparse.Namespace(config=f"{path}:variant={name}")
        total = count_parameters(_experiment(variant_args, overrides).model)["total"]
        paper = TABLE3_PAPER_PARAMS_M.get(name)
        paper_text = f"{paper:g}" if paper is not None else "—"
        print(f"| {name} | {paper_text} | {total:,} | {total / 1e6:.1f} |")
    return 0


def _cmd_vocab(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    experiment = _experiment(args, overrides)
    from attnmt.data.prepare import ensure_vocab, vocab_path

    tokenizer = ensure_vocab(experiment.data, experiment.model.vocab_size, args.workdir)
    path = vocab_path(experiment.data, args.workdir)
    print(f"vocabulary of {tokenizer.vocab_size} tokens at {path}")
    return 0


def _decode_config(run, args: argparse.Namespace, overrides: Sequence[str]):
    """The run's decode section, then `--config.decode.*` overrides, then the flags."""
    import dataclasses

    import ml_collections

    from attnmt.cli.config_file import apply_command_line_overrides
    from attnmt.config_types import from_mapping
    from attnmt.decode.config import DecodeConfig

    only_section_overrides(args.command, overrides, "decode")
    config = ml_collections.ConfigDict({"decode": dataclasses.asdict(run.experiment.decode)})
    apply_command_line_overrides(config, overrides)
    values = config.decode.to_dict()
    flags = (
        ("beam_size", args.beam),
        ("alpha", args.alpha),
        ("max_len_offset", args.max_len_offset),
        ("batch_sentences", args.batch_sentences),
        ("xla_backend_optimization_level", args.xla_opt_level),
        ("sample", getattr(args, "sample", None)),
        ("temperature", getattr(args, "temperature", None)),
        ("top_k", getattr(args, "top_k", None)),
        ("seed", getattr(args, "seed", None)),
    )
    values.update({key: value for key, value in flags if value is not None})
    return from_mapping(DecodeConfig, values, "decode")


def only_section_overrides(command: str, overrides: Sequence[str], section: str | None) -> None:
    """Refuses `--config.*` overrides a command would otherwise ignore, naming the key."""
    for item in overrides:
        key = item.removeprefix("--config.").partition("=")[0]
        if section is None or not key.startswith(f"{section}."):
            what = f"only --config.{section}.* overrides" if section else "no --config overrides"
            raise ConfigError(
                f"attnmt {command} takes {what}, got --config.{key} (the rest of the "
                "config is the trained run's own)"
            )


def _load_runs(args: argparse.Namespace) -> list:
    from attnmt.workdir import load_run

    workdir = args.workdir
    if getattr(args, "average_last", 0):
        from attnmt.checkpoint.average import average_checkpoints

        result = average_checkpoints(args.workdir, args.average_last, overwrite=True)
        print(f"averaged steps {list(result.steps)} into {result.output_dir}", file=sys.stderr)
        workdir = result.output_dir
    runs = [load_run(workdir, args.step)]
    runs += [load_run(other) for other in args.ensemble]
    return runs


def _cmd_translate(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    from attnmt.decode.translate import Translator

    runs = _load_runs(args)
    translator = Translator(
        [run.experiment.model for run in runs],
        [run.params for run in runs],
        runs[0].tokenizer,
        _decode_config(runs[0], args, overrides),
    )
    try:
        _translate_files(translator, args)
    except OSError as error:  # a missing input, an unwritable output
        raise DataError(f"{error.filename}: {error.strerror}") from None
    return 0


def _translate_files(translator, args: argparse.Namespace) -> None:
    with contextlib.ExitStack() as files:
        # Undecodable bytes become U+FFFD instead of stopping the stream mid-file, and only
        # "\n" ends a line (as in training data): universal newlines would split a line at
        # a lone "\r" and shift every later translation by one.
        # Files are opened as bytes through etils (local or in a bucket; its text mode takes
        # no errors= or newline=) and decoded here.
        raw_in = (
            files.enter_context(_path(args.input, "--input").open("rb")) if args.input else None
        )
        source = files.enter_context(
            io.TextIOWrapper(
                raw_in or sys.stdin.buffer, encoding="utf-8", errors="replace", newline="\n"
            )
        )
        raw_out = (
            files.enter_context(_path(args.output, "--output").open("wb")) if args.output else None
        )
        target = files.enter_context(
            io.TextIOWrapper(raw_out or sys.stdout.buffer, encoding="utf-8", write_through=True)
        )
        translator.translate_stream(source, target)


def _path(value: str, flag: str):
    from attnmt.storage import as_path

    return as_path(value, flag)


def _cmd_evaluate(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    runs = _load_runs(args)
    split = args.split or runs[0].experiment.data.test_split
    if split == "test":
        split = runs[0].experiment.data.test_split
    if runs[0].experiment.data.source == "treebank":
        from attnmt.cli.parse import evaluate_parsing

        return evaluate_parsing(args, overrides, split)
    # Averaged and ensembled decodes get their own file and TensorBoard series, so they do
    # not overwrite the plain checkpoint's results of the same step.
    tag = f"-avg{args.average_last}" if args.average_last else ""
    tag += "-ensemble" if args.ensemble else ""
    _score_and_log(runs, split, _decode_config(runs[0], args, overrides), args.workdir, tag)
    return 0


def _score_and_log(runs: list, split: str, decode, workdir: str, tag: str) -> None:
    """Decodes and scores `split`, prints the scores, logs them to TensorBoard."""
    from attnmt.decode.evaluation import evaluate_split
    from attnmt.train.metrics import MetricsSink

    scores = evaluate_split(runs, split, decode, _path(workdir, "--workdir") / "decodes", tag)
    print(scores.format(), flush=True)
    sink = MetricsSink(workdir)
    sink.write(f"bleu_{split}{tag.replace('-', '_')}", runs[0].step, scores.scalars())
    sink.close()


def _cmd_average(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    from attnmt.checkpoint.average import average_checkpoints

    only_section_overrides("average", overrides, None)

    result = average_checkpoints(args.workdir, args.last, args.output, overwrite=args.overwrite)
    print(f"averaged steps {list(result.steps)} into {result.output_dir} (step {result.step})")
    return 0


def _cmd_report(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    from attnmt import report as report_module

    only_section_overrides("report", overrides, None)
    return report_module.run(args)


def local_path(value: str) -> str:
    """argparse type: a local folder only (`attnmt import` / `export` write and read plain
    files with Hugging Face's and CTranslate2's own code; copy to a bucket afterwards)."""
    from attnmt.storage import local_only

    try:
        return local_only(value, "this command's --workdir")
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def storage_path(value: str) -> str:
    """argparse type: a local path or a bucket URL (`gs://b/run`, any etils.epath URL).

    Checked before anything is written: an unknown scheme, a missing filesystem package or
    a URL that lost a slash is refused, never turned into a local folder named `gs:`.
    """
    from attnmt.storage import as_path

    try:
        as_path(value, "path")
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("path ")) from None
    return value


def _add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workdir", required=True, type=storage_path, help="a training (or averaged) workdir"
    )
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default newest)")
    parser.add_argument("--average-last", type=int, default=0, help="average the last K first")
    parser.add_argument(
        "--ensemble", nargs="*", type=storage_path, default=[], help="more workdirs to ensemble"
    )
    parser.add_argument("--beam", type=int, default=None, help="beam size (1 = greedy)")
    parser.add_argument("--alpha", type=float, default=None, help="length penalty α")
    parser.add_argument("--max-len-offset", type=int, default=None)
    parser.add_argument("--batch-sentences", type=int, default=None)
    parser.add_argument(
        "--xla-opt-level",
        type=int,
        default=None,
        help="XLA backend optimisation level 0-3 of the search (lower compiles faster)",
    )


def _add_translate_command(commands: argparse._SubParsersAction) -> None:
    translate = commands.add_parser("translate", help="translate lines from stdin or --input")
    _add_decode_arguments(translate)
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
    translate.add_argument("--seed", type=int, default=None, help="for --sample")
    translate.set_defaults(handler=_cmd_translate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnmt",
        description="Train and use the Transformer of 'Attention Is All You Need'. Any config "
        "key can be overridden with --config.section.key=value.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train, or resume the run in --workdir")
    _add_config_arguments(train)
    train.add_argument(
        "--workdir", required=True, type=storage_path, help="checkpoints, logs, vocabulary"
    )
    train.set_defaults(handler=_cmd_train)

    params = commands.add_parser("params", help="parameter count with a per-module breakdown")
    _add_config_arguments(params)
    params.add_argument("--depth", type=int, default=2, help="module nesting depth shown")
    params.add_argument(
        "--table3", action="store_true", help="count every Table-3 variant of the config file"
    )
    params.set_defaults(handler=_cmd_params)

    vocab = commands.add_parser("vocab", help="train the shared sentencepiece vocabulary")
    _add_config_arguments(vocab)
    vocab.add_argument("--workdir", required=True, type=storage_path)
    vocab.set_defaults(handler=_cmd_vocab)

    average = commands.add_parser("average", help="average the last K checkpoints (§6.1)")
    average.add_argument("--workdir", required=True, type=storage_path)
    average.add_argument("--last", type=int, default=5, help="paper: 5 (base), 20 (big)")
    average.add_argument(
        "--output", type=storage_path, default=None, help="default <workdir>/average-last<K>"
    )
    average.add_argument("--overwrite", action="store_true")
    average.set_defaults(handler=_cmd_average)

    _add_translate_command(commands)
    from attnmt.cli.attention import add_attention_command
    from attnmt.cli.parse import add_parse_command

    add_attention_command(commands)
    add_parse_command(commands)
    from attnmt.cli.interop import add_interop_commands

    add_interop_commands(commands, local_path)

    evaluate = commands.add_parser("evaluate", help="BLEU on a held-out split")
    _add_decode_arguments(evaluate)
    evaluate.add_argument("--split", default=None, help="default: the config's test split")
    evaluate.set_defaults(handler=_cmd_evaluate)

    from attnmt import report as report_module

    report = commands.add_parser("report", help="a Table-3-like table of runs under a folder")
    report_module.add_arguments(report)
    report.set_defaults(handler=_cmd_report)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("absl", "jax._src.xla_bridge", "orbax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        rest, parsed = split_overrides(sys.argv[1:] if argv is None else argv)
    except UserError as error:
        print(f"attnmt: error: {error}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(rest)
    overrides = [f"{OVERRIDE_PREFIX}{key}={value}" for key, value in parsed.items()]
    try:
        return args.handler(args, overrides)
    except UserError as error:
        print(f"attnmt {args.command}: error: {error}", file=sys.stderr)
        return 2
    except FloatingPointError as error:
        print(f"attnmt {args.command}: stopped: {error}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
