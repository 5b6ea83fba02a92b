"""What the cloud machines are given, as the launchers render it (--dry-run) and as the
image's install step runs: the GKE GPU pod's driver library path and coordinator variables
(the names attnmt.parallel.distributed reads), the image built for the nodes' platform, the
TPU VM's Python 3.11 environment with the gcs extra under the tpu constraints, the variable
that marks a Cloud TPU VM slice, and the Docker install held to its accelerator's set.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from attnmt.parallel import distributed
from tests.launch.helpers import REPO, dry_run, launch, shell_commands, train_part

RUN = shlex.split("--config configs/tiny.py --workdir gs://bucket/runs/demo")
GPU = shlex.split("--image reg/attnmt:1 --gpu-type nvidia-h100-80gb --gpus-per-node 8")
EXPECTED_JAX = {"cpu": "jax", "cuda": "jax[cuda12]", "tpu": "jax[tpu]"}
TPU = shlex.split("--image reg/attnmt:1 --tpu-type tpu-v4-podslice --tpu-topology 2x2x4")


def _container(*flags: str) -> dict:
    ((words, manifest),) = shell_commands(dry_run("gke", *flags, *RUN))
    assert words == ["kubectl", "apply", "-f", "-"]
    job = yaml.safe_load(manifest)["spec"]["replicatedJobs"][0]["template"]["spec"]
    (container,) = job["template"]["spec"]["containers"]
    return container


def _env(container: dict) -> dict[str, dict]:
    return {item["name"]: item for item in container.get("env", [])}


def test_gke_gpu_pods_see_the_driver_that_gke_mounts():
    env = _env(_container(*GPU, "--nodes", "2"))
    assert "/usr/local/nvidia/lib64" in env["LD_LIBRARY_PATH"]["value"].split(":")
    # A path of the user's own wins (and must then name the driver folder itself).
    mine = _env(_container(*GPU, "--env", "LD_LIBRARY_PATH=/opt/x:/usr/local/nvidia/lib64"))
    assert mine["LD_LIBRARY_PATH"]["value"] == "/opt/x:/usr/local/nvidia/lib64"
    assert "LD_LIBRARY_PATH" not in _env(_container(*TPU))  # TPU pods have no NVIDIA driver


def test_gke_gpu_pods_give_the_variables_that_distributed_reads():
    env = _env(_container(*GPU, "--nodes", "2"))
    names = {distributed.COORDINATOR, distributed.NUM_PROCESSES, distributed.PROCESS_ID}
    assert names <= set(env)
    # Each pod's process id is its completion index, which Kubernetes fills in: stand in a
    # value for it and read the environment as a pod would.
    values = {k: item.get("value", "1") for k, item in env.items()}
    plan = distributed.plan_from_environment(values)
    assert (plan.mode, plan.num_processes, plan.process_id) == ("explicit", 2, 1)
    assert plan.coordinator_address == "attnmt-demo-workers-0-0.attnmt-demo:1234"


def test_the_image_is_built_for_the_nodes_platform():
    ((bash, _),) = shell_commands(
        dry_run("image", "--accelerator", "tpu", "--registry", "r", "--no-push")
    )
    build = shlex.split(bash[2].split(" | ")[1])
    assert build[build.index("--platform") + 1] == "linux/amd64"


def _remote(words: list[str]) -> str:
    (command,) = [w for w in words if w.startswith("--command=")]
    return command.removeprefix("--command=")


def test_tpu_vm_run_uses_the_environment_install_made_and_marks_the_slice():
    ((words, _),) = shell_commands(dry_run("tpu_vm", "run", "--tpu", "t", "--zone", "z", *RUN))
    remote = _remote(words)
    assert 'export PATH="$HOME/attnmt-venv/bin:$PATH" ATTNMT_CLUSTER=tpu_vm &&' in remote
    assert train_part(shlex.split(remote))[:1] == ["train"]


def _recorder(folder: Path, name: str, log: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    line = f"open({str(log)!r}, 'a').write(json.dumps([{name!r}, *sys.argv[1:]]) + '\\n')"
    path.write_text(f"#!{sys.executable}\nimport json, sys\n{line}\n")
    path.chmod(0o755)


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _worker_home(tmp_path: Path, archive: str) -> tuple[Path, Path]:
    """A worker's home holding the shipped archive (made here from the working tree's files
    the install reads) and stand-ins for python3 and uv that record their arguments."""
    home, log = tmp_path / "home", tmp_path / "calls.jsonl"
    home.mkdir()
    with tarfile.open(home / archive, "w:gz") as tar:
        for name in ("pyproject.toml", "constraints"):
            tar.add(REPO / name, arcname=name)
    _recorder(tmp_path / "bin", "python3", log)
    _recorder(home / ".local" / "bin", "uv", log)
    return home, log


def test_tpu_vm_install_makes_a_python_311_environment_with_the_gcs_extra(tmp_path):
    ssh = shell_commands(dry_run("tpu_vm", "install", "--tpu", "t", "--zone", "z"))[-1][0]
    scp = shell_commands(dry_run("tpu_vm", "install", "--tpu", "t", "--zone", "z"))[1][0]
    home, log = _worker_home(tmp_path, scp[6].split(":", 1)[1])
    env = {"HOME": str(home), "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", "-c", _remote(ssh)], check=True, env=env)
    pip_uv, venv, install = _calls(log)
    assert pip_uv[:5] == ["python3", "-m", "pip", "install", "--quiet"] and "--user" in pip_uv
    assert pip_uv[-1].startswith("uv")
    assert venv[:2] == ["uv", "venv"] and venv[venv.index("--python") + 1] == "3.11"
    assert venv[-1] == f"{home}/attnmt-venv"
    assert install[:3] == ["uv", "pip", "install"]
    assert install[install.index("--python") + 1] == f"{home}/attnmt-venv/bin/python"
    constraints = Path(install[install.index("--constraint") + 1])
    assert constraints == home / "attnmt" / "constraints" / "tpu.txt" and constraints.is_file()
    assert install[-2:] == [f"{home}/attnmt[tfds,gcs]", "jax[tpu]"]


def test_tpu_vm_wheel_install_ships_the_constraints_too():
    flags = ["install", "--tpu", "t", "--zone", "z", "--source", "wheel", "--wheel", "a.whl"]
    commands = [words for words, _ in shell_commands(dry_run("tpu_vm", *flags))]
    (folders,) = [w for w in commands if "--recurse" in w]
    assert str(REPO / "constraints") in folders and str(REPO / "configs") in folders
    assert "--constraint" in _remote(commands[-1])


@pytest.mark.parametrize(
    ("accelerator", "name"), [("cpu", "cpu"), ("cuda", "cuda12"), ("tpu", "tpu")]
)
def test_docker_install_holds_pip_to_the_accelerators_set(tmp_path, accelerator, name):
    record = tmp_path / "pip.json"
    stub = tmp_path / "bin" / "python"
    stub.parent.mkdir()
    # A stand-in python: records its argv and the constraint pip would read, installs nothing.
    body = (
        f"json.dump([sys.argv[1:], os.environ.get('PIP_CONSTRAINT')], open({str(record)!r}, 'w'))"
    )
    stub.write_text(f"#!{sys.executable}\nimport json, os, sys\n{body}\n")
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stub.parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PIP_CONSTRAINT", None)
    command = ["sh", "docker/install.sh", accelerator, "tfds,gcs"]
    subprocess.run(command, cwd=REPO, env=env, check=True)
    argv, constraint = json.loads(record.read_text())
    assert argv == ["-m", "pip", "install", ".[tfds,gcs]", EXPECTED_JAX[accelerator]]
    assert constraint == str(REPO / "constraints" / f"{name}.txt")


def test_slurm_says_a_bucket_workdir_needs_the_gcs_extra():
    result = launch("slurm", *RUN, "--dry-run")
    assert result.returncode == 0 and "gcs extra" in result.stderr
    local = launch("slurm", "--config", "configs/tiny.py", "--workdir", "/shared/r", "--dry-run")
    assert "gcs extra" not in local.stderr
