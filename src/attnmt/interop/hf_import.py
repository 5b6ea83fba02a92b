"""`attnmt import`: a Hugging Face MarianMT directory becomes an attnmt workdir.

The workdir holds config.json (the model options that reproduce the Marian model, a
`pair` vocabulary, a `files` data source whose paths fine-tuning supplies), vocab.json in
attnmt's id order, source.spm and target.spm, and one checkpoint (step 0) holding only the
parameters: `translate`, `evaluate` and `attention` read it as any run, and `train` starts
from those parameters with a fresh optimizer (train/assemble.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from attnmt.checkpoint.manager import CheckpointManager, checkpoint_dir
from attnmt.common import PAD_ID
from attnmt.config.experiment import Experiment
from attnmt.config.recipes import base_config
from attnmt.data.pair_tokenizer import SOURCE_SPM, TARGET_SPM, VOCAB_FILE, read_vocab
from attnmt.errors import CheckpointError, ConfigError
from attnmt.interop.hf_files import read_json, read_weights, write_json
from attnmt.interop.marian_config import check_importable, model_options
from attnmt.interop.marian_weights import params_from_marian
from attnmt.interop.vocab_order import marian_ids_in_attnmt_order


def _check_tokenizer(folder: Path, tokenizer_config: dict[str, Any]) -> None:
    if tokenizer_config.get("separate_vocabs"):
        raise ConfigError(
            f"{folder / 'tokenizer_config.json'}: separate_vocabs=true is not supported "
            "(attnmt shares one vocabulary between source and target)"
        )
    for name in (VOCAB_FILE, SOURCE_SPM, TARGET_SPM):
        if not (folder / name).is_file():
            raise ConfigError(f"{folder / name}: not found (MarianTokenizer.save_pretrained)")


def _vocab_order(folder: Path, hf: dict[str, Any]) -> tuple[dict[str, int], np.ndarray]:
    """Marian's piece → id, and `order[a]` = the Marian id of attnmt id `a`."""
    vocab = read_vocab(folder / VOCAB_FILE)
    if len(vocab) != hf["vocab_size"]:
        raise ConfigError(
            f"config.json: vocab_size={hf['vocab_size']} but {VOCAB_FILE} holds {len(vocab)} "
            "pieces (a padded embedding is not supported)"
        )
    pieces = {i: piece for piece, i in vocab.items()}
    ids = {"pad": hf.get("pad_token_id"), "eos": hf.get("eos_token_id", 0)}
    for name, key, piece in (("pad", "pad_token_id", "<pad>"), ("eos", "eos_token_id", "</s>")):
        if ids[name] is None:
            raise ConfigError(f"config.json: {key} is missing (Marian's {piece})")
        if pieces.get(ids[name]) != piece:
            raise ConfigError(
                f"config.json: {key}={ids[name]} is {pieces.get(ids[name])!r} in "
                f"{VOCAB_FILE}; the {name} token must be {piece}"
            )
    ids["unk"] = vocab.get("<unk>")
    if ids["unk"] is None:
        raise ConfigError(f"{folder / VOCAB_FILE}: no <unk> piece (Marian's unknown token)")
    return vocab, marian_ids_in_attnmt_order(len(vocab), ids["pad"], ids["eos"], ids["unk"])


def _experiment(
    hf: dict, generation: dict, tokenizer_config: dict, start: int, zero_pad: bool
) -> Experiment:
    config = base_config()
    config.model.update(model_options(hf, start))
    # Marian's padding_idx row: kept at zero (and out of training) when it is zero here.
    config.model.zero_pad_embedding = zero_pad
    config.data.source = "files"
    config.data.vocab_kind = "pair"
    config.data.src_lang = tokenizer_config.get("source_lang") or "src"
    config.data.tgt_lang = tokenizer_config.get("target_lang") or "tgt"
    config.data.max_length = min(config.data.max_length, config.model.max_length)
    beams = generation.get("num_beams", hf.get("num_beams"))
    if isinstance(beams, int) and beams > 0:
        config.decode.beam_size = beams
    return Experiment.from_mapping(config)


def import_marian(hf_dir: str | Path, workdir: str | Path) -> Experiment:
    """Writes the attnmt workdir of the MarianMT model saved in `hf_dir`."""
    folder, workdir = Path(hf_dir), Path(workdir)
    hf = read_json(folder / "config.json")
    check_importable(hf)  # before any other file is read
    tokenizer_config = read_json(folder / "tokenizer_config.json", required=False)
    _check_tokenizer(folder, tokenizer_config)
    vocab, order = _vocab_order(folder, hf)
    to_attnmt = np.argsort(order)
    start = int(to_attnmt[hf.get("decoder_start_token_id", hf.get("pad_token_id"))])
    generation = read_json(folder / "generation_config.json", required=False)
    weights = read_weights(folder)
    shared = weights.get("model.shared.weight")
    zero_pad = shared is not None and not np.any(shared[order[PAD_ID]])
    experiment = _experiment(hf, generation, tokenizer_config, start, zero_pad)
    params = params_from_marian(weights, experiment.model, order)

    checkpoints = Path(checkpoint_dir(workdir))
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        raise CheckpointError(f"{checkpoints} already holds checkpoints; import into a new one")
    workdir.mkdir(parents=True, exist_ok=True)
    experiment_dict = experiment.to_dict()
    write_json(workdir / "config.json", experiment_dict)
    write_json(workdir / VOCAB_FILE, {piece: int(to_attnmt[i]) for piece, i in vocab.items()})
    for name in (SOURCE_SPM, TARGET_SPM):
        shutil.copyfile(folder / name, workdir / name)
    writer = CheckpointManager(workdir)
    try:
        writer.save(0, {"params": _as_jax(params)}, {}, experiment_dict)
    finally:
        writer.close()  # waits for the asynchronous save
    return experiment


def _as_jax(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {key: _as_jax(value) for key, value in tree.items()}
    return jnp.asarray(tree)
