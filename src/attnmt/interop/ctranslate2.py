"""`attnmt export --format ctranslate2`: the Hugging Face export, converted by
CTranslate2's own converter (TransformersConverter), quantization passed through.

CTranslate2 starts Marian decoders from a zero vector instead of the `<pad>` row, and drops
`<pad>` from the vocabulary: the same model when that row is zero, as in opus-mt
checkpoints (Hugging Face never trains it through the embedding lookup), or when the model
holds it at zero (model.zero_pad_embedding). A model whose start row is not zero is
refused, naming it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from attnmt.common import PAD_ID
from attnmt.errors import ConfigError, UserError
from attnmt.interop.hf_export import export_marian
from attnmt.interop.hf_files import HF_EXTRA
from attnmt.workdir import load_run

QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_float16", "int16", "float16", "bfloat16")


def _check_start_row(workdir: str | Path, step: int | None) -> None:
    run = load_run(workdir, step)
    model = run.experiment.model
    if model.decoder_start_id != PAD_ID:
        raise ConfigError(
            f"cannot export to CTranslate2: model.decoder_start_id={model.decoder_start_id} "
            "(CTranslate2's Marian decoder starts from the pad token's zero embedding)"
        )
    if model.zero_pad_embedding:
        return  # computed as zero whatever is stored, and exported so (hf_export.py)
    row = np.asarray(run.params["embed"]["embedding"][PAD_ID])
    if np.any(row != 0):
        raise ConfigError(
            "cannot export to CTranslate2: the <pad> (decoder start) embedding row is not "
            f"zero (max |value| {np.abs(row).max():.3g}); CTranslate2 would start from zero"
        )


def export_ctranslate2(
    workdir: str | Path, out: str | Path, quantization: str = "float32", step: int | None = None
) -> Path:
    """Writes a CTranslate2 model directory for the workdir's newest (or given) step."""
    try:
        from ctranslate2.converters import TransformersConverter
    except ImportError:
        raise UserError(f"the CTranslate2 export needs ctranslate2 ({HF_EXTRA})") from None
    if quantization not in QUANTIZATIONS:
        raise ConfigError(
            f"--quantization {quantization!r}: one of {', '.join(QUANTIZATIONS)} expected"
        )
    _check_start_row(workdir, step)
    with tempfile.TemporaryDirectory(prefix="attnmt-hf-") as hf_dir:
        export_marian(workdir, hf_dir, step)
        converter = TransformersConverter(hf_dir, copy_files=["source.spm", "target.spm"])
        converter.convert(str(out), quantization=quantization, force=True)
    return Path(out)
