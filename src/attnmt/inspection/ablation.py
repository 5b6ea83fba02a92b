"""Head ablation at decoding: which heads the translation needs.

One head at a time is removed (as in Michel et al., 2019, "Are Sixteen Heads Really Better
than One?") and the held-out sentences are translated again; the BLEU change per head says
how much that head matters. A head is removed by zeroing its rows of the output
projection W^O (the kernel's [head] slice): Concat(head_1..head_h) W^O is a sum of
head_i W^O_i, so exactly that head's contribution disappears and nothing else changes.
Parameters are arguments of the compiled decoder, so each ablation reuses its compile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax.core import unfreeze

from attnmt.config.model import ModelConfig
from attnmt.decode.translate import Translator
from attnmt.inspection.view import KINDS, module_name, stack_of
from attnmt.model import layout

Scorer = Callable[[list[str], list[str]], float]


def without_head(config: ModelConfig, params: Any, kind: str, layer: int, head: int) -> Any:
    """A copy of (per-layer or stacked) `params` in which one head contributes nothing."""
    config, params = layout.for_decoding(config, params)
    depth = config.stack_depth(stack_of(kind))
    if not 0 <= layer < depth or not 0 <= head < config.num_heads:
        raise ValueError(
            f"layer {layer} / head {head} outside the {stack_of(kind)}'s {depth} layers × "
            f"{config.num_heads} heads"
        )
    stack, module = module_name(kind, layer).split("/")
    params = unfreeze(params)  # new containers (leaves shared), so the caller's stay intact
    attention = dict(params[stack][module])
    original = attention["out"]["kernel"]
    kernel = np.array(original)  # [heads, d_v, d_model]
    kernel[head] = 0.0
    if isinstance(original, jax.Array):
        # Placed as the original: a host array among device arrays is another input
        # placement, for which the compiled decoder would be compiled again.
        kernel = jax.device_put(kernel, original.sharding)
    attention["out"] = {**attention["out"], "kernel": kernel}
    params[stack] = {**params[stack], module: attention}
    return params


@dataclasses.dataclass(frozen=True)
class HeadAblation:
    kind: str
    layer: int
    head: int
    bleu: float
    change: float  # bleu − the full model's

    def row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def ablate_heads(
    translator: Translator,
    config: ModelConfig,
    params: Any,
    pairs: Sequence[tuple[str, str]],
    score: Scorer,
    kinds: Sequence[str] = KINDS,
    progress: Callable[[str], None] | None = None,
) -> tuple[float, list[HeadAblation]]:
    """(the full model's score, one row per removed head) on `pairs` (source, reference).

    `translator` holds the decode settings; its parameters are replaced for each head and
    restored at the end.
    """
    sources, references = [s for s, _ in pairs], [r for _, r in pairs]
    translator.set_params([params])
    baseline = score(translator.translate(sources), references)
    per_layer, _ = layout.for_decoding(config, None)
    rows = []
    try:
        for kind in kinds:
            for layer in range(per_layer.stack_depth(stack_of(kind))):
                for head in range(per_layer.num_heads):
                    translator.set_params([without_head(config, params, kind, layer, head)])
                    bleu = score(translator.translate(sources), references)
                    rows.append(HeadAblation(kind, layer, head, bleu, bleu - baseline))
                    if progress:
                        progress(f"{kind} layer {layer + 1} head {head + 1}: {bleu:.2f}")
    finally:
        translator.set_params([params])
    return baseline, rows


def format_ablation(baseline: float, rows: Sequence[HeadAblation], metric: str) -> str:
    """A table, the heads that matter most (largest drop) first."""
    lines = [
        f"full model: {metric} {baseline:.2f}",
        f"{'kind':<8} {'layer':>5} {'head':>4} {metric:>10} {'change':>8}",
    ]
    for r in sorted(rows, key=lambda r: r.change):
        lines.append(
            f"{r.kind:<8} {r.layer + 1:>5} {r.head + 1:>4} {r.bleu:10.2f} {r.change:+8.2f}"
        )
    return "\n".join(lines)


def ablation_figure(baseline: float, rows: Sequence[HeadAblation], metric: str) -> Any:
    """Per kind, a layers × heads grid of the BLEU change when that head is removed."""
    from matplotlib.figure import Figure

    kinds = [k for k in KINDS if any(r.kind == k for r in rows)]
    layers = max(r.layer for r in rows) + 1
    heads = max(r.head for r in rows) + 1
    grids = {k: np.full((layers, heads), np.nan) for k in kinds}
    for r in rows:
        grids[r.kind][r.layer, r.head] = r.change
    limit = max(max(abs(r.change) for r in rows), 1e-6)
    figure = Figure(figsize=(1.2 + 0.55 * heads * len(kinds), 1.4 + 0.45 * layers))
    axes = figure.subplots(1, len(kinds), squeeze=False)[0]
    for ax, kind in zip(axes, kinds, strict=True):
        image = ax.imshow(grids[kind], cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
        ax.set_title(f"{kind}")
        ax.set_xticks(range(heads), [str(h + 1) for h in range(heads)])
        ax.set_yticks(range(layers), [str(layer + 1) for layer in range(layers)])
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        for (layer, head), value in np.ndenumerate(grids[kind]):
            if np.isfinite(value):
                ax.text(head, layer, f"{value:+.1f}", ha="center", va="center", fontsize=7)
    figure.colorbar(image, ax=list(axes), label=f"{metric} change")
    figure.suptitle(f"{metric} without each head (full model {baseline:.2f})")
    return figure
