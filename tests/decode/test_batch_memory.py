"""Decoding batches sized by memory: the search XLA compiles for the chosen batch fits the
budget, the outputs are those of sentences decoded one at a time, and the choice rule finds
the largest fitting batch where memory grows linearly with it (brute force)."""

from __future__ import annotations

import random
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.config.decode import DecodeConfig
from attnmt.data.tokenizer import Tokenizer, train_vocab
from attnmt.decode import batch_memory
from attnmt.decode.sharded import decode_mesh
from attnmt.decode.translate import Translator
from attnmt.errors import ConfigError
from attnmt.parallel.memory import NoMemoryAnalysisError, compiled_peak_bytes, per_device_bytes
from tests.helpers import WORDS, random_params, tiny_model

BEAM, OFFSET, BATCH = 3, 60, 32


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    rng = random.Random(1)
    text = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(300)]
    path = tmp_path_factory.mktemp("vocab") / "vocab.model"
    train_vocab(text, path, vocab_size=48)
    # Wide enough, with outputs up to input + 60, that the beams' caches outweigh the
    # fixed costs (parameters, code): memory then grows with the batch.
    config = tiny_model(vocab_size=48, num_layers=1, d_model=64, d_k=32, d_v=32, max_length=96)
    params = random_params(config, 0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 7))) for _ in range(40)]
    return config, params, Tokenizer.load(path), lines


def _translator(setup, limit_bytes, monkeypatch, batch=BATCH):
    config, params, tokenizer, _ = setup
    monkeypatch.setattr(
        batch_memory, "device_memory_limit", lambda device: (limit_bytes, "a test's limit")
    )
    decode = DecodeConfig(
        beam_size=BEAM,
        max_len_offset=OFFSET,
        batch_sentences=batch,
        memory_fraction=1.0,
        xla_backend_optimization_level=0,
    )
    warnings: list[str] = []
    # One device: its budget is then the whole (fake) limit.
    mesh = decode_mesh(jax.devices()[:1])
    translator = Translator([config], [params], tokenizer, decode, warn=warnings.append, mesh=mesh)
    return translator, warnings


def _peak(translator: Translator, lines: list[str], rows: int) -> int:
    """What XLA says the search holds for `rows` of the longest lines."""
    sources = translator._source_ids(lines, 1)
    order = sorted(range(len(lines)), key=lambda i: len(sources[i]))
    placed = translator._rows(lines, sources, order[-rows:], 1, rows)
    return compiled_peak_bytes(translator._decode.lower(translator.params_list, *placed).compile())


def test_a_batch_over_budget_shrinks_fits_and_decodes_as_one_at_a_time(setup, monkeypatch):
    lines = setup[3]
    probe, _ = _translator(setup, None, monkeypatch)
    full = _peak(probe, lines, BATCH)
    eighth = _peak(probe, lines, BATCH // 8)
    assert eighth < full / 2, "the caches must dominate for this test to mean anything"
    budget = (full + eighth) // 2  # room for about half the batch
    translator, warnings = _translator(setup, budget, monkeypatch)
    outputs = translator.translate(lines)
    rows = next(iter(translator._fitting.values()))
    assert BATCH // 8 <= rows < BATCH
    assert _peak(translator, lines, rows) <= budget
    assert any("decode.memory_fraction" in w and f"{rows} sentences" in w for w in warnings), (
        warnings
    )
    # Sentences do not interact in a batch: each alone gives the same output.
    single, _ = _translator(setup, None, monkeypatch, batch=1)
    assert outputs == [single.translate([line])[0] for line in lines]


def test_a_batch_within_budget_is_left_alone(setup, monkeypatch):
    translator, warnings = _translator(setup, 1 << 40, monkeypatch)
    translator.translate(setup[3][:5])
    assert list(translator._fitting.values()) == [BATCH] and not warnings


def test_cpu_devices_share_the_host_budget(monkeypatch):
    monkeypatch.setattr(batch_memory, "device_memory_limit", lambda device: (8000, "host"))
    devices = jax.devices()
    budget, _ = batch_memory.per_device_budget(0.5, devices)
    assert budget == int(0.5 * (8000 // len(devices)))  # one host's memory, n devices
    assert batch_memory.per_device_budget(0.0, devices)[0] is None


def _fake_compile(peak_of_rows):
    def compile_rows(rows: int):
        peak = peak_of_rows(rows)
        stats = types.SimpleNamespace(
            argument_size_in_bytes=1000,
            output_size_in_bytes=0,
            alias_size_in_bytes=0,
            temp_size_in_bytes=peak - 1000,
            generated_code_size_in_bytes=0,
        )
        return types.SimpleNamespace(memory_analysis=lambda: stats)

    return compile_rows


@pytest.mark.parametrize("shards", [1, 2, 4])
@pytest.mark.parametrize("budget", [1000 + 37 * 5, 1000 + 37 * 29, 1000 + 37 * 64, 5000])
def test_linear_memory_gives_the_largest_fitting_batch(shards, budget):
    peak = lambda rows: 1000 + 37 * rows  # noqa: E731
    rows = batch_memory.fitting_sentences(_fake_compile(peak), 64, shards, budget, print, "t")
    brute = [n for n in range(shards, 65, shards) if peak(n) <= budget]
    assert rows == (max(brute) if brute else shards)


def test_curved_memory_still_fits_and_even_one_row_over_warns():
    peak = lambda rows: 1000 + 3 * rows**2  # noqa: E731
    warnings: list[str] = []
    rows = batch_memory.fitting_sentences(_fake_compile(peak), 64, 2, 4000, warnings.append, "t")
    assert rows % 2 == 0 and peak(rows) <= 4000 and rows >= 2
    warnings.clear()
    rows = batch_memory.fitting_sentences(_fake_compile(peak), 64, 2, 1010, warnings.append, "t")
    assert rows == 2 and "may run out of memory" in warnings[-1]


def test_no_memory_analysis_keeps_the_batch():
    def compile_rows(rows):
        raise NoMemoryAnalysisError("none")

    assert batch_memory.fitting_sentences(compile_rows, 64, 1, 10, print, "t") == 64


def test_memory_fraction_is_checked():
    with pytest.raises(ConfigError, match=r"decode\.memory_fraction"):
        DecodeConfig(memory_fraction=1.5)


def test_memory_held_by_training_comes_off_the_budget(monkeypatch):
    monkeypatch.setattr(batch_memory, "device_memory_limit", lambda device: (8000, "a limit"))
    one = jax.devices()[:1]
    # The smaller of the fraction and what the held bytes leave free.
    assert batch_memory.per_device_budget(0.5, one, 1000)[0] == 4000
    budget, where = batch_memory.per_device_budget(0.5, one, 6000)
    assert budget == 2000 and "held by training" in where
    assert batch_memory.per_device_budget(0.5, one, 9000)[0] == 0
    assert batch_memory.per_device_budget(0.5, one, 0) == (4000, "a limit")


def test_per_device_bytes_counts_each_devices_shard():
    devices = np.array(jax.devices()[:4])
    mesh = jax.sharding.Mesh(devices, ("data",))
    spec = jax.sharding.PartitionSpec

    def leaf(shape, partition):
        sharding = jax.sharding.NamedSharding(mesh, partition)
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)

    tree = {
        "split": leaf((16, 3), spec("data")),  # 4 rows × 3 per device
        "whole": leaf((5, 2), spec()),  # replicated: every device holds all 10
        "plain": jax.ShapeDtypeStruct((7,), jnp.int8),  # no sharding: counted whole
    }
    assert per_device_bytes(tree) == 4 * 3 * 4 + 10 * 4 + 7
    placed = jax.device_put(np.ones((16, 3), np.float32), tree["split"].sharding)
    assert per_device_bytes(placed) == placed.addressable_shards[0].data.nbytes == 48
