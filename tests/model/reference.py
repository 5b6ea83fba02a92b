"""NumPy float64 reference implementations used only by tests."""

import numpy as np


def softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def attention(q, k, v, mask, qk_gain=None):
    """q [b, q, h, d], k [b, k, h, d], v [b, k, h, dv], mask [b, 1|h, q, k] (True = keep).

    With `qk_gain`, QKNorm (Henry et al. 2020): g · (q/‖q‖)·(k/‖k‖) instead of q·k/√d."""
    if qk_gain is None:
        scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    else:
        unit_q = q / np.linalg.norm(q, axis=-1, keepdims=True)
        unit_k = k / np.linalg.norm(k, axis=-1, keepdims=True)
        scores = float(qk_gain) * np.einsum("bqhd,bkhd->bhqk", unit_q, unit_k)
    scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores)
    return np.einsum("bhqk,bkhd->bqhd", weights, v), weights


def multi_head(x_q, x_kv, params, mask):
    """Concat(head_1..head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V);
    QKNorm's where `params` hold its gain ("qk_gain")."""
    qk_gain = params.get("qk_gain")
    wq = np.asarray(params["query"]["kernel"], np.float64)  # [embed, heads, d_k]
    wk = np.asarray(params["key"]["kernel"], np.float64)
    wv = np.asarray(params["value"]["kernel"], np.float64)
    wo = np.asarray(params["out"]["kernel"], np.float64)  # [heads, d_v, embed]
    heads = []
    for h in range(wq.shape[1]):
        q = x_q @ wq[:, h, :]
        k = x_kv @ wk[:, h, :]
        v = x_kv @ wv[:, h, :]
        out, _ = attention(q[:, :, None], k[:, :, None], v[:, :, None], mask, qk_gain)
        heads.append(out[:, :, 0])
    concat = np.concatenate(heads, axis=-1)  # [b, q, h*d_v]
    return concat @ wo.reshape(-1, wo.shape[-1])


def sinusoids(length, d):
    """The sinusoidal position table of §3.5, [length, d] (sines in even columns)."""
    pos = np.arange(length)[:, None]
    angle = pos / 10000 ** (2 * np.arange(d // 2)[None, :] / d)
    table = np.zeros((length, d))
    table[:, 0::2], table[:, 1::2] = np.sin(angle), np.cos(angle)
    return table
