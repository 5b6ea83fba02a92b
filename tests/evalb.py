"""The real EVALB (Sekine & Collins, bug-fixed 2006 version), compiled from the C source in
../shared/reference/evalb/ and run with its COLLINS.prm: the independent reference that
attnmt.evaluate.parse_f1 is held to.

A missing compiler or a failed compile fails the test (cc is on every machine here); only a
missing source skips, like the shared corpora, and ATTNMT_TESTS_STRICT=1 fails that too.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from attnmt.data.treebank import Tree, to_bracketed
from attnmt.evaluate.parse_f1 import ParseScores

REPO = Path(__file__).resolve().parents[1]


def evalb_source_dir() -> Path:
    default = REPO.parent / "shared" / "reference" / "evalb"
    return Path(os.environ.get("ATTNMT_EVALB_DIR", default))


@dataclass(frozen=True)
class EvalbBlock:
    """One block of EVALB's summary (``-- All --`` or ``-- len<=40 --``), numbers as printed."""

    sentences: int
    errors: int
    skipped: int
    valid: int
    recall: str
    precision: str
    f1: str
    complete_match: str

    def value(self, name: str) -> float:
        text = getattr(self, name)
        return math.nan if "nan" in text else float(text)


@dataclass(frozen=True)
class EvalbRow:
    """One sentence's line: ID (1-based), Len., Stat., matched, gold and test brackets."""

    line: int
    length: int
    status: int
    matched: int
    gold: int
    test: int


@dataclass(frozen=True)
class EvalbResult:
    rows: tuple[EvalbRow, ...]
    totals: tuple[int, int, int] | None  # matched, gold, test (printed only when both > 0)
    all: EvalbBlock
    short: EvalbBlock
    stdout: str
    stderr: str


_ROW = re.compile(
    r"^\s*(\d+)\s+(\d+)\s+(\d)\s+\S+\s+\S+\s+(\d+)\s+(\d+)\s+(\d+)\s+\d+\s+\d+\s+\d+\s+\S+\s*$"
)
_TOTALS = re.compile(r"^\s+\S+\s+\S+\s+(\d+)\s+(\d+)\s+(\d+)\s+\d+\s+\d+\s+\d+\s+\S+\s*$")


def _block(lines: list[str]) -> EvalbBlock:
    values = {}
    for line in lines:
        name, _, value = line.partition("=")
        values[name.strip()] = value.strip()
    return EvalbBlock(
        sentences=int(values["Number of sentence"]),
        errors=int(values["Number of Error sentence"]),
        skipped=int(values["Number of Skip  sentence"]),
        valid=int(values["Number of Valid sentence"]),
        recall=values["Bracketing Recall"],
        precision=values["Bracketing Precision"],
        f1=values["Bracketing FMeasure"],
        complete_match=values["Complete match"],
    )


def parse_output(stdout: str, stderr: str = "") -> EvalbResult:
    """EVALB's report: the per-sentence lines, the totals line and both summary blocks."""
    lines = stdout.splitlines()
    rule = [i for i, line in enumerate(lines) if line.startswith("=====")]
    if len(rule) < 2 or "=== Summary ===" not in lines:
        raise AssertionError(f"no EVALB summary in its output:\n{stdout[-2000:]}\n{stderr}")
    rows = []
    for line in lines[rule[0] + 1 : rule[1]]:
        match = _ROW.match(line)
        assert match, f"unexpected EVALB line {line!r}"
        rows.append(EvalbRow(*map(int, match.groups())))
    totals_match = _TOTALS.match(lines[rule[1] + 1])
    totals = tuple(map(int, totals_match.groups())) if totals_match else None
    summary = lines.index("=== Summary ===")
    all_start = lines.index("-- All --", summary)
    short_start = next(i for i in range(all_start + 1, len(lines)) if lines[i].startswith("-- len"))
    return EvalbResult(
        rows=tuple(rows),
        totals=totals,  # type: ignore[arg-type]
        all=_block(lines[all_start + 1 : short_start]),
        short=_block(lines[short_start + 1 :]),
        stdout=stdout,
        stderr=stderr,
    )


@dataclass(frozen=True)
class Evalb:
    binary: Path
    parameters: Path

    def run(self, gold: Path, test: Path, max_error: int | None = 1_000_000) -> EvalbResult:
        """``evalb -p COLLINS.prm gold test`` (then ``-e max_error``, which overrides the
        parameter file's MAX_ERROR 10: beyond it EVALB exits without a summary; None keeps
        it)."""
        command = [str(self.binary), "-p", str(self.parameters)]
        if max_error is not None:
            command += ["-e", str(max_error)]
        result = subprocess.run(
            [*command, str(gold), str(test)], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, f"evalb exited {result.returncode}: {result.stderr[-2000:]}"
        return parse_output(result.stdout, result.stderr)

    def run_trees(
        self, gold: Sequence[Tree], test: Sequence[Tree], folder: Path, name: str = "trees"
    ) -> EvalbResult:
        """Writes both tree lists one bracketing per line (as attnmt writes them) and runs."""
        gold_path, test_path = folder / f"{name}.gold", folder / f"{name}.test"
        gold_path.write_text("".join(to_bracketed(tree) + "\n" for tree in gold))
        test_path.write_text("".join(to_bracketed(tree) + "\n" for tree in test))
        return self.run(gold_path, test_path)


def compile_evalb(folder: Path) -> Evalb:
    """evalb.c built with ``cc`` into ``folder`` (once per folder)."""
    source = evalb_source_dir()
    if not (source / "evalb.c").exists():
        pytest.skip(f"EVALB's source is not at {source} (set ATTNMT_EVALB_DIR)")
    binary = folder / "evalb"
    if not binary.exists():
        compiler = shutil.which("cc")
        if compiler is None:
            pytest.fail("no C compiler: `cc` is not on PATH, and the EVALB comparison needs one")
        # gnu89: the source is K&R C (unprototyped declarations), which C23 compilers reject.
        command = [compiler, "-std=gnu89", "-O2", "-w", "-o", str(binary), str(source / "evalb.c")]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            pytest.fail(f"compiling EVALB failed ({' '.join(command)}):\n{result.stderr}")
    return Evalb(binary, source / "COLLINS.prm")


def evalb_fixture(tmp_path_factory: pytest.TempPathFactory) -> Evalb:
    """The body of the session fixtures: one binary per session (per xdist worker)."""
    folder = tmp_path_factory.getbasetemp() / "evalb-build"
    folder.mkdir(exist_ok=True)
    return compile_evalb(folder)


def assert_agrees(scores: ParseScores, evalb: EvalbResult) -> None:
    """attnmt's scores equal EVALB's: per sentence (status, length, bracket counts), totals,
    and every summary figure of both blocks as EVALB prints it (F1 0.00 where EVALB says
    nan: nothing matched)."""
    assert len(evalb.rows) == scores.num_sentences
    for sentence, row in zip(scores.sentences, evalb.rows, strict=True):
        ours = (sentence.index + 1, sentence.length, sentence.status)
        ours += (sentence.matched, sentence.gold_brackets, sentence.test_brackets)
        assert ours == (row.line, row.length, row.status, row.matched, row.gold, row.test), (
            sentence.message
        )
    counts = (scores.matched, scores.gold_brackets, scores.test_brackets)
    if evalb.totals is not None:
        assert counts == evalb.totals
    else:
        assert 0 in counts[1:]
    for ours, theirs in ((scores, evalb.all), (scores.up_to(40), evalb.short)):
        assert (ours.num_sentences, ours.num_errors, ours.num_skipped, ours.num_valid) == (
            theirs.sentences,
            theirs.errors,
            theirs.skipped,
            theirs.valid,
        )
        assert f"{ours.recall:.2f}" == theirs.recall
        assert f"{ours.precision:.2f}" == theirs.precision
        assert f"{ours.exact_match:.2f}" == theirs.complete_match
        if "nan" in theirs.f1:
            assert ours.f1 == 0.0 and ours.matched == 0
        else:
            assert f"{ours.f1:.2f}" == theirs.f1
