"""What several `attnmt` commands share: argument types, the `--config` flag, the flags of
commands that decode a trained run, and turning those flags into runs and a decode section.

Imports nothing of training: the decoding commands load only what inference needs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Mapping
from typing import Any

import ml_collections

from attnmt.config import Experiment, load_experiment
from attnmt.config.decode import DecodeConfig
from attnmt.config.overrides import apply_overrides, only_section
from attnmt.config.typed import from_mapping
from attnmt.errors import ConfigError
from attnmt.storage import as_path, local_only

Overrides = Mapping[str, str]  # dotted key → its command-line text


def storage_path(value: str) -> str:
    """argparse type: a local path or a bucket URL (`gs://b/run`, any etils.epath URL).

    Checked before anything is written: an unknown scheme, a missing filesystem package or
    a URL that lost a slash is refused, never turned into a local folder named `gs:`.
    """
    try:
        as_path(value, "path")
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("path ")) from None
    return value


def local_path(what: str):
    """argparse type: a local path only, `what` naming it in the refusal (Hugging Face's
    and CTranslate2's own code read and write plain files; copy to a bucket separately)."""

    def check(value: str) -> str:
        try:
            return local_only(value, what)
        except ConfigError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return check


def checkpoint_step(text: str) -> int | str:
    """argparse type: a step number, or "best" (the step train.keep_best_by kept)."""
    if text == "best":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a step number or 'best', got {text!r}") from None


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        required=True,
        help="config file, optionally with an argument: configs/wmt14_ende.py:variant=big",
    )


def experiment(args: argparse.Namespace, overrides: Overrides) -> Experiment:
    """The command's `--config` file with its `--config.*` overrides, checked."""
    return load_experiment(args.config, overrides)


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of every command that decodes a trained run."""
    parser.add_argument(
        "--workdir", required=True, type=storage_path, help="a training (or averaged) workdir"
    )
    parser.add_argument(
        "--step",
        type=checkpoint_step,
        default=None,
        help="checkpoint step, or best (kept by train.keep_best_by); default the newest",
    )
    averaged = parser.add_mutually_exclusive_group()
    averaged.add_argument("--average-last", type=int, default=0, help="average the last K first")
    averaged.add_argument(
        "--average-best", type=int, default=0, help="average the N best first (attnmt average)"
    )
    averaged.add_argument(
        "--ema",
        action="store_true",
        help="decode the moving average of the parameters (optim.ema_decay) of the newest "
        "checkpoint, or of --step's; with --ensemble, every member's (of its newest)",
    )
    parser.add_argument(
        "--ensemble", nargs="*", type=storage_path, default=[], help="more workdirs to ensemble"
    )
    parser.add_argument("--beam", type=int, default=None, help="beam size (1 = greedy)")
    parser.add_argument("--alpha", type=float, default=None, help="length penalty α")
    parser.add_argument("--coverage", type=float, default=None, help="coverage penalty β")
    parser.add_argument(
        "--mbr",
        choices=("bleu", "chrf"),
        default=None,
        help="return the beam's minimum-Bayes-risk hypothesis under this sentence metric "
        "(decode.mbr; weights: decode.mbr_weights)",
    )
    parser.add_argument(
        "--mbr-samples",
        type=int,
        default=None,
        help="with --mbr, weigh the beam's hypotheses against this many samples per input "
        "too (decode.mbr_samples; how they are drawn: decode.epsilon, top_p, seed)",
    )
    parser.add_argument("--max-len-offset", type=int, default=None)
    parser.add_argument("--batch-sentences", type=int, default=None)
    parser.add_argument(
        "--xla-opt-level",
        type=int,
        default=None,
        help="XLA backend optimisation level 0-3 of the search (lower compiles faster)",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="compute dtype to decode in (decode.dtype; default: the model's own)",
    )


_DECODE_FLAGS = (  # decode key ← argparse destination
    ("beam_size", "beam"),
    ("alpha", "alpha"),
    ("coverage_penalty", "coverage"),
    ("max_len_offset", "max_len_offset"),
    ("batch_sentences", "batch_sentences"),
    ("xla_backend_optimization_level", "xla_opt_level"),
    ("sample", "sample"),
    ("temperature", "temperature"),
    ("top_k", "top_k"),
    ("top_p", "top_p"),
    ("epsilon", "epsilon"),
    ("dtype", "dtype"),
    ("seed", "seed"),
    ("mbr", "mbr"),
    ("mbr_samples", "mbr_samples"),
)


def decode_config(run: Any, args: argparse.Namespace, overrides: Overrides) -> DecodeConfig:
    """The run's decode section, then `--config.decode.*` overrides, then the flags (the
    last steps of the order in attnmt/config/__init__.py)."""
    only_section(args.command, overrides, "decode")
    config = ml_collections.ConfigDict({"decode": dataclasses.asdict(run.experiment.decode)})
    apply_overrides(config, overrides)
    values = config.decode.to_dict()
    for key, flag in _DECODE_FLAGS:
        if getattr(args, flag, None) is not None:
            values[key] = getattr(args, flag)
    return from_mapping(DecodeConfig, values, "decode")


def decoded_tag(args: argparse.Namespace) -> str:
    """What the decodes of `--workdir` are of when its step alone does not say: "-avg5",
    "-avgbest3", "-ema", "-ensemble" (their files and metric series get it)."""
    tag = f"-avg{args.average_last}" if getattr(args, "average_last", 0) else ""
    best = getattr(args, "average_best", 0)
    tag += f"-avgbest{best}" if best else ""
    tag += "-ema" if getattr(args, "ema", False) else ""
    return tag + ("-ensemble" if getattr(args, "ensemble", None) else "")


def load_runs(args: argparse.Namespace) -> list:
    """The run of `--workdir` (averaged first with `--average-last` or `--average-best`, or
    its moving average with `--ema`), then `--ensemble`'s (with `--ema`, each one's moving
    average of its newest checkpoint: an ensemble of runs trained side by side is an
    ensemble of their averages, the form each is best decoded in)."""
    from attnmt.workdir import load_run

    workdir, step = args.workdir, args.step
    last, best = getattr(args, "average_last", 0), getattr(args, "average_best", 0)
    ema = getattr(args, "ema", False)
    if ema:
        workdir, step = _moving_average(args.workdir, args.step), None  # that step's average
    elif last or best:
        import jax

        from attnmt.checkpoint.average import average_checkpoints

        if best and jax.process_count() > 1:  # every process would write the same folder
            raise ConfigError("--average-best in a job: run `attnmt average --best` first")
        result = average_checkpoints(args.workdir, last, overwrite=True, best=best)
        print(f"averaged steps {list(result.steps)} into {result.output_dir}", file=sys.stderr)
        workdir = result.output_dir
    runs = [load_run(workdir, step)]
    runs += [load_run(_moving_average(other) if ema else other) for other in args.ensemble]
    check_ensemble(runs)
    return runs


def _moving_average(workdir: Any, step: int | str | None = None) -> Any:
    """The workdir `attnmt average --ema` writes for `workdir`'s newest checkpoint (or
    `step`'s), written afresh."""
    from attnmt.checkpoint.average import ema_checkpoint

    result = ema_checkpoint(workdir, overwrite=True, step=step)
    print(f"moving average of step {result.step} in {result.output_dir}", file=sys.stderr)
    return result.output_dir


def _vocabulary_identity(run: Any) -> Any:
    """What must match for two runs' ids to mean the same pieces."""
    processor = getattr(run.tokenizer, "processor", None)
    if processor is not None:
        return processor.serialized_model_proto()
    return (type(run.tokenizer).__name__, run.tokenizer.vocab_size)


def check_ensemble(runs: list) -> None:
    """An ensemble averages the models' distributions over one vocabulary, fed one input
    form: a member that differs would decode nonsense without an error."""
    for other in runs[1:]:
        _check_member(runs[0], other)


def _check_member(first: Any, other: Any) -> None:
    if _vocabulary_identity(other) != _vocabulary_identity(first):
        raise ConfigError(
            f"--ensemble {other.workdir}: its vocabulary differs from {first.workdir}'s "
            "(an ensemble needs runs trained with the same vocabulary)"
        )
    forms = (first.experiment.data.text_form, other.experiment.data.text_form)
    if forms[0] != forms[1]:
        raise ConfigError(
            f"--ensemble {other.workdir}: it was trained with data.text_form={forms[1]!r}, "
            f"{first.workdir} with {forms[0]!r} (an ensemble reads one input form)"
        )
