"""The parsing task end to end: treebank files → (words, linearized tree) pairs; the paper
variant's splits and size; a trained run's `attnmt evaluate` (the files it writes, scored
by the real EVALB, give the F1 it prints) and `attnmt parse` trees (well formed, over
exactly each input line's words, one line out per line in)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnmt.checkpoint.manager import CheckpointManager
from attnmt.cli.main import main
from attnmt.config import Experiment, load_experiment
from attnmt.config.decode import DecodeConfig
from attnmt.data.parsing import parse_splits, treebank_pairs, treebank_trees
from attnmt.data.treebank import parse_bracketed, retag, tags, to_bracketed, words
from attnmt.decode.parsing import parsing_translator
from attnmt.errors import ConfigError, DataError
from attnmt.workdir import load_run
from tests.evalb import Evalb, evalb_fixture
from tests.helpers import CONFIGS, TINY_MODEL_OVERRIDES, event_scalars, is_tree

PUNCTUATION = {",", ".", ":", "``", "''"}


@pytest.fixture(scope="module")
def ptb_dir(ptb_sample_dir):
    return ptb_sample_dir


@pytest.fixture(scope="session")
def evalb(tmp_path_factory: pytest.TempPathFactory) -> Evalb:
    return evalb_fixture(tmp_path_factory)


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
        experiment = load_experiment(str(CONFIGS / f"wsj_parsing.py:variant={variant}"))
        assert experiment.data.source == "treebank"
        decode = experiment.decode
        assert (decode.beam_size, decode.alpha, decode.max_len_offset) == (21, 0.3, 300)
    assert (experiment.model.num_layers, experiment.data.treebank_splits) == (
        4,
        "train=1-159,dev=160-179",
    )


def _paper() -> Experiment:
    return load_experiment(str(CONFIGS / "wsj_parsing.py:variant=paper"))


def test_the_paper_variant_splits_wsj_sections_2_21_22_23(tmp_path: Path):
    """§6.3 / README: train on sections 02-21, dev 22, test 23. PTB numbers its files
    section * 100 + file, in one folder per section: a file at each edge of every range (and
    one just outside) shows which split reads which section, no treebank needed."""
    data = _paper().data
    assert (data.train_split, data.eval_split, data.test_split) == ("train", "dev", "test")
    numbers = (199, 200, 1234, 2199, 2200, 2299, 2300, 2399, 2400)
    for number in numbers:
        section = tmp_path / "wsj" / f"{number // 100:02d}"
        section.mkdir(parents=True, exist_ok=True)
        (section / f"wsj_{number:04d}.mrg").write_text(f"( (S (NN file{number:04d})) )\n")
    read = {
        split: [
            words(tree)[0] for tree in treebank_trees(split, str(tmp_path), data.treebank_splits)
        ]
        for split in ("train", "dev", "test")
    }
    assert read == {
        "train": ["file0200", "file1234", "file2199"],  # sections 02-21
        "dev": ["file2200", "file2299"],  # section 22
        "test": ["file2300", "file2399"],  # section 23
    }


def test_the_paper_variant_has_133_9m_parameters(capsys):
    """The count `attnmt params` prints for variant=paper (no data needed) equals the
    Transformer's count by formula from its sizes, and that is the README's 133.9M."""
    model = _paper().model
    # §6.3: 4 layers, d_model 1024, a 16K vocabulary; the rest as the big model's.
    sizes = (model.num_layers, model.d_model, model.d_ff, model.num_heads, model.vocab_size)
    assert sizes == (4, 1024, 4096, 16, 16_000)
    assert (model.d_k, model.d_v) == (64, 64)
    # The switches the formula assumes: §3.4's one shared embedding matrix, sinusoidal
    # positions (no parameters), no attention biases, post-norm (no final norms).
    assert model.share_embeddings and model.positional == "sinusoidal"
    assert not model.attention_bias and not model.final_logits_bias
    assert model.norm_position == "post"
    d, heads = model.d_model, model.num_heads
    attention = d * heads * model.d_k * 2 + d * heads * model.d_v * 2  # W_Q, W_K; W_V, W_O
    ffn = d * model.d_ff + model.d_ff + model.d_ff * d + d  # two layers with biases
    norm = 2 * d  # scale and offset
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    expected = model.vocab_size * d + model.num_layers * (encoder_layer + decoder_layer)
    assert expected == 133_906_432
    capsys.readouterr()
    assert main(["params", "--config", str(CONFIGS / "wsj_parsing.py:variant=paper")]) == 0
    total = re.search(r"^total\s+([\d,]+)\s+\((\S+)\)$", capsys.readouterr().out, re.M)
    assert total, "no total line in attnmt params"
    assert (int(total.group(1).replace(",", "")), total.group(2)) == (expected, "133.9M")


def _summary(out: str, block: str = "-- All --") -> dict[str, str]:
    """The lines `name = value` of one block of the summary attnmt evaluate printed."""
    lines = out.splitlines()
    assert lines.count(block) == 1, out
    values = {}
    for line in lines[lines.index(block) + 1 :]:
        if "=" not in line:
            break
        name, _, value = line.partition("=")
        values[name.strip()] = value.strip()
    return values


SPLITS = "train=2-10,dev=1-1"  # dev: wsj_0001's two sentences, both with punctuation


@pytest.mark.slow
@pytest.mark.parametrize("leaves", ["pos", "words"])
def test_a_trained_parser_is_evaluated_and_parses_any_line(
    ptb_dir, evalb, tmp_path, capsys, leaves
):
    workdir = tmp_path / "run"
    overrides = [
        f"--config.data.data_dir={ptb_dir}",
        f"--config.data.treebank_leaves={leaves}",
        f"--config.data.treebank_splits={SPLITS}",
        "--config.model.vocab_size=300",
        *TINY_MODEL_OVERRIDES,
        "--config.data.tokens_per_batch=2048",
        # A few large updates: enough for the parses to share some brackets with the gold
        # trees (P 100, R 10 with either leaves, where this was written), so the figures
        # compared with EVALB below are not all 0. Nothing asserts their values.
        "--config.train.num_steps=6",
        "--config.optim.warmup_steps=3",
        "--config.train.eval_every_steps=0",
        # Dev F1 during training, ranking the kept best step; parsed greedily, as the
        # evaluations below, so that their files score what training logged.
        "--config.train.f1_every_steps=3",
        "--config.train.keep_best_by=f1",
        "--config.decode.beam_size=1",
        "--config.decode.max_len_offset=20",
        "--config.train.time_limit_minutes=0",
        "--config.train.memory_preflight=false",
        # Compiling is most of this test: XLA's level 1 compiles faster and trains as well;
        # level 0 for the search, whose run time on two short sentences is nothing.
        "--config.train.xla_backend_optimization_level=1",
        "--config.decode.xla_backend_optimization_level=0",
    ]
    config = f"{CONFIGS / 'wsj_parsing.py'}:variant=sample"
    assert main(["train", "--config", config, "--workdir", str(workdir), *overrides]) == 0
    decode = ["--beam", "1", "--config.decode.max_len_offset=20"]
    capsys.readouterr()
    assert main(["evaluate", "--workdir", str(workdir), "--split", "dev", *decode]) == 0
    out = capsys.readouterr().out

    # The three files written, line i for gold tree i: the gold trees, the parses as
    # decoded (XX tags), the same parses with the gold tags (the file scored).
    gold = treebank_trees("dev", str(ptb_dir), SPLITS)
    stem = workdir / "decodes" / "dev-step6-beam1"
    gold_file, tagged_file = Path(f"{stem}.gold.trees"), Path(f"{stem}.tagged.trees")
    assert gold_file.read_text() == "".join(to_bracketed(tree) + "\n" for tree in gold)
    parsed = [parse_bracketed(line) for line in Path(f"{stem}.trees").read_text().splitlines()]
    tagged = [parse_bracketed(line) for line in tagged_file.read_text().splitlines()]
    assert len(parsed) == len(tagged) == len(gold) == 2
    for as_decoded, with_gold_tags, gold_tree in zip(parsed, tagged, gold, strict=True):
        assert set(tags(as_decoded)) == {"XX"}
        assert tags(with_gold_tags) == tags(gold_tree)
        assert retag(as_decoded, tags(gold_tree)) == with_gold_tags
    # EVALB scores the tagged file with no error or skipped sentence, and gets every
    # figure attnmt printed (the "-- All --" block, then the len<=40 one).
    result = evalb.run(gold_file, tagged_file)
    assert (result.all.errors, result.all.skipped) == (0, 0)
    for printed, theirs in (
        (_summary(out), result.all),
        (_summary(out, "-- len<=40 --"), result.short),
    ):
        assert printed == {
            "Number of sentence": str(theirs.sentences),
            "Number of Error sentence": "0",
            "Number of Skip  sentence": "0",
            "Number of Valid sentence": str(theirs.valid),
            "Bracketing Recall": theirs.recall,
            "Bracketing Precision": theirs.precision,
            "Bracketing FMeasure": "0.00" if "nan" in theirs.f1 else theirs.f1,
            "Complete match": theirs.complete_match,
        }
    assert f"evalb -p COLLINS.prm {gold_file} {tagged_file}" in out

    # F1 during training (train.f1_every_steps) parses with the run's moving average (the
    # sample keeps one: optim.ema_decay), logged as ema_f1: EVALB's F1 of the parses
    # `attnmt evaluate --ema` writes for the same step; keep_best_by=f1 kept its best step.
    logged = event_scalars(workdir / "tensorboard" / "f1", "ema_f1")
    assert sorted(logged) == [3, 6]
    best_value = max(logged.values())
    best_step = min(step for step, value in logged.items() if value == best_value)
    assert CheckpointManager(workdir).best() == (best_step, pytest.approx(best_value, abs=1e-6))
    for step in ("3", "best", "6"):
        argv = ["evaluate", "--workdir", str(workdir), "--split", "dev", "--ema"]
        assert main([*argv, "--step", step, *decode]) == 0
        chosen = best_step if step == "best" else int(step)
        assert f"moving average of step {chosen} in" in capsys.readouterr().err
    for step in (3, 6):
        prefix = workdir / "decodes" / f"dev-step{step}-ema-beam1"
        theirs = evalb.run(Path(f"{prefix}.gold.trees"), Path(f"{prefix}.tagged.trees")).all
        printed = 0.0 if "nan" in theirs.f1 else float(theirs.f1)
        # To EVALB's two decimals (half a unit of the last, plus TensorBoard's float32).
        assert abs(logged[step] - printed) <= 0.005 + 1e-4, (step, logged[step], theirs.f1)
    # The file as decoded is what EVALB cannot score: with XX tags no punctuation is
    # deleted from it, and both sentences have punctuation ("length unmatch").
    assert evalb.run(gold_file, Path(f"{stem}.trees")).all.errors == 2

    # Another α than the run's own (0.3), or unsmoothed scores, write files of their own
    # names; the default's stay.
    before = {path.name: path.read_bytes() for path in stem.parent.iterdir()}
    evaluate = ["evaluate", "--workdir", str(workdir), "--split", "dev", *decode]
    assert main([*evaluate, "--alpha", "0.9"]) == 0
    assert main([*evaluate, "--config.decode.unsmooth_words=true"]) == 0
    after = {path.name: path.read_bytes() for path in stem.parent.iterdir()}
    suffixes = (".trees", ".tagged.trees", ".gold.trees")
    assert set(after) - set(before) == {
        f"dev-step6-beam1{variant}{suffix}"
        for variant in ("-alpha0.9", "-unsmoothed")
        for suffix in suffixes
    }
    assert all(after[name] == content for name, content in before.items())

    # Under the tree grammar (the default) the model's raw outputs are already trees with
    # one leaf per word (the word itself, when copied), by beam search and greedily.
    run = load_run(workdir)
    sentences = [" ".join(words(tree)) for tree in gold]
    for beam, unsmooth in ((1, False), (3, False), (3, True)):
        translator = parsing_translator(
            run,
            DecodeConfig(
                beam_size=beam,
                max_len_offset=20,
                xla_backend_optimization_level=0,
                unsmooth_words=unsmooth,
            ),
        )
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
    capsys.readouterr()
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
