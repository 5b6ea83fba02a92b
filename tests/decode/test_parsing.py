"""The parsing task end to end: treebank files → (words, linearized tree) pairs, a trained
run's `attnmt evaluate` F1 and `attnmt parse` trees (well formed, over exactly each input
line's words, one line out per line in)."""

from __future__ import annotations

import pytest

from attnmt.cli.config_file import load_config_file
from attnmt.cli.main import main
from attnmt.data.parsing import parse_splits, treebank_pairs, treebank_trees
from attnmt.data.treebank import parse_bracketed, to_bracketed, words
from attnmt.decode.config import DecodeConfig
from attnmt.decode.parsing import parsing_translator
from attnmt.errors import ConfigError, DataError
from attnmt.evaluate.parse_f1 import score_trees
from attnmt.experiment import Experiment
from attnmt.workdir import load_run
from tests.decode.test_tree_grammar import is_tree
from tests.launch.helpers import TINY_MODEL
from tests.test_config import CONFIGS


@pytest.fixture(scope="module")
def ptb_dir(ptb_sample_dir):
    return ptb_sample_dir


def test_splits_are_file_ranges_and_bad_ones_are_named():
    assert parse_splits("train=1-159, dev=160-179") == {"train": (1, 159), "dev": (160, 179)}
    for bad in ("train=1", "train=9-3", "=1-2", ""):
        with pytest.raises(ConfigError, match="treebank_splits"):
            parse_splits(bad)


def test_pairs_are_the_words_and_the_linearized_tree(ptb_dir):
    pairs = treebank_pairs("train", str(ptb_dir), "train=1-1", "XX")
    source, target = pairs[0]
    assert source == (
        "Pierre Vinken , 61 years old , will join the board as a nonexecutive director Nov. 29 ."
    )
    # Vinyals et al.'s format, every POS tag XX; the function tag of NP-SBJ is gone.
    assert target.startswith("(S (NP (NP XX XX )NP XX (ADJP (NP XX XX )NP XX )ADJP XX )NP (VP")
    assert target.endswith(")VP XX )S")
    assert len(pairs) == 2  # wsj_0001 holds two sentences
    with pytest.raises(DataError, match="no split 'test'"):
        treebank_pairs("test", str(ptb_dir), "train=1-1", "XX")


def test_the_configs_load_with_the_paper_decoding():
    for variant in ("paper", "sample"):
        config = load_config_file(str(CONFIGS / f"wsj_parsing.py:variant={variant}"))
        experiment = Experiment.from_mapping(config)
        assert experiment.data.source == "treebank"
        decode = experiment.decode
        assert (decode.beam_size, decode.alpha, decode.max_len_offset) == (21, 0.3, 300)
    assert (experiment.model.num_layers, experiment.data.treebank_splits) == (
        4,
        "train=1-159,dev=160-179",
    )


@pytest.mark.slow
@pytest.mark.parametrize("leaves", ["pos", "words"])
def test_a_trained_parser_is_evaluated_and_parses_any_line(ptb_dir, tmp_path, capsys, leaves):
    workdir = tmp_path / "run"
    overrides = [
        f"--config.data.data_dir={ptb_dir}",
        f"--config.data.treebank_leaves={leaves}",
        "--config.data.treebank_splits=train=1-30,dev=160-161",
        "--config.model.vocab_size=300",
        *TINY_MODEL,
        "--config.data.tokens_per_batch=2048",
        "--config.train.num_steps=10",
        "--config.train.eval_every_steps=0",
        "--config.train.time_limit_minutes=0",
        "--config.train.memory_preflight=false",
    ]
    config = f"{CONFIGS / 'wsj_parsing.py'}:variant=sample"
    assert main(["train", "--config", config, "--workdir", str(workdir), *overrides]) == 0
    decode = ["--beam", "1", "--config.decode.max_len_offset=20"]
    capsys.readouterr()
    assert main(["evaluate", "--workdir", str(workdir), "--split", "dev", *decode]) == 0
    out = capsys.readouterr().out
    assert "Bracketing FMeasure" in out, out
    # The written trees are the ones scored: rescoring them gives the printed figure.
    written = next((workdir / "decodes").glob("dev-step10-beam1.trees")).read_text()
    gold = treebank_trees("dev", str(ptb_dir), "train=1-30,dev=160-161")
    parsed = [parse_bracketed(line) for line in written.splitlines()]
    assert f"{score_trees(gold, parsed).f1:.2f}" in out

    # Under the tree grammar (the default) the model's raw outputs are already trees with
    # one leaf per word (the word itself, when copied), for the untrained model too, by
    # beam search and greedily.
    run = load_run(workdir)
    sentences = [" ".join(words(tree)) for tree in gold]
    for beam in (1, 3):
        translator = parsing_translator(run, DecodeConfig(beam_size=beam, max_len_offset=20))
        for sentence, output in zip(sentences, translator.translate(sentences), strict=True):
            tokens = tuple(output.split())
            leaf_tokens = [t for t in tokens if t[0] not in "()"]
            if leaves == "words":
                assert leaf_tokens == sentence.split(), (sentence, output)
                tokens = tuple(t if t[0] in "()" else "XX" for t in tokens)
            else:
                assert set(leaf_tokens) == {"XX"}
            assert is_tree(tokens, len(sentence.split())), (sentence, output)

    lines = ["The cat sat on the mat .", "", "( odd ) tokens ( (", "a " * 40, "single"]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n")
    target = tmp_path / "out.txt"
    argv = ["parse", "--workdir", str(workdir), "--input", str(source), "--output", str(target)]
    assert main([*argv, *decode]) == 0
    trees = target.read_text().split("\n")[:-1]
    assert main(["parse", "--workdir", str(workdir), "--input", str(tmp_path / "none")]) == 2
    assert "--input" in capsys.readouterr().err
    assert len(trees) == len(lines) and trees[1] == ""
    for line, bracketed in zip(lines, trees, strict=True):
        if line.strip():
            tree = parse_bracketed(bracketed)
            assert words(tree) == [
                w.replace("(", "-LRB-").replace(")", "-RRB-") for w in line.split()
            ]
            assert to_bracketed(tree) == bracketed
