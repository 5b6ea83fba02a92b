"""Translating arbitrary text never crashes and keeps one output line per input line.

A tiny random model is enough: what is tested is the handling of the text around it
(control characters, line and paragraph separators, BOMs, NULs, undecodable bytes, lines
far longer than the model's maximum), not the quality of the translations.
"""

from __future__ import annotations

import random

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnmt.checkpoint.manager import CheckpointManager
from attnmt.cli.config_file import apply_command_line_overrides, load_config_file
from attnmt.cli.main import main
from attnmt.data.tokenizer import Tokenizer, train_vocab
from attnmt.decode.config import DecodeConfig
from attnmt.decode.translate import Translator
from attnmt.experiment import Experiment
from attnmt.model.transformer import Transformer
from attnmt.train.optim import make_optimizer
from attnmt.train.step import create_train_state
from tests.test_config import CONFIGS

WORDS = "the a dog cat runs sits on mat red blue big small house tree".split()  # noqa: SIM905
# Characters that end a line for some reader (str.splitlines, universal newlines) or that
# text tools often mishandle; NEL (U+0085) even survives sentencepiece's normalisation, so
# the vocabulary below holds a piece with it and the model can emit it.
AWKWARD = ["\x00", "\r", "\n", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029", "\ufeff"]
EXAMPLES = 30


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A workdir as training leaves it: config, vocabulary, one checkpoint (random weights)."""
    root = tmp_path_factory.mktemp("run")
    rng = random.Random(0)
    text = [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) + rng.choice(AWKWARD) + "x"
        for _ in range(300)
    ]
    train_vocab(text, root / "vocab.model", vocab_size=48)
    config = load_config_file(str(CONFIGS / "tiny.py"))
    apply_command_line_overrides(
        config,
        [
            "--config.model.vocab_size=48",
            "--config.model.d_model=16",
            "--config.model.d_ff=32",
            "--config.model.d_k=8",
            "--config.model.d_v=8",
            "--config.model.num_layers=1",
            "--config.model.max_length=24",
            "--config.data.max_length=16",
            "--config.decode.beam_size=2",
            "--config.decode.max_len_offset=5",
            "--config.decode.batch_sentences=4",
        ],
    )
    experiment = Experiment.from_mapping(config)
    example = {"src_tokens": np.ones((1, 8), np.int32), "tgt_tokens": np.ones((1, 8), np.int32)}
    model, optimizer = Transformer(experiment.model), make_optimizer(experiment.optim, 16)
    state = create_train_state(model, optimizer, jax.random.PRNGKey(0), example)
    manager = CheckpointManager(root)
    manager.save(1, state, {"epoch": 0, "index": 0, "seed": 0}, experiment.to_dict())
    manager.close()
    return root, experiment, state.params


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
