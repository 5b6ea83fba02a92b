"""Every launcher's environment joins the same job: the arguments jax.distributed.initialize
receives (coordinator, process count, process id) for each process of a local run, a GKE
GPU Indexed Job, a GKE TPU slice, a SLURM step and a Cloud TPU VM slice (a fake metadata
server on 127.0.0.1), each environment taken from what the launcher renders (read-only)
plus what the platform adds; JAX's own cluster detection (jax._src.clusters), run on the
same environment, is the reference. Two local processes started with the variables of a
SLURM step, of the GKE GPU Indexed Job's pods and of a Cloud TPU VM slice (each worker
asking its own fake metadata server) reach step 1 of `attnmt train`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import pytest
from jax._src.clusters import cloud_tpu_cluster, slurm_cluster

from attnmt.errors import ConfigError
from attnmt.parallel import distributed
from attnmt.parallel.distributed import initialize, plan_from_environment
from launch import gke, local, slurm, tpu_vm
from launch.common import add_run_arguments, run_from_args
from tests.parallel.fake_metadata import fake_metadata_server
from tests.parallel.jobs import job_env, run_processes, train_args, write_corpus

# Variables of any launcher or platform, cleared before each test sets its own.
PREFIXES = ("ATTNMT_", "SLURM_", "TPU_", "MEGASCALE_", "GCE_METADATA", "JAX_COORDINATOR")
OTHERS = ("JOB_COMPLETION_INDEX", "http_proxy", "no_proxy", "NO_PROXY")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What jax.distributed.initialize is called with; jax.config.update is recorded too,
    since this process's backend is already up."""
    for name in list(os.environ):
        if name.startswith(PREFIXES) or name in OTHERS:
            monkeypatch.delenv(name)
    recorded: list[dict[str, Any]] = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: recorded.append(kw))
    monkeypatch.setattr(jax.config, "update", lambda *args: recorded.append({"config": args}))
    monkeypatch.setattr(distributed, "libtpu_installed", lambda: False)
    return recorded


def joined(monkeypatch: pytest.MonkeyPatch, calls: list, env: Mapping[str, str]) -> tuple:
    """(coordinator, count, id) that `initialize()` passes, in the environment `env`."""
    with monkeypatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        initialize()
    (call,) = [call for call in calls if "config" not in call]
    calls.clear()
    return call["coordinator_address"], call["num_processes"], call["process_id"]


def jax_reference(monkeypatch: pytest.MonkeyPatch, cluster: type, env: Mapping[str, str]):
    """(coordinator, count, id) of JAX's own detection `cluster` in the environment `env`."""
    with monkeypatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        patch.delenv("http_proxy", raising=False)  # requests, unlike attnmt, would use it
        patch.setattr(cloud_tpu_cluster, "running_in_cloud_tpu_vm", True)
        patch.setattr(cloud_tpu_cluster.BaseTpuCluster, "wait_for_coordinator", lambda *a: None)
        assert cluster.is_env_present()
        return (
            cluster.get_coordinator_address(timeout_secs=1, override_coordinator_port=None),
            cluster.get_process_count(),
            cluster.get_process_id(),
        )


# ---- local and GKE GPU: the ATTNMT_* variables -------------------------------------------


def test_local_launcher_processes(monkeypatch, calls):
    options = argparse.Namespace(
        processes=3, devices_per_process=2, port=5123, log_dir="/tmp/x", program="attnmt"
    )
    run = run_from_args(argparse.Namespace(name=None, config="c.py", workdir="runs/a"), {})
    started = [item for item in local.commands_for_run(run, options) if item.background]
    assert len(started) == 3
    for index, item in enumerate(started):
        assert joined(monkeypatch, calls, item.env) == ("127.0.0.1:5123", 3, index)


def _parse(add_arguments, argv: list[str]) -> tuple[Any, argparse.Namespace]:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser, "attnmt")
    add_arguments(parser)
    options = parser.parse_args(argv)
    return run_from_args(options, {}), options


def _find(document: Any, key: str) -> Iterator[Any]:
    """Every value stored under `key` anywhere in a manifest."""
    if isinstance(document, dict):
        for name, value in document.items():
            if name == key:
                yield value
            yield from _find(value, key)
    elif isinstance(document, list):
        for item in document:
            yield from _find(item, key)


def pod_env(manifest: dict, index: int) -> dict[str, str]:
    """The container's environment in pod `index` of the Indexed Job, as Kubernetes fills
    it in: fieldRefs to the completion index resolved, JOB_COMPLETION_INDEX added."""
    (containers,) = list(_find(manifest, "containers"))
    env = {"JOB_COMPLETION_INDEX": str(index)}
    for item in containers[0].get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        path = item["valueFrom"]["fieldRef"]["fieldPath"]
        assert "job-completion-index" in path, item  # the only field these manifests read
        env[item["name"]] = str(index)
    return env


GKE_COMMON = ["--config", "configs/wmt14_ende.py", "--workdir", "gs://b/runs/ende"]
GKE_COMMON += ["--image", "registry.example/attnmt:x"]


@pytest.mark.parametrize("drop_process_id", [False, True])
def test_gke_gpu_indexed_job_pods(monkeypatch, calls, drop_process_id):
    """Without ATTNMT_PROCESS_ID the completion index Kubernetes sets is the process id."""
    argv = [*GKE_COMMON, "--gpu-type", "nvidia-h100-80gb", "--nodes", "3"]
    run, options = _parse(gke.add_launcher_arguments, argv)
    manifest = gke.manifest(run, options)
    (completions,) = set(_find(manifest, "completions"))
    assert completions == 3
    coordinators = set()
    for index in range(completions):
        env = pod_env(manifest, index)
        if drop_process_id:
            env.pop("ATTNMT_PROCESS_ID")
        address, count, process = joined(monkeypatch, calls, env)
        assert (count, process) == (3, index)
        coordinators.add(address)
    assert coordinators == {pod_env(manifest, 0)["ATTNMT_COORDINATOR_ADDRESS"]}


def test_gke_tpu_slice_pods(monkeypatch, calls):
    """GKE gives each pod of a TPU slice TPU_WORKER_HOSTNAMES (the Indexed Job's pods, by
    index) and TPU_WORKER_ID; JAX's GkeTpuCluster is the reference."""
    argv = [*GKE_COMMON, "--tpu-type", "tpu-v5-lite-podslice", "--tpu-topology", "4x4"]
    run, options = _parse(gke.add_launcher_arguments, [*argv, "--chips-per-host", "4"])
    manifest = gke.manifest(run, options)
    (completions,) = set(_find(manifest, "completions"))
    name = manifest["metadata"]["name"]
    hosts = ",".join(f"{name}-workers-0-{i}.{name}" for i in range(completions))
    with fake_metadata_server({"tpu-env": ""}) as server:  # JAX asks it for MEGASCALE_*
        for index in range(completions):
            env = {**pod_env(manifest, index), "TPU_WORKER_HOSTNAMES": hosts}
            env["TPU_WORKER_ID"] = str(index)
            got = joined(monkeypatch, calls, env)
            reference = {**env, "GCE_METADATA_IP": server.address}
            assert got == jax_reference(monkeypatch, cloud_tpu_cluster.GkeTpuCluster, reference)
            assert got == (f"{name}-workers-0-0.{name}:8482", 4, index)


# ---- SLURM ---------------------------------------------------------------------------------


def slurm_task_env(script: str, job_id: int, nodelist: str, task: int) -> dict[str, str]:
    """What `srun` gives task `task` of the batch script's allocation."""
    directives = dict(re.findall(r"^#SBATCH --([a-z-]+)=(\S+)$", script, re.MULTILINE))
    nodes, per_node = int(directives["nodes"]), int(directives["ntasks-per-node"])
    return {
        "SLURM_JOB_ID": str(job_id),
        "SLURM_NTASKS": str(nodes * per_node),
        "SLURM_PROCID": str(task),
        "SLURM_LOCALID": str(task % per_node),
        "SLURM_NODEID": str(task // per_node),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_NUM_NODES": str(nodes),
    }


def test_slurm_srun_tasks(monkeypatch, calls):
    argv = [*GKE_COMMON[:4], "--nodes", "2", "--gpus-per-node", "4"]
    run, options = _parse(slurm.add_launcher_arguments, argv)
    script = slurm.batch_script(run, options)
    assert re.search(r"^srun .* train ", script, re.MULTILINE)  # srun starts every task
    for task in range(8):
        env = slurm_task_env(script, 416600, "gpu[07-08]", task)
        got = joined(monkeypatch, calls, env)
        assert got == jax_reference(monkeypatch, slurm_cluster.SlurmCluster, env)
        assert got == ("gpu07:64344", 8, task)  # 61440 + 416600 mod 4096


@pytest.mark.parametrize(
    "nodelist",
    ["node001", "node001,host2", "node[001-0015],host2", "node[001,007-015],host2", "a-b[3-4]"],
)
def test_slurm_coordinator_is_the_first_host(nodelist):
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": nodelist}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        reference = slurm_cluster.SlurmCluster.get_coordinator_address(None, None)
    assert distributed.first_slurm_host(nodelist) == reference.split(":")[0]


# ---- Cloud TPU VM: the metadata server ----------------------------------------------------

ENDPOINTS = ",".join(f"unused:{i}:10.130.0.{11 + i}" for i in range(4))  # old name:id:ip form
TPU_ENV = "ACCELERATOR_TYPE: 'v4-32'\nZONE: 'us-central2-b'\n"
MULTISLICE = "MEGASCALE_NUM_SLICES: '2'\nMEGASCALE_SLICE_ID: '1'\n"
MULTISLICE += "MEGASCALE_COORDINATOR_ADDRESS: '10.0.9.9:8080'\n"


def tpu_vm_env(declare: bool) -> dict[str, str]:
    """The variables `tpu_vm.py run` puts before the program on every worker; with
    `declare`, ATTNMT_CLUSTER=tpu_vm whether or not the launcher sets it yet."""
    args = tpu_vm.build_parser().parse_args(
        ["run", "--tpu", "t", "--zone", "z", "--config", "c.py", "--workdir", "gs://b/r"]
    )
    (ssh,) = tpu_vm.commands_for_run(run_from_args(args, {}), args)
    remote = next(arg for arg in ssh.argv if arg.startswith("--command=")).split("=", 1)[1]
    words = shlex.split(remote.replace("{", " ").replace("}", " "))
    env = dict(w.split("=", 1) for w in words if re.match(r"^[A-Z_][A-Z0-9_]*=", w))
    return {**env, "ATTNMT_CLUSTER": "tpu_vm"} if declare else env


@pytest.mark.parametrize(
    ("endpoints", "tpu_env", "expected"),
    [
        (ENDPOINTS, TPU_ENV, ("10.130.0.11:8482", 4, 0)),
        ("t-w-0,t-w-1,t-w-2,t-w-3", TPU_ENV, ("t-w-0:8482", 4, 0)),  # the newer hostname form
        (ENDPOINTS, MULTISLICE, ("10.0.9.9:8482", 8, 4)),
    ],
)
@pytest.mark.parametrize("declare", [True, False])  # ATTNMT_CLUSTER, or libtpu installed
def test_cloud_tpu_vm_workers(monkeypatch, calls, endpoints, tpu_env, expected, declare):
    monkeypatch.setattr(distributed, "libtpu_installed", lambda: not declare)
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # the server is asked directly
    attributes = {"worker-network-endpoints": endpoints, "tpu-env": tpu_env}
    with fake_metadata_server(attributes) as server:  # it reads `attributes` as they change
        for worker in range(4):
            attributes["agent-worker-number"] = str(worker)
            env = {**tpu_vm_env(declare), "GCE_METADATA_HOST": server.address}
            got = joined(monkeypatch, calls, env)
            reference = {"GCE_METADATA_IP": server.address}
            assert got == jax_reference(monkeypatch, cloud_tpu_cluster.GceTpuCluster, reference)
            address, count, first = expected
            assert got == (address, count, first + worker)


def test_single_host_tpu_vm_and_no_tpu_need_no_job(monkeypatch, calls):
    monkeypatch.setattr(distributed, "libtpu_installed", lambda: True)
    attributes = {"agent-worker-number": "0", "worker-network-endpoints": "unused:0:10.0.0.2"}
    with fake_metadata_server(attributes) as server:
        env = {"GCE_METADATA_HOST": server.address}
        assert plan_from_environment(env).mode == "single"
        assert server.requests  # it was asked: libtpu is installed
    monkeypatch.setattr(distributed, "libtpu_installed", lambda: False)
    with fake_metadata_server(attributes) as server:
        monkeypatch.setenv("GCE_METADATA_HOST", server.address)
        assert initialize().mode == "single"
        assert server.requests == [] and calls == []  # nothing says TPU: never asked


def test_jax_opt_out_skips_the_metadata_server(monkeypatch, calls):
    monkeypatch.setattr(distributed, "libtpu_installed", lambda: True)
    with fake_metadata_server({"agent-worker-number": "0"}) as server:
        env = {"GCE_METADATA_HOST": server.address, "TPU_SKIP_MDS_QUERY": "1"}
        assert plan_from_environment(env).mode == "single"
        assert server.requests == []


def _closed_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"  # closed once the block ends


def test_an_unreachable_metadata_server(monkeypatch, calls):
    """A guess (libtpu alone) runs as one process at once; a declared TPU VM stops, naming
    the server, within seconds."""
    monkeypatch.setattr(distributed, "libtpu_installed", lambda: True)
    started = time.monotonic()
    assert plan_from_environment({"GCE_METADATA_HOST": _closed_port()}).mode == "single"
    env = {"GCE_METADATA_HOST": _closed_port(), "ATTNMT_CLUSTER": "tpu_vm"}
    with pytest.raises(ConfigError, match=rf"metadata server at {env['GCE_METADATA_HOST']}"):
        plan_from_environment(env)
    assert time.monotonic() - started < 10
    with fake_metadata_server({}) as server, pytest.raises(ConfigError, match="no TPU workers"):
        plan_from_environment({"GCE_METADATA_HOST": server.address, "ATTNMT_CLUSTER": "tpu_vm"})
    with pytest.raises(ConfigError, match="ATTNMT_CLUSTER"):
        plan_from_environment({"ATTNMT_CLUSTER": "tpu-vm"})


# ---- two local processes started the way each launcher starts them -----------------------


def _free_port(start: int = 20000) -> int:
    """A free port at or after `start` (offset by the pid, so parallel runs differ)."""
    for port in range(start + os.getpid() % 4000, 65536):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port from {start}")


def _slurm_envs(stack: contextlib.ExitStack) -> list[dict[str, str]]:
    """srun's variables for two tasks on one node; JAX's port follows from the job id."""
    job_id = _free_port(61440) - 61440  # JAX: 61440 + job id mod 4096
    script = "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=2\n"
    return [slurm_task_env(script, job_id, "127.0.0.1", task) for task in range(2)]


def _gke_gpu_envs(stack: contextlib.ExitStack) -> list[dict[str, str]]:
    """The two pods of the rendered GKE GPU Indexed Job, with the coordinator's DNS name
    (pod 0's headless service) resolved to this machine and the process id left to
    JOB_COMPLETION_INDEX, as Kubernetes sets it."""
    argv = [*GKE_COMMON, "--gpu-type", "nvidia-h100-80gb", "--nodes", "2"]
    run, options = _parse(gke.add_launcher_arguments, argv)
    manifest = gke.manifest(run, options)
    envs = []
    for index in range(2):
        env = pod_env(manifest, index)
        env.pop("ATTNMT_PROCESS_ID")
        env["ATTNMT_COORDINATOR_ADDRESS"] = f"127.0.0.1:{_free_port()}"
        envs.append(env)
    assert envs[0]["ATTNMT_COORDINATOR_ADDRESS"] == envs[1]["ATTNMT_COORDINATOR_ADDRESS"]
    return envs


def _tpu_vm_envs(stack: contextlib.ExitStack) -> list[dict[str, str]]:
    """`tpu_vm.py run`'s variables on two workers, each asking its own (fake) metadata
    server, which lists both workers at 127.0.0.1 and tells each its number; JAX's fixed
    TPU port moved to a free one."""
    port = str(_free_port())
    envs = []
    for worker in range(2):
        attributes = {
            "worker-network-endpoints": "unused:0:127.0.0.1,unused:1:127.0.0.1",
            "agent-worker-number": str(worker),
            "tpu-env": TPU_ENV,
        }
        server = stack.enter_context(fake_metadata_server(attributes))
        env = {**tpu_vm_env(declare=False), "GCE_METADATA_HOST": server.address}
        envs.append({**env, "JAX_COORDINATOR_PORT": port, "NO_PROXY": "127.0.0.1"})
    return envs


LAUNCHER_ENVS = {"slurm": _slurm_envs, "gke_gpu": _gke_gpu_envs, "tpu_vm": _tpu_vm_envs}
LOGGED_SOURCE = {"slurm": "slurm", "gke_gpu": "attnmt", "tpu_vm": "tpu-vm"}


@pytest.mark.slow
@pytest.mark.parametrize("launcher", sorted(LAUNCHER_ENVS))
def test_two_processes_started_as_the_launcher_starts_them_reach_step_1(tmp_path, launcher):
    corpus = write_corpus(tmp_path / "corpus")
    argv = [sys.executable, "-m", "attnmt.cli.main", *train_args(corpus, tmp_path / "run", 1)]
    base = {k: v for k, v in job_env(tmp_path / "cache").items() if not k.startswith(PREFIXES)}
    base = {k: v for k, v in base.items() if k not in OTHERS}
    with contextlib.ExitStack() as stack:
        envs = [
            {**base, **launcher_env, "ATTNMT_LOCAL_DEVICE_COUNT": "1"}  # gloo on CPU
            for launcher_env in LAUNCHER_ENVS[launcher](stack)
        ]
        (code0, log0), (code1, log1) = run_processes(argv, envs, tmp_path / "task")
    codes, text = [code0, code1], [log0, log1]
    assert codes == [0, 0], text[0][-3000:] + text[1][-3000:]
    assert f"from the {LOGGED_SOURCE[launcher]} environment" in text[1], text[1][-3000:]
    assert "process 1 of 2" in text[1] and "stopped at step 1" in text[0]
