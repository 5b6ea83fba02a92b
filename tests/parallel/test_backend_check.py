"""A run logs its backend first and stops, in one line naming the likely cause, when it is
not the accelerator asked for (parallel.accelerator, or the image's ATTNMT_ACCELERATOR);
XLA's GPU flags are added when, and only when, the backend will be a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from attnmt.config import load_experiment
from attnmt.errors import ConfigError
from attnmt.parallel import backend
from attnmt.parallel.backend import (
    GPU_XLA_FLAGS,
    apply_xla_gpu_flags,
    backend_will_be_gpu,
    check_backend,
    likely_cause,
    requested_accelerator,
    with_gpu_flags,
)
from attnmt.parallel.distributed import LaunchPlan, initialize
from tests.helpers import REPO, TINY_CONFIG, tiny_train_args, write_reversal_corpus

FLAG = "--xla_gpu_enable_latency_hiding_scheduler=true"


def _attnmt_train(tmp_path: Path, *extra: str, **env: str) -> subprocess.CompletedProcess:
    corpus = write_reversal_corpus(tmp_path / "corpus", train=40, dev=0)
    argv = tiny_train_args(tmp_path / "run", corpus, 1, *extra)
    base = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    return subprocess.run(
        [sys.executable, "-m", "attnmt.cli.main", *argv],
        env={**base, **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("extra", "env", "source"),
    [
        (["--config.parallel.accelerator=gpu"], {}, "parallel.accelerator=gpu"),
        ([], {"ATTNMT_ACCELERATOR": "cuda"}, "ATTNMT_ACCELERATOR=cuda"),
    ],
)
def test_asking_for_a_gpu_on_this_cpu_machine_stops_before_training(tmp_path, extra, env, source):
    """As a GKE pod whose CUDA plugin did not load: JAX starts the CPU; attnmt stops."""
    result = _attnmt_train(tmp_path, *extra, **env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("attnmt train: error: "), result.stderr
    assert f"{source} asks for gpu, but JAX started cpu" in errors[0]
    cause = "jax[cuda12]" if not backend.cuda_plugin_installed() else "libcuda.so.1"
    assert cause in errors[0]
    # The backend was logged first, the GPU flags were set (a GPU was expected), and
    # nothing was trained or written.
    assert "backend cpu: 1 local × cpu, 1 device(s) in 1 process(es)" in result.stderr
    assert f"XLA_FLAGS for GPU: {FLAG}" in result.stderr
    assert "[train] step" not in result.stderr and "stopped at step" not in result.stdout
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").rglob("*"))


def test_the_config_key_is_typed_and_defaults_to_any():
    assert load_experiment(str(TINY_CONFIG)).parallel.accelerator == "any"
    chosen = load_experiment(str(TINY_CONFIG), ["--config.parallel.accelerator=tpu"])
    assert chosen.parallel.accelerator == "tpu"
    with pytest.raises(ConfigError, match=r"parallel\.accelerator"):
        load_experiment(str(TINY_CONFIG), ["--config.parallel.accelerator=cuda"])


def test_the_requested_accelerator():
    assert requested_accelerator("any", {}) == "any"
    assert requested_accelerator("any", {"ATTNMT_ACCELERATOR": "cuda"}) == "gpu"
    assert requested_accelerator("any", {"ATTNMT_ACCELERATOR": "TPU"}) == "tpu"
    assert requested_accelerator("any", {"ATTNMT_ACCELERATOR": "cpu"}) == "cpu"
    assert requested_accelerator("cpu", {"ATTNMT_ACCELERATOR": "cuda"}) == "cpu"  # config wins
    with pytest.raises(ConfigError, match="ATTNMT_ACCELERATOR='metal' is not one of"):
        requested_accelerator("any", {"ATTNMT_ACCELERATOR": "metal"})


def test_the_backend_is_checked_against_jax():
    found = check_backend("cpu", {})
    assert (found.platform, found.devices) == (jax.default_backend(), jax.device_count())
    assert check_backend("any", {"ATTNMT_ACCELERATOR": "cpu"}).platform == "cpu"
    with pytest.raises(ConfigError, match=r"ATTNMT_ACCELERATOR=tpu asks for tpu, but JAX .*cpu"):
        check_backend("any", {"ATTNMT_ACCELERATOR": "tpu"})


def test_each_likely_cause(monkeypatch):
    present: set[str] = set()
    monkeypatch.setattr(backend, "installed", lambda name: name in present)
    monkeypatch.setattr(backend, "driver_loads", lambda: "driver" in present)
    assert "JAX_PLATFORMS=cpu leaves gpu out" in likely_cause("gpu", {"JAX_PLATFORMS": "cpu"})
    assert "pip install 'jax[cuda12]'" in likely_cause("gpu", {})
    present.add("jax_cuda12_plugin")
    cause = likely_cause("gpu", {"LD_LIBRARY_PATH": "/usr/local/cuda/lib64"})
    assert "LD_LIBRARY_PATH='/usr/local/cuda/lib64'" in cause
    assert "/usr/local/nvidia/lib64" in cause
    present.add("driver")
    assert "found no GPU" in likely_cause("gpu", {"CUDA_VISIBLE_DEVICES": ""})
    assert "libtpu is not installed" in likely_cause("tpu", {})
    present.add("libtpu")
    assert "not a TPU VM" in likely_cause("tpu", {})
    assert "JAX_PLATFORMS=cpu" in likely_cause("cpu", {})


def test_jax_failing_to_start_is_one_line(monkeypatch):
    def fail() -> str:
        raise RuntimeError("Unable to initialize backend 'cuda': no devices\n(more detail)")

    monkeypatch.setattr(jax, "default_backend", fail)
    with pytest.raises(ConfigError) as caught:
        check_backend("gpu", {})
    assert str(caught.value) == (
        "JAX could not start its backend: Unable to initialize backend 'cuda': no devices"
    )


# ---- XLA's GPU flags ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("platforms", "requested", "gpu"),
    [
        ("cpu", "gpu", False),  # JAX_PLATFORMS decides: the CPU will start
        ("cuda", "any", True),
        ("cuda,cpu", "any", True),
        ("tpu", "any", False),
        ("", "gpu", True),
        ("", "cpu", False),
        ("", "tpu", False),
    ],
)
def test_when_the_backend_will_be_a_gpu(platforms, requested, gpu):
    env = {"JAX_PLATFORMS": platforms} if platforms else {}
    assert backend_will_be_gpu(requested, env) is gpu


def test_any_accelerator_on_a_machine_without_the_cuda_plugin(monkeypatch):
    assert backend_will_be_gpu("any", {}) is backend.cuda_plugin_installed()
    monkeypatch.setattr(backend, "cuda_plugin_installed", lambda: True)
    monkeypatch.setattr(backend.os.path, "exists", lambda path: path == "/dev/nvidiactl")
    assert backend_will_be_gpu("any", {}) is True


def test_gpu_flags_are_added_on_gpu_only():
    for requested in ("cpu", "tpu"):
        env = {"XLA_FLAGS": "--xla_cpu_use_xnnpack=true"}
        assert not apply_xla_gpu_flags(requested, env)
        assert env == {"XLA_FLAGS": "--xla_cpu_use_xnnpack=true"}
    env = {}
    assert apply_xla_gpu_flags("any", {"JAX_PLATFORMS": "cpu"}) is False
    assert apply_xla_gpu_flags("gpu", env) and env == {"XLA_FLAGS": FLAG}
    env = {"XLA_FLAGS": "--xla_dump_to=/tmp/d"}
    apply_xla_gpu_flags("gpu", env)
    assert env["XLA_FLAGS"] == f"--xla_dump_to=/tmp/d {FLAG}"
    mine = "--xla_gpu_enable_latency_hiding_scheduler=false"  # the user's choice stays
    assert with_gpu_flags(mine) == mine
    assert with_gpu_flags(with_gpu_flags("")) == FLAG  # not added twice


def test_initialize_sets_them_before_the_backend_on_gpu_only(monkeypatch):
    monkeypatch.delenv("JAX_PLATFORMS")
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/d")
    monkeypatch.delenv("ATTNMT_ACCELERATOR", raising=False)
    initialize(LaunchPlan("single"), accelerator="cpu")
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/d"
    monkeypatch.setenv("ATTNMT_ACCELERATOR", "tpu")
    initialize(LaunchPlan("single"))
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/d"
    monkeypatch.setenv("ATTNMT_ACCELERATOR", "cuda")
    initialize(LaunchPlan("single"))
    assert os.environ["XLA_FLAGS"] == f"--xla_dump_to=/tmp/d {FLAG}"


def test_the_flags_exist_in_this_jaxlib():
    """XLA aborts on a flag it does not know: every one is accepted by the installed XLA."""
    assert all(name.startswith("xla_gpu_") for name in GPU_XLA_FLAGS)
    code = "import jax.numpy as jnp; print(float(jnp.ones(3).sum()))"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": with_gpu_flags("")}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout.strip() == "3.0", result.stderr[-2000:]
    assert "Unknown flag" not in result.stderr
