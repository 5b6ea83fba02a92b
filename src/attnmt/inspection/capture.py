"""Attention weights for inspection (the paper's appendix figures), collected on request.

The model sows its weights into the "intermediates" collection; nothing is stored unless
that collection is made mutable, as done here, so training pays nothing for this.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from attnmt.model import layout
from attnmt.model.transformer import Transformer


def attention_maps(
    model: Transformer, params: Any, src_tokens: Any, tgt_tokens: Any
) -> dict[str, np.ndarray]:
    """{"encoder_4/self_attention": [batch, heads, q_len, kv_len], ...} for one batch.

    Decoder maps are for teacher forcing on `tgt_tokens` (query t sees targets < t).
    """
    # The per-layer layout names every map by its layer ("encoder_4/...").
    config, params = layout.for_decoding(model.config, params)
    model = Transformer(config)
    _, state = model.apply({"params": params}, src_tokens, tgt_tokens, mutable=["intermediates"])
    maps: dict[str, np.ndarray] = {}
    flat = jax.tree_util.tree_flatten_with_path(state["intermediates"])[0]
    for path, weights in flat:
        names = [str(getattr(k, "key", k)) for k in path]
        # path: layer / attention module / "attention_weights" / sow index
        maps["/".join(names[:2])] = np.asarray(weights)
    return maps
