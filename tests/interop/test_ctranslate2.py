"""`attnmt export --format ctranslate2`: float32 translates exactly as attnmt does; int8
stores int8 weights that are the float32 ones rounded, and translates nearly as float32
does; what CTranslate2 would compute differently is refused, naming why."""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from attnmt.cli.main import main
from tests.helpers import SOURCES

ctranslate2 = pytest.importorskip("ctranslate2", reason="the interop tests need [hf]")

# CTranslate2's DataType enum (include/ctranslate2/types.h), the ids model.bin stores.
DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def read_model_bin(path: Path) -> dict[str, np.ndarray]:
    """The variables of a CTranslate2 model.bin, read from its binary layout (version,
    spec name, revision, then per variable: name, rank, dims, dtype id, byte count, bytes;
    then aliases), independently of CTranslate2."""
    data = path.read_bytes()
    position = 0

    def take(fmt: str) -> tuple:
        nonlocal position
        values = struct.unpack_from("<" + fmt, data, position)
        position += struct.calcsize("<" + fmt)
        return values

    def string() -> str:
        nonlocal position
        (length,) = take("H")
        text = data[position : position + length - 1].decode("utf-8")
        position += length
        return text

    take("I")  # binary version
    string()  # spec name
    take("I")  # revision
    (count,) = take("I")
    variables = {}
    for _ in range(count):
        name = string()
        (rank,) = take("B")
        shape = take(f"{rank}I")
        (dtype_id,) = take("B")
        (size,) = take("I")
        dtype = np.dtype(DTYPES[dtype_id])
        variables[name] = np.frombuffer(data, dtype, size // dtype.itemsize, position).reshape(
            shape
        )
        position += size
    (aliases,) = take("I")
    for _ in range(aliases):
        string(), string()
    assert position == len(data), "model.bin has bytes this reader does not know"
    return variables


def _export(workdir: Path, out: Path) -> list[str]:
    return ["export", "--workdir", str(workdir), "--format", "ctranslate2", "--out", str(out)]


@pytest.fixture(scope="module")
def exports(imported, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ct2")
    out = {}
    for quantization in ("float32", "int8"):
        out[quantization] = root / quantization
        argv = [*_export(imported, out[quantization]), "--quantization", quantization]
        assert main(argv) == 0
    return out


def _translator(folder: Path):
    return ctranslate2.Translator(str(folder), device="cpu", intra_threads=1)


def _pieces(tokenizer) -> list[list[str]]:
    return [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(SOURCES)["input_ids"]]


def test_float32_greedy_translations_identical(hf, exports, imported_greedy):
    _, tokenizer = hf
    results = _translator(exports["float32"]).translate_batch(
        _pieces(tokenizer), beam_size=1, max_decoding_length=60
    )
    theirs = [tokenizer.convert_tokens_to_string(r.hypotheses[0]) for r in results]
    assert imported_greedy == theirs


# int8 rounds each weight row to 127 steps of max|row| / 127 (CTranslate2's per-row scale,
# checked below), so each weight moves by at most half a step, max|row| / 254. As
# independent errors, uniform over a step, their effect on a dot product is about
# (max/rms of the row) / (√12 · 127) of the product's size: ≈ 0.6 % for rows like these
# (max/rms ≈ 2.5). CTranslate2 rounds each matmul's input rows to int8 as well, as much
# again: ≈ 0.8 % per matmul. Over the 10 sublayers, with a LayerNorm after each, such errors
# add in quadrature to ≈ √10 · 0.8 % ≈ 2.5 % of the logits, which are ≤ 10 here: ≈ 0.25. A
# token's log-probability z_k − logsumexp(z) moves by at most twice the largest logit
# change: 0.5. Measured: at most 0.06. A wrong scale or layout moves them by nats.
INT8_LOGPROB_ATOL = 0.5


def test_int8_weights_are_the_float32_ones_rounded_and_translate_nearly_alike(hf, exports):
    full = read_model_bin(exports["float32"] / "model.bin")
    quantized = read_model_bin(exports["int8"] / "model.bin")
    matrices = [k for k, v in full.items() if k.endswith("/weight") and v.ndim == 2]
    # Every linear layer (encoder: 2 attention, 2 FFN; decoder: 2 self-attention, 3 cross-
    # attention, 2 FFN; CTranslate2 fuses Q, K, V) and the shared embedding.
    assert len(matrices) == 2 * 4 + 2 * 7 + 1
    for key in matrices:
        weight, rows = full[key], quantized[key]
        scale = quantized[f"{key}_scale"]
        assert rows.dtype == np.int8 and scale.dtype == np.float32, key
        np.testing.assert_allclose(scale, 127 / np.abs(weight).max(axis=1), rtol=1e-6)
        # Rounded to the nearest step (half a step, plus float32 rounding of w · scale).
        assert np.abs(weight * scale[:, None] - rows).max() <= 0.5 + 1e-5, key
        assert np.abs(rows).max() == 127
    assert all(v.dtype != np.float32 for k, v in quantized.items() if k in matrices)

    _, tokenizer = hf
    pieces = _pieces(tokenizer)
    options = {"beam_size": 1, "max_decoding_length": 60}
    float32 = _translator(exports["float32"]).translate_batch(pieces, **options)
    int8 = _translator(exports["int8"]).translate_batch(pieces, **options)
    same = sum(a.hypotheses[0] == b.hypotheses[0] for a, b in zip(float32, int8, strict=True))
    print(f"int8 greedy translations equal to float32's: {same} of {len(SOURCES)}")
    assert same > len(SOURCES) // 2  # most (measured: 10 of 12)
    # Each token of float32's translations, scored by both.
    hypotheses = [r.hypotheses[0] for r in float32]
    scored = [_translator(exports[q]).score_batch(pieces, hypotheses) for q in ("float32", "int8")]
    worst = 0.0
    for a, b, hypothesis in zip(*scored, hypotheses, strict=True):
        assert len(a.log_probs) == len(b.log_probs) == len(hypothesis) + 1  # and </s>
        worst = max(worst, float(np.abs(np.subtract(a.log_probs, b.log_probs)).max()))
    print(f"int8 vs float32: largest |log-probability difference| per token {worst:.3g}")
    assert 0 < worst <= INT8_LOGPROB_ATOL


def test_what_ctranslate2_cannot_compute_or_read_is_refused(
    hf_dir, imported, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "ct2"
    assert main([*_export(imported, out), "--quantization", "int4"]) == 2
    error = capsys.readouterr().err
    assert "--quantization 'int4'" in error and "int8" in error and not out.exists()
    hf_export = ["export", "--workdir", str(imported), "--format", "hf", "--out", str(out)]
    assert main([*hf_export, "--quantization", "int8"]) == 2
    assert "--quantization applies to --format ctranslate2" in capsys.readouterr().err

    # A decoder start row that is not zero: CTranslate2 would start from zero instead.
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "nonzero_pad"
    shutil.copytree(hf_dir, folder)
    state = load_file(str(folder / "model.safetensors"))
    pad = json.loads((folder / "config.json").read_text())["pad_token_id"]
    state["model.shared.weight"][pad] = 0.25
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    workdir = tmp_path / "run"
    assert main(["import", str(folder), "--workdir", str(workdir)]) == 0
    capsys.readouterr()
    assert main(_export(workdir, out)) == 2
    error = capsys.readouterr().err.strip()
    assert "<pad>" in error and "not zero" in error and "0.25" in error, error
    assert len(error.splitlines()) == 1 and not out.exists()

    # Without the extra: the one line that names it.
    monkeypatch.setitem(sys.modules, "ctranslate2.converters", None)  # as if not installed
    assert main(_export(imported, out)) == 2
    assert "pip install 'attnmt[hf]'" in capsys.readouterr().err
