"""The tree grammar of parsing decodes, against brute force: the token sequences it lets
through are exactly the well-formed linearized trees with the sentence's number of leaves
that fit the length limit, and a search under it always ends in one of them."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.common import BOS_ID, EOS_ID, PAD_ID
from attnmt.config.xla import compiler_options
from attnmt.decode import beam_search as search
from attnmt.decode.tree_grammar import TreeGrammar
from tests.helpers import is_tree, tree_leaves

# ids 0-3 are the special tokens; 4 is an ordinary word piece the grammar must never allow.
SYMBOLS = {5: "(S", 6: ")S", 7: "(NP", 8: ")NP", 9: "XX", 10: "(VP"}  # no ")VP" piece
VOCAB = 12
TREE_IDS = sorted(SYMBOLS)


MAX_LIMIT = 8  # the longest length limit of the brute-force tests (EOS included)


@functools.cache
def _all_trees() -> dict[int, frozenset[tuple[str, ...]]]:
    """Leaf count → every tree of at most MAX_LIMIT - 1 tokens over the pieces: every
    sequence enumerated, once for all the tests."""
    pieces = [SYMBOLS[i] for i in TREE_IDS]
    closers = frozenset(token[1:] for token in pieces if token.startswith(")"))
    found: dict[int, set[tuple[str, ...]]] = {}
    for n in range(1, MAX_LIMIT):
        for tokens in itertools.product(pieces, repeat=n):
            leaves = tree_leaves(tokens, closers)
            if leaves is not None:
                found.setdefault(leaves, set()).add(tokens)
    return {leaves: frozenset(trees) for leaves, trees in found.items()}


def brute_force(leaves: int, limit: int) -> set[tuple[str, ...]]:
    """All trees with `leaves` leaves of at most limit - 1 tokens (EOS takes the last slot)
    over the pieces, `(VP` closed by any closing bracket (the vocabulary has no `)VP`)."""
    assert limit <= MAX_LIMIT
    return {tokens for tokens in _all_trees().get(leaves, ()) if len(tokens) < limit}


@functools.cache
def jitted_banned(copy_words: bool) -> tuple[TreeGrammar, Callable[..., jax.Array]]:
    """The grammar of SYMBOLS (BRACKETS with copy_words) and its jitted `banned`, shared by
    every test: each prefix shape compiles once."""
    grammar = TreeGrammar.from_symbols(BRACKETS if copy_words else SYMBOLS, VOCAB, copy_words)
    assert grammar is not None and grammar.copy_words == copy_words
    return grammar, jax.jit(grammar.banned)


def grammar_walk(
    copy_words: bool,
    leaves: int,
    limit: int,
    copy: tuple[np.ndarray, np.ndarray] | None = None,
    names: dict[int, str] = SYMBOLS,
    never: frozenset[int] = frozenset({PAD_ID, 4, 11}),
) -> set[tuple[str, ...]]:
    """Every sequence the grammar allows, step by step, until EOS (`copy`: one row's word
    pieces and starts, for a copying grammar). Prefixes are MAX_LIMIT wide whatever the
    limit (positions from the step on are ignored), so that few shapes compile."""
    _, banned_fn = jitted_banned(copy_words)
    done, frontier = set(), [()]
    for step in range(limit):
        if not frontier:
            break
        rows = 1 << max(4, (len(frontier) - 1).bit_length())  # few shapes to compile
        prefixes = np.full((rows, 1, MAX_LIMIT), PAD_ID, np.int32)
        for row, prefix in enumerate(frontier):
            prefixes[row, 0, :step] = prefix
        rows_copy = None if copy is None else tuple(np.repeat(a[None], rows, 0) for a in copy)
        banned = np.asarray(
            banned_fn(
                prefixes,
                jnp.asarray(step),
                jnp.full(rows, leaves),
                jnp.full(rows, limit),
                rows_copy,
            )
        )[:, 0]
        next_frontier = []
        for row, prefix in enumerate(frontier):
            allowed = np.flatnonzero(~banned[row])
            # Never a dead end: something is always allowed, and never a stray piece.
            assert len(allowed) and allowed.size < VOCAB, prefix
            assert not never & set(allowed.tolist()), prefix
            for token in allowed.tolist():
                if token == EOS_ID:
                    done.add(tuple(names[i] for i in prefix))
                else:
                    next_frontier.append((*prefix, token))
        frontier = next_frontier
    assert not frontier, "prefixes still open at the length limit"
    return done


def test_the_brute_force_closes_vp_with_any_bracket_and_the_rest_by_label():
    """The reference itself, on hand cases: `(VP` (no `)VP` piece) takes any closing
    bracket, `(NP` only its own."""
    closers = frozenset({"S", "NP"})
    assert tree_leaves(("(S", "(VP", "XX", ")NP", ")S"), closers) == 1
    assert tree_leaves(("(VP", "XX", ")S"), closers) == 1
    assert tree_leaves(("(S", "(NP", "XX", ")S", ")S"), closers) is None
    assert tree_leaves(("(S", "(VP", ")NP", ")S"), closers) is None  # empty constituent
    assert tree_leaves(("(S", "(VP", "XX", ")NP", ")S")) is None  # labels must match
    assert ("(VP", "XX", ")S") in brute_force(1, 5)
    assert ("(S", "(VP", "XX", ")NP", ")S") not in brute_force(1, 5)  # 5 tokens + EOS > 5
    assert ("(S", "(VP", "XX", ")NP", ")S") in brute_force(1, 6)


@pytest.mark.parametrize("leaves, limit", [(1, 5), (1, 7), (2, 7), (3, 8)])
def test_the_grammar_allows_exactly_the_trees_with_the_words_that_fit(leaves, limit):
    # (VP has no closing piece in this vocabulary, so any closing bracket may close it.
    allowed = grammar_walk(False, leaves, limit)
    expected = brute_force(leaves, limit)
    assert allowed == expected
    assert any("(VP" in tokens for tokens in expected) == (leaves + 3 <= limit)
    assert expected or leaves + 3 > limit


# A copying grammar's vocabulary: the brackets kept whole, every other id a word piece.
BRACKETS = {i: token for i, token in SYMBOLS.items() if token[0] in "()"}
PIECES = {3: "<unk>", 4: "▁a", 9: "▁b", 11: "c"}


@pytest.mark.parametrize(
    "sentence, limit",
    [([[4]], 6), ([[9, 11]], 7), ([[4], [4]], 8), ([[9, 11], [3]], 8), ([[4, 11, 11]], 8)],
)
def test_a_copying_grammar_writes_exactly_the_trees_over_the_words_pieces(sentence, limit):
    """The sequences allowed are the brute-force trees with one XX per word, each XX spelled
    out as that word's pieces, that fit the limit."""
    grammar, _ = jitted_banned(True)
    width = 6
    pieces = np.full(width, -1, np.int32)
    starts = np.zeros(width, bool)
    flat = [p for word in sentence for p in word]
    pieces[: len(flat)] = flat
    starts[np.cumsum([0] + [len(word) for word in sentence[:-1]])] = True
    names = {**BRACKETS, **PIECES}
    allowed = grammar_walk(True, 99, limit, (pieces, starts), names, frozenset({PAD_ID, BOS_ID}))
    expected = set()
    for tree in brute_force(len(sentence), limit):
        spelled, word = [], iter(sentence)
        for token in tree:
            spelled += [PIECES[p] for p in next(word)] if token == "XX" else [token]
        if len(spelled) + 1 <= limit:
            expected.add(tuple(spelled))
    assert expected and any("(VP" in tokens for tokens in expected)
    assert allowed == expected
    with pytest.raises(ValueError, match="word pieces"):
        grammar.banned(jnp.zeros((1, 1, 4), jnp.int32), jnp.asarray(0), jnp.ones(1), jnp.ones(1))


def test_a_limit_too_short_for_the_words_leaves_the_row_unconstrained():
    _, banned_fn = jitted_banned(False)
    prefixes = jnp.full((16, 1, MAX_LIMIT), PAD_ID, jnp.int32)
    words, limits = jnp.full(16, 5).at[1].set(1), jnp.full(16, 4)
    banned = np.asarray(banned_fn(prefixes, jnp.asarray(0), words, limits, None))
    assert not banned[0].any() and banned[1].any()  # row 1's one word fits: constrained


def test_a_vocabulary_without_tree_pieces_has_no_grammar():
    assert TreeGrammar.from_symbols({5: "▁x"}, VOCAB) is None
    assert TreeGrammar.from_symbols({}, VOCAB) is None


def spelled_out_words(ids: list[int], pieces: list[int], starts: list[bool]) -> tuple[str, ...]:
    """A copying grammar's output with each word's pieces checked against the sentence and
    replaced by one XX: brackets only between words, every piece in order."""
    skeleton, at = [], 0
    for i, token in enumerate(ids):
        if token in BRACKETS:
            skeleton.append(BRACKETS[token])
            continue
        assert at < len(pieces) and token == pieces[at], (ids, pieces)
        if starts[at]:
            skeleton.append("XX")
        else:
            assert ids[i - 1] not in BRACKETS, ids
        at += 1
    assert at == len(pieces), (ids, pieces)
    return tuple(skeleton)


@pytest.mark.parametrize("copy_words", [False, True])
def test_beam_and_greedy_search_under_the_grammar_write_trees(copy_words):
    """A random 'model' (fixed random logits per step) under the grammar: every finished
    hypothesis of beam search and greedy decoding is a tree with each row's leaf count (its
    words' pieces, for a copying grammar)."""
    symbols = BRACKETS if copy_words else SYMBOLS
    matched = {i: token for i, token in symbols.items() if token != "(VP"}
    grammar = TreeGrammar.from_symbols(matched, VOCAB, copy_words=copy_words)
    batch, beam, max_len = 3, 3, 14
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.normal(size=(max_len, VOCAB)) * 3, jnp.float32)
    leaf_counts = jnp.asarray([1, 2, 3])
    row_max = jnp.asarray([12, 10, 14])
    sentences = [[[4]], [[9, 11], [4]], [[4], [9, 11, 11], [3]]]
    pieces = np.full((batch, 6), -1, np.int32)
    starts = np.zeros((batch, 6), bool)
    for row, sentence in enumerate(sentences):
        flat = [p for word in sentence for p in word]
        pieces[row, : len(flat)] = flat
        starts[row, np.cumsum([0] + [len(word) for word in sentence[:-1]])] = True
    copy = (jnp.asarray(pieces), jnp.asarray(starts)) if copy_words else None

    def tokens_to_logits(tokens, cache):
        step = cache
        return jnp.broadcast_to(table[step], (tokens.shape[0], VOCAB)), step + 1

    def constraint(prefixes, step, log_probs):
        return grammar.constrain(prefixes, step, log_probs, leaf_counts, row_max, copy)

    common = dict(
        batch_size=batch, max_decode_len=max_len, max_lengths=row_max, constraint=constraint
    )

    @functools.partial(jax.jit, compiler_options=compiler_options(0))  # compiles faster
    def both_searches():
        beams, scores = search.beam_search(
            tokens_to_logits, jnp.asarray(0), beam_size=beam, alpha=0.3, **common
        )
        greedy, _ = search.greedy_search(tokens_to_logits, jnp.asarray(0), **common)
        return beams, scores, greedy

    beams, scores, greedy = both_searches()
    outputs = [(b, np.asarray(beams)[b, k]) for b in range(batch) for k in range(beam)]
    outputs += [(b, np.asarray(greedy)[b]) for b in range(batch)]
    assert np.isfinite(np.asarray(scores)).all()
    for row, ids in outputs:
        ids = ids.tolist()
        assert EOS_ID in ids, ids
        ids = ids[: ids.index(EOS_ID)]
        if copy_words:
            real = pieces[row][pieces[row] >= 0].tolist()
            tokens = spelled_out_words(ids, real, starts[row][: len(real)].tolist())
        else:
            tokens = tuple(SYMBOLS[i] for i in ids)
        assert is_tree(tokens, int(leaf_counts[row])), tokens
        assert len(ids) + 1 <= int(row_max[row])


def test_a_copying_grammar_scores_a_word_as_the_chance_of_any_word():
    """Against float64 NumPy: at a word's first piece the forced piece is scored with the
    log-sum of every leaf piece's probability, a later piece of the word with 0, brackets
    keep their own, banned tokens -inf."""
    grammar, _ = jitted_banned(True)
    constrain = jax.jit(grammar.constrain)
    rng = np.random.default_rng(1)
    log_probs = rng.normal(size=(1, 3, VOCAB)) - 3.0
    # Beam 0: "(S" placed, the next word "▁b c" begins; beam 1: "(S ▁b" placed, "c" next;
    # beam 2: "(S ▁b c", the next word "▁a" begins.
    prefixes = np.full((1, 3, 8), PAD_ID, np.int32)
    prefixes[0, 0, :1] = [5]
    prefixes[0, 1, :2] = [5, 9]
    prefixes[0, 2, :3] = [5, 9, 11]
    steps = [1, 2, 3]
    pieces = np.asarray([[9, 11, 4, -1]], np.int32)
    starts = np.asarray([[True, False, True, False]])
    leaf_ids = [i for i in range(VOCAB) if i not in BRACKETS and i not in (PAD_ID, 1, BOS_ID)]
    for beam, step in enumerate(steps):
        got = np.asarray(
            constrain(
                jnp.asarray(prefixes[:, beam : beam + 1]),
                jnp.asarray(step),
                jnp.asarray(log_probs[:, beam : beam + 1], jnp.float32),
                jnp.asarray([2]),
                jnp.asarray([8]),
                (jnp.asarray(pieces), jnp.asarray(starts)),
            ),
            np.float64,
        )[0, 0]
        row = log_probs[0, beam]
        any_word = np.log(np.sum(np.exp(row[leaf_ids])))
        next_piece = {0: 9, 1: 11, 2: 4}[beam]
        expected_leaf = 0.0 if beam == 1 else any_word
        np.testing.assert_allclose(got[next_piece], expected_leaf, rtol=1e-5, atol=1e-5)
        others = [i for i in leaf_ids if i != next_piece]
        assert np.all(got[others] == -np.inf)
        if beam == 1:  # inside a word: nothing but its next piece
            assert np.isfinite(got).sum() == 1
        else:  # between words: "(NP" may open, keeping the model's own score
            np.testing.assert_allclose(got[7], row[7], rtol=1e-5, atol=1e-6)


def _constrain_first_word(grammar: TreeGrammar, log_probs: np.ndarray) -> np.ndarray:
    """grammar.constrain after "(S", where the word "▁b c" (pieces 9, 11) begins next."""
    prefixes = np.full((1, 1, 8), PAD_ID, np.int32)
    prefixes[0, 0, 0] = 5
    pieces = np.asarray([[9, 11, 4, -1]], np.int32)
    starts = np.asarray([[True, False, True, False]])
    got = grammar.constrain(
        jnp.asarray(prefixes),
        jnp.asarray(1),
        jnp.asarray(log_probs[None, None], jnp.float32),
        jnp.asarray([2]),
        jnp.asarray([8]),
        (jnp.asarray(pieces), jnp.asarray(starts)),
    )
    return np.asarray(got, np.float64)[0, 0]


def test_unsmoothing_inverts_the_smoothed_target_before_the_word_sum():
    """Against float64 NumPy: with ε the scores are those of (p - ε/K) / (1 - ε), floored at
    e^-60, the forced piece the sum over the leaf pieces; a search's -inf stays -inf."""
    epsilon = 0.3
    grammar = TreeGrammar.from_symbols(BRACKETS, VOCAB, True, label_smoothing=epsilon)
    rng = np.random.default_rng(4)
    logits = rng.normal(size=VOCAB) * 2.0
    log_probs = logits - np.log(np.sum(np.exp(logits)))
    log_probs[3] = -np.inf  # a leaf piece the search itself ruled out
    got = _constrain_first_word(grammar, log_probs)
    data = (np.exp(log_probs) - epsilon / VOCAB) / (1 - epsilon)
    leaf_ids = [i for i in range(VOCAB) if i not in BRACKETS and i not in (PAD_ID, 1, BOS_ID)]
    expected_word = np.log(np.sum(np.maximum(data[[i for i in leaf_ids if i != 3]], np.exp(-60))))
    np.testing.assert_allclose(got[9], expected_word, rtol=1e-5, atol=1e-5)
    for bracket in (7, 10):  # "(NP", "(VP" may open here
        expected = np.log(max(data[bracket], np.exp(-60)))
        np.testing.assert_allclose(got[bracket], expected, rtol=1e-5, atol=1e-4)
    assert np.all(np.isneginf(got[[i for i in leaf_ids if i != 9]]))


def test_unsmoothing_lets_a_bracket_win_where_the_smoothing_floor_favoured_the_word():
    """A model fit to the smoothed target of data "(NP" 0.5 / the next word 0.45 / "(VP"
    0.05: summed over the four leaf pieces, the floors ε/K make the word the likelier
    move (0.415 against 0.375); taken back out, the bracket is (0.5 against 0.45)."""
    epsilon = 0.3
    data = np.zeros(VOCAB)
    data[7], data[9], data[10] = 0.5, 0.45, 0.05
    log_probs = np.log((1 - epsilon) * data + epsilon / VOCAB)
    smoothed = _constrain_first_word(TreeGrammar.from_symbols(BRACKETS, VOCAB, True), log_probs)
    assert smoothed[9] > smoothed[7]
    np.testing.assert_allclose(np.exp(smoothed[[9, 7]]), [0.415, 0.375], rtol=1e-5)
    grammar = TreeGrammar.from_symbols(BRACKETS, VOCAB, True, label_smoothing=epsilon)
    unsmoothed = _constrain_first_word(grammar, log_probs)
    assert unsmoothed[7] > unsmoothed[9]
    np.testing.assert_allclose(np.exp(unsmoothed[[7, 9, 10]]), [0.5, 0.45, 0.05], rtol=1e-5)
