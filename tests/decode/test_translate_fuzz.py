"""Translating arbitrary text never crashes and keeps one output line per input line.

A tiny random model is enough: what is tested is the handling of the text around it
(control characters, line and paragraph separators, BOMs, NULs, undecodable bytes, lines
far longer than the model's maximum), not the quality of the translations.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnmt.cli.main import main
from attnmt.config.decode import DecodeConfig
from attnmt.data.tokenizer import Tokenizer
from attnmt.decode.translate import Translator
from tests.helpers import AWKWARD, WORDS

EXAMPLES = 30


@pytest.fixture(scope="module")
def translator(workdir):
    root, experiment, params = workdir
    tokenizer = Tokenizer.load(root / "vocab.model")
    warnings: list[str] = []
    decode = DecodeConfig(beam_size=2, max_len_offset=5, batch_sentences=4)
    return Translator([experiment.model], [params], tokenizer, decode, warn=warnings.append)


line = st.one_of(
    st.text(st.one_of(st.characters(), st.sampled_from(AWKWARD)), max_size=40),
    st.lists(st.sampled_from([*WORDS, *AWKWARD, " "]), max_size=20).map("".join),
    # Far longer than the model's 24 positions: truncated, with a warning.
    st.lists(st.sampled_from([*WORDS, " ", "\x85"]), min_size=60, max_size=1500).map(" ".join),
)


def test_translate_returns_one_line_per_input_whatever_the_text(translator):
    tried: list[int] = []  # the length of each list hypothesis tried

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(lines=st.lists(line, max_size=6))
    def check(lines):
        tried.append(len(lines))
        outputs = translator.translate(lines)
        assert len(outputs) == len(lines)
        for source, output in zip(lines, outputs, strict=True):
            assert isinstance(output, str)
            assert "\n" not in output and "\r" not in output
            if not source.strip():
                assert output == ""

    check()
    # Reported by the test run (-s). Hypothesis runs max_examples examples unless it
    # exhausts the strategy, which unbounded text cannot be: fewer means it was cut short.
    print(f"fuzzed translate with {len(tried)} lists, {sum(tried)} lines")
    assert len(tried) >= EXAMPLES


def test_cli_translate_keeps_lines_aligned_on_bad_bytes(workdir, tmp_path, capsys):
    root = workdir[0]
    lines = [
        b"the dog runs",
        b"\xff\xfe broken \xc3",  # not UTF-8 at all, then a truncated sequence
        b"",
        b"cat\rmat",  # a lone CR inside a line is not a line break in a parallel corpus
        b"tree\x0bhouse\x0c",
        "red\x85blue".encode(),
        "a\u2028b\u2029c".encode(),
        b"\xef\xbb\xbfbig small",  # a BOM
        b"\x00",
        b"   ",
        b"small mat\r",  # CRLF line ending
    ]
    source = tmp_path / "input.txt"
    source.write_bytes(b"\n".join(lines) + b"\n")
    target = tmp_path / "output.txt"
    args = ["translate", "--workdir", str(root), "--input", str(source), "--output", str(target)]
    assert main(args) == 0, capsys.readouterr().err
    written = target.read_bytes()
    assert written.count(b"\n") == len(lines) and written.endswith(b"\n")
    assert b"\r" not in written
    outputs = written.decode("utf-8").split("\n")[:-1]
    assert outputs[2] == "" and outputs[9] == ""
