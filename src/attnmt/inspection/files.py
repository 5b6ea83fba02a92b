"""Writing a selection of attention figures to a folder: PNGs, statistics.csv and an
index.md that lists every file with a caption (what `attnmt attention` writes).

Figures are drawn one at a time and each is saved and freed before the next, so a 6-layer,
8-head model's ~200 figures never sit in memory together.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from attnmt.inspection.figures import (
    KEY_SIDE,
    QUERY_SIDE,
    TITLES,
    alignment_figure,
    check_index,
    head_figure,
    layer_figure,
    model_figure,
    query_figure,
    save_figure,
    statistics_figure,
    title,
)
from attnmt.inspection.stats import HeadStatistics
from attnmt.inspection.view import KINDS, AttentionView, check_kind

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _default_query(view: AttentionView, kind: str) -> int:
    """The middle word of the query side, EOS left out."""
    return max(0, (len(view.queries(kind)) - 2) // 2)


def _sides(kind: str) -> str:
    return f"rows: query ({QUERY_SIDE[kind]}), columns: key ({KEY_SIDE[kind]})"


def _kind_figures(
    view: AttentionView, kind: str, layers: Sequence[int], heads: Sequence[int], query: int
) -> Iterator[tuple[str, Figure, str]]:
    """(file name, figure, caption) of every figure of one kind for the selection, drawn
    one at a time so that each is saved and freed before the next is drawn."""
    layers = [layer for layer in layers if layer < view.depth(kind)]  # a shallower stack
    for layer in layers:
        for head in heads:
            name = f"{kind}_layer{layer + 1}_head{head + 1}.png"
            caption = f"{title(kind, layer, head)}; {_sides(kind)}"
            yield name, head_figure(view, kind, layer, head), caption
        caption = f"{title(kind, layer)}, every head on one scale; {_sides(kind)}"
        yield f"{kind}_layer{layer + 1}.png", layer_figure(view, kind, layer), caption
        token = view.queries(kind)[query]
        caption = f"{title(kind, layer)}, lines from query {query + 1} ({token}) to every key"
        name = f"{kind}_layer{layer + 1}_query{query + 1}.png"
        yield name, query_figure(view, kind, layer, query), caption
    caption = f"{TITLES[kind]}, thumbnails of every layer (rows) and head (columns)"
    yield f"{kind}_model.png", model_figure(view, kind), caption


def _write_statistics_csv(rows: Sequence[HeadStatistics], path: Path) -> Path:
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0].row()))
        writer.writeheader()
        # 1-based layers and heads, as in the file names, titles and the ablation table.
        writer.writerows({**r.row(), "layer": r.layer + 1, "head": r.head + 1} for r in rows)
    return path


def _write_index(view: AttentionView, out_dir: Path, entries: list[tuple[Path, str]]) -> Path:
    lines = [
        "# Attention figures",
        "",
        f"Source: `{' '.join(view.source)}`",
        "",
        f"Translation: `{' '.join(view.target)}`",
        "",
        "Layers and heads are numbered from 1, as in the paper.",
        "",
    ]
    lines += [f"- [{path.name}]({path.name}): {caption}" for path, caption in entries]
    index = out_dir / "index.md"
    index.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return index


def _selection(name: str, chosen: Sequence[int] | None, count: int) -> list[int]:
    chosen = list(range(count)) if chosen is None else list(chosen)
    for value in chosen:
        check_index(name, value, count)
    return chosen


def write_figures(
    view: AttentionView,
    out_dir: str | Path,
    *,
    kinds: Sequence[str] = KINDS,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    query: int | None = None,
    statistics_rows: Sequence[HeadStatistics] | None = None,
) -> list[Path]:
    """Write PNGs of the selection (0-based `layers` and `heads`, None: all) and an index.md
    captioning each file; returns every path written.

    Per kind: each selected head, each selected layer, the query view of each selected layer
    (`query`, 0-based, defaults to the middle word of the query side) and the model overview.
    Then the alignment when "cross" is among `kinds`, and with `statistics_rows` the
    statistics figure and statistics.csv (layers and heads 1-based there too).
    """
    for kind in kinds:
        check_kind(kind)
    layers = _selection("layer", layers, view.deepest)
    heads = _selection("head", heads, view.num_heads)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    entries: list[tuple[Path, str]] = []
    for kind in kinds:
        chosen = _default_query(view, kind) if query is None else query
        check_index("query", chosen, len(view.queries(kind)))
        for name, figure, caption in _kind_figures(view, kind, layers, heads, chosen):
            entries.append((save_figure(figure, out_dir / name), caption))
    if "cross" in kinds:
        figure = alignment_figure(view)
        caption = "alignment: encoder-decoder attention, mean of every layer and head"
        entries.append((save_figure(figure, out_dir / "alignment.png"), caption))
    if statistics_rows:
        figure = statistics_figure(statistics_rows)
        caption = "per-head statistics, a layers × heads map per kind and statistic"
        entries.append((save_figure(figure, out_dir / "statistics.png"), caption))
        path = _write_statistics_csv(statistics_rows, out_dir / "statistics.csv")
        entries.append((path, "per-head statistics, one row per head (layer and head 1-based)"))
    return [path for path, _ in entries] + [_write_index(view, out_dir, entries)]
