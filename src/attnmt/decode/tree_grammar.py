"""Decoding that can only write well-formed linearized trees over the input's words.

A parsing model's target (attnmt.data.treebank.linearize) is a bracketing such as
``(S (NP XX XX )NP (VP XX )VP )S``, one vocabulary piece per token (the vocabulary keeps
them whole: attnmt.data.prepare.tree_symbols). Left to itself a small model stops early,
loops, or writes the wrong number of leaves, and the repair afterwards flattens what it
cannot place. Here each step bans the tokens that would break the grammar:

- a leaf once the sentence's words are all placed, or outside the root constituent;
- an opening bracket after the root has closed, or when no word is left to fill it;
- a closing bracket other than the innermost open constituent's, one that would leave a
  constituent empty, or the root's before every word is placed;
- EOS before every word is placed and every bracket closed; any other piece always;
- whatever could not be finished within the sentence's length limit (each missing word
  and each open bracket needs a token, and EOS one more).

When the leaves are the words themselves (``(S (NP The cat )NP ...``, data.treebank_leaves =
"words"), the grammar copies: a leaf must be the next piece of the next input word, a word
once begun is finished before any bracket, and every ordinary piece is a leaf piece.

The state (leaves placed, depth, innermost open label) is recomputed from the prefix at
every step, so the search's beams need no extra bookkeeping. A row the grammar cannot
finish at all (its limit too short for its words) is left unconstrained.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from attnmt.common import BOS_ID, EOS_ID, PAD_ID

# Token classes of the grammar.
OTHER, LEAF, OPEN, CLOSE = 0, 1, 2, 3


class _PrefixState(NamedTuple):
    """A prefix's place in the tree, each [batch, k]."""

    leaves: jax.Array  # leaf tokens placed
    depth: jax.Array  # brackets open
    required_close: jax.Array  # id closing the innermost open constituent (-1: any close)
    just_opened: jax.Array  # the last token opened a bracket


class _Moves(NamedTuple):
    """Which token classes may come next, each bool [batch, k]."""

    leaf: jax.Array
    open: jax.Array
    close: jax.Array
    eos: jax.Array


def _allowed_moves(
    state: _PrefixState,
    step: jax.Array,
    needed: jax.Array,
    in_word: jax.Array,
    row_max: jax.Array,
) -> _Moves:
    """The grammar's rules (module docstring) for the token at ``step``; ``needed``: leaf
    tokens each row must place, ``in_word``: a copied word is half written, ``row_max``:
    [batch, 1] length limits."""
    leaves, depth, just_opened = state.leaves, state.depth, state.just_opened

    def fits(new_leaves: jax.Array, new_depth: jax.Array) -> jax.Array:
        # After this token: the missing leaves, one close per open bracket and EOS.
        return (needed - new_leaves) + new_depth + 1 <= row_max - step - 1

    allow_leaf = (leaves < needed) & (depth > 0) & fits(leaves + 1, depth)
    allow_open = (
        ((step == 0) | (depth > 0)) & (leaves < needed) & ~in_word & fits(leaves, depth + 1)
    )
    allow_close = (depth > 0) & ~just_opened & ((depth > 1) | (leaves >= needed)) & ~in_word
    allow_eos = (leaves >= needed) & (depth == 0) & (step > 0)
    return _Moves(allow_leaf, allow_open, allow_close, allow_eos)


@dataclasses.dataclass(frozen=True, eq=False)
class TreeGrammar:
    """Per-vocabulary-id tables: each id's class, and for an opening bracket the id of
    the closing bracket with its label (-1: none in the vocabulary); ``copy_words``: the
    leaves are the input's words, piece by piece; ``label_smoothing``: the ε a copying
    grammar takes back out of the model's probabilities before it scores (0: none)."""

    token_class: np.ndarray  # int32 [vocab]
    closing_id: np.ndarray  # int32 [vocab]
    copy_words: bool = False
    label_smoothing: float = 0.0

    @classmethod
    def from_symbols(
        cls,
        symbols: dict[int, str],
        vocab_size: int,
        copy_words: bool = False,
        label_smoothing: float = 0.0,
    ) -> TreeGrammar | None:
        """From a vocabulary's whole-word pieces (id → token); None without brackets (a
        vocabulary trained before tree tokens were kept whole). With ``copy_words`` every
        piece that is not a bracket or a control token is a leaf piece."""
        token_class = np.full(vocab_size, LEAF if copy_words else OTHER, np.int32)
        token_class[[PAD_ID, EOS_ID, BOS_ID]] = OTHER
        closing_id = np.full(vocab_size, -1, np.int32)
        ids = {token: i for i, token in symbols.items()}
        for i, token in symbols.items():
            if token.startswith("(") and len(token) > 1:
                token_class[i] = OPEN
                closing_id[i] = ids.get(")" + token[1:], -1)
            elif token.startswith(")") and len(token) > 1:
                token_class[i] = CLOSE
            else:
                token_class[i] = LEAF
        if not (token_class == OPEN).any() or not (token_class == LEAF).any():
            return None
        return cls(token_class, closing_id, copy_words, label_smoothing)

    def banned(
        self,
        prefixes: jax.Array,
        step: jax.Array,
        words: jax.Array,
        row_max: jax.Array,
        copy: tuple[jax.Array, jax.Array] | None = None,
    ) -> jax.Array:
        """bool [batch, k, vocab]: tokens that may not come at position ``step``.

        prefixes: [batch, k, L] (positions ≥ step are ignored); words: [batch] leaves each
        sentence needs; row_max: [batch] its length limit, EOS included. A copying grammar
        needs ``copy`` = (pieces, starts), [batch, P] each: every row's words as vocabulary
        ids in order (-1 after the last), and which of them begins a word; ``words`` is then
        ignored.
        """
        token_class = jnp.asarray(self.token_class)
        state = self._prefix_state(token_class, prefixes, step)
        vocab = token_class[None, None, :]  # [1, 1, vocab]
        ids = jnp.arange(token_class.shape[0])
        row_max = row_max[:, None]  # [batch, 1]
        if self.copy_words:
            needed, next_piece, in_word = self._copy_position(state.leaves, copy)
            leaf_ids = (vocab == LEAF) & (ids == next_piece[..., None])
        else:
            needed, in_word = words[:, None], jnp.zeros_like(state.leaves, bool)
            leaf_ids = vocab == LEAF
        allow = _allowed_moves(state, step, needed, in_word, row_max)

        required_close = state.required_close
        close_matches = (required_close[..., None] < 0) | (ids == required_close[..., None])
        allowed = (
            (leaf_ids & allow.leaf[..., None])
            | ((vocab == OPEN) & allow.open[..., None])
            | ((vocab == CLOSE) & allow.close[..., None] & close_matches)
            | ((ids == EOS_ID) & allow.eos[..., None])
        )  # [batch, k, vocab]
        # Rows the grammar cannot finish keep the model's own choices.
        return ~allowed & jnp.any(allowed, axis=-1, keepdims=True)

    def _prefix_state(
        self, token_class: jax.Array, prefixes: jax.Array, step: jax.Array
    ) -> _PrefixState:
        """Where each prefix [batch, k, L] stands in the tree after its first ``step`` tokens."""
        classes = token_class[prefixes]  # [batch, k, L]
        filled = jnp.arange(prefixes.shape[-1]) < step  # [L]
        is_open = (classes == OPEN) & filled
        is_close = (classes == CLOSE) & filled
        depth_after = jnp.cumsum(is_open.astype(jnp.int32) - is_close, axis=-1)  # [batch, k, L]
        depth = depth_after[..., -1]  # [batch, k]
        leaves = jnp.sum((classes == LEAF) & filled, axis=-1)  # [batch, k] leaf tokens
        # The innermost open constituent is the last opening bracket whose depth is the
        # current one (any later one at that depth would still be open itself).
        innermost = is_open & (depth_after == depth[..., None])
        position = jnp.argmax(jnp.where(innermost, jnp.arange(prefixes.shape[-1]), -1), -1)
        innermost_tok = jnp.take_along_axis(prefixes, position[..., None], axis=-1)[..., 0]
        required_close = jnp.asarray(self.closing_id)[innermost_tok]  # [batch, k]
        previous = jnp.take(classes, jnp.maximum(step - 1, 0), axis=-1)  # [batch, k]
        just_opened = (step > 0) & (previous == OPEN)
        return _PrefixState(leaves, depth, required_close, just_opened)

    def _copy_position(
        self, leaves: jax.Array, copy: tuple[jax.Array, jax.Array] | None
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(leaf pieces each row needs [batch, 1], the piece to copy next [batch, k], whether
        it continues a word already begun [batch, k]) after `leaves` leaf pieces."""
        if copy is None:
            raise ValueError("a copying tree grammar needs each row's word pieces")
        pieces, starts = copy
        needed = jnp.sum(pieces >= 0, axis=-1)[:, None]
        at = jnp.minimum(leaves, pieces.shape[-1] - 1)[..., None]  # [batch, k, 1]
        next_piece = jnp.take_along_axis(pieces[:, None, :], at, axis=-1)[..., 0]
        begins = jnp.take_along_axis(starts[:, None, :], at, axis=-1)[..., 0]
        return needed, next_piece, (leaves < needed) & ~begins

    def constrain(
        self,
        prefixes: jax.Array,
        step: jax.Array,
        log_probs: jax.Array,
        words: jax.Array,
        row_max: jax.Array,
        copy: tuple[jax.Array, jax.Array] | None = None,
    ) -> jax.Array:
        """The search's log-probabilities [batch, k, vocab] for position ``step`` under the
        grammar (a :data:`attnmt.decode.beam_search.TokenConstraint`): banned tokens -inf.

        A copying grammar also scores each word as the model's probability of *a* word
        there, whichever it spells (the log-sum of every leaf piece's probability), and the
        rest of a word's pieces as certain: the search then weighs brackets against words,
        and a model not yet sure which word comes next still places its brackets by
        structure, not by how well it would have spelled the forced word.

        With ``label_smoothing`` ε > 0 the probabilities are first mapped back to the data's
        (p - ε/K) / (1 - ε), the inverse of the smoothed target (1 - ε)·onehot + ε/K the
        model was fit to: a model fit to it puts ε/K on every piece, so the sum over the
        word pieces alone gives "a word" about ε at every position, where a bracket is due
        too. What the inverse leaves at or under 0 becomes e^-60 (not -inf: a forced word
        must stay writable).
        """
        banned = self.banned(prefixes, step, words, row_max, copy)
        if self.copy_words:
            if self.label_smoothing > 0:
                log_probs = _unsmoothed(log_probs, self.label_smoothing)
            is_leaf = jnp.asarray(self.token_class == LEAF)
            leaves = jnp.sum(is_leaf[prefixes] & (jnp.arange(prefixes.shape[-1]) < step), -1)
            _, next_piece, in_word = self._copy_position(leaves, copy)
            any_word = jax.nn.logsumexp(jnp.where(is_leaf, log_probs, -jnp.inf), axis=-1)
            copied = jnp.where(in_word, 0.0, any_word)  # [batch, k]
            is_next = jnp.arange(log_probs.shape[-1]) == next_piece[..., None]
            # (where the search itself allows the piece: not past a row's length limit)
            rescore = is_next & is_leaf & (log_probs > -jnp.inf)
            log_probs = jnp.where(rescore, copied[..., None], log_probs)
        return jnp.where(banned, -jnp.inf, log_probs)


def _unsmoothed(log_probs: jax.Array, label_smoothing: float) -> jax.Array:
    """log((p - ε/K) / (1 - ε)) per piece, at least -60; -inf (a search's own ban) kept."""
    floor = label_smoothing / log_probs.shape[-1]
    data = (jnp.exp(log_probs) - floor) / (1.0 - label_smoothing)
    unsmoothed = jnp.log(jnp.maximum(data, _SMALLEST))
    return jnp.where(log_probs > -jnp.inf, unsmoothed, log_probs)


_SMALLEST = float(np.exp(-60.0))
