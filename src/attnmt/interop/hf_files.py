"""Reading and writing the files of a Hugging Face model directory (save_pretrained's):
JSON configs and safetensors / PyTorch weights, with one-line errors naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from attnmt.errors import CheckpointError, ConfigError, UserError

HF_EXTRA = "pip install 'attnmt[hf]'"


def read_json(path: Path, required: bool = True) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise ConfigError(f"{path}: not found (a save_pretrained directory has it)")
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: must hold a JSON object")
    return value


def write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _safetensors_numpy():
    try:
        from safetensors import numpy as st_numpy
    except ImportError:
        raise UserError(f"reading and writing safetensors weights needs {HF_EXTRA}") from None
    return st_numpy


def _unreadable_weights_errors() -> tuple[type[BaseException], ...]:
    from safetensors import SafetensorError  # a damaged header, not an OSError

    return (OSError, ValueError, SafetensorError)


def _torch_weights(path: Path) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError:
        raise UserError(f"{path}: PyTorch weights need torch ({HF_EXTRA})") from None
    state = torch.load(path, map_location="cpu", weights_only=True)
    return {key: value.float().numpy() for key, value in state.items()}


def read_weights(folder: Path) -> dict[str, np.ndarray]:
    """The state dict of model.safetensors (or its shards) or pytorch_model.bin."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(read_json(index).get("weight_map", {}).values()))
        files = [folder / shard for shard in shards]
    elif (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif (folder / "pytorch_model.bin").is_file():
        return _torch_weights(folder / "pytorch_model.bin")
    else:
        raise CheckpointError(f"{folder}: no model.safetensors or pytorch_model.bin")
    state: dict[str, np.ndarray] = {}
    reader = _safetensors_numpy()
    for file in files:
        try:
            state.update(reader.load_file(str(file)))
        except _unreadable_weights_errors() as e:
            raise CheckpointError(f"{file}: unreadable weights ({e})") from None
    return state


def write_weights(path: Path, state: dict[str, np.ndarray]) -> None:
    _safetensors_numpy().save_file(state, str(path), metadata={"format": "pt"})
