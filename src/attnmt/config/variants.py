"""The paper's model variants as dotted config overrides: base, big and Table 3's rows.

Rows are numbered in the table's order within each group: A1 = 1 head, ..., C1 = N 2,
C4 = d_model 256, C6 = d_ff 1024. Unlisted values are the base model's. Row (B) changes
d_k alone (d_v stays 64), so d_k is never derived from d_model / h.
"""

from __future__ import annotations

from typing import Any

TABLE3: dict[str, dict[str, Any]] = {
    "A1": {"model.num_heads": 1, "model.d_k": 512, "model.d_v": 512},
    "A2": {"model.num_heads": 4, "model.d_k": 128, "model.d_v": 128},
    "A3": {"model.num_heads": 16, "model.d_k": 32, "model.d_v": 32},
    "A4": {"model.num_heads": 32, "model.d_k": 16, "model.d_v": 16},
    "B1": {"model.d_k": 16},
    "B2": {"model.d_k": 32},
    "C1": {"model.num_layers": 2},
    "C2": {"model.num_layers": 4},
    "C3": {"model.num_layers": 8},
    "C4": {"model.d_model": 256, "model.d_k": 32, "model.d_v": 32},
    "C5": {"model.d_model": 1024, "model.d_k": 128, "model.d_v": 128},
    "C6": {"model.d_ff": 1024},
    "C7": {"model.d_ff": 4096},
    "D1": {"model.dropout_rate": 0.0},
    "D2": {"model.dropout_rate": 0.2},
    "D3": {"train.label_smoothing": 0.0},
    "D4": {"train.label_smoothing": 0.2},
    "E": {"model.positional": "learned"},
}

# The paper's params column (millions) for the rows that list one.
TABLE3_PAPER_PARAMS_M: dict[str, float] = {
    "base": 65,
    "B1": 58,
    "B2": 60,
    "C1": 36,
    "C2": 50,
    "C3": 80,
    "C4": 28,
    "C5": 168,
    "C6": 53,
    "C7": 90,
    "big": 213,
}


def big(language_pair: str) -> dict[str, Any]:
    """Transformer (big): §6.1 uses P_drop 0.3 for En-De and 0.1 for En-Fr, 300k steps."""
    return {
        "model.d_model": 1024,
        "model.d_ff": 4096,
        "model.num_heads": 16,
        "model.dropout_rate": 0.3 if language_pair == "en-de" else 0.1,
        "train.num_steps": 300_000,
        "train.keep_checkpoints": 20,
    }


def variant_overrides(name: str, language_pair: str) -> dict[str, Any]:
    """Overrides for `name` in {base, big, A1..E}; KeyError lists the valid names."""
    if name == "base":
        return {}
    if name == "big":
        return big(language_pair)
    if name in TABLE3:
        return dict(TABLE3[name])
    valid = ", ".join(["base", "big", *TABLE3])
    raise KeyError(f"unknown variant {name!r}; valid variants: {valid}")
