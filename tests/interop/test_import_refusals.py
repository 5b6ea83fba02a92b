"""`attnmt import` refuses every checkpoint it would compute differently from
MarianMTModel, or cannot read, with one line naming the key (or file) and exit code 2,
before anything is written: each refusal in interop/hf_import.py, hf_files.py,
marian_config.py and marian_weights.py, one case each."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from attnmt.cli.main import main

pytest.importorskip("safetensors", reason="the interop tests need the [hf] extra")


def _copy(hf_dir: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "edited"
    shutil.copytree(hf_dir, folder)
    return folder


def _edit_json(folder: Path, file: str, changes: dict) -> None:
    config = json.loads((folder / file).read_text())
    for key, value in changes.items():
        if value is _DELETE:
            del config[key]
        else:
            config[key] = value
    (folder / file).write_text(json.dumps(config))


def _refused(folder: Path, tmp_path: Path, capsys) -> str:
    """The one-line error of importing `folder`, after checking nothing was written."""
    run = tmp_path / "run"
    assert main(["import", str(folder), "--workdir", str(run)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "Traceback" not in error, error
    assert not (run / "checkpoints").exists() and not (run / "config.json").exists()
    return error


_DELETE = object()

# (file, changes, what the message must name). Marian's config keys that MarianMTModel
# ignores but another architecture would have computed, what attnmt has no option for, and
# keys whose values are malformed.
CONFIG_REFUSALS = [
    ("config.json", {"model_type": "bart"}, "model_type"),
    ("config.json", {"normalize_before": True}, "normalize_before"),
    ("config.json", {"normalize_embedding": True}, "normalize_embedding"),
    ("config.json", {"layernorm_embedding": True}, "layernorm_embedding"),
    ("config.json", {"add_final_layer_norm": True}, "add_final_layer_norm"),
    ("config.json", {"add_bias_logits": True}, "add_bias_logits"),
    ("config.json", {"static_position_embeddings": False}, "static_position_embeddings"),
    ("config.json", {"decoder_layers": 0}, "decoder_layers"),
    ("config.json", {"decoder_attention_heads": 2}, "decoder_attention_heads"),
    ("config.json", {"decoder_ffn_dim": 128}, "decoder_ffn_dim"),
    ("config.json", {"decoder_vocab_size": 50}, "decoder_vocab_size"),
    ("config.json", {"tie_word_embeddings": False}, "tie_word_embeddings"),
    (
        "config.json",
        {"share_encoder_decoder_embeddings": False},
        "share_encoder_decoder_embeddings",
    ),
    ("config.json", {"encoder_layerdrop": 0.1}, "encoder_layerdrop"),
    ("config.json", {"decoder_layerdrop": 0.1}, "decoder_layerdrop"),
    ("config.json", {"activation_function": "tanh"}, "activation_function"),
    (
        "config.json",
        {"encoder_attention_heads": 3, "decoder_attention_heads": 3},
        "d_model",  # 32 is not a multiple of 3
    ),
    ("config.json", {"eos_token_id": [0, 5]}, "eos_token_id"),
    ("config.json", {"forced_eos_token_id": 5}, "forced_eos_token_id"),
    ("config.json", {"vocab_size": 1000}, "vocab_size"),  # not what vocab.json holds
    ("config.json", {"pad_token_id": 5}, "pad_token_id"),
    ("config.json", {"eos_token_id": 5, "forced_eos_token_id": 5}, "eos_token_id"),
    ("config.json", {"decoder_start_token_id": 999}, "decoder_start_token_id"),
    ("config.json", {"d_model": _DELETE}, "d_model"),
    ("config.json", {"d_model": "32"}, "d_model"),
    ("tokenizer_config.json", {"separate_vocabs": True}, "separate_vocabs"),
]


@pytest.mark.parametrize(
    ("file", "changes", "named"), CONFIG_REFUSALS, ids=[c[2] for c in CONFIG_REFUSALS]
)
def test_unsupported_marian_features_are_refused(hf_dir, tmp_path, capsys, file, changes, named):
    folder = _copy(hf_dir, tmp_path)
    _edit_json(folder, file, changes)
    error = _refused(folder, tmp_path, capsys)
    assert named in error and file in error, error


def test_an_unknown_token_missing_from_the_vocabulary_is_refused(hf_dir, tmp_path, capsys):
    folder = _copy(hf_dir, tmp_path)
    vocab = json.loads((folder / "vocab.json").read_text())
    vocab["<unknown>"] = vocab.pop("<unk>")
    (folder / "vocab.json").write_text(json.dumps(vocab))
    error = _refused(folder, tmp_path, capsys)
    assert "vocab.json" in error and "<unk>" in error, error


@pytest.mark.parametrize(
    "missing", ["config.json", "vocab.json", "source.spm", "target.spm", "model.safetensors"]
)
def test_a_missing_file_is_refused_by_name(hf_dir, tmp_path, capsys, missing):
    folder = _copy(hf_dir, tmp_path)
    (folder / missing).unlink()
    error = _refused(folder, tmp_path, capsys)
    assert missing in error, error


def test_unreadable_files_are_refused_by_name(hf_dir, tmp_path, capsys):
    folder = _copy(hf_dir, tmp_path)
    (folder / "config.json").write_text('{"model_type": "marian",')
    assert "config.json" in _refused(folder, tmp_path, capsys)
    (folder / "config.json").write_text("[1, 2]")
    assert "config.json" in _refused(folder, tmp_path, capsys)
    shutil.copyfile(hf_dir / "config.json", folder / "config.json")
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    assert "model.safetensors" in _refused(folder, tmp_path, capsys)


def _edit_weights(folder: Path, edit) -> None:
    from safetensors.numpy import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    edit(state)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_weights_attnmt_would_not_compute_alike_are_refused_by_key(hf_dir, tmp_path, capsys):
    folder = _copy(hf_dir, tmp_path)
    key = "model.decoder.layers.1.encoder_attn.k_proj.weight"
    _edit_weights(folder, lambda state: state.pop(key))
    assert key in _refused(folder, tmp_path, capsys)

    shutil.copyfile(hf_dir / "model.safetensors", folder / "model.safetensors")
    _edit_weights(folder, lambda state: state.pop("model.shared.weight"))
    assert "model.shared.weight" in _refused(folder, tmp_path, capsys)

    # An output projection of its own (untied), whatever config.json says.
    shutil.copyfile(hf_dir / "model.safetensors", folder / "model.safetensors")

    def untie(state: dict) -> None:
        state["lm_head.weight"] = state["model.shared.weight"] + np.float32(0.01)

    _edit_weights(folder, untie)
    assert "lm_head.weight" in _refused(folder, tmp_path, capsys)


def test_importing_into_a_workdir_with_checkpoints_is_refused(hf_dir, imported, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(imported, run)
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert main(["import", str(hf_dir), "--workdir", str(run)]) == 2
    error = capsys.readouterr().err.strip()
    assert str(run / "checkpoints") in error and len(error.splitlines()) == 1, error
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
