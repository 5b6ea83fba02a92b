"""Where each Marian vocabulary id goes in attnmt, and back.

attnmt keeps its special ids fixed (pad 0, eos 1, unk 3: data, loss and search rely on
them), while a Marian vocabulary puts `</s>` at 0, `<unk>` at 1 and `<pad>` (also the
decoder's start token) last. Importing therefore permutes the vocabulary: the three special
tokens move to attnmt's ids and every other piece keeps its relative order in the ids left
(2, 4, 5, …). The model computes the same function with its embedding rows permuted alike.
Marian has no separate BOS, so id 2 holds an ordinary piece.
"""

from __future__ import annotations

import numpy as np

from attnmt.common import EOS_ID, PAD_ID, UNK_ID


def marian_ids_in_attnmt_order(size: int, pad: int, eos: int, unk: int) -> np.ndarray:
    """`order[a]` is the Marian id of attnmt id `a` (a permutation of 0..size-1)."""
    special = {PAD_ID: pad, EOS_ID: eos, UNK_ID: unk}
    others = iter(i for i in range(size) if i not in special.values())
    return np.asarray([special[a] if a in special else next(others) for a in range(size)])


def attnmt_ids_in_marian_order(size: int) -> np.ndarray:
    """The Marian layout an export writes: `order[m]` is the attnmt id of Marian id `m`:
    eos, unk, the ordinary pieces in attnmt's order, and pad last (opus-mt's layout; the
    inverse of importing a vocabulary laid out so)."""
    ordinary = [a for a in range(size) if a not in (PAD_ID, EOS_ID, UNK_ID)]
    return np.asarray([EOS_ID, UNK_ID, *ordinary, PAD_ID])
