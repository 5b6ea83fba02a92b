"""Multi-process start-up: jax.distributed initialised from the environment.

Each launcher's environment gives the coordinator, the process count and this process's
id, which are computed here the way JAX's own cluster detection does
(jax._src.clusters), and passed to `jax.distributed.initialize` explicitly:

- local (launch/local.py) and GKE GPU pods (launch/gke.py): ATTNMT_COORDINATOR_ADDRESS,
  ATTNMT_NUM_PROCESSES and ATTNMT_PROCESS_ID; a Kubernetes Indexed Job's
  JOB_COMPLETION_INDEX stands in for the process id when ATTNMT_PROCESS_ID is unset.
- SLURM (launch/slurm.py, `srun`): SLURM_NTASKS, SLURM_PROCID, the first host of
  SLURM_STEP_NODELIST, a port from SLURM_JOB_ID.
- GKE TPU pods: TPU_WORKER_HOSTNAMES (or TPU_PROCESS_ADDRESSES) and TPU_WORKER_ID, which
  GKE sets; MEGASCALE_* for a multislice job.
- Cloud TPU VMs (launch/tpu_vm.py): the GCE metadata server lists the slice's workers. It is
  asked only when a TPU is plausible (ATTNMT_CLUSTER=tpu_vm, which tpu_vm.py sets, or libtpu
  installed), with a short timeout, so a laptop never waits on 169.254.169.254.
  GCE_METADATA_HOST or GCE_METADATA_IP moves it, as in Google's own clients.

ATTNMT_LOCAL_DEVICE_COUNT gives each CPU process that many fake devices (testing only).
Must run before anything asks JAX for its devices.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping

import jax

from attnmt.errors import ConfigError
from attnmt.parallel.backend import apply_xla_gpu_flags, requested_accelerator

log = logging.getLogger(__name__)

COORDINATOR = "ATTNMT_COORDINATOR_ADDRESS"
NUM_PROCESSES = "ATTNMT_NUM_PROCESSES"
PROCESS_ID = "ATTNMT_PROCESS_ID"
LOCAL_DEVICES = "ATTNMT_LOCAL_DEVICE_COUNT"
CLUSTER = "ATTNMT_CLUSTER"  # "tpu_vm": this is a Cloud TPU VM, ask its metadata server
CLUSTERS = ("tpu_vm",)
COMPLETION_INDEX = "JOB_COMPLETION_INDEX"  # set by Kubernetes in every Indexed Job pod
TPU_COORDINATOR_PORT = "8482"  # JAX's fixed port for TPU slices (cloud_tpu_cluster.py)
SLURM_PORT_BASE = 65535 - 2**12 + 1  # JAX's SLURM ports: SLURM_JOB_ID mod 4096 above it
METADATA_IP = "169.254.169.254"  # the GCE metadata server (no DNS look-up needed)
METADATA_PATH = "/computeMetadata/v1/instance/attributes/"
METADATA_TIMEOUT_S = 2.0
METADATA_ATTEMPTS = 3  # when the VM is declared a TPU VM; a mere guess tries once
MEGASCALE = ("MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID")


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """How this process joins the job, read from the environment."""

    mode: str  # "single", "explicit", "auto" (JAX detects the rest itself)
    coordinator_address: str | None = None
    num_processes: int = 1
    process_id: int = 0
    local_device_count: int | None = None
    source: str = "local"  # which environment said so: attnmt, slurm, gke-tpu, tpu-vm


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        raise ConfigError(
            f"environment variable {name} must be an integer, got {env.get(name)!r}"
        ) from None


def _joined(
    source: str, coordinator: str, count: int, pid: int, local: int | None, pid_name: str
) -> LaunchPlan:
    if not 0 <= pid < count:
        raise ConfigError(f"{pid_name}={pid} is outside 0..{count - 1}")
    return LaunchPlan("explicit", coordinator, count, pid, local, source)


def plan_from_environment(env: Mapping[str, str] | None = None) -> LaunchPlan:
    """The plan of the first environment that describes a job; "single" when none does."""
    env = os.environ if env is None else env
    local = _int(env, LOCAL_DEVICES) if env.get(LOCAL_DEVICES) else None
    detectors: tuple[Callable[[Mapping[str, str], int | None], LaunchPlan | None], ...] = (
        _from_attnmt,
        _from_slurm,
        _from_gke_tpu,
        _from_tpu_vm,
    )
    for detect in detectors:
        plan = detect(env, local)
        if plan is not None:
            return plan
    if env.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return LaunchPlan("auto", local_device_count=local, source="megascale")
    return LaunchPlan("single", local_device_count=local)


def _from_attnmt(env: Mapping[str, str], local: int | None) -> LaunchPlan | None:
    """launch/local.py, launch/gke.py's GPU pods (and anything setting the same)."""
    if not env.get(COORDINATOR):
        return None
    given = env.get(PROCESS_ID) or not env.get(COMPLETION_INDEX)
    name = PROCESS_ID if given else COMPLETION_INDEX
    count, pid = _int(env, NUM_PROCESSES), _int(env, name)
    return _joined("attnmt", env[COORDINATOR], count, pid, local, name)


def _from_slurm(env: Mapping[str, str], local: int | None) -> LaunchPlan | None:
    """`srun` tasks, as jax._src.clusters.slurm_cluster reads them."""
    if not env.get("SLURM_NTASKS") or _int(env, "SLURM_NTASKS") <= 1:
        return None
    needed = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_PROCID")
    if not all(env.get(name) for name in needed):
        return LaunchPlan("auto", local_device_count=local, source="slurm")
    port = env.get("JAX_COORDINATOR_PORT") or _int(env, "SLURM_JOB_ID") % 2**12 + SLURM_PORT_BASE
    host = first_slurm_host(env["SLURM_STEP_NODELIST"])
    count, pid = _int(env, "SLURM_NTASKS"), _int(env, "SLURM_PROCID")
    return _joined("slurm", f"{host}:{port}", count, pid, local, "SLURM_PROCID")


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list: node001 for 'node[001-016,020],login'."""
    match = re.match(r"([^,\[]*)(?:\[([^,\-\]]+))?", nodelist.strip())
    host = (match.group(1) + (match.group(2) or "")) if match else ""
    if not host:
        raise ConfigError(f"SLURM_STEP_NODELIST={nodelist!r} names no host")
    return host


def _from_gke_tpu(env: Mapping[str, str], local: int | None) -> LaunchPlan | None:
    """GKE's TPU pods; the multislice variables come in the environment there."""
    hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES")
    if not hosts:
        return None
    if not env.get("TPU_WORKER_ID"):
        return LaunchPlan("auto", local_device_count=local, source="gke-tpu")
    workers = hosts.split(",")
    return _tpu_plan("gke-tpu", workers, _int(env, "TPU_WORKER_ID"), env.get, env, local)


def _tpu_plan(
    source: str,
    workers: list[str],
    worker: int,
    lookup: Callable[[str], str | None],
    env: Mapping[str, str],
    local: int | None,
) -> LaunchPlan:
    """As JAX's BaseTpuCluster: hosts of all slices, numbered slice by slice; the
    coordinator is the multislice coordinator, else the slice's first worker."""
    slices = int(lookup("MEGASCALE_NUM_SLICES") or 1)
    slice_id = int(lookup("MEGASCALE_SLICE_ID") or 0)
    host = (lookup("MEGASCALE_COORDINATOR_ADDRESS") or workers[0]).split(":")[0]
    port = env.get("JAX_COORDINATOR_PORT") or TPU_COORDINATOR_PORT
    count = len(workers) * slices
    if count == 1:
        return LaunchPlan("single", local_device_count=local, source=source)
    pid = worker + slice_id * len(workers)
    return _joined(source, f"{host}:{port}", count, pid, local, f"the {source} worker id")


def _tpu_vm_hint(env: Mapping[str, str]) -> str | None:
    """ "declared" (ATTNMT_CLUSTER=tpu_vm), "plausible" (libtpu installed) or None."""
    declared = env.get(CLUSTER, "")
    if declared and declared not in CLUSTERS:
        raise ConfigError(f"{CLUSTER}={declared!r} is not one of {', '.join(CLUSTERS)}")
    if declared == "tpu_vm":
        return "declared"
    if env.get("TPU_SKIP_MDS_QUERY") is not None:  # JAX's own opt-out of the query
        return None
    return "plausible" if libtpu_installed() else None


def libtpu_installed() -> bool:
    """jax[tpu] brings libtpu: a TPU is plausible here (jax's own cloud_tpu_init asks too)."""
    return importlib.util.find_spec("libtpu") is not None


def metadata_host(env: Mapping[str, str]) -> str:
    return env.get("GCE_METADATA_HOST") or env.get("GCE_METADATA_IP") or METADATA_IP


def read_metadata(host: str, key: str, attempts: int = 1) -> str | None:
    """An instance attribute's text; None when the server has no such attribute. A server
    that does not answer raises OSError. Proxies are bypassed: the server is link-local."""
    request = urllib.request.Request(
        f"http://{host}{METADATA_PATH}{key}", headers={"Metadata-Flavor": "Google"}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for attempt in range(attempts):
        try:
            with opener.open(request, timeout=METADATA_TIMEOUT_S) as response:
                return response.read().decode()
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            if attempt == attempts - 1:
                raise
        except OSError:
            if attempt == attempts - 1:
                raise
        time.sleep(0.5)
    return None


def _from_tpu_vm(env: Mapping[str, str], local: int | None) -> LaunchPlan | None:
    """A Cloud TPU VM slice, from the metadata server as JAX's GceTpuCluster reads it."""
    hint = _tpu_vm_hint(env)
    if hint is None:
        return None
    host, attempts = metadata_host(env), METADATA_ATTEMPTS if hint == "declared" else 1
    try:
        worker = read_metadata(host, "agent-worker-number", attempts)
        endpoints = read_metadata(host, "worker-network-endpoints", attempts)
        tpu_env = _tpu_env(host, env, attempts)
    except OSError as error:
        if hint == "declared":
            raise ConfigError(
                f"{CLUSTER}=tpu_vm, but the metadata server at {host} did not answer ({error})"
            ) from None
        log.debug("libtpu is installed but no metadata server answered at %s: %s", host, error)
        return None
    if worker is None or endpoints is None:
        if hint == "declared":
            raise ConfigError(
                f"{CLUSTER}=tpu_vm, but the metadata server at {host} lists no TPU workers "
                f"(instance/attributes/worker-network-endpoints): not a Cloud TPU VM?"
            )
        return None

    def lookup(name: str) -> str | None:  # the environment first, then tpu-env (as JAX)
        return env.get(name) if name in env else tpu_env.get(name)

    return _tpu_plan("tpu-vm", tpu_workers(endpoints), int(worker), lookup, env, local)


def tpu_workers(endpoints: str) -> list[str]:
    """Hosts of worker-network-endpoints: 'host,host' or the older 'name:id:ip,...'."""
    hosts = []
    for entry in endpoints.strip().split(","):
        parts = entry.split(":")
        if len(parts) not in (1, 3):
            raise ConfigError(f"unreadable worker-network-endpoints entry {entry!r}")
        hosts.append(parts[-1])
    return hosts


def _tpu_env(host: str, env: Mapping[str, str], attempts: int) -> dict[str, str]:
    """The MEGASCALE_* lines of the tpu-env attribute (`KEY: 'value'`), when needed."""
    if all(name in env for name in MEGASCALE):
        return {}
    text = read_metadata(host, "tpu-env", attempts) or ""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            values[key.strip()] = value.strip().strip("'")
    return values


def initialize(plan: LaunchPlan | None = None, accelerator: str = "any") -> LaunchPlan:
    """Joins the job described by the environment; a single process needs nothing.

    First the GPU's XLA flags, when the backend will be a GPU: JAX reads them once, when
    its backend starts, which joining a job may do.
    """
    apply_xla_gpu_flags(requested_accelerator(accelerator))
    plan = plan_from_environment() if plan is None else plan
    if plan.local_device_count is not None:
        jax.config.update("jax_num_cpu_devices", plan.local_device_count)
    if plan.mode == "single":
        return plan
    if plan.local_device_count is not None:
        # CPU processes talk through gloo; accelerators bring their own collectives.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if plan.mode == "explicit":
        log.info(
            "joining %s as process %d of %d (from the %s environment)",
            plan.coordinator_address,
            plan.process_id,
            plan.num_processes,
            plan.source,
        )
        jax.distributed.initialize(
            coordinator_address=plan.coordinator_address,
            num_processes=plan.num_processes,
            process_id=plan.process_id,
        )
    else:
        jax.distributed.initialize()
    log.info(
        "process %d of %d, %d local / %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    return plan
