"""The `attnmt` command: reads flags and hands them to one subcommand module, each of
which adds its parsers (`add_command`) and calls the library."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from attnmt.cli import attention, interop, parse, report, train, translate
from attnmt.config.overrides import split_overrides
from attnmt.errors import UserError

COMMAND_MODULES = (train, translate, attention, parse, interop, report)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnmt",
        description="Train and use the Transformer of 'Attention Is All You Need'. Any config "
        "key can be overridden with --config.section.key=value.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.add_command(commands)
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
        rest, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    except UserError as error:
        print(f"attnmt: error: {error}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(rest)
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
