"""`attnmt report <root>`: every run under a folder in one table, like the paper's Table 3.

A run is any folder holding the config.json that training writes. For each: the model's
sizes from that config, the newest checkpoint step, the last dev loss and perplexity (the
`eval` TensorBoard scalars), the last dev BLEU (`bleu`, written during training, or
`bleu_<eval split>`, written by `attnmt evaluate`) and the parameter count. Event files are
read with tensorboardX's protocol buffers, so neither TensorFlow nor TensorBoard is needed.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import re
import struct
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from etils import epath

from attnmt.config.overrides import only_section
from attnmt.errors import UserError
from attnmt.metrics import tensorboardx
from attnmt.storage import as_path, is_remote

# Preference order when a BLEU event holds several scores: the dataset's own convention
# first (Multi30K), then the paper's tokenized BLEU, then sacreBLEU.
_SCORES = ("multi30k_bleu", "tokenized_bleu", "sacrebleu")
# A run with a moving average logs its BLEU during training as ema_* (train/loop.py).
BLEU_TAGS = (*(p + s for s in _SCORES for p in ("", "ema_")), "bleu")
_HEADER = struct.Struct("<Q")  # TFRecord: uint64 length, crc(length), data, crc(data)


class ReportError(UserError):
    """Nothing to report under the given folder."""


@dataclasses.dataclass(frozen=True)
class Scalar:
    step: int
    wall_time: float
    value: float


@dataclasses.dataclass(frozen=True)
class RunSummary:
    name: str
    workdir: str
    config: dict[str, Any]
    steps: int | None
    dev: dict[str, float]  # last eval scalars: loss, perplexity, ...
    dev_bleu: float | None
    test_bleu: float | None
    params: int | None

    def section(self, name: str) -> dict[str, Any]:
        return self.config.get(name, {})


def _records(path: epath.Path) -> Iterator[bytes]:
    """Payloads of a TFRecord file; stops quietly at a torn or corrupt tail (a run that is
    still writing, or was killed mid-write)."""
    tensorboardx()  # the package without torch (attnmt/metrics.py)
    from tensorboardX.record_writer import masked_crc32c

    data = path.read_bytes()
    offset = 0
    while offset + 12 <= len(data):
        header = data[offset : offset + 8]
        (length,) = _HEADER.unpack(header)
        (header_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
        end = offset + 12 + length
        if header_crc != masked_crc32c(header) or end + 4 > len(data):
            return
        payload = data[offset + 12 : end]
        (payload_crc,) = struct.unpack("<I", data[end : end + 4])
        if payload_crc != masked_crc32c(payload):
            return
        yield payload
        offset = end + 4


def read_scalars(directory: epath.Path) -> dict[str, Scalar]:
    """The newest value of each scalar tag in a directory of event files.

    Newest by wall time: after a resume from an earlier checkpoint the steps repeat, and
    the later values describe the run as it is now.
    """
    tensorboardx()
    from tensorboardX.proto import event_pb2

    latest: dict[str, Scalar] = {}
    if not directory.is_dir():
        return latest
    for path in sorted(directory.glob("events.out.tfevents.*")):
        for payload in _records(path):
            event = event_pb2.Event.FromString(payload)
            for value in event.summary.value:
                number = _scalar_value(value)
                if number is None:
                    continue
                scalar = Scalar(int(event.step), float(event.wall_time), number)
                old = latest.get(value.tag)
                if old is None or (scalar.wall_time, scalar.step) >= (old.wall_time, old.step):
                    latest[value.tag] = scalar
    return latest


def _scalar_value(value: Any) -> float | None:
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if value.HasField("tensor"):
        tensor = value.tensor
        for field in (tensor.float_val, tensor.double_val):
            if len(field) == 1:
                return float(field[0])
    return None


def find_runs(root: epath.Path) -> list[epath.Path]:
    """Folders under `root` (itself included) holding a config.json; runs do not nest."""
    if (root / "config.json").exists():
        return [root]
    found: list[epath.Path] = []
    for child in sorted(root.iterdir()) if root.is_dir() else []:
        if child.is_dir():
            found += find_runs(child)
    return found


def newest_checkpoint_step(workdir: epath.Path) -> int | None:
    """The largest finished step in <workdir>/checkpoints: Orbax's temporary folders are
    excluded, and in a bucket (where a folder cannot be renamed) a step counts once its
    commit_success.txt is written."""
    directory = workdir / "checkpoints"
    if not directory.is_dir():
        return None
    remote = is_remote(directory)
    steps = [
        int(child.name)
        for child in directory.iterdir()
        if child.name.isdigit() and (not remote or (child / "commit_success.txt").exists())
    ]
    return max(steps, default=None)


def _bleu(scalars: dict[str, Scalar]) -> Scalar | None:
    for tag in BLEU_TAGS:
        if tag in scalars:
            return scalars[tag]
    return None


def _newest_bleu(tensorboard: epath.Path, splits: Sequence[str]) -> float | None:
    found = [_bleu(read_scalars(tensorboard / split)) for split in splits]
    found = [scalar for scalar in found if scalar is not None]
    if not found:
        return None
    return max(found, key=lambda s: (s.wall_time, s.step)).value


class _ParamCounter:
    """Counts parameters from a config's model section, once per distinct model."""

    def __init__(self) -> None:
        self._cache: dict[str, int | None] = {}

    def __call__(self, config: dict[str, Any], name: str) -> int | None:
        key = json.dumps(config.get("model", {}), sort_keys=True)
        if key not in self._cache:
            self._cache[key] = self._count(config, name)
        return self._cache[key]

    @staticmethod
    def _count(config: dict[str, Any], name: str) -> int | None:
        from attnmt.config.experiment import Experiment
        from attnmt.model.param_count import count_parameters

        try:
            experiment = Experiment.from_mapping(config)
        except UserError as error:
            print(f"attnmt report: {name}: parameters not counted: {error}", file=sys.stderr)
            return None
        return count_parameters(experiment.model)["total"]


def summarize(workdir: epath.Path, name: str, count: _ParamCounter) -> RunSummary:
    config = json.loads((workdir / "config.json").read_text())
    data = config.get("data", {})
    tensorboard = workdir / "tensorboard"
    eval_split = data.get("eval_split") or "dev"
    test_split = data.get("test_split") or "test"
    dev = {tag: scalar.value for tag, scalar in read_scalars(tensorboard / "eval").items()}
    return RunSummary(
        name=name,
        workdir=str(workdir),
        config=config,
        steps=newest_checkpoint_step(workdir),
        dev=dev,
        dev_bleu=_newest_bleu(tensorboard, ["bleu", f"bleu_{eval_split}"]),
        test_bleu=_newest_bleu(tensorboard, [f"bleu_{test_split}"]),
        params=count(config, name),
    )


def _natural_key(text: str) -> list[Any]:
    """C2 before C10: digit runs compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def gather(root: str) -> list[RunSummary]:
    """A summary of each run under `root`, sorted by name."""
    base = as_path(root, "attnmt report ROOT")
    workdirs = find_runs(base)
    if not workdirs:
        raise ReportError(f"no runs under {root}: no folder there holds a config.json")
    count = _ParamCounter()
    summaries = []
    for workdir in workdirs:
        relative = str(workdir)[len(str(base)) :].strip("/")
        summaries.append(summarize(workdir, relative or workdir.name, count))
    return sorted(summaries, key=lambda summary: _natural_key(summary.name))


def stack_depths(model: dict[str, Any]) -> Any:
    """Column N: num_layers, or "encoder/decoder" depths where a stack has its own."""
    n = model.get("num_layers")
    encoder = model.get("num_encoder_layers") or n
    decoder = model.get("num_decoder_layers") or n
    return n if encoder == decoder else f"{encoder}/{decoder}"


# (header, value) for each column of the printed table, in the paper's order.
COLUMNS = [
    ("run", lambda s: s.name),
    ("N", lambda s: stack_depths(s.section("model"))),
    ("d_model", lambda s: s.section("model").get("d_model")),
    ("d_ff", lambda s: s.section("model").get("d_ff")),
    ("h", lambda s: s.section("model").get("num_heads")),
    ("d_k", lambda s: s.section("model").get("d_k")),
    ("d_v", lambda s: s.section("model").get("d_v")),
    ("P_drop", lambda s: s.section("model").get("dropout_rate")),
    ("ε_ls", lambda s: s.section("train").get("label_smoothing")),
    ("steps", lambda s: s.steps),
    ("dev PPL", lambda s: _fixed(s.dev.get("perplexity"), 2)),
    ("dev BLEU", lambda s: _fixed(s.dev_bleu, 1)),
    ("params ×10^6", lambda s: _millions(s.params)),
]


def _fixed(value: float | None, digits: int) -> str | None:
    return None if value is None else f"{value:.{digits}f}"


def _millions(count: int | None) -> str | None:
    # One decimal as the paper's sizes need; small test models keep three significant digits.
    if count is None:
        return None
    millions = count / 1e6
    return f"{millions:.1f}" if millions >= 1 else f"{millions:.3g}"


def markdown_table(summaries: Sequence[RunSummary]) -> str:
    """A markdown table with a row per run; a missing value shows as —."""
    lines = ["| " + " | ".join(header for header, _ in COLUMNS) + " |"]
    lines.append("|" + "---|" * len(COLUMNS))
    for summary in summaries:
        cells = ["—" if (v := cell(summary)) is None else str(v) for _, cell in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def csv_rows(summaries: Sequence[RunSummary]) -> list[dict[str, Any]]:
    """Unrounded values, plus the ones the table leaves out (dev loss, test BLEU, ...)."""
    rows = []
    for s in summaries:
        model, train = s.section("model"), s.section("train")
        rows.append(
            {
                "run": s.name,
                "workdir": s.workdir,
                "N": stack_depths(model),
                "d_model": model.get("d_model"),
                "d_ff": model.get("d_ff"),
                "h": model.get("num_heads"),
                "d_k": model.get("d_k"),
                "d_v": model.get("d_v"),
                "P_drop": model.get("dropout_rate"),
                "eps_ls": train.get("label_smoothing"),
                "positional": model.get("positional"),
                "steps": s.steps,
                "dev_loss": s.dev.get("loss"),
                "dev_ppl": s.dev.get("perplexity"),
                "dev_accuracy": s.dev.get("accuracy"),
                "dev_bleu": s.dev_bleu,
                "test_bleu": s.test_bleu,
                "params": s.params,
            }
        )
    return rows


def write_csv(summaries: Sequence[RunSummary], path: str) -> None:
    rows = csv_rows(summaries)
    # As bytes: etils' text mode takes no newline= (csv writes its own line ends).
    with (
        as_path(path, "--csv").open("wb") as raw,
        io.TextIOWrapper(raw, encoding="utf-8", newline="") as handle,
    ):
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("report", help="a Table-3-like table of runs under a folder")
    parser.add_argument("root", help="a folder of runs (any depth), or one run's workdir")
    parser.add_argument("--csv", default=None, help="also write the rows to this CSV file")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, overrides: Mapping[str, str]) -> int:
    """Prints the table (and writes the CSV)."""
    only_section("report", overrides, None)
    summaries = gather(args.root)
    print(markdown_table(summaries))
    if args.csv:
        write_csv(summaries, args.csv)
    return 0
