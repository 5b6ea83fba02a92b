"""Pictures of attention: one head, one layer, the whole model, the paper's appendix view of
one query word (Figures 3-5), the source-translation alignment and per-head statistics.

Every function returns a `matplotlib.figure.Figure` built directly, never through pyplot:
there is no global list of open figures, so nothing leaks from one figure (or notebook cell)
into the next, and Jupyter displays a returned Figure (after `%matplotlib inline`, as
notebooks/attention.ipynb does). Saving attaches the non-interactive Agg canvas to the one
figure being saved and leaves the session's backend alone.

Layers and heads are 0-based in the API, as in `AttentionView`, and 1-based in titles and
file names, as in the paper ("layer 5 of 6"): `head_figure(view, "encoder", 4, 0)` is titled
"encoder self-attention · layer 5 · head 1" and written as `encoder_layer5_head1.png`.

matplotlib is optional (`pip install 'attnmt[viz]'`) and imported only when a figure is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from attnmt.inspection.stats import STATISTICS, HeadStatistics
from attnmt.inspection.view import KINDS, AttentionView, check_kind

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.image import AxesImage

TITLES = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "encoder-decoder attention",
}
# What a row (query) and a column (key) of each kind stands for, for the axis labels.
QUERY_SIDE = {"encoder": "source", "decoder": "target predicted", "cross": "target predicted"}
KEY_SIDE = {"encoder": "source", "decoder": "decoder input", "cross": "source"}
_CMAP = "viridis"  # perceptually uniform: equal steps in weight look like equal steps
_INCH_PER_TOKEN = 0.2  # one heat-map cell; 40 tokens make an 8-inch side
_PANEL_INCH_PER_TOKEN = 0.17  # a cell of a panel in layer_figure's grid
_DPI = 100


def _new_figure(width: float, height: float) -> Figure:
    """A Figure outside pyplot; constrained layout keeps long token labels inside it."""
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError("attention figures need matplotlib: pip install 'attnmt[viz]'") from error
    return Figure(figsize=(width, height), layout="constrained")


def save_figure(figure: Figure, path: str | Path) -> Path:
    """Write `figure` as a PNG with the Agg canvas, then free it (it holds every artist)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)  # this figure only: the session's backend (e.g. inline) stays
    path = Path(path)
    figure.savefig(path, dpi=_DPI)
    figure.clear()  # the figure was never registered with pyplot: clearing is closing it
    return path


def title(kind: str, layer: int | None = None, head: int | None = None) -> str:
    """ "encoder self-attention · layer 3 · head 5" from 0-based `layer` and `head`."""
    check_kind(kind)
    parts = [TITLES[kind]]
    if layer is not None:
        parts.append(f"layer {layer + 1}")
    if head is not None:
        parts.append(f"head {head + 1}")
    return " · ".join(parts)


def check_index(name: str, value: int, count: int) -> None:
    if not 0 <= value < count:
        raise ValueError(f"{name} {value} is out of range: 0 ≤ {name} < {count} (0-based)")


def _check(
    view: AttentionView, kind: str, layer: int | None = None, head: int | None = None
) -> None:
    check_kind(kind)
    if layer is not None:
        check_index("layer", layer, view.depth(kind))
    if head is not None:
        check_index("head", head, view.num_heads)


def _tick_size(inch_per_label: float) -> float:
    """The largest font size (points) at which labels `inch_per_label` apart do not touch."""
    return float(np.clip(0.62 * 72 * inch_per_label, 5, 10))


def _heat_map(
    ax: Axes,
    matrix: np.ndarray,  # [rows, columns]
    rows: Sequence[str],
    columns: Sequence[str],
    *,
    vmax: float | None = None,
    row_labels: bool = True,
    column_labels: bool = True,
    inch_per_token: float = _INCH_PER_TOKEN,
) -> AxesImage:
    """Weights as cells, first row at the top; tokens as tick labels where asked."""
    top = float(matrix.max()) if vmax is None else vmax
    image = ax.imshow(
        matrix, cmap=_CMAP, vmin=0.0, vmax=max(top, 1e-9), interpolation="nearest", aspect="auto"
    )
    size = _tick_size(inch_per_token)
    ax.set_xticks(range(len(columns)))
    ax.set_yticks(range(len(rows)))
    if column_labels:
        ax.set_xticklabels(_labels(columns), rotation=90, fontsize=size)
    else:
        ax.tick_params(labelbottom=False)
    if row_labels:
        ax.set_yticklabels(_labels(rows), fontsize=size)
    else:
        ax.tick_params(labelleft=False)
    return image


def _labels(tokens: Sequence[str]) -> list[str]:
    """Tokens as literal text: a "$" would otherwise start matplotlib's mathtext."""
    return [token.replace("$", r"\$") for token in tokens]


def _heat_size(columns: int, rows: int, extra_width: float = 0.0) -> tuple[float, float]:
    """Figure inches for one heat map: a fixed margin for labels plus a cell per token."""
    return (
        max(5.0, 2.2 + extra_width + _INCH_PER_TOKEN * columns),  # room for the title
        max(3.5, 2.2 + _INCH_PER_TOKEN * rows),
    )


def head_figure(view: AttentionView, kind: str, layer: int, head: int) -> Figure:
    """One head as a heat map: a row per query token, a column per key token, each cell the
    weight that query gives that key (every row sums to 1)."""
    _check(view, kind, layer, head)
    rows, columns = view.queries(kind), view.keys(kind)
    figure = _new_figure(*_heat_size(len(columns), len(rows), extra_width=1.2))
    ax = figure.add_subplot()
    image = _heat_map(ax, view.head(kind, layer, head), rows, columns)
    ax.set_xlabel(f"key ({KEY_SIDE[kind]})")
    ax.set_ylabel(f"query ({QUERY_SIDE[kind]})")
    ax.set_title(title(kind, layer, head))
    figure.colorbar(image, ax=ax, label="attention weight", shrink=0.8)
    return figure


def layer_figure(view: AttentionView, kind: str, layer: int) -> Figure:
    """Every head of one layer side by side on one colour scale, so heads can be compared:
    tokens label the outer axes only (query tokens on the left, key tokens at the bottom)."""
    _check(view, kind, layer)
    rows, columns = view.queries(kind), view.keys(kind)
    weights = view.weights[kind][layer]  # [heads, queries, keys]
    grid_columns = min(view.num_heads, 4)
    grid_rows = math.ceil(view.num_heads / grid_columns)
    panel_width = max(2.2, _PANEL_INCH_PER_TOKEN * len(columns))
    panel_height = max(2.2, _PANEL_INCH_PER_TOKEN * len(rows))
    figure = _new_figure(
        2.5 + grid_columns * (panel_width + 0.2), 2.3 + grid_rows * (panel_height + 0.4)
    )
    axes = figure.subplots(grid_rows, grid_columns, squeeze=False)
    vmax = float(weights.max())
    for head in range(view.num_heads):
        row, column = divmod(head, grid_columns)
        ax = axes[row, column]
        image = _heat_map(
            ax,
            weights[head],
            rows,
            columns,
            vmax=vmax,
            row_labels=column == 0,
            column_labels=head + grid_columns >= view.num_heads,  # no panel below it
            inch_per_token=_PANEL_INCH_PER_TOKEN,
        )
        ax.set_title(f"head {head + 1}", fontsize=10)
    for unused in axes.flat[view.num_heads :]:
        figure.delaxes(unused)
    figure.colorbar(image, ax=list(axes.flat[: view.num_heads]), label="attention weight")
    figure.suptitle(title(kind, layer))
    figure.supxlabel(f"key ({KEY_SIDE[kind]})")
    figure.supylabel(f"query ({QUERY_SIDE[kind]})")
    return figure


def model_figure(view: AttentionView, kind: str) -> Figure:
    """Thumbnails of every layer (rows) and head (columns), each on its own colour scale:
    the shapes at a glance (diagonals, stripes, a column on EOS) to choose heads to open."""
    check_kind(kind)
    layers, heads = view.depth(kind), view.num_heads
    figure = _new_figure(1.0 + 1.6 * heads, 1.0 + 1.6 * layers)
    axes = figure.subplots(layers, heads, squeeze=False)
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer, head]
            matrix = view.head(kind, layer, head)
            top = max(float(matrix.max()), 1e-9)
            ax.imshow(matrix, cmap=_CMAP, vmin=0.0, vmax=top, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if layer == 0:
                ax.set_title(f"head {head + 1}", fontsize=10)
            if head == 0:
                ax.set_ylabel(f"layer {layer + 1}", fontsize=10)
    figure.suptitle(f"{TITLES[kind]} · every layer and head (each on its own scale)")
    return figure


def _column_positions(count: int) -> np.ndarray:
    """Heights in [0, 1] of `count` tokens spread down a column, the first at the top."""
    return 1.0 - (np.arange(count) + 0.5) / count


def _head_colours(heads: int) -> np.ndarray:
    """One RGBA colour per head: tab10 (then tab20) for a few heads, hues beyond."""
    from matplotlib import colormaps

    if heads <= 10:
        return colormaps["tab10"](np.arange(heads))
    if heads <= 20:
        return colormaps["tab20"](np.arange(heads))
    return colormaps["hsv"](np.arange(heads) / heads)


def _query_lines(ax: Axes, weights: np.ndarray, query_y: float, key_y: np.ndarray) -> list:
    """Per head, a line from the query to every key (weights: [heads, keys]); opacity and
    width proportional to the weight, the strongest line of the figure opaque. Each head
    ends at its own height within the key's slot, so overlapping heads stay apart."""
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D

    heads, keys = weights.shape
    colours = _head_colours(heads)
    strongest = max(float(weights.max()), 1e-9)
    handles = []
    for head in range(heads):
        offset = (head - (heads - 1) / 2) * 0.5 / (keys * heads)
        segments = [[(0.0, query_y), (1.0, y + offset)] for y in key_y]
        share = weights[head] / strongest
        rgba = np.tile(colours[head], (keys, 1))
        rgba[:, 3] = share
        ax.add_collection(LineCollection(segments, colors=rgba, linewidths=0.2 + 3.0 * share))
        handles.append(Line2D([], [], color=colours[head], linewidth=3, label=f"head {head + 1}"))
    return handles


def query_figure(view: AttentionView, kind: str, layer: int, query: int) -> Figure:
    """The paper's appendix view (Figures 3-5): query tokens in the left column, key tokens
    in the right, and for each head of the layer (one colour each) lines from the chosen
    query token to every key, opacity and width proportional to the weight."""
    _check(view, kind, layer)
    queries, keys = view.queries(kind), view.keys(kind)
    check_index("query", query, len(queries))
    height = max(3.5, 1.8 + 0.22 * max(len(queries), len(keys)))
    figure = _new_figure(6.5, height)
    ax = figure.add_subplot()
    query_y, key_y = _column_positions(len(queries)), _column_positions(len(keys))
    handles = _query_lines(ax, view.weights[kind][layer, :, query], query_y[query], key_y)
    size = _tick_size((height - 1.8) / max(len(queries), len(keys)))
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, 1.0)
    ax.set_yticks(query_y, _labels(queries), fontsize=size)
    chosen = ax.get_yticklabels()[query]
    chosen.set_fontweight("bold")
    chosen.set_color("crimson")
    keys_ax = ax.twinx()
    keys_ax.set_ylim(0.0, 1.0)
    keys_ax.set_yticks(key_y, _labels(keys), fontsize=size)
    ax.set_xticks([0.0, 1.0], [f"query ({QUERY_SIDE[kind]})", f"key ({KEY_SIDE[kind]})"])
    for axis in (ax, keys_ax):
        axis.tick_params(length=0)
        for spine in axis.spines.values():
            spine.set_visible(False)
    ax.set_title(f"{title(kind, layer)} · query {query + 1}: {_labels(queries)[query]}")
    figure.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4))
    return figure


def alignment_figure(view: AttentionView, layer: int | None = None) -> Figure:
    """Encoder-decoder attention averaged over the heads of `layer` (of every layer when
    None): a soft alignment, a row per translation token, a column per source token."""
    weights = view.weights["cross"]  # [layers, heads, target, source]
    if layer is None:
        matrix = weights.mean(axis=(0, 1))
        which = f"mean of {view.depth('cross')} layers × {view.num_heads} heads"
    else:
        _check(view, "cross", layer)
        matrix = weights[layer].mean(axis=0)
        which = f"layer {layer + 1} · mean of {view.num_heads} heads"
    figure = _new_figure(*_heat_size(len(view.source), len(view.target), extra_width=1.2))
    ax = figure.add_subplot()
    image = _heat_map(ax, matrix, view.target, view.source)
    ax.set_xlabel("source")
    ax.set_ylabel("translation (token predicted)")
    ax.set_title(f"alignment ({TITLES['cross']})\n{which}")
    figure.colorbar(image, ax=ax, label="mean attention weight", shrink=0.8)
    return figure


def _statistic_grids(
    rows: Sequence[HeadStatistics],
) -> tuple[list[str], dict[tuple[str, str], np.ndarray]]:
    """The kinds present, and per (kind, statistic) a [layers, heads] grid (NaN: no row)."""
    kinds = [kind for kind in KINDS if any(row.kind == kind for row in rows)]
    layers = max(row.layer for row in rows) + 1
    heads = max(row.head for row in rows) + 1
    grids = {(k, s): np.full((layers, heads), np.nan) for k in kinds for s in STATISTICS}
    for row in rows:
        for statistic in STATISTICS:
            grids[row.kind, statistic][row.layer, row.head] = getattr(row, statistic)
    return kinds, grids


def _annotate(ax: Axes, grid: np.ndarray, vmin: float, vmax: float) -> None:
    """Write each finite value in its cell, light on dark cells and dark on light ones."""
    span = max(vmax - vmin, 1e-12)
    for (layer, head), value in np.ndenumerate(grid):
        if np.isfinite(value):
            colour = "white" if (value - vmin) / span < 0.5 else "black"
            ax.text(head, layer, f"{value:.2f}", ha="center", va="center", fontsize=7, c=colour)


def statistics_figure(rows: Sequence[HeadStatistics]) -> Figure:
    """A layers × heads map of each statistic (columns) for each kind (rows), one colour
    scale per statistic; blank cells are undefined (position statistics of cross-attention)
    and values are written in the cells while the grids are small."""
    if not rows:
        raise ValueError("no statistics to draw")
    kinds, grids = _statistic_grids(rows)
    layers, heads = grids[kinds[0], STATISTICS[0]].shape
    panel_width, panel_height = max(1.8, 0.45 * heads), max(1.3, 0.35 * layers)
    figure = _new_figure(
        1.2 + len(STATISTICS) * (panel_width + 0.3), 2.0 + len(kinds) * (panel_height + 0.5)
    )
    axes = figure.subplots(len(kinds), len(STATISTICS), squeeze=False)
    for column, statistic in enumerate(STATISTICS):
        values = np.stack([grids[kind, statistic] for kind in kinds])
        finite = values[np.isfinite(values)]
        vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        for row, kind in enumerate(kinds):
            ax = axes[row, column]
            grid = grids[kind, statistic]
            image = ax.imshow(grid, cmap=_CMAP, vmin=vmin, vmax=vmax, aspect="auto")
            ax.set_xticks(range(heads), [str(h + 1) for h in range(heads)], fontsize=7)
            ax.set_yticks(range(layers), [str(i + 1) for i in range(layers)], fontsize=7)
            if layers * heads <= 48:
                _annotate(ax, grid, vmin, vmax)
            if row == 0:
                ax.set_title(statistic)
            if column == 0:
                ax.set_ylabel(f"{kind}\nlayer")
            if row == len(kinds) - 1:
                ax.set_xlabel("head")
        figure.colorbar(image, ax=list(axes[:, column]), location="bottom", shrink=0.8)
    figure.suptitle("per-head statistics, means over query positions (blank: undefined)")
    return figure
