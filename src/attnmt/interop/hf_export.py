"""`attnmt export --format hf`: a workdir's model as a directory that
`MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained` load.

The vocabulary is written in Marian's layout (`</s>` 0, `<unk>` 1, `<pad>` last), the
inverse of what importing does to such a vocabulary, so import → export gives back the ids.
A model trained with attnmt's own shared sentencepiece vocabulary exports too (that model
serves as both source.spm and target.spm), if its architecture is one MarianMTModel
computes (interop/marian_config.check_exportable names what is not).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np

from attnmt.common import PAD_ID
from attnmt.config.model import ModelConfig
from attnmt.data.pair_tokenizer import SOURCE_SPM, TARGET_SPM, VOCAB_FILE
from attnmt.errors import ConfigError
from attnmt.interop.hf_files import write_json, write_weights
from attnmt.interop.marian_config import check_exportable, hf_config
from attnmt.interop.marian_weights import marian_from_params
from attnmt.interop.vocab_order import attnmt_ids_in_marian_order
from attnmt.model import layout
from attnmt.workdir import LoadedRun, load_run


def _sentencepiece_files(run: LoadedRun) -> tuple[Path, Path]:
    if run.experiment.data.vocab_kind == "pair":
        return (run.tokenizer.path.parent / SOURCE_SPM, run.tokenizer.path.parent / TARGET_SPM)
    return (run.tokenizer.path, run.tokenizer.path)  # one shared model serves both sides


def _generation_config(pad: int, start: int, beams: int) -> dict[str, Any]:
    # attnmt never emits pad or the start token; bad_words_ids makes generate() agree.
    banned = [[pad]] if start == pad else [[pad], [start]]
    return {
        "decoder_start_token_id": start,
        "eos_token_id": 0,
        "forced_eos_token_id": 0,
        "pad_token_id": pad,
        "bad_words_ids": banned,
        "num_beams": beams,
        "max_length": 512,
    }


def _tokenizer_config(languages: tuple[str, str]) -> dict[str, Any]:
    return {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": languages[0],
        "target_lang": languages[1],
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": 512,
        "separate_vocabs": False,
        "sp_model_kwargs": {},
    }


def write_marian_dir(
    out: str | Path,
    model: ModelConfig,
    params: Any,
    pieces: list[str],
    spm_files: tuple[Path, Path],
    languages: tuple[str, str] = ("src", "tgt"),
    beams: int = 4,
) -> Path:
    """Writes the MarianMT directory of per-layer `params`; `pieces[a]` is attnmt id a's
    piece, `spm_files` the source and target sentencepiece models."""
    check_exportable(model)
    size = model.vocab_size
    if len(pieces) != size:
        raise ConfigError(
            f"cannot export: the vocabulary holds {len(pieces)} pieces but "
            f"model.vocab_size is {size} (MarianMTModel needs one id per piece)"
        )
    order = attnmt_ids_in_marian_order(size)  # order[m] = attnmt id of Marian id m
    start = int(np.flatnonzero(order == model.decoder_start_id)[0])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    host_params = jax.tree_util.tree_map(np.asarray, params)
    if model.zero_pad_embedding:
        # The model computes with a zero pad row whatever the stored one holds (the initial
        # weights' row, never trained: model/layers.py); MarianMTModel reads the row as is.
        embedding = np.array(host_params["embed"]["embedding"])
        embedding[PAD_ID] = 0.0
        host_params = {**host_params, "embed": {**host_params["embed"], "embedding": embedding}}
    write_weights(out / "model.safetensors", marian_from_params(host_params, model, order))
    write_json(out / "config.json", hf_config(model, start))
    write_json(out / "generation_config.json", _generation_config(size - 1, start, beams))
    write_json(out / VOCAB_FILE, {pieces[a]: m for m, a in enumerate(order.tolist())})
    write_json(out / "tokenizer_config.json", _tokenizer_config(languages))
    for name, path in zip((SOURCE_SPM, TARGET_SPM), spm_files, strict=True):
        shutil.copyfile(path, out / name)
    return out


def export_marian(workdir: str | Path, out: str | Path, step: int | None = None) -> Path:
    """Writes the Hugging Face MarianMT directory of the workdir's newest (or given) step."""
    run = load_run(workdir, step)
    model, params = layout.for_decoding(run.experiment.model, run.params)
    data = run.experiment.data
    pieces = run.tokenizer.pieces(range(run.tokenizer.vocab_size))
    return write_marian_dir(
        out,
        model,
        params,
        pieces,
        _sentencepiece_files(run),
        (data.src_lang, data.tgt_lang),
        run.experiment.decode.beam_size,
    )
