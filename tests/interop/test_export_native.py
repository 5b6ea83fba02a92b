"""A model trained by attnmt itself (its own shared sentencepiece vocabulary, its own
checkpoint) exports to Hugging Face: MarianTokenizer tokenizes as attnmt does,
MarianMTModel computes attnmt's logits, and generate() finds attnmt's greedy translations.
The CTranslate2 export is refused, naming why, unless the decoder starts on the pad token
with a zero embedding row; then CTranslate2 scores as attnmt does."""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import numpy as np
import pytest

from attnmt.checkpoint.manager import CheckpointManager
from attnmt.cli.main import main
from attnmt.common import BOS_ID, EOS_ID, PAD_ID
from attnmt.config import load_experiment
from attnmt.data.tokenizer import train_vocab
from attnmt.model.transformer import Transformer
from attnmt.train.optim import make_optimizer
from attnmt.train.step import create_train_state
from attnmt.workdir import load_run
from tests.helpers import (
    EN,
    LOGIT_ATOL,
    SOURCES,
    sentences,
    translate_cli,
    translation,
    word_task_overrides,
    write_word_task_corpus,
)

torch = pytest.importorskip("torch", reason="the interop tests need the [hf] extra")
transformers = pytest.importorskip("transformers", reason="the interop tests need [hf]")

JIT0 = {"compiler_options": {"xla_backend_optimization_level": 0}}
# What makes an attnmt model one MarianMTModel computes (the export refuses others).
EXPORTABLE = ["--config.model.positional_layout=halves", "--config.model.layer_norm_epsilon=1e-5"]


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> Path:
    """`attnmt train` on the word-for-word task: 200 updates of configs/tiny.py (its own
    64-piece BPE vocabulary, decoder start <s>), enough for translations that depend on the
    input and end with </s>."""
    root = tmp_path_factory.mktemp("native")
    splits = {"train": sentences(EN, 2000, 21), "dev": sentences(EN, 16, 22)}
    corpus = write_word_task_corpus(root / "corpus", splits)
    workdir = root / "run"
    overrides = [*word_task_overrides(corpus, 200), *EXPORTABLE]
    argv = ["train", "--config", "configs/tiny.py", "--workdir", str(workdir), *overrides]
    assert main(argv) == 0
    return workdir


@pytest.fixture(scope="module")
def exported(native, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("native_hf") / "hf"
    assert main(["export", "--workdir", str(native), "--format", "hf", "--out", str(out)]) == 0
    return out


def _marian_to_attnmt(tokenizer, run) -> np.ndarray:
    """Each Marian id's attnmt id, matched by piece string (not by interop/vocab_order)."""
    pieces = run.tokenizer.pieces(range(run.tokenizer.vocab_size))
    ids = {piece: i for i, piece in enumerate(pieces)}
    marian = tokenizer.get_vocab()
    assert len(marian) == len(ids)
    table = np.full(len(marian), -1)
    for piece, m in marian.items():
        table[m] = ids[piece]
    assert sorted(table) == list(range(len(ids)))  # a permutation
    return table


@functools.cache
def _forward(config):
    """attnmt's teacher-forced forward pass, jitted once per model config."""
    model = Transformer(config)
    return jax.jit(lambda p, s, t: model.apply({"params": p}, s, t), **JIT0)


def _attnmt_logits(run, src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
    return np.asarray(_forward(run.experiment.model)(run.params, src, tgt))


def _teacher_forced(hf_model, tokenizer, run, table):
    """Logits of both on the same pairs, in attnmt's vocabulary order, at real targets."""
    targets = [translation(s) for s in SOURCES]
    batch = tokenizer(SOURCES, text_target=targets, return_tensors="pt", padding=True)
    labels = batch["labels"]
    start = torch.full_like(labels[:, :1], hf_model.config.decoder_start_token_id)
    with torch.no_grad():
        theirs = (
            hf_model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                decoder_input_ids=torch.cat([start, labels[:, :-1]], dim=1),
            )
            .logits.double()
            .numpy()
        )
    src = table[batch["input_ids"].numpy()].astype(np.int32)
    tgt = table[labels.numpy()].astype(np.int32)
    ours = _attnmt_logits(run, src, tgt)
    to_marian = np.argsort(table)  # attnmt id → Marian id
    real = labels.numpy() != hf_model.config.pad_token_id
    return ours[real], theirs[..., to_marian][real]


# A model 200 updates old loops on some sentences, and which ones differs from CPU to CPU
# (training is not bit-identical across them; one CI CPU looped where others ended): the
# length limit decides where a loop ends, so both searches get attnmt's, made short enough
# that some sentences reach it on any CPU.
OFFSET = 4


def _marian_greedy(hf_model, tokenizer, run, table, text: str) -> str:
    """generate(num_beams=1) under attnmt's length limit: at most (source pieces with </s>)
    + OFFSET tokens, </s> included and forced at the last of them (beam_search.py). Its ids
    are detokenized by attnmt, as sentencepiece does: MarianTokenizer.decode also strips
    the text, which differs where a search cut short ends on a bare "▁"."""
    batch = tokenizer([text], return_tensors="pt")
    limit = batch["input_ids"].shape[1] + OFFSET
    eos = hf_model.config.eos_token_id
    with torch.no_grad():
        out = hf_model.generate(
            **batch, max_new_tokens=limit, do_sample=False, num_beams=1, forced_eos_token_id=eos
        )
    emitted = out[0, 1:].tolist()  # after the decoder start
    assert eos in emitted, "a reference never ended"
    return run.tokenizer.decode([int(table[i]) for i in emitted[: emitted.index(eos)]])


def test_native_model_exports_to_marian_with_its_logits_and_translations(
    native, exported, tmp_path
):
    run = load_run(native)
    assert run.experiment.data.vocab_kind == "sentencepiece"  # its own shared vocabulary
    assert run.experiment.model.decoder_start_id == BOS_ID
    tokenizer = transformers.MarianTokenizer.from_pretrained(exported)
    hf_model = transformers.MarianMTModel.from_pretrained(exported).eval()
    table = _marian_to_attnmt(tokenizer, run)
    # Tokenization: MarianTokenizer's ids (with its </s>) are attnmt's pieces.
    for text in SOURCES:
        marian = tokenizer(text, text_target=translation(text))
        source = [*run.tokenizer.encode(text), EOS_ID]
        assert [int(table[i]) for i in marian["input_ids"]] == source
        target = run.tokenizer.encode_target_batch([translation(text)])[0]
        assert [int(table[i]) for i in marian["labels"]] == [*target, EOS_ID]
    ours, theirs = _teacher_forced(hf_model, tokenizer, run, table)
    difference = np.abs(ours - theirs).max()
    print(f"native export: max |logit difference| {difference:.3g}")
    assert difference < LOGIT_ATOL

    # Greedy search: `attnmt translate --beam 1` and generate(num_beams=1).
    ours = translate_cli(native, tmp_path, "--beam", "1", "--max-len-offset", str(OFFSET))
    assert ours == [_marian_greedy(hf_model, tokenizer, run, table, t) for t in SOURCES]
    assert len(set(ours)) > 1, ours  # the outputs depend on the input


def test_ctranslate2_refuses_a_decoder_that_starts_on_bos(native, tmp_path, capsys):
    out = tmp_path / "ct2"
    argv = ["export", "--workdir", str(native), "--format", "ctranslate2", "--out", str(out)]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert f"model.decoder_start_id={BOS_ID}" in error and len(error.splitlines()) == 1
    assert not out.exists()


def _random_workdir(root: Path, *overrides: str) -> Path:
    """A workdir as training leaves it (config, its own vocabulary, a whole train state),
    with the random initial weights: enough wherever only computed values are compared."""
    root.mkdir(parents=True)
    lines = sentences(EN, 300, seed=31)
    train_vocab([x for s in lines for x in (s, translation(s))], root / "vocab.model", 64)
    experiment = load_experiment("configs/tiny.py", [*EXPORTABLE, *overrides])
    model = Transformer(experiment.model)
    optimizer = make_optimizer(experiment.optim, experiment.model.d_model)
    example = {"src_tokens": np.ones((1, 8), np.int32), "tgt_tokens": np.ones((1, 8), np.int32)}
    init = jax.jit(lambda rng: create_train_state(model, optimizer, rng, example), **JIT0)
    manager = CheckpointManager(root)
    manager.save(
        1, init(jax.random.PRNGKey(0)), {"epoch": 0, "index": 0, "seed": 0}, experiment.to_dict()
    )
    manager.close()
    return root


START_ON_PAD = [f"--config.model.decoder_start_id={PAD_ID}"]


def test_ctranslate2_refuses_a_start_row_that_is_not_zero(tmp_path, capsys):
    workdir = _random_workdir(tmp_path / "run", *START_ON_PAD)
    out = tmp_path / "ct2"
    argv = ["export", "--workdir", str(workdir), "--format", "ctranslate2", "--out", str(out)]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert "<pad>" in error and "not zero" in error and len(error.splitlines()) == 1
    assert not out.exists()


def _log_probs(logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """float64 log-softmax over every id but pad (CTranslate2 drops <pad> from the
    vocabulary), at `tokens`."""
    z = np.delete(np.float64(logits), PAD_ID, axis=-1)
    z = z - z.max(-1, keepdims=True)
    log_softmax = z - np.log(np.exp(z).sum(-1, keepdims=True))
    columns = tokens - (tokens > PAD_ID)  # the ids after pad move down by one
    return np.take_along_axis(log_softmax, columns[..., None], -1)[..., 0]


def test_a_model_starting_on_a_zero_pad_row_exports_to_both(tmp_path):
    """Decoder start <pad> with model.zero_pad_embedding: the model computes with a zero
    row whatever the stored one holds (the initial weights' row is not zero), so both
    exports must carry the zero row the model computes with."""
    workdir = _random_workdir(
        tmp_path / "run", *START_ON_PAD, "--config.model.zero_pad_embedding=true"
    )
    run = load_run(workdir)
    assert np.any(np.asarray(run.params["embed"]["embedding"][PAD_ID]))
    hf_dir = tmp_path / "hf"
    assert main(["export", "--workdir", str(workdir), "--format", "hf", "--out", str(hf_dir)]) == 0
    tokenizer = transformers.MarianTokenizer.from_pretrained(hf_dir)
    hf_model = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
    table = _marian_to_attnmt(tokenizer, run)
    ours, theirs = _teacher_forced(hf_model, tokenizer, run, table)
    difference = np.abs(ours - theirs).max()
    print(f"start on a zero <pad> row, HF export: max |logit difference| {difference:.3g}")
    assert difference < LOGIT_ATOL

    ctranslate2 = pytest.importorskip("ctranslate2", reason="the interop tests need [hf]")
    ct2_dir = tmp_path / "ct2"
    argv = ["export", "--workdir", str(workdir), "--format", "ctranslate2", "--out", str(ct2_dir)]
    assert main(argv) == 0
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", intra_threads=1)
    targets = [translation(s) for s in SOURCES]
    batch = tokenizer(SOURCES, text_target=targets, return_tensors="np", padding=True)
    src = table[batch["input_ids"]].astype(np.int32)
    tgt = table[batch["labels"]].astype(np.int32)
    expected = _log_probs(_attnmt_logits(run, src, tgt), tgt)  # one padded batch
    source_lengths, target_lengths = (src != PAD_ID).sum(1), (tgt != PAD_ID).sum(1)
    scored = translator.score_batch(
        [
            tokenizer.convert_ids_to_tokens(ids[:n])
            for ids, n in zip(batch["input_ids"], source_lengths, strict=True)
        ],
        [
            tokenizer.convert_ids_to_tokens(ids[: n - 1])
            for ids, n in zip(batch["labels"], target_lengths, strict=True)
        ],
    )  # each target without its </s>, which CTranslate2 scores as the last token
    for result, want, n in zip(scored, expected, target_lengths, strict=True):
        # log-softmax moves by at most twice the largest logit change
        np.testing.assert_allclose(result.log_probs, want[:n], rtol=0, atol=2 * LOGIT_ATOL)
