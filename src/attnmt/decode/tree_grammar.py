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

The state (leaves placed, depth, innermost open label) is recomputed from the prefix at
every step, so the search's beams need no extra bookkeeping. A row the grammar cannot
finish at all (its limit too short for its words) is left unconstrained.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from attnmt.special_tokens import EOS_ID

# Token classes of the grammar.
OTHER, LEAF, OPEN, CLOSE = 0, 1, 2, 3


@dataclasses.dataclass(frozen=True, eq=False)
class TreeGrammar:
    """Per-vocabulary-id tables: each id's class, and for an opening bracket the id of
    the closing bracket with its label (-1: none in the vocabulary)."""

    token_class: np.ndarray  # int32 [vocab]
    closing_id: np.ndarray  # int32 [vocab]

    @classmethod
    def from_symbols(cls, symbols: dict[int, str], vocab_size: int) -> TreeGrammar | None:
        """From a vocabulary's whole-word pieces (id → token); None without brackets (a
        vocabulary trained before tree tokens were kept whole)."""
        token_class = np.full(vocab_size, OTHER, np.int32)
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
        return cls(token_class, closing_id)

    def banned(
        self, prefixes: jax.Array, step: jax.Array, words: jax.Array, row_max: jax.Array
    ) -> jax.Array:
        """bool [batch, k, vocab]: tokens that may not come at position ``step``.

        prefixes: [batch, k, L] (positions ≥ step are ignored); words: [batch] leaves each
        sentence needs; row_max: [batch] its length limit, EOS included.
        """
        token_class = jnp.asarray(self.token_class)
        classes = token_class[prefixes]  # [batch, k, L]
        filled = jnp.arange(prefixes.shape[-1]) < step  # [L]
        is_open = (classes == OPEN) & filled
        is_close = (classes == CLOSE) & filled
        depth_after = jnp.cumsum(is_open.astype(jnp.int32) - is_close, axis=-1)  # [batch, k, L]
        depth = depth_after[..., -1]  # [batch, k]
        leaves = jnp.sum((classes == LEAF) & filled, axis=-1)  # [batch, k]
        # The innermost open constituent is the last opening bracket whose depth is the
        # current one (any later one at that depth would still be open itself).
        innermost = is_open & (depth_after == depth[..., None])
        position = jnp.argmax(jnp.where(innermost, jnp.arange(prefixes.shape[-1]), -1), -1)
        innermost_tok = jnp.take_along_axis(prefixes, position[..., None], axis=-1)[..., 0]
        required_close = jnp.asarray(self.closing_id)[innermost_tok]  # [batch, k]
        previous = jnp.take(classes, jnp.maximum(step - 1, 0), axis=-1)  # [batch, k]
        just_opened = (step > 0) & (previous == OPEN)

        words, row_max = words[:, None], row_max[:, None]  # [batch, 1]

        def fits(new_leaves: jax.Array, new_depth: jax.Array) -> jax.Array:
            # After this token: the missing words, one close per open bracket and EOS.
            return (words - new_leaves) + new_depth + 1 <= row_max - step - 1

        allow_leaf = (leaves < words) & (depth > 0) & fits(leaves + 1, depth)
        allow_open = ((step == 0) | (depth > 0)) & (leaves < words) & fits(leaves, depth + 1)
        allow_close = (depth > 0) & ~just_opened & ((depth > 1) | (leaves >= words))
        allow_eos = (leaves >= words) & (depth == 0) & (step > 0)

        vocab = token_class[None, None, :]  # [1, 1, vocab]
        ids = jnp.arange(token_class.shape[0])
        close_matches = (required_close[..., None] < 0) | (ids == required_close[..., None])
        allowed = (
            ((vocab == LEAF) & allow_leaf[..., None])
            | ((vocab == OPEN) & allow_open[..., None])
            | ((vocab == CLOSE) & allow_close[..., None] & close_matches)
            | ((ids == EOS_ID) & allow_eos[..., None])
        )  # [batch, k, vocab]
        # Rows the grammar cannot finish keep the model's own choices.
        return ~allowed & jnp.any(allowed, axis=-1, keepdims=True)
