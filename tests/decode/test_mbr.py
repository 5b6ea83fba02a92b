"""Minimum Bayes-risk choice (attnmt.decode.mbr): against a brute-force expected utility
over the raw n-best list (duplicates unmerged, weights from float64 math), on cases whose
answer is known by construction, and through the Translator and the command line against
the n-best lists the same search writes."""

from __future__ import annotations

import dataclasses
import math
import random
from types import SimpleNamespace

import pytest
from sacrebleu.metrics import BLEU, CHRF

from attnmt.cli.main import main
from attnmt.config.decode import DecodeConfig
from attnmt.decode.evaluation import decodes_stem
from attnmt.decode.mbr import candidate_weights, mbr_index, sentence_utility
from attnmt.decode.translate import Translator, parse_hypothesis
from attnmt.errors import ConfigError

REFERENCE_METRICS = {
    "bleu": lambda h, r: BLEU(effective_order=True).sentence_score(h, [r]).score,
    "chrf": lambda h, r: CHRF().sentence_score(h, [r]).score,
}


def brute_force_gains(texts, log_probs, metric, weights):
    """Σ_j w_j u(h_i, h_j) for every entry i of the list as given (no merging)."""
    finite = [math.isfinite(x) for x in log_probs]
    if weights == "uniform":
        raw = [1.0 if ok else 0.0 for ok in finite]
    else:
        top = max(x for x, ok in zip(log_probs, finite, strict=True) if ok)
        raw = [math.exp(x - top) if ok else 0.0 for x, ok in zip(log_probs, finite, strict=True)]
    total = sum(raw)
    w = [x / total for x in raw]
    return [
        sum(w[j] * metric(texts[i], texts[j]) for j in range(len(texts)) if w[j] > 0)
        if w[i] > 0
        else -math.inf
        for i in range(len(texts))
    ]


def brute_force_choice(texts, log_probs, metric, weights, samples=(), share=0.5):
    """The first entry whose gain is the highest (within float64 rounding of the sums);
    with `samples`, each adds share / len(samples) · u(h_i, sample) and the beam's part is
    scaled by 1 - share."""
    gains = brute_force_gains(texts, log_probs, metric, weights)
    if samples:
        gains = [
            (1 - share) * g + sum(share / len(samples) * metric(texts[i], s) for s in samples)
            if g > -math.inf
            else g
            for i, g in enumerate(gains)
        ]
    best = max(gains)
    return next(i for i, g in enumerate(gains) if g >= best - 1e-9 * max(1.0, abs(best)))


WORDS = ["a", "dog", "cat", "runs", "on", "the", "red", "mat", "house", "big", "small"]


@pytest.mark.parametrize("utility", ["bleu", "chrf"])
@pytest.mark.parametrize("weights", ["model", "uniform"])
def test_choice_is_the_brute_force_expected_utility_argmax(utility, weights):
    rng = random.Random(f"{utility}-{weights}")
    metric = REFERENCE_METRICS[utility]
    ours = sentence_utility(utility)
    moved = 0
    for _ in range(100):
        pool = [" ".join(rng.choices(WORDS, k=rng.randint(1, 7))) for _ in range(4)]
        # Repeats: two segmentations of one string are one candidate with summed weight.
        texts = [rng.choice(pool) for _ in range(rng.randint(2, 6))]
        log_probs = sorted((rng.uniform(-2.5, -0.5) for _ in texts), reverse=True)
        chosen = mbr_index(texts, log_probs, ours, weights)
        assert chosen == brute_force_choice(texts, log_probs, metric, weights), texts
        moved += chosen != 0
    # The cases are not all won by the beam's best: the test can tell MBR from it.
    assert moved >= 8, moved


@pytest.mark.parametrize("utility", ["bleu", "chrf"])
@pytest.mark.parametrize("share", [0.5, 0.8])
def test_choice_with_samples_is_the_brute_force_mixture_argmax(utility, share):
    rng = random.Random(f"samples-{utility}-{share}")
    metric = REFERENCE_METRICS[utility]
    ours = sentence_utility(utility)
    moved = 0
    for _ in range(60):
        pool = [" ".join(rng.choices(WORDS, k=rng.randint(1, 7))) for _ in range(5)]
        texts = [rng.choice(pool) for _ in range(rng.randint(2, 5))]
        log_probs = sorted((rng.uniform(-2.5, -0.5) for _ in texts), reverse=True)
        samples = [rng.choice(pool) for _ in range(rng.randint(1, 6))]
        chosen = mbr_index(texts, log_probs, ours, "model", samples=samples, sample_share=share)
        expected = brute_force_choice(texts, log_probs, metric, "model", samples, share)
        assert chosen == expected, (texts, samples)
        moved += chosen != mbr_index(texts, log_probs, ours, "model")
    # The samples change the choice in some cases: the test can tell them from no samples.
    assert moved >= 5, moved


def test_samples_outvote_the_beam_only_with_their_share():
    texts = ["a big red dog", "a dog runs on the mat"]
    samples = ["a dog runs on a mat", "the dog runs on the mat", "a dog runs on the mat"]
    utility = sentence_utility("chrf")
    # The beam's weights favour the first hypothesis by far; the samples agree with the second.
    assert mbr_index(texts, [-0.01, -6.0], utility, samples=samples, sample_share=0.0) == 0
    assert mbr_index(texts, [-0.01, -6.0], utility, samples=samples, sample_share=0.9) == 1
    assert mbr_index(texts, [-0.01, -6.0], utility, samples=samples, sample_share=1.0) == 1
    with pytest.raises(ValueError, match="sample_share"):
        mbr_index(texts, [-0.01, -6.0], utility, samples=samples, sample_share=1.5)


def test_consensus_beats_the_best_scored_outlier():
    texts = ["a big red dog", "a dog runs on the mat", "a dog runs on a mat"]
    texts.append("the dog runs on a mat")
    # Uniform: the best-scored outlier shares little with the other three.
    assert mbr_index(texts, [-1.0, -1.1, -1.2, -1.3], sentence_utility("bleu"), "uniform") == 2
    # Model weights that put nearly all the mass on the outlier keep it.
    assert mbr_index(texts, [-0.01, -9.0, -9.0, -9.0], sentence_utility("bleu"), "model") == 0


def test_unfilled_slots_weigh_nothing_and_are_never_chosen():
    utility = sentence_utility("chrf")
    texts = ["a dog", "", "a dog runs"]
    for weights in ("model", "uniform"):
        assert mbr_index(texts, [-1.0, -math.inf, -2.0], utility, weights) in (0, 2)
        assert mbr_index(["", "x"], [math.nan, -math.inf], utility, weights) == 0
        assert mbr_index(["only"], [-3.0], utility, weights) == 0
    weights = candidate_weights([-1.0, -math.inf, -2.0, math.nan], "model")
    e = math.exp(-1.0) + math.exp(-2.0)
    assert weights.tolist() == pytest.approx([math.exp(-1.0) / e, 0.0, math.exp(-2.0) / e, 0.0])
    assert candidate_weights([-1.0, -math.inf, -5.0], "uniform").tolist() == [0.5, 0.0, 0.5]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"mbr": "bleu", "beam_size": 1}, "beam_size ≥ 2"),
        ({"mbr": "chrf", "sample": True}, "sample=True"),
        ({"mbr": "ter"}, "decode.mbr"),
        ({"mbr_weights": "softmax"}, "decode.mbr_weights"),
        ({"mbr_samples": 8}, "needs decode.mbr"),
        ({"mbr": "chrf", "mbr_samples": -1}, "decode.mbr_samples"),
        ({"mbr": "chrf", "mbr_samples": 4, "mbr_sample_share": 1.5}, "mbr_sample_share"),
    ],
)
def test_config_refuses_what_mbr_cannot_choose_among(values, message):
    with pytest.raises(ConfigError, match=message):
        DecodeConfig(**values)


# --------------------------------------------------------------------------- a real model

LINES = ["the dog runs", "", "a red house on the mat", "cat", "big small big small", "x y z"]


@pytest.fixture(scope="module")
def loaded(workdir):
    from attnmt.data.tokenizer import Tokenizer

    root, experiment, params = workdir
    return Tokenizer.load(root / "vocab.model"), experiment.model, params


def _decode(**values) -> DecodeConfig:
    return DecodeConfig(
        max_len_offset=5, batch_sentences=4, xla_backend_optimization_level=0, **values
    )


@pytest.mark.parametrize(("utility", "weights"), [("bleu", "model"), ("chrf", "uniform")])
def test_translator_returns_the_mbr_choice_of_its_beam(loaded, utility, weights):
    tokenizer, config, params = loaded
    lists = Translator(
        [config], [params], tokenizer, _decode(beam_size=3), nbest=3
    ).translate_nbest(LINES)
    mbr = Translator(
        [config], [params], tokenizer, _decode(beam_size=3, mbr=utility, mbr_weights=weights)
    )
    got = mbr.translate(LINES)
    metric = REFERENCE_METRICS[utility]
    moved = 0
    for line, best, output in zip(LINES, lists, got, strict=True):
        if not line:
            assert output == ""
            continue
        texts, log_probs = [h.text for h in best], [h.log_prob for h in best]
        assert output == texts[brute_force_choice(texts, log_probs, metric, weights)], line
        moved += output != texts[0]
    if weights == "uniform":
        # Uniform weights move 3 of the 5 lines off the beam's best on this model (model
        # weights none): the comparison tells MBR from the beam's best.
        assert moved >= 1


def test_translator_weighs_the_beam_against_its_samples(loaded):
    tokenizer, config, params = loaded
    # Hot samples, so that they differ from the beam's hypotheses and from each other.
    sampling = dict(temperature=3.0, seed=5)
    lists = Translator(
        [config], [params], tokenizer, _decode(beam_size=3), nbest=3
    ).translate_nbest(LINES)
    values = dict(beam_size=3, mbr="chrf", mbr_samples=4, mbr_sample_share=0.75, **sampling)
    mbr = Translator([config], [params], tokenizer, _decode(**values))
    samples = mbr._samples(LINES, 1)
    # Draw 0 is what sampling the same lines with the same seed writes; the others differ,
    # and none depends on how the lines are batched.
    single = Translator([config], [params], tokenizer, _decode(sample=True, **sampling))
    assert [drawn[0] for drawn in samples] == single.translate(LINES)
    assert any(len(set(drawn)) > 1 for drawn in samples)
    one_by_one = Translator(
        [config], [params], tokenizer, dataclasses.replace(_decode(**values), batch_sentences=1)
    )
    assert one_by_one._samples(LINES, 1) == samples
    got = mbr.translate(LINES)
    moved = 0
    for line, best, drawn, output in zip(LINES, lists, samples, got, strict=True):
        if not line:
            assert output == ""
            continue
        texts, log_probs = [h.text for h in best], [h.log_prob for h in best]
        pick = brute_force_choice(texts, log_probs, REFERENCE_METRICS["chrf"], "model", drawn, 0.75)
        assert output == texts[pick], line
        moved += pick != brute_force_choice(texts, log_probs, REFERENCE_METRICS["chrf"], "model")
    assert moved >= 1  # the samples moved some choice away from the beam-only one


def test_cli_mbr_chooses_among_the_nbest_it_would_write(workdir, tmp_path):
    root = workdir[0]  # decode.beam_size = 2 in its config
    source = tmp_path / "input.txt"
    source.write_text("\n".join(LINES) + "\n")

    def run(name, *flags):
        target = tmp_path / f"{name}.txt"
        argv = ["translate", "--workdir", str(root), "--input", str(source)]
        assert main([*argv, "--output", str(target), "--xla-opt-level", "0", *flags]) == 0
        return target.read_text(encoding="utf-8").split("\n")[:-1]

    rows = [parse_hypothesis(line) for line in run("nbest", "--nbest", "2")]
    chosen = run("mbr", "--mbr", "chrf", "--config.decode.mbr_weights=uniform")
    moved = 0
    assert len(chosen) == len(LINES)
    for number, line in enumerate(LINES, start=1):
        best = [h for n, _, h in rows if n == number]
        if not line:
            assert chosen[number - 1] == ""
            continue
        texts, log_probs = [h.text for h in best], [h.log_prob for h in best]
        pick = brute_force_choice(texts, log_probs, REFERENCE_METRICS["chrf"], "uniform")
        assert chosen[number - 1] == texts[pick], line
        moved += pick != 0
    assert moved >= 1  # 2 of the 5 lines here: not the beam's best throughout


@pytest.mark.parametrize(
    ("own", "asked", "suffix"),
    [
        ({}, {}, ""),
        ({}, {"mbr": "chrf"}, "-mbrchrf"),
        ({}, {"mbr": "bleu", "mbr_weights": "uniform"}, "-mbrbleu-uniform"),
        ({"mbr": "chrf"}, {"mbr": "chrf"}, ""),
        ({"mbr": "chrf"}, {}, "-nombr"),
        ({"mbr": "chrf", "mbr_weights": "uniform"}, {"mbr": "chrf"}, "-mbrchrf"),
        ({}, {"mbr_weights": "uniform"}, ""),  # weights without MBR change nothing
        ({}, {"mbr": "chrf", "mbr_samples": 16}, "-mbrchrf-s16"),
        ({}, {"mbr": "chrf", "mbr_samples": 8, "epsilon": 0.02}, "-mbrchrf-s8-eps0.02"),
        ({}, {"mbr": "bleu", "mbr_samples": 8, "mbr_sample_share": 1.0}, "-mbrbleu-s8-share1"),
        ({"mbr": "chrf", "mbr_samples": 8}, {"mbr": "chrf", "mbr_samples": 8}, ""),
        ({"mbr": "chrf", "mbr_samples": 8}, {"mbr": "chrf"}, "-mbrchrf"),
        ({}, {"epsilon": 0.02, "seed": 3}, ""),  # how samples are drawn, without any drawn
    ],
)
def test_decodes_file_says_which_choice_when_not_the_runs_own(own, asked, suffix):
    # Each choice gets its own decodes file, so a sweep over them overwrites none.
    run = SimpleNamespace(experiment=SimpleNamespace(decode=DecodeConfig(**own)), step=7)
    stem = decodes_stem("val", run, DecodeConfig(**asked), "-ema")
    assert stem == f"val-step7-ema-beam4{suffix}"
