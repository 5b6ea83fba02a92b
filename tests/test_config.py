"""Config files, command-line overrides and validation errors that name the key."""

import pytest

from attnmt.config import load_config_file, load_experiment
from attnmt.config.variants import TABLE3
from attnmt.errors import ConfigError
from tests.helpers import CONFIGS


def _experiment(spec, *overrides):
    return load_experiment(str(CONFIGS / spec), list(overrides))


@pytest.mark.parametrize(
    "name",
    [
        "wmt14_ende.py",
        "wmt14_enfr.py",
        "multi30k.py",
        "tiny.py",
        "multi30k.py:pair=en-fr,quick=true",
        "wmt14_ende.py:runlocal=1",
    ],
)
def test_every_config_file_validates(name):
    _experiment(name)


def test_variants_follow_table_3_row_order():
    a1 = _experiment("wmt14_ende.py:variant=A1").model
    assert (a1.num_heads, a1.d_k, a1.d_v) == (1, 512, 512)
    b1 = _experiment("wmt14_ende.py:variant=B1").model
    assert (b1.d_k, b1.d_v, b1.d_model, b1.num_heads) == (16, 64, 512, 8)  # d_k alone
    assert _experiment("wmt14_ende.py:variant=C1").model.num_layers == 2
    c4 = _experiment("wmt14_ende.py:variant=C4").model
    assert (c4.d_model, c4.d_k, c4.d_v) == (256, 32, 32)
    assert _experiment("wmt14_ende.py:variant=C6").model.d_ff == 1024
    assert _experiment("wmt14_ende.py:variant=D4").train.label_smoothing == 0.2
    assert _experiment("wmt14_ende.py:variant=E").model.positional == "learned"
    big_de = _experiment("wmt14_ende.py:variant=big")
    big_fr = _experiment("wmt14_enfr.py:variant=big")
    assert (big_de.model.d_model, big_de.model.num_heads, big_de.model.d_ff) == (1024, 16, 4096)
    assert big_de.model.dropout_rate == 0.3 and big_fr.model.dropout_rate == 0.1
    assert big_de.train.num_steps == 300_000
    assert len(TABLE3) == 18


def test_overrides_are_typed():
    exp = _experiment(
        "tiny.py",
        "--config.model.num_layers=4",
        "--config.optim.warmup_steps=7",
        "--config.model.dropout_rate=0.25",
        "--config.model.positional=learned",
    )
    assert exp.model.num_layers == 4 and exp.optim.warmup_steps == 7
    assert exp.model.dropout_rate == 0.25 and exp.model.positional == "learned"


@pytest.mark.parametrize(
    "override, key",
    [
        ("--config.model.num_layer=4", "model.num_layer"),
        ("--config.modle.num_layers=4", "modle"),
        ("--config.model.num_layers=four", "model.num_layers"),
        ("--config.model.d_ff=0", "model.d_ff"),
        ("--config.model.d_k=-3", "model.d_k"),
        ("--config.model.dropout_rate=1.0", "model.dropout_rate"),
        ("--config.model.attention_dropout_rate=-0.1", "model.attention_dropout_rate"),
        ("--config.model.vocab_size=3", "model.vocab_size"),
        ("--config.model.positional=rotary", "model.positional"),
        ("--config.train.label_smoothing=1.5", "train.label_smoothing"),
        ("--config.train.early_dropout_rate=1.0", "train.early_dropout_rate"),
        ("--config.train.early_dropout_steps=-5", "train.early_dropout_steps"),
        ("--config.train.early_dropout_rate=0.1", "train.early_dropout_steps"),  # no steps
        ("--config.optim.warmup_steps=0", "optim.warmup_steps"),
        ("--config.optim.weight_decay=-0.01", "optim.weight_decay"),
        ("--config.model.num_decoder_layers=-1", "model.num_decoder_layers"),
        ("--config.data.tokens_per_batch=0", "data.tokens_per_batch"),
        ("--config.data.pack_source_length=32", "data.pack_source_length"),  # not packed
        ("--config.data.pack_source_length=-1", "data.pack_source_length"),
        ("--config.train.f1_every_steps=-1", "train.f1_every_steps"),
        ("--config.train.keep_best_by=f1", "train.f1_every_steps"),  # ranks nothing
        ("--config.train.f1_every_steps=100", "train.f1_every_steps"),  # not a parsing run
    ],
)
def test_bad_values_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _experiment("tiny.py", override)


def test_a_stack_of_its_own_depth_leaves_the_other_at_num_layers():
    model = _experiment("tiny.py", "--config.model.num_decoder_layers=1").model
    assert (model.encoder_layers, model.decoder_layers) == (model.num_layers, 1)
    assert model.num_layers != 1
    expected = f"model.num_layers={model.num_layers}, model.num_decoder_layers=1"
    assert model.depth_settings() == expected


def test_unknown_variant_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="C7"):
        _experiment("wmt14_ende.py:variant=Z9")


def test_missing_config_file_is_named():
    with pytest.raises(ConfigError, match=r"nope\.py"):
        load_config_file("configs/nope.py")
