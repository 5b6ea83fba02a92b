"""attnmt against Hugging Face's own MarianMTModel / MarianTokenizer on the same weights:
teacher-forced logits, greedy and beam search through `attnmt translate`, attention maps,
the export → import round trip, and the export's refusals of what MarianMTModel does not
compute. (Import refusals: test_import_refusals.py; fine-tuning and resuming:
test_finetune.py; CTranslate2: test_ctranslate2.py; a model attnmt trained:
test_export_native.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attnmt.cli.main import main
from attnmt.interop.vocab_order import marian_ids_in_attnmt_order
from tests.helpers import LOGIT_ATOL, SOURCES, translate_cli, translation

torch = pytest.importorskip("torch", reason="the interop tests need the [hf] extra")
transformers = pytest.importorskip("transformers", reason="the interop tests need [hf]")

LEVEL0 = {"compiler_options": {"xla_backend_optimization_level": 0}}  # a shorter compile
# A weight p_i = softmax(s)_i moves by p_i·(Δs_i − Σ_j p_j·Δs_j), at most 2·p_i·max|Δs|,
# when the scores s move by Δs. Scores end a shorter chain of float32 matmuls than the logits
# and are no larger, so LOGIT_ATOL bounds the two implementations' Δs too; the float32 exp
# and normalisation add a few u (2^-24) of relative error, well inside. A relative bound
# holds each small weight to its own size, where an absolute one would let it be anything.
ATTENTION_RTOL = 2 * LOGIT_ATOL


@pytest.fixture(scope="module")
def workdir(imported) -> Path:
    return imported


def _order(model) -> np.ndarray:
    c = model.config
    return marian_ids_in_attnmt_order(c.vocab_size, c.pad_token_id, c.eos_token_id, 1)


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
    _check_teacher_forced_logits(hf, workdir)


def _check_teacher_forced_logits(hf, workdir) -> None:
    import jax

    from attnmt.model.transformer import Transformer
    from attnmt.workdir import load_run

    hf_model, tokenizer = hf
    run = load_run(workdir)
    batch = tokenizer(
        SOURCES, text_target=[translation(s) for s in SOURCES], return_tensors="pt", padding=True
    )
    labels = batch["labels"]
    start = torch.full_like(labels[:, :1], hf_model.config.decoder_start_token_id)
    with torch.no_grad():
        reference = hf_model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=torch.cat([start, labels[:, :-1]], dim=1),
        ).logits.numpy()
    order = _order(hf_model)
    to_attnmt = np.argsort(order)
    src = to_attnmt[batch["input_ids"].numpy()].astype(np.int32)
    tgt = to_attnmt[labels.numpy()].astype(np.int32)
    ours = Transformer(run.experiment.model)
    forward = jax.jit(lambda p, s, t: ours.apply({"params": p}, s, t), **LEVEL0)
    logits = np.asarray(forward(run.params, src, tgt))
    real = labels.numpy() != hf_model.config.pad_token_id
    difference = np.abs(logits[real] - reference[..., order][real]).max()
    print(f"max |logit difference| attnmt vs MarianMTModel: {difference:.3g}")
    assert difference < LOGIT_ATOL


def test_greedy_translations_identical(hf, imported_greedy):
    ours = imported_greedy
    assert ours == _generate(hf, num_beams=1)
    assert len(set(ours)) > 1  # the outputs depend on the input: the equality says more


def test_beam4_identical_without_length_penalty(hf, workdir, tmp_path):
    # attnmt's length penalty is GNMT's ((5+|Y|)/6)^α, Hugging Face's |Y|^length_penalty:
    # they rank alike only at 0, so that is where the searches must agree.
    ours = translate_cli(workdir, tmp_path, "--beam", "4", "--alpha", "0")
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


def test_a_deeper_encoder_than_decoder_imports_and_exports_alike(hf, hf_dir, tmp_path):
    # Marian's encoder_layers / decoder_layers: model.num_layers and model.num_decoder_layers.
    # The reference model's config with a 3-layer encoder under a 1-layer decoder, freshly
    # initialised (the logits need no training to differ when a weight is misplaced).
    from attnmt.workdir import load_run

    _, tokenizer = hf
    config = transformers.MarianConfig.from_pretrained(hf_dir)
    config.encoder_layers, config.decoder_layers = 3, 1
    torch.manual_seed(1)
    uneven = transformers.MarianMTModel(config).eval()
    source = tmp_path / "uneven"
    uneven.save_pretrained(source)
    tokenizer.save_pretrained(source)
    workdir = tmp_path / "run"
    assert main(["import", str(source), "--workdir", str(workdir)]) == 0
    model = load_run(workdir).experiment.model
    assert (model.encoder_layers, model.decoder_layers) == (3, 1)
    assert "decoder_1" not in load_run(workdir).params and "encoder_2" in load_run(workdir).params
    _check_teacher_forced_logits((uneven, tokenizer), workdir)

    out = tmp_path / "exported"
    assert main(["export", "--workdir", str(workdir), "--format", "hf", "--out", str(out)]) == 0
    again = transformers.MarianMTModel.from_pretrained(out).eval()
    assert (again.config.encoder_layers, again.config.decoder_layers) == (3, 1)
    theirs, ours = uneven.state_dict(), again.state_dict()
    assert theirs.keys() == ours.keys()
    for key, value in theirs.items():
        assert torch.equal(value, ours[key]), key


def test_attention_maps_match_marian(hf, hf_dir, workdir):
    from attnmt.inspection.view import attention_view
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
        np.testing.assert_allclose(
            view.weights[kind], reference, rtol=ATTENTION_RTOL, atol=1e-30, err_msg=kind
        )


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({}, "model.positional_layout"),  # the paper's interleaved sinusoids
        ({"positional_layout": "halves"}, "model.layer_norm_epsilon"),
        (
            {"positional_layout": "halves", "layer_norm_epsilon": 1e-5, "norm_position": "pre"},
            "model.norm_position",
        ),
        (
            {"positional_layout": "halves", "layer_norm_epsilon": 1e-5, "norm_type": "scale"},
            "model.norm_type",
        ),
        (
            {"positional_layout": "halves", "layer_norm_epsilon": 1e-5, "qk_norm": True},
            "model.qk_norm",
        ),
        ({"positional_layout": "halves", "layer_norm_epsilon": 1e-5, "d_k": 32}, "model.d_k"),
    ],
)
def test_export_refuses_what_marian_does_not_compute(change, key):
    from attnmt.config.model import ModelConfig
    from attnmt.errors import ConfigError
    from attnmt.interop.marian_config import check_exportable

    with pytest.raises(ConfigError, match=key):
        check_exportable(ModelConfig(**change))
    exportable = {"positional_layout": "halves", "layer_norm_epsilon": 1e-5}
    check_exportable(ModelConfig(**exportable))  # the paper's sizes otherwise


def test_training_dropouts_travel_through_import_and_export(hf_dir, tmp_path):
    """Marian's three dropout rates become model.* rates, and export writes them back."""
    import json
    import shutil

    from attnmt.workdir import load_run

    folder = tmp_path / "dropouts"
    shutil.copytree(hf_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    rates = {"dropout": 0.25, "attention_dropout": 0.15, "activation_dropout": 0.1}
    (folder / "config.json").write_text(json.dumps({**config, **rates}))
    run = tmp_path / "run"
    assert main(["import", str(folder), "--workdir", str(run)]) == 0
    model = load_run(run).experiment.model
    imported = (model.dropout_rate, model.attention_dropout_rate, model.activation_dropout_rate)
    assert imported == (0.25, 0.15, 0.1)
    out = tmp_path / "exported"
    assert main(["export", "--workdir", str(run), "--format", "hf", "--out", str(out)]) == 0
    written = json.loads((out / "config.json").read_text())
    assert {key: written[key] for key in rates} == rates
