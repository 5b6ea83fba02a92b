"""Decoding commands honour the `--config.decode.*` overrides and the sampling flags, and
refuse overrides they cannot use (naming the key) instead of ignoring them."""

import pytest

from attnmt.cli.main import main
from tests.helpers import translate_lines


def test_translate_samples_by_flag_or_override_and_repeats_with_the_seed(
    workdir,
    tmp_path,
):
    root = workdir[0]
    searched = translate_lines(root, tmp_path, "beam")
    by_flag = translate_lines(
        root, tmp_path, "flag", "--sample", "--temperature", "5", "--seed", "3"
    )
    assert len(by_flag) == len(searched) == 5 and by_flag[2] == ""
    assert by_flag != searched
    overrides = ["--config.decode.sample=true", "--config.decode.temperature=5"]
    by_config = translate_lines(root, tmp_path, "config", *overrides, "--config.decode.seed=3")
    assert by_config == by_flag
    # A flag wins over the override of the same setting.
    both = translate_lines(
        root, tmp_path, "both", *overrides, "--config.decode.seed=4", "--seed", "3"
    )
    assert both == by_flag


def test_decode_overrides_reach_the_search(workdir, tmp_path):
    root = workdir[0]
    greedy = translate_lines(root, tmp_path, "greedy", "--beam", "1")
    assert translate_lines(root, tmp_path, "override", "--config.decode.beam_size=1") == greedy


@pytest.mark.parametrize(
    "argv, key",
    [
        (["translate"], "model.d_ff"),
        (["evaluate"], "train.num_steps"),
        (["average"], "decode.beam_size"),
        (["translate"], "decode.no_such_key"),
    ],
)
def test_commands_refuse_overrides_they_would_ignore(workdir, capsys, argv, key):
    root = workdir[0]
    code = main([*argv, "--workdir", str(root), f"--config.{key}=3"])
    assert code == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err


def test_bad_sampling_settings_name_the_key(workdir, capsys):
    root = workdir[0]
    assert main(["translate", "--workdir", str(root), "--temperature", "-1"]) == 2
    assert "decode.temperature" in capsys.readouterr().err


def test_a_missing_input_file_is_named_without_a_traceback(workdir, tmp_path, capsys):
    missing = tmp_path / "missing.txt"
    code = main(["translate", "--workdir", str(workdir[0]), "--input", str(missing)])
    err = capsys.readouterr().err
    assert code == 2 and str(missing) in err and "Traceback" not in err
