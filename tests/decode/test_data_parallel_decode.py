"""Decoding with sentences split over a mesh (8 devices; 2 × 4 data × fsdp) gives what one
device gives: the same strings for beam search, greedy decoding, samples of a seed, n-best
lists and tree-grammar parses, scores to float32 rounding, one output per input line in
input order, with a number of lines that is not a multiple of the devices and an empty
line among them."""

from __future__ import annotations

import random

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from attnmt.cli.main import main
from attnmt.config.decode import DecodeConfig
from attnmt.data.tokenizer import Tokenizer, train_vocab
from attnmt.decode.parsing import bracketed_lines, parse_sentences
from attnmt.decode.sharded import decode_mesh, padded_rows, row_shards
from attnmt.decode.translate import Translator
from attnmt.decode.tree_grammar import TreeGrammar
from attnmt.parallel.mesh import FSDP, MESH_AXES
from attnmt.workdir import load_run
from tests.helpers import LOGIT_ATOL, WORDS, random_params, tiny_model

# 11 lines (not a multiple of 8), the fifth empty, lengths mixed so the batches (sorted by
# length) do not follow the input order.
_rng = random.Random(0)
LINES = [" ".join(_rng.choices(WORDS, k=1 + (7 * i) % 9)) for i in range(11)]
LINES[4] = ""
MAX_DECODE_LEN = 24  # the fixture model's max_length bounds every output

# Scores: the mesh runs the same operations on each row as one device, but on fewer rows
# per device, and XLA's CPU matmuls block their sums by all three sizes, so a logit may
# differ by rounding. LOGIT_ATOL (tests/helpers.py) bounds that for a deeper, wider model
# than this one. A log-probability z_y - logsumexp(z) then moves by at most 2·max|Δz|, a
# hypothesis's log_prob sums at most MAX_DECODE_LEN of them, and its score divides that by
# a length penalty ≥ 1. Measured: at most 4 float32 ulps (8e-6 on scores near -50); any
# mix-up of rows moves scores by whole units.
SCORE_ATOL = 2 * MAX_DECODE_LEN * LOGIT_ATOL


@pytest.fixture(scope="module")
def run(workdir):
    """The conftest workdir loaded as `attnmt translate` loads it (parameters on device 0)."""
    return load_run(workdir[0])


def _meshes() -> dict[str, Mesh]:
    devices = jax.devices()
    assert len(devices) == 8, "tests/conftest.py gives the suite 8 CPU devices"
    return {
        "one": decode_mesh(devices[:1]),
        "eight": decode_mesh(),
        "2x4": Mesh(np.asarray(devices).reshape(2, 4, 1), MESH_AXES),
    }


def _translator(run, mesh: Mesh, nbest: int = 0, **decode) -> Translator:
    settings = DecodeConfig(
        **{
            **dict(max_len_offset=5, xla_backend_optimization_level=0),  # compiles faster
            **decode,
        }
    )
    return Translator.from_runs([run], settings, nbest=nbest, mesh=mesh)


def _texts_and_scores(nbest_lists) -> tuple[list[list[str]], np.ndarray]:
    texts = [[h.text for h in hypotheses] for hypotheses in nbest_lists]
    scores = np.asarray([[(h.score, h.log_prob) for h in hs] for hs in nbest_lists])
    return texts, scores


def test_the_mesh_splits_rows_over_data_and_fsdp():
    meshes = _meshes()
    assert [row_shards(meshes[name]) for name in ("one", "eight", "2x4")] == [1, 8, 8]
    assert [padded_rows(rows, meshes["2x4"]) for rows in (1, 8, 9, 16)] == [8, 8, 16, 16]
    assert padded_rows(3, meshes["one"]) == 3


@pytest.mark.parametrize("beam, batch", [(1, 16), (2, 3)])
def test_search_on_a_mesh_writes_one_devices_strings_in_input_order(run, beam, batch):
    """Greedy with two rows a device (16 rows, 5 fillers), beam search with three lines a
    batch (8 rows: most devices decode only filler)."""
    outputs = {
        name: _translator(run, mesh, beam_size=beam, batch_sentences=batch).translate(LINES)
        for name, mesh in _meshes().items()
    }
    assert len(outputs["one"]) == len(LINES) and outputs["one"][4] == ""
    # The random model's outputs differ from line to line, so a reordering would show.
    assert len(set(outputs["one"])) > len(LINES) // 2
    assert outputs["eight"] == outputs["one"]
    assert outputs["2x4"] == outputs["one"]


def test_each_line_alone_gives_its_place_in_the_batch(run):
    """Input order, independently of the one-device run: every line translated on its own
    (one real row among fillers) is the output at that line's place."""
    translator = _translator(run, _meshes()["eight"], beam_size=2, batch_sentences=4)
    together = translator.translate(LINES)
    assert together == [translator.translate([line])[0] for line in LINES]


def test_nbest_lists_and_scores_on_a_mesh_equal_one_device(run):
    lists = {
        name: _translator(run, _meshes()[name], nbest=2, beam_size=2, batch_sentences=4)
        for name in ("one", "2x4")
    }
    (one_texts, one_scores), (mesh_texts, mesh_scores) = [
        _texts_and_scores(translator.translate_nbest(LINES)) for translator in lists.values()
    ]
    assert mesh_texts == one_texts and one_texts[4] == ["", ""]
    assert np.isnan(mesh_scores[4]).all() and np.isfinite(np.delete(mesh_scores, 4, 0)).all()
    np.testing.assert_allclose(mesh_scores, one_scores, rtol=0, atol=SCORE_ATOL)


def test_samples_of_a_seed_on_a_mesh_equal_one_device(run):
    def samples(mesh: str, seed: int):
        translator = _translator(
            run, _meshes()[mesh], nbest=1, sample=True, temperature=3.0, seed=seed
        )
        return _texts_and_scores(translator.translate_nbest(LINES))

    one_texts, one_scores = samples("one", seed=7)
    mesh_texts, mesh_scores = samples("eight", seed=7)
    assert mesh_texts == one_texts
    np.testing.assert_allclose(mesh_scores, one_scores, rtol=0, atol=SCORE_ATOL)
    assert samples("eight", seed=8)[0] != one_texts  # the seed, not the mesh, picks them


def test_parameters_sharded_over_a_training_mesh_are_gathered(run):
    """BLEU during training hands over parameters as the training mesh shards them (FSDP
    here: axis 0 split over 4 devices wherever it divides)."""
    mesh = _meshes()["2x4"]

    def shard(leaf):
        spec = PartitionSpec(FSDP) if leaf.ndim and leaf.shape[0] % 4 == 0 else PartitionSpec()
        return jax.device_put(leaf, NamedSharding(mesh, spec))

    sharded = jax.tree.map(shard, run.params)
    assert any(not leaf.is_fully_replicated for leaf in jax.tree.leaves(sharded))
    translator = _translator(run, _meshes()["eight"], beam_size=2, batch_sentences=4)
    expected = translator.translate(LINES)
    translator.set_params([sharded])
    assert translator.translate(LINES) == expected


BRACKETS = ["(S", ")S", "(NP", ")NP", "(VP", ")VP"]


@pytest.fixture(scope="module")
def parsing_tokenizer(tmp_path_factory) -> Tokenizer:
    """A parsing vocabulary: every bracket one piece, words split into pieces."""
    rng = random.Random(1)
    text = []
    for _ in range(200):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 5))]
        text += [" ".join(words), "(S (NP " + " ".join(words) + " )NP )S"]
    path = tmp_path_factory.mktemp("parsing") / "vocab.model"
    train_vocab(text, path, vocab_size=48, whole_words=BRACKETS)
    return Tokenizer.load(path)


def test_tree_grammar_parses_on_a_mesh_equal_one_device(parsing_tokenizer):
    """A random model under the copying tree grammar (words as leaves, the grammar's row
    inputs split over the mesh too): the same trees as one device."""
    config = tiny_model(vocab_size=48, num_layers=1, max_length=24)
    params = random_params(config, 3)
    grammar = TreeGrammar.from_symbols(parsing_tokenizer.whole_words(), 48, copy_words=True)
    decode = DecodeConfig(
        beam_size=2, max_len_offset=12, batch_sentences=4, xla_backend_optimization_level=0
    )
    # Short lines (long trees are slow to search), one empty; "dog's" is several pieces.
    sentences = [" ".join(line.split()[:3]).replace("cat", "dog's") for line in LINES]
    trees = {
        name: bracketed_lines(
            parse_sentences(
                Translator([config], [params], parsing_tokenizer, decode, grammar=grammar, mesh=m),
                sentences,
                pos="",
                leaves="words",
            )
        )
        for name, m in _meshes().items()
        if name != "2x4"
    }
    assert trees["eight"] == trees["one"]
    assert trees["one"][4] == "" and all(trees["one"][i] for i in range(11) if i != 4)


@pytest.mark.parametrize(
    "argv, refusal",
    [
        (["translate"], "--input is needed when 2 processes translate"),
        (["evaluate", "--average-last", "2"], "--average-last with 2 processes"),
        # --ema writes each member's <member>/ema: every process would write the same ones.
        (["evaluate", "--ema", "--ensemble", "other"], "--ema with 2 processes"),
        (["translate", "--input", "in.txt", "--ema"], "--ema with 2 processes"),
    ],
)
def test_a_job_of_processes_is_refused_what_only_one_process_can_do(
    workdir, monkeypatch, capsys, argv, refusal
):
    """Every process reads the input itself (stdin is one process's), and averaging would
    have every process write the same folder: both refused, in one line, before loading."""
    monkeypatch.setattr("attnmt.decode.sharded.join_job", lambda: 2)
    assert main([*argv, "--workdir", str(workdir[0])]) == 2
    err = capsys.readouterr().err
    assert refusal in err and "Traceback" not in err
