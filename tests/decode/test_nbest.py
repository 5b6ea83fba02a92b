"""n-best lists with scores: beam search's finished beam against brute force, each
hypothesis's raw log-probability against a teacher-forced float64 recomputation, and the
`line<TAB>rank<TAB>score<TAB>log_prob<TAB>text` format (attnmt.decode.translate) read back."""

from __future__ import annotations

import functools
import io
import math

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.cli.main import main
from attnmt.common import EOS_ID, PAD_ID
from attnmt.config.decode import DecodeConfig
from attnmt.decode.beam_search import beam_search, expand_to_beams
from attnmt.decode.translate import (
    Hypothesis,
    Translator,
    format_hypothesis,
    parse_hypothesis,
)
from attnmt.model.transformer import Transformer
from tests.decode.search_reference import (
    SHAPES,
    brute_force,
    fast_jit,
    log_softmax64,
    make_cache,
    random_tables,
    sequence_log_prob,
    strip,
    table_model,
)

EPS32 = float(np.finfo(np.float32).eps)


def log_prob_tolerance(length: int, logits: np.ndarray) -> float:
    """What float32 allows for a sum of `length` log-softmax entries of `logits`: each entry
    (x - max - log Σ exp) is a few roundings of numbers of size ≤ max|x| + log V, and the
    running sum adds one rounding of the total per step. 8 roundings per token is loose."""
    scale = float(np.abs(logits).max()) + math.log(logits.shape[-1])
    return 8 * EPS32 * length * scale


@functools.cache
def jit_nbest(batch: int, beam: int, length: int):
    return fast_jit(
        functools.partial(
            beam_search,
            table_model,
            batch_size=batch,
            beam_size=beam,
            max_decode_len=length,
            return_log_probs=True,
        )
    )


def run_nbest(tables: np.ndarray, beam: int, alpha: float):
    batch, length = tables.shape[0], tables.shape[1]
    cache = expand_to_beams(make_cache(tables), beam)
    lengths = jnp.full((batch,), length, jnp.int32)
    out = jit_nbest(batch, beam, length)(cache, alpha=alpha, max_lengths=lengths)
    return tuple(np.asarray(x) for x in out)


@pytest.mark.parametrize(("vocab", "length", "beam"), SHAPES)
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_nbest_is_the_brute_force_top_k_with_float64_log_probs(vocab, length, beam, alpha):
    # A beam this wide is exhaustive (tests/decode/test_beam_search.py, SHAPES), so its
    # finished set, and any first K of it, is the brute-force ranking.
    tables = random_tables(3, 3, length, vocab)
    seqs, scores, log_probs = run_nbest(tables, beam, alpha)
    for b in range(tables.shape[0]):
        logp = log_softmax64(tables[b])
        expected = brute_force(tables[b], length, alpha)[:beam]
        for k, (score, seq) in enumerate(expected):
            assert strip(seqs[b, k]) == seq, (b, k)
            # Teacher-forced float64 recomputation of exactly this hypothesis.
            reference = sequence_log_prob(tables[b], seq, logp)
            tolerance = log_prob_tolerance(len(seq), tables[b])
            assert abs(log_probs[b, k] - reference) <= tolerance, (b, k)
            lp = ((5.0 + len(seq)) / 6.0) ** alpha
            assert abs(scores[b, k] - reference / lp) <= tolerance / lp + EPS32 * abs(score)
        for k in range(len(expected), beam):  # empty slots carry -inf in both
            assert np.isneginf(scores[b, k]) and np.isneginf(log_probs[b, k])


def test_log_probs_do_not_change_the_search():
    vocab, length, beam = SHAPES[1]
    tables = random_tables(4, 3, length, vocab)
    cache = expand_to_beams(make_cache(tables), beam)
    plain = beam_search(table_model, cache, batch_size=3, beam_size=beam, max_decode_len=length)
    seqs, scores, _ = run_nbest(tables, beam, 0.6)
    np.testing.assert_array_equal(plain[0], seqs)
    np.testing.assert_array_equal(plain[1], scores)


# --------------------------------------------------------------------------- the format


def test_format_reads_back_exactly():
    values = np.array([-1.2345678, -1e-9, -0.1, -123456.78, -np.inf], np.float32)
    texts = ["a b", "tab\there\tand there", "ünïcødé ✓", "", "  spaced  "]
    for number, (value, text) in enumerate(zip(values, texts, strict=True), start=1):
        hypothesis = Hypothesis(text, float(value), float(value * 2))
        line = format_hypothesis(number, 3, hypothesis)
        assert "\n" not in line and line.count("\t") == 4 + text.count("\t")
        got_number, rank, got = parse_hypothesis(line + "\n")
        assert (got_number, rank, got.text) == (number, 3, text)
        # 9 significant digits read back to the same float32.
        assert np.float32(got.score) == value and np.float32(got.log_prob) == value * 2
    nan = parse_hypothesis(format_hypothesis(1, 1, Hypothesis("", math.nan, math.nan)))[2]
    assert math.isnan(nan.score) and math.isnan(nan.log_prob)
    # A newline inside a text cannot break the one-hypothesis-per-line layout.
    assert parse_hypothesis(format_hypothesis(1, 1, Hypothesis("a\nb", -1.0, -1.0)))[2].text == (
        "a b"
    )


# --------------------------------------------------------------------------- a real model


@pytest.fixture(scope="module")
def nbest_translators(tokenizer_and_model):
    tokenizer, config, params = tokenizer_and_model
    made = {}

    def get(beam: int, nbest: int) -> Translator:
        if (beam, nbest) not in made:
            decode = DecodeConfig(
                beam_size=beam,
                max_len_offset=5,
                batch_sentences=4,
                xla_backend_optimization_level=0,
            )
            made[beam, nbest] = Translator([config], [params], tokenizer, decode, nbest=nbest)
        return made[beam, nbest]

    return get


@pytest.fixture(scope="module")
def tokenizer_and_model(workdir):
    from attnmt.data.tokenizer import Tokenizer

    root, experiment, params = workdir
    return Tokenizer.load(root / "vocab.model"), experiment.model, params


LINES = ["the dog runs", "", "a red house on the mat", "cat", "big small big small"]


def teacher_forced_log_prob(config, params, tokenizer, line: str, ids: list[int]) -> float:
    """float64 log P(ids | line) from one full (uncached) forward pass of the model."""
    src = np.asarray([[*tokenizer.encode(line), EOS_ID]], np.int32)
    tgt = np.asarray([ids], np.int32)
    logits = Transformer(config).apply({"params": nn.meta.unbox(params)}, src, tgt)
    logp = log_softmax64(np.asarray(logits[0], np.float64))
    return float(sum(logp[t, token] for t, token in enumerate(ids)))


@pytest.mark.parametrize("beam", [1, 3])
def test_translator_nbest_scores_are_the_models_teacher_forced_log_probs(
    tokenizer_and_model, nbest_translators, beam
):
    tokenizer, config, params = tokenizer_and_model
    nbest = nbest_translators(beam, beam)
    lists = nbest.translate_nbest(LINES)
    assert [len(best) for best in lists] == [beam] * len(LINES)
    assert all(math.isnan(h.score) and h.text == "" for h in lists[1])
    # The 1-best is what plain translation writes.
    assert [best[0].text for best in lists] == nbest_translators(beam, 0).translate(LINES)
    sequences = _search_ids(nbest, LINES)
    for index, line in enumerate(LINES):
        if not line:
            continue
        scores = [h.score for h in lists[index]]
        assert scores == sorted(scores, reverse=True)
        for rank, hypothesis in enumerate(lists[index]):
            ids = [t for t in sequences[index][rank] if t != PAD_ID]
            reference = teacher_forced_log_prob(config, params, tokenizer, line, ids)
            # Cached vs full forward pass: the logits agree to float32 rounding of O(1) sums.
            assert abs(hypothesis.log_prob - reference) <= 1e-4 * len(ids), (index, rank)
            lp = ((5.0 + len(ids)) / 6.0) ** 0.6
            assert hypothesis.score == pytest.approx(hypothesis.log_prob / lp, rel=1e-6)


def _search_ids(translator: Translator, lines: list[str]) -> dict[int, np.ndarray]:
    """The token ids behind translate_nbest's texts, [K, max_decode_len] per input."""
    return {index: result.sequences for index, result in translator._decoded(lines, 1)}


def test_stream_writes_k_lines_per_input_in_order(nbest_translators):
    translator = nbest_translators(3, 2)
    target = io.StringIO()
    assert translator.translate_stream(io.StringIO("\n".join(LINES) + "\n"), target, 2) == 5
    rows = [parse_hypothesis(line) for line in target.getvalue().splitlines()]
    assert [(number, rank) for number, rank, _ in rows] == [
        (n, r) for n in range(1, 6) for r in (1, 2)
    ]
    expected = translator.translate_nbest(LINES)
    for number, rank, hypothesis in rows:
        want = expected[number - 1][rank - 1]
        assert hypothesis.text == want.text
        if not math.isnan(want.score):
            # The stream's batches of 2 lines compile other shapes than one batch of all 5,
            # whose float32 sums may round differently: a few ulp of the score (1 ulp on
            # an AVX2-only AMD EPYC; equal on AVX-512 CPUs). rel 1e-5 is ≈ 80 ulp.
            assert hypothesis.score == pytest.approx(want.score, rel=1e-5)
            assert hypothesis.log_prob == pytest.approx(want.log_prob, rel=1e-5)


def test_translator_refuses_more_hypotheses_than_the_beam(tokenizer_and_model):
    tokenizer, config, params = tokenizer_and_model
    with pytest.raises(ValueError, match="nbest"):
        Translator([config], [params], tokenizer, DecodeConfig(beam_size=2), nbest=3)
    with pytest.raises(ValueError, match="nbest"):
        Translator([config], [params], tokenizer, DecodeConfig(sample=True), nbest=2)


# --------------------------------------------------------------------------- the command


def _cli(root, tmp_path, name, *flags):
    source = tmp_path / "input.txt"
    source.write_text("\n".join(LINES) + "\n")
    target = tmp_path / f"{name}.txt"
    argv = ["translate", "--workdir", str(root), "--input", str(source), "--output", str(target)]
    assert main([*argv, "--xla-opt-level", "0", *flags]) == 0
    return target.read_text(encoding="utf-8").split("\n")[:-1]


def test_cli_nbest_and_scores(workdir, tmp_path):
    root = workdir[0]  # decode.beam_size = 2 in its config
    plain = _cli(root, tmp_path, "plain")
    scored_lines = _cli(root, tmp_path, "scores", "--scores")
    scored = [parse_hypothesis(line) for line in scored_lines]
    assert [(n, r) for n, r, _ in scored] == [(n, 1) for n in range(1, 6)]
    assert [h.text for _, _, h in scored] == plain
    two_lines = _cli(root, tmp_path, "two", "--nbest", "2")
    two = [parse_hypothesis(line) for line in two_lines]
    assert [(n, r) for n, r, _ in two] == [(n, r) for n in range(1, 6) for r in (1, 2)]
    assert two_lines[::2] == scored_lines  # the same 1-best, scores and all
    sampled = _cli(root, tmp_path, "sampled", "--sample", "--seed", "1", "--scores")
    assert len(sampled) == 5 and all(parse_hypothesis(line)[1] == 1 for line in sampled)


@pytest.mark.parametrize(
    "flags", [["--nbest", "3"], ["--nbest", "0"], ["--nbest", "2", "--sample"]]
)
def test_cli_refuses_an_impossible_nbest(workdir, capsys, flags):
    code = main(["translate", "--workdir", str(workdir[0]), *flags])
    err = capsys.readouterr().err
    assert code == 2 and "--nbest" in err and "Traceback" not in err
