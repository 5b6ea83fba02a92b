"""§5.4 label-smoothed cross-entropy, summed over non-pad target tokens; for a parsing model
that copies its input's words, optionally over words as one class
(`train.word_leaves_as_one_class`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from attnmt.common import PAD_ID
from attnmt.data.tokenizer import WORD_START
from attnmt.decode.tree_grammar import LEAF, TreeGrammar


def token_losses(
    logits: jax.Array, targets: jax.Array, label_smoothing: float
) -> tuple[jax.Array, jax.Array]:
    """Per-token smoothed loss and plain negative log-likelihood.

    The smoothed target puts 1 - ε on the reference token and spreads ε uniformly over
    all K vocabulary entries, u(k) = 1/K (Szegedy et al., 2016, which §5.4 cites).
    logits [batch, length, vocab] float32, targets [batch, length] → two [batch, length].
    """
    logits = logits.astype(jnp.float32)
    log_normalizer = jax.nn.logsumexp(logits, axis=-1)
    # A one-hot product instead of a gather: its gradient is a fused elementwise op, where
    # a gather's is a scatter that XLA:CPU runs slowly (measured: half the step time).
    one_hot = targets[..., None] == jnp.arange(logits.shape[-1], dtype=targets.dtype)
    target_logit = jnp.sum(jnp.where(one_hot, logits, 0.0), axis=-1)
    nll = log_normalizer - target_logit
    uniform = log_normalizer - jnp.mean(logits, axis=-1)
    smoothed = (1.0 - label_smoothing) * nll + label_smoothing * uniform
    return smoothed, nll


@dataclasses.dataclass(frozen=True, eq=False)
class WordClasses:
    """Which vocabulary entries a copying tree grammar treats as leaf pieces, and which of
    them begin a word: the constants of `train.word_leaves_as_one_class`'s loss."""

    leaf: np.ndarray  # bool [vocab]: TreeGrammar's LEAF pieces (copy_words=True)
    begins: np.ndarray  # bool [vocab]: leaf pieces that start with the word mark "▁"

    @classmethod
    def from_vocabulary(
        cls, whole_words: dict[int, str], pieces: Sequence[str], vocab_size: int
    ) -> WordClasses | None:
        """From a vocabulary's whole-word pieces (id → token, as `Tokenizer.whole_words`),
        every id's piece (`Tokenizer.pieces`) and the model's vocab_size (≥ len(pieces));
        None when the vocabulary keeps no bracket whole (the grammar cannot copy)."""
        grammar = TreeGrammar.from_symbols(whole_words, vocab_size, copy_words=True)
        if grammar is None:
            return None
        # The grammar's own rule, so that training and decoding agree on what a leaf is.
        leaf = grammar.token_class == LEAF
        marked = np.zeros(vocab_size, bool)
        marked[: len(pieces)] = [piece.startswith(WORD_START) for piece in pieces]
        # Each input word is encoded on its own at decoding and its first piece begins it;
        # sentencepiece marks exactly that piece with "▁" (ids past the vocabulary, never a
        # label, begin nothing).
        return cls(leaf, leaf & marked)


def word_class_token_losses(
    logits: jax.Array, targets: jax.Array, label_smoothing: float, classes: WordClasses
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """`token_losses` over the collapsed classes: every non-leaf entry, and one class WORD
    for all leaf pieces together (log-probability: the log-sum of theirs), which is what a
    copying tree grammar scores a word by (TreeGrammar.constrain).

    Returns per-token (smoothed loss, nll, correct, weight): a leaf label that begins a word
    is scored as WORD; one that continues a word gets weight 0 (the grammar forces it), as
    does padding. ε spreads over the K' collapsed classes. Without leaf pieces this is
    `token_losses` exactly.
    """
    leaf, begins = np.asarray(classes.leaf, bool), np.asarray(classes.begins, bool)
    if logits.shape[-1] != leaf.shape[0]:
        raise ValueError(f"logits have {logits.shape[-1]} entries, the classes {leaf.shape[0]}")
    # Label lookups in constant tables: integer indices, so no gradient flows through them.
    weights = (targets != PAD_ID) & ~jnp.asarray(leaf & ~begins)[targets]
    if not leaf.any():
        smoothed, nll = token_losses(logits, targets, label_smoothing)
        correct = jnp.argmax(logits, axis=-1) == targets
        return smoothed, nll, correct.astype(jnp.float32), weights.astype(jnp.float32)
    logits = logits.astype(jnp.float32)
    log_normalizer = jax.nn.logsumexp(logits, axis=-1)
    is_leaf = jnp.asarray(leaf)
    word_logit = jax.nn.logsumexp(jnp.where(is_leaf, logits, -jnp.inf), axis=-1)
    # One-hot masks, not gathers, on the logits (see token_losses).
    one_hot = targets[..., None] == jnp.arange(logits.shape[-1], dtype=targets.dtype)
    target_logit = jnp.sum(jnp.where(one_hot, logits, 0.0), axis=-1)
    label_is_word = is_leaf[targets]
    target_logit = jnp.where(label_is_word, word_logit, target_logit)
    nll = log_normalizer - target_logit
    other_logits = jnp.where(is_leaf, 0.0, logits)
    num_classes = int((~leaf).sum()) + 1
    collapsed_mean = (jnp.sum(other_logits, axis=-1) + word_logit) / num_classes
    uniform = log_normalizer - collapsed_mean
    smoothed = (1.0 - label_smoothing) * nll + label_smoothing * uniform
    # The collapsed argmax, WORD first among equals.
    others = jnp.where(is_leaf, -jnp.inf, logits)
    predicts_word = word_logit >= jnp.max(others, axis=-1)
    correct = jnp.where(
        label_is_word, predicts_word, ~predicts_word & (jnp.argmax(others, axis=-1) == targets)
    )
    return smoothed, nll, correct.astype(jnp.float32), weights.astype(jnp.float32)


def loss_sums(
    logits: jax.Array,
    targets: jax.Array,
    label_smoothing: float,
    word_classes: WordClasses | None = None,
) -> dict[str, jax.Array]:
    """Sums over real (non-pad) target tokens; divide by "tokens" for per-token values.

    With `word_classes`, over the collapsed classes of `word_class_token_losses`, whose
    forced word continuations count nowhere (not in "tokens" either)."""
    if word_classes is not None:
        smoothed, nll, correct, weights = word_class_token_losses(
            logits, targets, label_smoothing, word_classes
        )
        return {
            "loss": jnp.sum(smoothed * weights),
            "nll": jnp.sum(nll * weights),
            "correct": jnp.sum(correct * weights),
            "tokens": jnp.sum(weights),
        }
    weights = (targets != PAD_ID).astype(jnp.float32)
    smoothed, nll = token_losses(logits, targets, label_smoothing)
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return {
        "loss": jnp.sum(smoothed * weights),
        "nll": jnp.sum(nll * weights),
        "correct": jnp.sum(correct * weights),
        "tokens": jnp.sum(weights),
    }
