"""Per-head statistics that explain a head at a glance (no jax, NumPy only).

For each (kind, layer, head), averaged over the query positions of one or more views:
- entropy: of each query's distribution, in nats (0: all weight on one key; ln(keys):
  uniform);
- distance: mean |query position − key position| under the weights (self-attention only;
  for cross-attention positions of two sentences are not comparable, so it is NaN);
- previous / same / next: the weight on the key one position before, at, or after the
  query's position (self-attention only);
- special: the weight on the sentence-boundary key, EOS for source keys and `<s>` for the
  decoder's own keys: heads that park their weight there are often doing "nothing".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from attnmt.inspection.view import KINDS, AttentionView

STATISTICS = ("entropy", "distance", "previous", "same", "next", "special")


@dataclasses.dataclass(frozen=True)
class HeadStatistics:
    kind: str
    layer: int
    head: int
    entropy: float
    distance: float
    previous: float
    same: float
    next: float
    special: float

    def row(self) -> dict[str, float | int | str]:
        return dataclasses.asdict(self)


def _diagonal_share(weights: np.ndarray, offset: int) -> np.ndarray:
    """Per query q: the weight on key q + offset (0 where that key does not exist)."""
    queries, keys = weights.shape
    share = np.zeros(queries)
    for q in range(queries):
        k = q + offset
        if 0 <= k < keys:
            share[q] = weights[q, k]
    return share


def head_values(view: AttentionView, kind: str, layer: int, head: int) -> dict[str, float]:
    """The statistics of one head on one view."""
    weights = view.head(kind, layer, head).astype(np.float64)  # [queries, keys]
    queries, keys = weights.shape
    entropy = -np.sum(np.where(weights > 0, weights * np.log(np.maximum(weights, 1e-30)), 0.0), -1)
    # The boundary key: EOS closes the source (its last position); `<s>` opens the
    # decoder's inputs (its first).
    special = weights[:, 0] if kind == "decoder" else weights[:, keys - 1]
    values = {"entropy": entropy.mean(), "special": special.mean()}
    if kind == "cross":
        values.update(distance=np.nan, previous=np.nan, same=np.nan, next=np.nan)
    else:
        gap = np.abs(np.arange(queries)[:, None] - np.arange(keys)[None, :])
        values.update(
            distance=np.sum(weights * gap, -1).mean(),
            previous=_diagonal_share(weights, -1).mean(),
            same=_diagonal_share(weights, 0).mean(),
            next=_diagonal_share(weights, 1).mean(),
        )
    return {name: float(value) for name, value in values.items()}


def head_statistics(views: Sequence[AttentionView]) -> list[HeadStatistics]:
    """Every head's statistics, each the mean over `views` (one sentence each)."""
    if not views:
        raise ValueError("no views to summarise")
    rows = []
    for kind in KINDS:
        for layer in range(views[0].depth(kind)):
            for head in range(views[0].num_heads):
                per_view = [head_values(view, kind, layer, head) for view in views]
                means = {s: float(np.mean([v[s] for v in per_view])) for s in STATISTICS}
                rows.append(HeadStatistics(kind, layer, head, **means))
    return rows


def format_table(rows: Sequence[HeadStatistics]) -> str:
    """A fixed-width table, one line per head (layers and heads 1-based, as in figures)."""
    header = f"{'kind':<8} {'layer':>5} {'head':>4} " + " ".join(f"{s:>8}" for s in STATISTICS)
    lines = [header]
    for r in rows:
        values = " ".join(f"{getattr(r, s):8.3f}" for s in STATISTICS)
        lines.append(f"{r.kind:<8} {r.layer + 1:>5} {r.head + 1:>4} {values}")
    return "\n".join(lines)
