"""Translating raw text with a real (tiny, random) model: one line out per line in."""

import functools
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.common import BOS_ID, EOS_ID, PAD_ID
from attnmt.config.decode import DecodeConfig
from attnmt.config.model import ModelConfig
from attnmt.config.xla import compiler_options
from attnmt.data.tokenizer import Tokenizer, train_vocab
from attnmt.decode.translate import Translator, decode_batch
from attnmt.model.transformer import Transformer
from tests.helpers import random_params, tiny_model

WORDS = "the a dog cat runs sits on mat red blue big small house tree".split()  # noqa: SIM905


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    import random

    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) for _ in range(300)]
    path = tmp_path_factory.mktemp("vocab") / "vocab.model"
    train_vocab(lines, path, vocab_size=48)
    return Tokenizer.load(path)


@pytest.fixture(scope="module")
def model_and_params(tokenizer):
    config = tiny_model(vocab_size=48, num_layers=1, max_length=24)
    return config, random_params(config, 0)


@pytest.fixture(scope="module")
def translators(model_and_params, tokenizer):
    """translators(beam) → (the greedy / beam Translator, the warnings it gives from now on):
    one per beam size for the whole module, so each shape compiles once."""
    made: dict[int, tuple[Translator, list[str]]] = {}

    def get(beam: int) -> tuple[Translator, list[str]]:
        if beam not in made:
            config, params = model_and_params
            decode = DecodeConfig(
                beam_size=beam,
                max_len_offset=5,
                batch_sentences=4,
                xla_backend_optimization_level=0,  # compiles faster; the tests compare text
            )
            warnings: list[str] = []
            made[beam] = (
                Translator([config], [params], tokenizer, decode, warn=warnings.append),
                warnings,
            )
        made[beam][1].clear()
        return made[beam]

    return get


@pytest.mark.parametrize("beam", [1, 3])
def test_one_output_per_input_in_order(translators, beam):
    translator, warnings = translators(beam)
    lines = [
        "the dog runs",
        "",
        "   ",
        "a red house on the mat",
        "cat",
        " ".join(["tree"] * 40),
        "big small big small",
    ]
    outputs = translator.translate(lines)
    assert len(outputs) == len(lines)
    assert outputs[1] == "" and outputs[2] == ""
    assert len(warnings) == 1 and "line 6" in warnings[0]
    # Batching by length must not change any translation: compare with one at a time.
    for line, output in zip(lines, outputs, strict=True):
        assert translator.translate([line]) == [output]


def test_stream_writes_exactly_one_line_per_input(translators):
    translator, _ = translators(1)
    source = io.StringIO("the dog\n\nred\r\nblue mat\n")
    target = io.StringIO()
    count = translator.translate_stream(source, target, chunk_lines=2)
    assert count == 4
    written = target.getvalue().split("\n")
    assert written[-1] == "" and len(written) == 5
    assert written[1] == ""


# XLA's backend at optimisation level 0 (decode.xla_backend_optimization_level) compiles
# these searches about twice as fast; the tests compare token ids, not timings.
FAST_COMPILE = compiler_options(0)


@functools.cache
def _jitted_decode(configs: tuple[ModelConfig, ...], **settings):
    """decode_batch compiled as a Translator compiles it (configs and settings fixed,
    parameters and source traced), once per setting and batch shape for all the tests."""
    decode = functools.partial(decode_batch, list(configs), **settings)
    return jax.jit(decode, compiler_options=FAST_COMPILE)


def _decode(configs, params_list, src, **settings):
    return np.asarray(_jitted_decode(tuple(configs), **settings)(list(params_list), src))


@functools.cache
def _jitted_forward(config: ModelConfig):
    model = Transformer(config)

    def forward(params, src, tgt):
        return model.apply({"params": params}, src, tgt)

    return jax.jit(forward, compiler_options=FAST_COMPILE)


def _greedy_without_cache(config, params, src, steps):
    """Brute force: rerun the whole teacher-forced model on the prefix at every step (no
    cache, no search). The target buffer is `steps` wide, the prefix followed by filler:
    the logits at the prefix's end see only the prefix (the decoder is causal, as
    tests/model/test_transformer.py holds), and one compiled forward serves every step."""
    forward = _jitted_forward(config)
    out = np.full((src.shape[0], steps), EOS_ID, np.int32)
    for step in range(steps):
        # Position `step` reads BOS + out[:step] and predicts the token after the prefix.
        logits = forward(params, src, out)
        logp = np.array(jax.nn.log_softmax(logits[:, step].astype(jnp.float32)))
        logp[:, [PAD_ID, BOS_ID]] = -np.inf
        out[:, step] = np.argmax(logp, axis=-1)
    return out


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("initial_cache_length", [0, 1, 3])
def test_cached_search_with_beam_invariant_cross_attention_matches_brute_force(
    model_and_params, beam, initial_cache_length
):
    config, params = model_and_params
    src = jnp.array([[5, 9, 7, EOS_ID, PAD_ID], [11, 6, 8, 12, EOS_ID], [13, EOS_ID, 0, 0, 0]])
    kwargs = dict(
        beam_size=beam,
        alpha=0.6,
        max_len_offset=4,
        max_positions=None,
        initial_cache_length=initial_cache_length,
    )
    got = _decode([config], [params], src, **kwargs)
    if initial_cache_length:
        # Growing caches (room 1, 2, 4, 8, 9 or 3, 6, 9) must have grown in this batch.
        assert (got != PAD_ID).sum(axis=1).max() > 2 * initial_cache_length
        full = _decode([config], [params], src, **{**kwargs, "initial_cache_length": 0})
        np.testing.assert_array_equal(got, full)
    if beam == 1:
        expected = _greedy_without_cache(config, params, src, got.shape[1])
        for row in range(src.shape[0]):
            eos = list(got[row]).index(EOS_ID)
            limit = int(np.sum(np.asarray(src[row]) != PAD_ID)) + 4  # input length + offset
            # An EOS at the row's limit is forced (the brute force has no limit).
            end = eos + 1 if eos < limit - 1 else eos
            np.testing.assert_array_equal(got[row, :end], expected[row, :end])
    # Each sentence decoded alone gives the same result: no beam attends to another
    # sentence's encoder keys/values. "Alone": in a batch of copies of itself (the same
    # compiled shape), where reading another row's keys/values would change nothing.
    for row in range(src.shape[0]):
        copies = _decode([config], [params], jnp.broadcast_to(src[row], src.shape), **kwargs)
        np.testing.assert_array_equal(copies, np.broadcast_to(got[row], got.shape))


def test_ensemble_with_growing_caches_matches_full_caches(model_and_params):
    # An ensemble carries a tuple of caches; growing must reach every member's.
    config, params = model_and_params
    other = random_params(config, 1)
    src = jnp.array([[5, 9, 7, EOS_ID, PAD_ID], [11, 6, 8, 12, EOS_ID]])
    kwargs = dict(beam_size=2, alpha=0.6, max_len_offset=6, max_positions=None)
    configs, both = [config, config], [params, other]
    full = _decode(configs, both, src, **kwargs, initial_cache_length=0)
    grown = _decode(configs, both, src, **kwargs, initial_cache_length=2)
    assert (full != PAD_ID).sum(axis=1).max() > 4  # room 2 → 4 → 8 → 11 was used
    np.testing.assert_array_equal(grown, full)


def _sampler(model_and_params, tokenizer, **decode):
    config, params = model_and_params
    settings = {"max_len_offset": 5, "batch_sentences": 4, "sample": True, **decode}
    settings.setdefault("xla_backend_optimization_level", 0)
    return Translator([config], [params], tokenizer, DecodeConfig(**settings))


SAMPLED = ["the dog runs", "a red house", "", "cat", "big small big small", "tree", "mat on"]


def test_sampling_is_fixed_by_the_seed_whatever_the_batching(model_and_params, tokenizer):
    first = _sampler(model_and_params, tokenizer, seed=7).translate(SAMPLED)
    again = _sampler(model_and_params, tokenizer, seed=7).translate(SAMPLED)
    rebatched = _sampler(model_and_params, tokenizer, seed=7, batch_sentences=2)
    assert again == first
    assert rebatched.translate(SAMPLED) == first
    # Line i is drawn from its own key: alone, at the same line number, it comes out the same.
    assert [rebatched.translate([line], first_line=i + 1)[0] for i, line in enumerate(SAMPLED)] == (
        first
    )
    other = _sampler(model_and_params, tokenizer, seed=8).translate(SAMPLED)
    # A random model over 44 pieces: two seeds agreeing on every line is (1/44)^6-unlikely.
    assert other != first and first[2] == other[2] == ""


def test_top_1_sampling_is_greedy_search(model_and_params, tokenizer, translators):
    greedy = translators(1)[0].translate(SAMPLED)
    sampled = _sampler(model_and_params, tokenizer, seed=3, top_k=1, temperature=2.0)
    assert sampled.translate(SAMPLED) == greedy
    hot = _sampler(model_and_params, tokenizer, seed=3, temperature=5.0).translate(SAMPLED)
    assert hot != greedy  # the setting reaches the search: full sampling is not greedy
