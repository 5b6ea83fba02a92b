"""attnmt against Hugging Face's own MarianMTModel / MarianTokenizer on the same weights:
teacher-forced logits, greedy and beam search through `attnmt translate`, the export →
import round trip, and the refusals of what attnmt does not compute."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from attnmt.cli.main import main
from attnmt.interop.vocab_order import marian_ids_in_attnmt_order
from tests.interop.conftest import EN, sentences, translation

torch = pytest.importorskip("torch", reason="the interop tests need the [hf] extra")
transformers = pytest.importorskip("transformers", reason="the interop tests need [hf]")

# float32 through 2+2 layers of width 32: each logit is a sum of 32 products of O(1) terms,
# rounded at ~6e-8 relative per operation, so two correct implementations that order their
# sums differently agree to about 1e-6 on logits of size ~10; 1e-4 leaves room and still
# catches any wrong weight, layout or option (those move logits by 1e-2 or more).
LOGIT_ATOL = 1e-4
SOURCES = sentences(EN, 12, seed=7)


@pytest.fixture(scope="module")
def hf(hf_dir):
    model = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
    return model, transformers.MarianTokenizer.from_pretrained(hf_dir)


@pytest.fixture(scope="module")
def workdir(hf_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("imported") / "run"
    assert main(["import", str(hf_dir), "--workdir", str(out)]) == 0
    return out


def _order(model) -> np.ndarray:
    c = model.config
    return marian_ids_in_attnmt_order(c.vocab_size, c.pad_token_id, c.eos_token_id, 1)


def _translate_cli(workdir: Path, tmp_path: Path, *flags: str) -> list[str]:
    source, target = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    args = ["translate", "--workdir", str(workdir), "--input", str(source)]
    assert main([*args, "--output", str(target), *flags]) == 0
    return target.read_text(encoding="utf-8").splitlines()


def _generate(hf, **options) -> list[str]:
    model, tokenizer = hf
    batch = tokenizer(SOURCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=40, do_sample=False, **options)
    assert (out == model.config.eos_token_id).any(dim=1).all(), "a reference never ended"
    return tokenizer.batch_decode(out, skip_special_tokens=True)


def test_tokenization_matches_marian_tokenizer(hf, workdir):
    from attnmt.workdir import load_run

    model, tokenizer = hf
    ours = load_run(workdir).tokenizer
    order = _order(model)
    for text, target in zip(SOURCES, [translation(s) for s in SOURCES], strict=True):
        marian = tokenizer(text, text_target=target)
        assert [int(order[i]) for i in ours.encode(text)] == marian["input_ids"][:-1]
        assert [int(order[i]) for i in ours.encode_target_batch([target])[0]] == marian["labels"][
            :-1
        ]


def test_teacher_forced_logits_match(hf, workdir):
    from attnmt.model.transformer import Transformer
    from attnmt.workdir import load_run

    model, tokenizer = hf
    run = load_run(workdir)
    batch = tokenizer(
        SOURCES, text_target=[translation(s) for s in SOURCES], return_tensors="pt", padding=True
    )
    labels = batch["labels"]
    start = torch.full_like(labels[:, :1], model.config.decoder_start_token_id)
    with torch.no_grad():
        reference = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=torch.cat([start, labels[:, :-1]], dim=1),
        ).logits.numpy()
    order = _order(model)
    to_attnmt = np.argsort(order)
    src = to_attnmt[batch["input_ids"].numpy()].astype(np.int32)
    tgt = to_attnmt[labels.numpy()].astype(np.int32)
    logits = np.asarray(Transformer(run.experiment.model).apply({"params": run.params}, src, tgt))
    real = labels.numpy() != model.config.pad_token_id
    difference = np.abs(logits[real] - reference[..., order][real]).max()
    print(f"max |logit difference| attnmt vs MarianMTModel: {difference:.3g}")
    assert difference < LOGIT_ATOL


def test_greedy_translations_identical(hf, workdir, tmp_path):
    ours = _translate_cli(workdir, tmp_path, "--beam", "1")
    assert ours == _generate(hf, num_beams=1)
    assert len(set(ours)) > 3  # the outputs depend on the input


def test_beam4_identical_without_length_penalty(hf, workdir, tmp_path):
    # attnmt's length penalty is GNMT's ((5+|Y|)/6)^α, Hugging Face's |Y|^length_penalty:
    # they rank alike only at 0, so that is where the searches must agree.
    ours = _translate_cli(workdir, tmp_path, "--beam", "4", "--alpha", "0")
    assert ours == _generate(hf, num_beams=4, length_penalty=0.0)


def test_export_import_round_trip(hf, hf_dir, workdir, tmp_path):
    import jax

    from attnmt.workdir import load_run

    model, tokenizer = hf
    out = tmp_path / "exported"
    assert main(["export", "--workdir", str(workdir), "--format", "hf", "--out", str(out)]) == 0
    again = transformers.MarianMTModel.from_pretrained(out).eval()
    theirs, ours = model.state_dict(), again.state_dict()
    assert theirs.keys() == ours.keys()
    for key, value in theirs.items():
        assert torch.equal(value, ours[key]), key
    exported_tokenizer = transformers.MarianTokenizer.from_pretrained(out)
    assert exported_tokenizer(SOURCES)["input_ids"] == tokenizer(SOURCES)["input_ids"]
    assert main(["import", str(out), "--workdir", str(tmp_path / "again")]) == 0
    first, second = load_run(workdir).params, load_run(tmp_path / "again").params
    assert jax.tree_util.tree_structure(first) == jax.tree_util.tree_structure(second)
    for a, b in zip(
        jax.tree_util.tree_leaves(first), jax.tree_util.tree_leaves(second), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_ctranslate2_greedy_identical(hf, workdir, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2", reason="the interop tests need [hf]")
    _, tokenizer = hf
    out = tmp_path / "ct2"
    args = ["export", "--workdir", str(workdir), "--format", "ctranslate2", "--out", str(out)]
    assert main([*args, "--quantization", "float32"]) == 0
    translator = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    pieces = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(SOURCES)["input_ids"]]
    results = translator.translate_batch(pieces, beam_size=1, max_decoding_length=60)
    theirs = [tokenizer.convert_tokens_to_string(r.hypotheses[0]) for r in results]
    assert _translate_cli(workdir, tmp_path, "--beam", "1") == theirs


def _edited(hf_dir: Path, tmp_path: Path, file: str, key: str, value) -> Path:
    folder = tmp_path / "edited"
    shutil.copytree(hf_dir, folder)
    config = json.loads((folder / file).read_text())
    config[key] = value
    (folder / file).write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("file", "key", "value"),
    [
        ("config.json", "normalize_before", True),
        ("config.json", "normalize_embedding", True),
        ("config.json", "static_position_embeddings", False),
        ("config.json", "decoder_layers", 3),
        ("config.json", "decoder_ffn_dim", 128),
        ("config.json", "tie_word_embeddings", False),
        ("config.json", "share_encoder_decoder_embeddings", False),
        ("config.json", "activation_dropout", 0.1),
        ("config.json", "activation_function", "tanh"),
        ("tokenizer_config.json", "separate_vocabs", True),
    ],
)
def test_unsupported_marian_features_are_refused(hf_dir, tmp_path, capsys, file, key, value):
    folder = _edited(hf_dir, tmp_path, file, key, value)
    assert main(["import", str(folder), "--workdir", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert key in error and len(error.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_fine_tuning_starts_from_the_imported_model(hf, workdir, tmp_path):
    import jax

    from attnmt.cli.config_file import apply_command_line_overrides, load_config_file
    from attnmt.experiment import Experiment
    from attnmt.train.assemble import build_trainer
    from attnmt.workdir import load_run

    model, tokenizer = hf
    run = tmp_path / "run"
    shutil.copytree(workdir, run)
    pairs = {"train": sentences(EN, 64, seed=11), "dev": sentences(EN, 16, seed=12)}
    for split, lines in pairs.items():
        (tmp_path / f"{split}.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (tmp_path / f"{split}.de").write_text(
            "\n".join(map(translation, lines)) + "\n", encoding="utf-8"
        )
    config = load_config_file(f"configs/finetune.py:workdir={run},steps=2")
    apply_command_line_overrides(
        config,
        [
            f"--config.data.src_path={tmp_path}/{{split}}.{{src}}",
            f"--config.data.tgt_path={tmp_path}/{{split}}.{{tgt}}",
            "--config.data.eval_split=dev",
            "--config.data.tokens_per_batch=512",
            "--config.data.eval_tokens_per_batch=1024",
            "--config.data.max_length=64",
            "--config.train.log_every_steps=1",
            "--config.parallel.num_devices=1",
            "--config.train.memory_preflight=false",
            "--config.train.eval_every_steps=2",
        ],
    )
    trainer = build_trainer(Experiment.from_mapping(config), run)
    before = trainer.evaluate()
    # The imported model's own loss on the dev pairs, by Hugging Face (mean token NLL).
    batch = tokenizer(
        pairs["dev"],
        text_target=list(map(translation, pairs["dev"])),
        return_tensors="pt",
        padding=True,
    )
    batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
    with torch.no_grad():
        reference = float(model(**batch).loss)
    assert before["tokens"] == int((batch["labels"] >= 0).sum())  # every dev token counted
    assert before["nll"] == pytest.approx(reference, rel=1e-5)
    result = trainer.run()
    assert result.step == 2 and np.isfinite(result.last_train["loss"])
    tuned, imported = load_run(run).params, load_run(workdir).params
    assert load_run(run).step == 2
    changed = jax.tree_util.tree_map(lambda a, b: bool(np.any(a != b)), tuned, imported)
    assert any(jax.tree_util.tree_leaves(changed))
    # Held fixed, as Hugging Face holds them: the logits bias and the zero pad row.
    np.testing.assert_array_equal(tuned["final_logits_bias"], imported["final_logits_bias"])
    assert not np.any(np.asarray(tuned["embed"]["embedding"][0]))


def test_attention_maps_match_marian(hf, hf_dir, workdir):
    from attnmt.attention.view import attention_view
    from attnmt.workdir import load_run

    _, tokenizer = hf
    # (sdpa, the default, returns no attention weights)
    model = transformers.MarianMTModel.from_pretrained(hf_dir, attn_implementation="eager")
    run = load_run(workdir)
    text, translated = SOURCES[0], translation(SOURCES[0])
    view = attention_view(run.experiment.model, run.params, run.tokenizer, text, translated)
    batch = tokenizer([text], text_target=[translated], return_tensors="pt")
    labels = batch["labels"]
    assert view.target == tokenizer.convert_ids_to_tokens(labels[0])
    start = torch.full_like(labels[:, :1], model.config.decoder_start_token_id)
    with torch.no_grad():
        out = model(
            input_ids=batch["input_ids"],
            decoder_input_ids=torch.cat([start, labels[:, :-1]], dim=1),
            output_attentions=True,
        )
    kinds = {
        "encoder": out.encoder_attentions,
        "decoder": out.decoder_attentions,
        "cross": out.cross_attentions,
    }
    for kind, theirs in kinds.items():
        reference = torch.stack(theirs)[:, 0].numpy()  # [layers, heads, queries, keys]
        np.testing.assert_allclose(view.weights[kind], reference, atol=1e-5, err_msg=kind)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({}, "model.positional_layout"),  # the paper's interleaved sinusoids
        ({"positional_layout": "halves"}, "model.layer_norm_epsilon"),
        (
            {"positional_layout": "halves", "layer_norm_epsilon": 1e-5, "norm_position": "pre"},
            "model.norm_position",
        ),
        ({"positional_layout": "halves", "layer_norm_epsilon": 1e-5, "d_k": 32}, "model.d_k"),
    ],
)
def test_export_refuses_what_marian_does_not_compute(change, key):
    from attnmt.errors import ConfigError
    from attnmt.interop.marian_config import check_exportable
    from attnmt.model.config import ModelConfig

    with pytest.raises(ConfigError, match=key):
        check_exportable(ModelConfig(**change))
    exportable = {"positional_layout": "halves", "layer_norm_epsilon": 1e-5}
    check_exportable(ModelConfig(**exportable))  # the paper's sizes otherwise
