"""train.word_leaves_as_one_class: a copying parser's loss over the tree grammar's decisions
(every non-leaf entry, and all leaf pieces as one class WORD; a word's later pieces not
counted), against a NumPy float64 reference; the default loss untouched; the config check;
and a tiny parsing run trained and validated with it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.common import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from attnmt.config import load_experiment
from attnmt.config.parallel import ParallelConfig
from attnmt.data.parsing import treebank_pairs
from attnmt.data.tokenizer import Tokenizer
from attnmt.decode.tree_grammar import LEAF, TreeGrammar
from attnmt.errors import ConfigError
from attnmt.model.transformer import Transformer
from attnmt.parallel.mesh import make_mesh
from attnmt.train.assemble import build_trainer
from attnmt.train.loss import WordClasses, loss_sums
from attnmt.train.program import build_program
from tests.helpers import CONFIGS, TINY_MODEL_OVERRIDES, tiny_experiment

# A made-up vocabulary: the special ids, whole brackets (sentencepiece keeps the word mark
# on them), words that begin with the mark and pieces that continue a word.
PIECES = [
    "<pad>",
    "</s>",
    "<s>",
    "<unk>",
    "▁(S",
    "▁)S",
    "▁(NP",
    "▁)NP",
    "▁the",
    "▁cat",
    "s",
    "▁run",
    "ning",
    "▁.",
]
WHOLE_WORDS = {4: "(S", 5: ")S", 6: "(NP", 7: ")NP"}
VOCAB = len(PIECES) + 2  # the model's output layer padded past the vocabulary
BRACKETS, BEGINS, CONTINUES = (4, 5, 6, 7), (8, 9, 11, 13), (10, 12)


def _classes() -> WordClasses:
    classes = WordClasses.from_vocabulary(WHOLE_WORDS, PIECES, VOCAB)
    assert classes is not None
    return classes


def test_the_classes_are_the_copying_grammars_leaves_and_the_marked_pieces():
    classes = _classes()
    leaf = np.ones(VOCAB, bool)
    leaf[[PAD_ID, EOS_ID, BOS_ID, *BRACKETS]] = False  # UNK and the padded ids are leaves
    np.testing.assert_array_equal(classes.leaf, leaf)
    grammar = TreeGrammar.from_symbols(WHOLE_WORDS, VOCAB, copy_words=True)
    np.testing.assert_array_equal(classes.leaf, grammar.token_class == LEAF)
    np.testing.assert_array_equal(np.flatnonzero(classes.begins), BEGINS)
    assert WordClasses.from_vocabulary({}, PIECES, VOCAB) is None  # no brackets kept whole


def _logsumexp(x: np.ndarray) -> float:
    top = x.max()
    return float(top + np.log(np.exp(x - top).sum()))


def _reference(logits: np.ndarray, targets: np.ndarray, eps: float, classes: WordClasses):
    """Sums over the counted positions, and d loss / d logits, in float64: the smoothed
    cross-entropy against the collapsed classes [WORD, each non-leaf id]."""
    leaf, begins = classes.leaf, classes.begins
    others = np.flatnonzero(~leaf)
    sums = {"loss": 0.0, "nll": 0.0, "correct": 0.0, "tokens": 0.0}
    grad = np.zeros(logits.shape)
    for index in np.ndindex(targets.shape):
        label = int(targets[index])
        if label == PAD_ID or (leaf[label] and not begins[label]):
            continue
        row = logits[index].astype(np.float64)
        log_p = row - _logsumexp(row)
        collapsed = np.concatenate([[_logsumexp(log_p[leaf])], log_p[others]])
        target = 0 if leaf[label] else 1 + int(np.flatnonzero(others == label)[0])
        smoothed = np.full(len(collapsed), eps / len(collapsed))
        smoothed[target] += 1.0 - eps
        sums["loss"] += -(smoothed * collapsed).sum()
        sums["nll"] += -collapsed[target]
        sums["correct"] += float(np.argmax(collapsed) == target)  # WORD first among ties
        sums["tokens"] += 1.0
        # d(-log P_c)/d logit_k = p_k - [k in c] p_k / P_c, weighted by the smoothed target.
        p = np.exp(log_p)
        grad[index] = p
        grad[index][leaf] -= smoothed[0] * p[leaf] / np.exp(collapsed[0])
        grad[index][others] -= smoothed[1:]
    return sums, grad


def _batch(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random logits [3, 9, VOCAB] and labels of every kind, padding included; half the
    positions lean towards their label, so the accuracy counts both outcomes."""
    rng = np.random.default_rng(seed)
    kinds = [PAD_ID, EOS_ID, UNK_ID, *BRACKETS, *BEGINS, *CONTINUES]
    targets = rng.choice(kinds, size=(3, 9)).astype(np.int32)
    targets[0, :3] = (4, 8, 10)  # a bracket, a word begun, a word continued
    logits = rng.normal(0.0, 2.0, size=(3, 9, VOCAB)).astype(np.float32)
    lean = rng.random((3, 9)) < 0.5
    rows, cols = np.nonzero(lean)
    logits[rows, cols, targets[rows, cols]] += 6.0
    return logits, targets


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_loss_sums_and_gradients_match_a_float64_reference(eps, seed):
    logits, targets = _batch(seed)
    classes = _classes()
    expected, expected_grad = _reference(logits, targets, eps, classes)

    def loss(x):
        sums = loss_sums(x, jnp.asarray(targets), eps, classes)
        return sums["loss"], sums

    grad, sums = jax.jit(jax.grad(loss, has_aux=True))(jnp.asarray(logits))
    assert 0 < expected["correct"] < expected["tokens"]  # the accuracy is exercised
    for key, value in expected.items():
        np.testing.assert_allclose(float(sums[key]), value, rtol=1e-5, err_msg=key)
    np.testing.assert_allclose(np.asarray(grad), expected_grad, rtol=1e-4, atol=1e-6)


def test_without_leaf_pieces_it_is_the_plain_loss_bit_for_bit():
    logits, targets = _batch(2)
    none = WordClasses(np.zeros(VOCAB, bool), np.zeros(VOCAB, bool))
    plain = jax.jit(lambda x, y: loss_sums(x, y, 0.1))(logits, targets)
    collapsed = jax.jit(lambda x, y: loss_sums(x, y, 0.1, none))(logits, targets)
    for key in plain:
        assert np.asarray(collapsed[key]) == np.asarray(plain[key]), key


def _tiny_program(overrides: list[str], word_classes: WordClasses | None = None):
    settings = ["--config.model.vocab_size=16", "--config.model.num_layers=1"]
    experiment = tiny_experiment([*settings, *overrides])
    mesh = make_mesh(ParallelConfig(data=1), jax.devices()[:1])
    return build_program(experiment, mesh, word_classes)


def test_with_the_option_off_the_steps_keep_the_plain_loss_exactly():
    # The classes are ignored when the option is off: the eval step is today's loss_sums.
    program = _tiny_program([], _classes())
    params = program.init_state().params
    rng = np.random.default_rng(3)
    batch = {
        "src_tokens": rng.integers(4, 16, size=(2, 8)).astype(np.int32),
        "tgt_tokens": rng.integers(0, 16, size=(2, 8)).astype(np.int32),
    }
    model = Transformer(program.experiment.model)
    smoothing = program.experiment.train.label_smoothing

    def today(params, batch):  # the eval step's loss as it was before the option
        logits = model.apply({"params": params}, batch["src_tokens"], batch["tgt_tokens"])
        return loss_sums(logits, batch["tgt_tokens"], smoothing)

    expected = jax.jit(today)(params, batch)
    got = jax.jit(program.plain.eval_step)(params, batch)
    for key in expected:
        assert np.asarray(got[key]) == np.asarray(expected[key]), key


def test_the_option_needs_a_treebank_whose_leaves_are_the_words():
    on = "--config.train.word_leaves_as_one_class=true"
    with pytest.raises(ConfigError, match=r"train\.word_leaves_as_one_class"):
        tiny_experiment([on])
    parsing = str(CONFIGS / "wsj_parsing.py:variant=sample")
    with pytest.raises(ConfigError, match=r"train\.word_leaves_as_one_class"):
        load_experiment(parsing, [on, "--config.data.treebank_leaves=pos"])
    experiment = load_experiment(parsing, [on])
    assert experiment.train.word_leaves_as_one_class
    # A program built without the vocabulary's classes could not apply it.
    with pytest.raises(ConfigError, match=r"train\.word_leaves_as_one_class"):
        build_program(experiment, make_mesh(ParallelConfig(data=1), jax.devices()[:1]))


SPLITS = "train=2-10,dev=1-1"  # as tests/decode/test_parsing.py


@pytest.mark.slow
def test_a_parser_trains_and_validates_on_words_as_one_class(ptb_sample_dir, tmp_path):
    overrides = [
        f"--config.data.data_dir={ptb_sample_dir}",
        f"--config.data.treebank_splits={SPLITS}",
        "--config.model.vocab_size=300",
        "--config.data.max_length=128",
        "--config.data.pack_length=128",
        *TINY_MODEL_OVERRIDES,
        "--config.data.tokens_per_batch=1024",
        "--config.parallel.num_devices=1",
        "--config.train.word_leaves_as_one_class=true",
        "--config.train.num_steps=3",
        "--config.optim.warmup_steps=3",
        "--config.train.eval_every_steps=1000",
        "--config.train.checkpoint_every_steps=1000",
        "--config.train.time_limit_minutes=0",
        "--config.train.memory_preflight=false",
        "--config.train.xla_backend_optimization_level=1",
    ]
    experiment = load_experiment(str(CONFIGS / "wsj_parsing.py:variant=sample"), overrides)
    trainer = build_trainer(experiment, tmp_path / "run")
    result = trainer.run()
    assert result.step == 3 and np.isfinite(result.last_train["loss"])
    evaluation = trainer.evaluate()
    assert np.isfinite(evaluation["nll"]) and 0.0 <= evaluation["accuracy"] <= 1.0

    # Validation counts one decision per word, per bracket and for EOS: the target's
    # whitespace tokens and one more per tree, whatever pieces its words take.
    dev = treebank_pairs("dev", str(ptb_sample_dir), SPLITS, "XX", "words")
    assert evaluation["tokens"] == sum(len(tree.split()) + 1 for _, tree in dev)

    # The words' first pieces, as decoding splits its input (Translator._grammar_inputs:
    # each word encoded alone), are exactly the pieces the loss takes to begin a word.
    tokenizer = Tokenizer.load(tmp_path / "run" / "vocab.model")
    classes = WordClasses.from_vocabulary(
        tokenizer.whole_words(), tokenizer.pieces(range(tokenizer.vocab_size)), 300
    )
    assert classes is not None
    for sentence, _ in dev:
        for word in sentence.split():
            pieces = tokenizer.encode(word)
            assert classes.begins[pieces[0]] and not classes.begins[pieces[1:]].any(), word
            assert classes.leaf[pieces].all(), word
