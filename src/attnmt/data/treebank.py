"""Penn Treebank trees for constituency parsing as translation (Transformer paper §6.3).

The paper follows "Grammar as a Foreign Language" (Vinyals et al. 2015): a parse tree becomes a
target "sentence" of brackets, the source is the plain word sequence, and a seq2seq model learns
the mapping. This module holds the pure-Python part of that recipe (no numpy, no jax):

* reading the combined-format ``.mrg`` files (:func:`read_trees`, :func:`read_treebank`, which
  selects files by number so a config can split train/dev/test by file range);
* the standard cleanup (:func:`preprocess`): drop ``-NONE-`` empty elements and every
  constituent left empty by that, strip function tags and indices (``NP-SBJ-1`` → ``NP``,
  ``PP-LOC=2`` → ``PP``) and drop the outer unlabelled root bracket. Unary chains are kept as
  they are, including a constituent whose only child got the same label after stripping
  (``(NP (NP ...))``): EVALB counts both brackets, so removing one would change the gold
  standard the scores are compared against;
* GaFL linearization (:func:`linearize`) and its inverse with repair (:func:`delinearize`),
  which turns any token sequence a model emits into a well-formed tree over the source words;
* one-line PTB bracketing (:func:`to_bracketed`, :func:`parse_bracketed`), the format EVALB and
  other parsers' tools read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from attnmt.errors import DataError

__all__ = [
    "DEFAULT_ROOT_LABEL",
    "EMPTY_ELEMENT",
    "Tree",
    "delinearize",
    "iter_linearized",
    "linearize",
    "parse_bracketed",
    "parse_trees",
    "preprocess",
    "preterminals",
    "read_treebank",
    "read_trees",
    "retag",
    "strip_function_tags",
    "tags",
    "to_bracketed",
    "treebank_files",
    "words",
]

EMPTY_ELEMENT = "-NONE-"
# Labels of an outer bracket that only wraps the real tree: PTB's "( (S ...) )", tgrep's TOP.
ROOT_WRAPPER_LABELS = frozenset({"", "TOP", "ROOT"})
DEFAULT_ROOT_LABEL = "S"
# Tag for leaves that delinearize must invent when pos=None gives it no predicted tag.
UNKNOWN_TAG = "XX"

_ATOM = re.compile(r"\(|\)|[^\s()]+")
_FORBIDDEN_IN_ATOM = re.compile(r"[\s()]")
_WHITESPACE = re.compile(r"\s")
_FUNCTION_TAG_START = re.compile(r"[-=]")
_FILE_NUMBER = re.compile(r"(\d+)\.mrg$", re.IGNORECASE)


@dataclass(frozen=True)
class Tree:
    """A constituent (``label`` over non-empty ``children``) or a preterminal (POS tag + word).

    Exactly one of ``children`` and ``word`` is given, and no label or word holds whitespace
    (words may hold parentheses; :func:`to_bracketed` escapes them), so every ``Tree`` is well
    formed by construction and can always be written as a bracketing.
    """

    label: str
    children: tuple[Tree, ...] = field(default=())
    word: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "children", tuple(self.children))
        if (self.word is None) == (not self.children):
            raise ValueError(f"tree {self.label!r} needs exactly one of children and a word")
        if _FORBIDDEN_IN_ATOM.search(self.label) or (self.word is not None and not self.label):
            raise ValueError(f"invalid label {self.label!r}")
        if self.word is not None and (not self.word or _WHITESPACE.search(self.word)):
            raise ValueError(f"invalid word {self.word!r} (empty or with whitespace)")

    @property
    def is_preterminal(self) -> bool:
        return self.word is not None


def preterminals(tree: Tree) -> list[Tree]:
    """The (POS, word) leaves left to right; iterative so deep repaired trees are fine."""
    found: list[Tree] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if node.is_preterminal:
            found.append(node)
        else:
            stack.extend(reversed(node.children))
    return found


def words(tree: Tree) -> list[str]:
    """The source side of the translation task: the sentence's words in order."""
    return [leaf.word for leaf in preterminals(tree) if leaf.word is not None]


def tags(tree: Tree) -> list[str]:
    """POS tags in word order (EVALB uses the gold ones to find punctuation)."""
    return [leaf.label for leaf in preterminals(tree)]


def retag(tree: Tree, new_tags: Sequence[str]) -> Tree:
    """The tree with its i-th preterminal's tag replaced by ``new_tags[i]`` (same words and
    brackets): e.g. a parse written with XX tags given the gold tags, so that EVALB, which
    finds punctuation by each tree's own tags, can score it. Iterative, for deep trees.

    Raises ValueError if the numbers of leaves and tags differ.
    """
    leaves = preterminals(tree)
    if len(leaves) != len(new_tags):
        raise ValueError(f"the tree has {len(leaves)} leaves but {len(new_tags)} tags were given")
    next_tag = iter(new_tags)
    built: list[Tree] = []  # finished subtrees, left to right
    stack: list[tuple[Tree, bool]] = [(tree, False)]
    while stack:
        node, children_done = stack.pop()
        if node.is_preterminal:
            built.append(Tree(next(next_tag), word=node.word))
        elif children_done:
            children = tuple(built[-len(node.children) :])
            del built[-len(node.children) :]
            built.append(Tree(node.label, children))
        else:
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(node.children))
    return built[0]


# --------------------------------------------------------------------------- reading


class _OpenBracket:
    """A bracket being read: its label, then either one word or subtrees."""

    def __init__(self, line: int) -> None:
        self.line = line
        self.label: str | None = None
        self.word: str | None = None
        self.children: list[Tree] = []

    def add_atom(self, atom: str, where: str) -> None:
        if self.label is None and not self.children:
            self.label = atom
        elif self.word is None and not self.children:
            self.word = atom
        else:
            raise DataError(f"{where}: unexpected {atom!r} in ({self.label or ''} ...)")

    def add_child(self, child: Tree, where: str) -> None:
        if self.word is not None:
            raise DataError(f"{where}: ({self.label} {self.word} ...) mixes a word and subtrees")
        if self.label is None:
            self.label = ""  # PTB's unlabelled outer bracket "( (S ...) )"
        self.children.append(child)

    def close(self, where: str) -> Tree:
        if self.label is None:
            raise DataError(f"{where}: empty brackets ()")
        if self.word is None and not self.children:
            raise DataError(f"{where}: ({self.label}) has neither a word nor subtrees")
        return Tree(self.label, tuple(self.children), self.word)


def parse_trees(text: str, source: str = "<string>") -> list[Tree]:
    """Every tree in ``text`` (any layout, several per line or file), labels as written.

    Raises :class:`DataError` naming ``source`` and the line of the problem, because a corrupt
    treebank file should stop data preparation with a message the user can act on.
    """
    trees: list[Tree] = []
    stack: list[_OpenBracket] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        where = f"{source}, line {lineno}"
        for atom in _ATOM.findall(line):
            if atom == "(":
                stack.append(_OpenBracket(lineno))
            elif atom == ")":
                if not stack:
                    raise DataError(f"{where}: ')' closes nothing")
                node = stack.pop().close(where)
                if stack:
                    stack[-1].add_child(node, where)
                else:
                    trees.append(node)
            elif not stack:
                raise DataError(f"{where}: {atom!r} outside any tree")
            else:
                stack[-1].add_atom(atom, where)
    if stack:
        raise DataError(f"{source}, line {stack[0].line}: the tree opened here is never closed")
    return trees


def parse_bracketed(text: str) -> Tree:
    """One tree from its bracketing (e.g. a line of :func:`to_bracketed` output).

    Words stay as written (``-LRB-`` is not turned back into ``(``), as in the treebank itself.
    """
    trees = parse_trees(text)
    if len(trees) != 1:
        raise DataError(f"expected one tree, found {len(trees)} in {text[:80]!r}")
    return trees[0]


def read_trees(path: str | Path) -> list[Tree]:
    """All trees of one ``.mrg`` file, unprocessed (outer bracket, -NONE-, function tags)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read treebank file {path}: {err}") from err
    return parse_trees(text, source=str(path))


def treebank_files(folder: str | Path, first: int, last: int) -> list[Path]:
    """The ``*NNNN.mrg`` files under ``folder`` (recursively) numbered ``first..last``.

    PTB numbers files section*100 + file (``wsj_2300.mrg`` is section 23), so the usual
    splits are ranges: 0200-2199 train, 2200-2299 dev, 2300-2399 test. Sorted by number.
    """
    root = Path(folder)
    if not root.is_dir():
        raise DataError(f"treebank folder {root} does not exist")
    numbered = []
    for path in root.rglob("*"):
        match = _FILE_NUMBER.search(path.name)
        if match and path.is_file() and first <= int(match.group(1)) <= last:
            numbered.append((int(match.group(1)), str(path), path))
    if not numbered:
        raise DataError(f"no .mrg files numbered {first:04d}-{last:04d} under {root}")
    return [path for _, _, path in sorted(numbered)]


def read_treebank(folder: str | Path, first: int, last: int) -> list[Tree]:
    """The trees of the files numbered ``first..last`` (inclusive), in file order."""
    return [tree for path in treebank_files(folder, first, last) for tree in read_trees(path)]


# --------------------------------------------------------------------------- preprocessing


def strip_function_tags(label: str) -> str:
    """``NP-SBJ-1`` → ``NP``, ``PP-LOC=2`` → ``PP``; labels starting with ``-`` stay whole.

    Function tags and coindexation are annotation on top of the phrase category; parsers are
    trained and scored (EVALB does the same stripping) on the bare category. ``-LRB-``,
    ``-NONE-`` and similar labels begin with the separator and are kept intact.
    """
    if label.startswith("-"):
        return label
    return _FUNCTION_TAG_START.split(label, maxsplit=1)[0] or label


def _clean(tree: Tree) -> Tree | None:
    """Without -NONE- leaves and the constituents they leave empty (None if nothing is left),
    nonterminal labels stripped of function tags."""
    if tree.is_preterminal:
        return None if tree.label == EMPTY_ELEMENT else tree
    kept = tuple(child for child in (_clean(child) for child in tree.children) if child is not None)
    if not kept:
        return None
    return Tree(strip_function_tags(tree.label), kept)


def preprocess(tree: Tree) -> Tree:
    """The tree a parser is trained and scored on (see the module docstring for why).

    Removes ``-NONE-`` elements and constituents left empty, strips function tags and indices
    from nonterminals (POS tags are kept as they are), and drops an outer unlabelled (or TOP /
    ROOT) bracket that holds a single constituent. Unary chains are kept. A wrapper over
    several constituents or over a lone preterminal is relabelled ``S`` instead, so the
    result is always one labelled constituent, which :func:`delinearize` reproduces exactly.
    """
    cleaned = _clean(tree)
    if cleaned is None:
        raise ValueError("the tree holds only -NONE- elements")
    while cleaned.label in ROOT_WRAPPER_LABELS and len(cleaned.children) == 1:
        if cleaned.children[0].is_preterminal:
            return Tree(DEFAULT_ROOT_LABEL, cleaned.children)
        cleaned = cleaned.children[0]
    if cleaned.label in ROOT_WRAPPER_LABELS:
        return Tree(DEFAULT_ROOT_LABEL, cleaned.children)
    return cleaned


# --------------------------------------------------------------------------- linearization


def _is_label(text: str) -> bool:
    return bool(text) and not _FORBIDDEN_IN_ATOM.search(text)


LEAF_KINDS = ("pos", "words")


def _check_leaves(pos: str | None, leaves: str) -> None:
    if leaves not in LEAF_KINDS:
        raise ValueError(f"leaves must be one of {', '.join(LEAF_KINDS)}, got {leaves!r}")
    if pos is not None and not _is_label(pos):
        raise ValueError(f"pos token {pos!r} must be non-empty, without spaces or parentheses")


def linearize(tree: Tree, pos: str | None = "XX", leaves: str = "pos") -> list[str]:
    """GaFL target tokens: ``(S (NP XX XX )NP ... )S``, depth first.

    Every preterminal becomes the one token ``pos`` (GaFL normalises all POS tags to XX, so the
    model predicts brackets, not tags); ``pos=None`` keeps each real tag as its token instead.
    ``leaves="words"`` writes each preterminal's word instead (``(S (NP The cat )NP ...``,
    parentheses escaped as in :func:`to_bracketed`): the decoder then sees which word it has
    reached instead of counting XXs, and a copying grammar (attnmt.decode.tree_grammar)
    keeps the words exact.
    """
    _check_leaves(pos, leaves)
    tokens: list[str] = []
    stack: list[Tree | str] = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            tokens.append(item)
        elif item.is_preterminal and leaves == "words":
            tokens.append(escape_word(item.word or ""))
        elif item.is_preterminal:
            tokens.append(item.label if pos is None else pos)
        else:
            tokens.append("(" + item.label)
            stack.append(")" + item.label)
            stack.extend(reversed(item.children))
    return tokens


class _TreeBuilder:
    """The repairing reader behind :func:`delinearize`: a stack of open constituents."""

    def __init__(self, words: Sequence[str], pos: str | None, leaves: str) -> None:
        self.words = list(words)
        self.pos = pos
        self.leaves = leaves
        self.used = 0
        self.top: list[Tree] = []
        self.open: list[tuple[str, list[Tree]]] = []

    def feed(self, token: str) -> None:
        if token.startswith("("):
            if _is_label(token[1:]):
                self.open.append((token[1:], []))
        elif token.startswith(")"):
            if self.open:
                self._close()
        elif self._is_leaf(token) and self.used < len(self.words):
            self._attach(Tree(self._tag(token), word=self.words[self.used]))
            self.used += 1
        # anything else (garbage, surplus leaves) is dropped

    def _is_leaf(self, token: str) -> bool:
        if self.leaves == "words":
            return not token.startswith(("(", ")"))
        return token == self.pos or (self.pos is None and _is_label(token))

    def _tag(self, token: str) -> str:
        if self.leaves == "words":
            return UNKNOWN_TAG if self.pos is None else self.pos
        return token

    def _attach(self, node: Tree) -> None:
        (self.open[-1][1] if self.open else self.top).append(node)

    def _close(self) -> None:
        label, children = self.open.pop()
        if children:  # an empty constituent has no span: drop it
            self._attach(Tree(label, tuple(children)))

    def finish(self, root_label: str) -> Tree:
        tag = UNKNOWN_TAG if self.pos is None else self.pos
        missing = [Tree(tag, word=word) for word in self.words[self.used :]]
        if self.open:
            self.open[-1][1].extend(missing)
        elif len(self.top) == 1 and not self.top[0].is_preterminal:
            only = self.top[0]
            self.top[0] = Tree(only.label, only.children + tuple(missing))
        else:
            self.top.extend(missing)
        while self.open:
            self._close()
        if len(self.top) == 1 and not self.top[0].is_preterminal:
            return self.top[0]
        return Tree(root_label, tuple(self.top))


def delinearize(
    tokens: Sequence[str],
    words: Sequence[str],
    pos: str | None = "XX",
    root_label: str = DEFAULT_ROOT_LABEL,
    leaves: str = "pos",
) -> Tree:
    """The tree a model's output tokens describe, repaired so it is always well formed.

    A decoder may emit anything, and EVALB scores only well-formed trees over the gold words,
    so every sequence is turned into one whose leaves are exactly ``words`` in order. Rules,
    applied left to right:

    * ``(LABEL`` opens a constituent; a bare ``(`` or a label with parentheses is dropped.
    * Any token starting with ``)`` closes the innermost open constituent; the label after it
      is ignored (so ``)NP`` may close a VP); a close with nothing open is dropped.
    * A leaf token (``pos``; with ``pos=None`` any other token, which becomes the predicted
      tag; with ``leaves="words"`` any token not starting with a parenthesis, tagged ``pos``
      or ``XX``) takes the next unused word, whatever the token says, so the leaves are
      always ``words``; leaf tokens beyond the last word are dropped.
    * Every other token (garbage) is dropped.
    * At the end, unused words become leaves appended to the innermost constituent still
      open, or else to the single top-level constituent, or else at the top level; their tag
      is ``pos`` (``XX`` when ``pos=None``). Constituents still open are then closed.
    * A constituent closed without children is removed (recursively, as its parent may then
      be empty too).
    * If the top level is not exactly one constituent (several constituents, bare leaves),
      it is wrapped in one ``root_label`` constituent.

    Raises ValueError if ``words`` is empty (a tree needs at least one leaf) or a word holds
    whitespace.
    """
    if not words:
        raise ValueError("cannot build a tree over zero words")
    if not _is_label(root_label):
        raise ValueError(f"invalid root label {root_label!r}")
    _check_leaves(pos, leaves)
    builder = _TreeBuilder(words, pos, leaves)
    for token in tokens:
        builder.feed(token)
    return builder.finish(root_label)


# --------------------------------------------------------------------------- writing


def escape_word(word: str) -> str:
    return word.replace("(", "-LRB-").replace(")", "-RRB-")


def to_bracketed(tree: Tree) -> str:
    """One-line PTB bracketing, ``(S (NP (XX The) (XX cat)) ...)``, for EVALB and friends.

    Parentheses in words are written ``-LRB-`` / ``-RRB-`` (the PTB convention) so the line
    reads back with :func:`parse_bracketed`.
    """
    pieces: list[str] = []
    stack: list[Tree | str] = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            pieces.append(item)
            continue
        if pieces:
            pieces.append(" ")
        if item.is_preterminal and item.word is not None:
            pieces.append(f"({item.label} {escape_word(item.word)})")
        else:
            pieces.append("(" + item.label)
            stack.append(")")
            stack.extend(reversed(item.children))
    return "".join(pieces)


def iter_linearized(
    trees: Sequence[Tree], pos: str | None = "XX", leaves: str = "pos"
) -> Iterator[tuple[str, str]]:
    """(source line, target line) pairs: the words (parentheses escaped, as the target's
    copied words are) and the linearized tree, space-joined."""
    for tree in trees:
        source = " ".join(escape_word(word) for word in words(tree))
        yield source, " ".join(linearize(tree, pos, leaves))
