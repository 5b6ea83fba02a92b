"""A tiny random MarianMTModel and its MarianTokenizer, saved with save_pretrained: the
reference the interop tests compare attnmt against (built offline, in a few seconds), and
its import into an attnmt workdir, shared by every interop test file.

The sentencepiece models are trained on generated sentences; the model is fitted for a
few seconds to a word-for-word task, so that its translations depend on the input and end
as a trained model's do (a random one repeats one piece until the length limit).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import EN, sentences, translate_cli, translation

pytest.importorskip("transformers", reason="the interop tests need the [hf] extra")
pytest.importorskip("torch", reason="the interop tests need the [hf] extra")


def _train_spm(lines: list[str], prefix: Path) -> None:
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(prefix),
        vocab_size=60,
        model_type="unigram",
        pad_id=-1,
        bos_id=-1,
        eos_id=0,
        unk_id=1,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    prefix.with_suffix(".model").rename(prefix.with_suffix(".spm"))


def _marian_vocab(folder: Path) -> dict[str, int]:
    """Marian's layout: </s> 0, <unk> 1, the pieces of both models, <pad> last."""
    import sentencepiece as spm

    vocab = {"</s>": 0, "<unk>": 1}
    for name in ("source.spm", "target.spm"):
        sp = spm.SentencePieceProcessor(model_file=str(folder / name))
        for i in range(sp.get_piece_size()):
            vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


def _fit(model, tokenizer, steps: int = 300) -> None:
    """A few hundred Adam updates on the word-for-word task, so that outputs depend on the
    input and end with </s> as a trained model's do; then a random final_logits_bias."""
    import torch

    # One thread: with the other test worker (or anything else) on the second core, torch's
    # spinning thread pool made this fit ten times slower (200 s instead of 20 in CI).
    torch.set_num_threads(1)
    torch.manual_seed(0)
    source = sentences(EN, 512, seed=3)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    model.train()
    for step in range(steps):
        rows = slice(32 * (step % 16), 32 * (step % 16 + 1))
        batch = tokenizer(
            source[rows],
            text_target=[translation(s) for s in source[rows]],
            return_tensors="pt",
            padding=True,
        )
        batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        model.model.shared.weight[tokenizer.pad_token_id] = 0.0  # the padding_idx row
        model.final_logits_bias.copy_(0.1 * torch.randn_like(model.final_logits_bias))


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory) -> Path:
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    folder = tmp_path_factory.mktemp("marian")
    _train_spm(sentences(EN, 300, 1), folder / "source")
    _train_spm([translation(s) for s in sentences(EN, 300, 2)], folder / "target")
    vocab = _marian_vocab(folder)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    tokenizer = MarianTokenizer(
        str(folder / "source.spm"),
        str(folder / "target.spm"),
        str(folder / "vocab.json"),
        source_lang="en",
        target_lang="de",
    )
    size = len(vocab)
    config = MarianConfig(
        vocab_size=size,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function="swish",
        scale_embedding=True,
        max_position_embeddings=128,
        pad_token_id=size - 1,
        decoder_start_token_id=size - 1,
        eos_token_id=0,
        forced_eos_token_id=0,
    )
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    _fit(model, tokenizer)
    model.generation_config.bad_words_ids = [[size - 1]]  # as opus-mt's configs have it
    model.generation_config.num_beams = 4
    out = folder / "hf"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def hf(hf_dir):
    """The reference MarianMTModel (eval mode) and MarianTokenizer, loaded once."""
    from transformers import MarianMTModel, MarianTokenizer

    return MarianMTModel.from_pretrained(hf_dir).eval(), MarianTokenizer.from_pretrained(hf_dir)


@pytest.fixture(scope="session")
def imported(hf_dir, tmp_path_factory) -> Path:
    """`attnmt import` of the reference model; tests copy it before writing into it."""
    from attnmt.cli.main import main

    out = tmp_path_factory.mktemp("imported") / "run"
    assert main(["import", str(hf_dir), "--workdir", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def imported_greedy(imported, tmp_path_factory) -> list[str]:
    """`attnmt translate --beam 1` of SOURCES with the imported model."""
    return translate_cli(imported, tmp_path_factory.mktemp("greedy"), "--beam", "1")
