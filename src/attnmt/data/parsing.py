"""The parsing task's data (§6.3): a user's treebank folder, split by file number, as
(words, linearized tree) sentence pairs for the translation pipeline.

`data.treebank_splits` names each split's inclusive file-number range, e.g. the WSJ
standard "train=200-2199,dev=2200-2299,test=2300-2399" (sections 02-21 / 22 / 23) or, for
NLTK's 179-file sample, "train=1-159,dev=160-179". Trees are preprocessed (no empty
elements or function tags) before they are linearized; the same trees are the gold
standard of evaluation.
"""

from __future__ import annotations

import functools
from pathlib import Path

from attnmt.data.treebank import Tree, iter_linearized, preprocess, read_treebank
from attnmt.errors import ConfigError, DataError
from attnmt.storage import local_only


def parse_splits(text: str) -> dict[str, tuple[int, int]]:
    """ "train=1-159,dev=160-179" → {"train": (1, 159), "dev": (160, 179)}."""
    splits: dict[str, tuple[int, int]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, span = item.partition("=")
        first, dash, last = span.partition("-")
        if not (equals and dash and name.strip() and first.isdigit() and last.isdigit()):
            raise ConfigError(
                f"data.treebank_splits: {item!r} is not NAME=FIRST-LAST "
                "(e.g. train=200-2199,dev=2200-2299,test=2300-2399)"
            )
        if int(first) > int(last):
            raise ConfigError(f"data.treebank_splits: {item!r} has its first file after its last")
        splits[name.strip()] = (int(first), int(last))
    if not splits:
        raise ConfigError("data.treebank_splits is empty; e.g. train=1-159,dev=160-179")
    return splits


@functools.lru_cache(maxsize=8)
def _trees(folder: str, first: int, last: int) -> tuple[Tree, ...]:
    return tuple(preprocess(tree) for tree in read_treebank(folder, first, last))


def treebank_trees(split: str, data_dir: str, splits: str) -> list[Tree]:
    """The preprocessed gold trees of `split`, in file and sentence order."""
    ranges = parse_splits(splits)
    if split not in ranges:
        raise DataError(
            f"treebank: no split {split!r} in data.treebank_splits ({', '.join(ranges)})"
        )
    # The trees are read with a local walk of the folder (cached per process): copy a
    # treebank in a bucket to local disk first.
    local_only(data_dir, "treebank data.data_dir")
    if not data_dir or not Path(data_dir).is_dir():
        raise DataError(
            f"treebank: data.data_dir={data_dir!r} is not a folder of .mrg files (bring your "
            "own Penn Treebank; NLTK's sample has wsj_0001-0199.mrg)"
        )
    return list(_trees(str(Path(data_dir).resolve()), *ranges[split]))


def treebank_pairs(
    split: str, data_dir: str, splits: str, pos: str, leaves: str = "pos"
) -> list[tuple[str, str]]:
    """(space-joined words, space-joined linearized tree) of every tree of `split`; `pos`
    is the token every POS tag becomes ("XX", as Vinyals et al.; "" keeps the tags), and
    `leaves` says whether the tree's leaves are those tokens ("pos") or the words."""
    trees = treebank_trees(split, data_dir, splits)
    return list(iter_linearized(trees, pos or None, leaves))
