"""The accelerator a run asked for, checked against the one JAX started.

A GPU image whose CUDA plugin cannot load its driver (GKE mounts it under
/usr/local/nvidia/lib64, which must be on LD_LIBRARY_PATH) or a TPU VM without libtpu does
not fail: JAX warns once and runs on the CPU, many times slower. So the run names the
accelerator it needs, as `parallel.accelerator` or the image's ATTNMT_ACCELERATOR
(cpu | cuda | tpu, set by the Dockerfile), and stops at start-up, in one line naming the
likely cause, when `jax.default_backend()` is another.

XLA's GPU scheduling flags are added to XLA_FLAGS only when the backend will be a GPU;
they must be in place before JAX starts its backend, so `apply_xla_gpu_flags` runs first.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import logging
import os
from collections.abc import Mapping, MutableMapping

import jax

from attnmt.errors import ConfigError

log = logging.getLogger(__name__)

ACCELERATOR_ENV = "ATTNMT_ACCELERATOR"
# What ATTNMT_ACCELERATOR may say (the Dockerfile's build argument) → a JAX backend name.
ENV_ACCELERATORS = {
    "": "any",
    "any": "any",
    "cpu": "cpu",
    "cuda": "gpu",
    "gpu": "gpu",
    "tpu": "tpu",
}
GKE_DRIVER_DIR = "/usr/local/nvidia/lib64"  # where GKE mounts the NVIDIA driver libraries
CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")
# Documented in JAX's "GPU performance tips" and set by NVIDIA's JAX images: lets XLA move
# collectives (the gradient all-reduce) to overlap with compute. A flag the user already
# put in XLA_FLAGS keeps the user's value.
GPU_XLA_FLAGS = {"xla_gpu_enable_latency_hiding_scheduler": "true"}
GPU_PLATFORMS = ("cuda", "gpu", "rocm")


@dataclasses.dataclass(frozen=True)
class Backend:
    """What JAX started: its platform, the kind of device, local and global counts."""

    platform: str
    device_kind: str
    local_devices: int
    devices: int
    processes: int

    def describe(self) -> str:
        return (
            f"backend {self.platform}: {self.local_devices} local × {self.device_kind}, "
            f"{self.devices} device(s) in {self.processes} process(es)"
        )


def requested_accelerator(configured: str = "any", env: Mapping[str, str] | None = None) -> str:
    """ "any", "cpu", "gpu" or "tpu": the config key when it names one, else the image's."""
    if configured != "any":
        return configured
    env = os.environ if env is None else env
    value = env.get(ACCELERATOR_ENV, "").strip().lower()
    if value not in ENV_ACCELERATORS:
        choices = ", ".join(sorted(key for key in ENV_ACCELERATORS if key))
        raise ConfigError(f"{ACCELERATOR_ENV}={value!r} is not one of {choices}")
    return ENV_ACCELERATORS[value]


def _platforms(env: Mapping[str, str]) -> list[str]:
    """JAX_PLATFORMS as a list; JAX makes the first it can start the default backend."""
    text = env.get("JAX_PLATFORMS", "")
    return [name.strip().lower() for name in text.split(",") if name.strip()]


def backend_will_be_gpu(requested: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether JAX is going to start a GPU backend, decided before it starts one."""
    env = os.environ if env is None else env
    platforms = _platforms(env)
    if platforms:
        return platforms[0] in GPU_PLATFORMS
    if requested != "any":
        return requested == "gpu"
    # Nothing says: a GPU backend needs the CUDA plugin and a driver device node.
    return cuda_plugin_installed() and os.path.exists("/dev/nvidiactl")


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def cuda_plugin_installed() -> bool:
    return any(installed(name) for name in CUDA_PLUGINS)


def driver_loads() -> bool:
    """Whether the NVIDIA driver's libcuda.so.1 is on the library path."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def with_gpu_flags(xla_flags: str) -> str:
    """`xla_flags` plus each GPU_XLA_FLAGS entry it does not set already."""
    present = {flag.split("=", 1)[0].lstrip("-") for flag in xla_flags.split()}
    added = [f"--{name}={value}" for name, value in GPU_XLA_FLAGS.items() if name not in present]
    return " ".join([xla_flags.strip(), *added]).strip()


def apply_xla_gpu_flags(requested: str, env: MutableMapping[str, str] | None = None) -> bool:
    """Adds the GPU flags to XLA_FLAGS when the backend will be a GPU; True if it did."""
    env = os.environ if env is None else env
    if not backend_will_be_gpu(requested, env):
        return False
    flags = with_gpu_flags(env.get("XLA_FLAGS", ""))
    if flags != env.get("XLA_FLAGS", ""):
        env["XLA_FLAGS"] = flags
        log.info("XLA_FLAGS for GPU: %s", flags)
    return True


def current_backend() -> Backend:
    """The backend JAX starts (or started); JAX's own start-up error becomes a ConfigError."""
    try:
        platform = jax.default_backend()
    except RuntimeError as error:  # e.g. JAX_PLATFORMS=cuda without a usable GPU
        first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise ConfigError(f"JAX could not start its backend: {first}") from None
    local = jax.local_devices()
    return Backend(
        platform, local[0].device_kind, len(local), jax.device_count(), jax.process_count()
    )


def check_backend(configured: str = "any", env: Mapping[str, str] | None = None) -> Backend:
    """Logs the backend; stops with the likely cause when it is not the requested one."""
    env = os.environ if env is None else env
    requested = requested_accelerator(configured, env)
    backend = current_backend()
    log.info("%s", backend.describe())
    if requested not in ("any", backend.platform):
        source = f"parallel.accelerator={configured}" if configured != "any" else None
        source = source or f"{ACCELERATOR_ENV}={env.get(ACCELERATOR_ENV)}"
        raise ConfigError(
            f"{source} asks for {requested}, but JAX started {backend.platform} "
            f"({backend.device_kind}): {likely_cause(requested, env)}"
        )
    return backend


def likely_cause(requested: str, env: Mapping[str, str] | None = None) -> str:
    """One sentence on why JAX did not start the `requested` backend."""
    env = os.environ if env is None else env
    platforms = _platforms(env)
    names = GPU_PLATFORMS if requested == "gpu" else (requested,)
    if platforms and not set(names) & set(platforms):
        return f"JAX_PLATFORMS={','.join(platforms)} leaves {requested} out"
    if requested == "gpu":
        return _gpu_cause(env)
    if requested == "tpu":
        return _tpu_cause()
    return "set JAX_PLATFORMS=cpu to run on the CPU of an accelerator machine"


def _gpu_cause(env: Mapping[str, str]) -> str:
    if not cuda_plugin_installed():
        return "the CUDA plugin is not installed (pip install 'jax[cuda12]')"
    if not driver_loads():
        path = env.get("LD_LIBRARY_PATH", "")
        return (
            f"the NVIDIA driver library libcuda.so.1 is not found: LD_LIBRARY_PATH={path!r} "
            f"lacks its folder (on GKE: {GKE_DRIVER_DIR})"
        )
    visible = env.get("CUDA_VISIBLE_DEVICES")
    hint = f"; CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
    return (
        f"the CUDA plugin and driver load but found no GPU (none allocated to this process?{hint})"
    )


def _tpu_cause() -> str:
    if not installed("libtpu"):
        return "libtpu is not installed (pip install 'jax[tpu]')"
    return (
        "libtpu is installed but found no TPU chips: not a TPU VM or TPU node, or another "
        "process holds the TPU (see /tmp/libtpu_lockfile)"
    )
