"""Pods that run and keep their work: the image launch/gke.py runs by default and how it is
built, the storage a JobSet mounts, and what the TPU VM launcher does on every worker.

Where a command would run on a cloud machine, its text is executed here with stand-ins for
the cloud-only programs (docker, python3, gcsfuse, sudo) that record what they were asked.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.launch.helpers import REPO, dry_run, launch, shell_commands

RUN = shlex.split("--config configs/wmt14_ende.py:variant=big --name ende_big")
TPU = shlex.split("--tpu-type tpu-v4-podslice --tpu-topology 2x2x4 --chips-per-host 4")
GPU = shlex.split("--gpu-type nvidia-h100-80gb --nodes 2 --gpus-per-node 8")


def _head() -> str:
    """HEAD's short hash, asked of git directly (not through the launcher)."""
    result = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


def _jobset(*args: str) -> dict:
    ((words, manifest),) = shell_commands(dry_run("gke", *args))
    assert words == ["kubectl", "apply", "-f", "-"]
    return yaml.safe_load(manifest)


def _pod(jobset: dict) -> dict:
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]


def _stub(folder: Path, name: str, body: str) -> None:
    """An executable `name` in `folder` running the Python `body` (argv in sys.argv)."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!{sys.executable}\nimport json, sys, os\n{body}\n")
    path.chmod(0o755)


def _recorder(folder: Path, name: str, log: Path) -> None:
    """A stand-in that appends its argv to `log` (one JSON list per line)."""
    _stub(
        folder,
        name,
        f"open({str(log)!r}, 'a').write(json.dumps([{name!r}, *sys.argv[1:]]) + '\\n')",
    )


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_gke_runs_the_image_of_head_from_the_registry_by_default():
    registry = "us-docker.pkg.dev/p/r"
    workdir = "gs://bucket/runs/ende_big"
    tpu = _pod(_jobset("--registry", registry, *TPU, *RUN, "--workdir", workdir))
    (container,) = tpu["spec"]["containers"]
    assert container["image"] == f"{registry}/attnmt:tpu-{_head()}"
    # The registry may come from the environment; a GPU slice gets the CUDA build.
    result = launch(
        "gke", *GPU, *RUN, "--workdir", workdir, "--dry-run", env={"ATTNMT_REGISTRY": registry}
    )
    assert result.returncode == 0, result.stderr
    assert f"image: {registry}/attnmt:cuda-{_head()}" in result.stdout
    # --image wins over both.
    named = _pod(
        _jobset("--image", "x/y:1", "--registry", registry, *TPU, *RUN, "--workdir", workdir)
    )
    assert named["spec"]["containers"][0]["image"] == "x/y:1"


def test_gke_without_an_image_says_how_to_build_one():
    result = launch(
        "gke", *TPU, *RUN, "--workdir", "gs://b/r", "--dry-run", env={"ATTNMT_REGISTRY": ""}
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "python launch/image.py --accelerator tpu" in result.stderr


def test_gke_gs_workdir_goes_to_attnmt_with_no_volume():
    pod = _pod(
        _jobset(
            "--image",
            "i",
            *TPU,
            *RUN,
            "--workdir",
            "gs://b/runs/ende_big",
            "--service-account",
            "attnmt",
        )
    )
    spec = pod["spec"]
    (container,) = spec["containers"]
    command = container["command"]
    assert command[command.index("--workdir") + 1] == "gs://b/runs/ende_big"
    assert "volumes" not in spec and "volumeMounts" not in container
    assert spec["serviceAccountName"] == "attnmt"  # Workload Identity reaches the bucket
    assert "metadata" not in pod  # no gcsfuse sidecar asked for


def test_gke_mounts_the_bucket_through_the_gcsfuse_csi_driver():
    flags = ["--image", "i", "--bucket", "gs://my-bucket", "--mount-path", "/gcs", *GPU]
    pod = _pod(_jobset(*flags, *RUN, "--workdir", "/gcs/runs/ende_big"))
    # GKE injects the gcsfuse sidecar only into pods whose template carries this annotation.
    assert pod["metadata"]["annotations"] == {"gke-gcsfuse/volumes": "true"}
    spec = pod["spec"]
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    assert mounts == {"/dev/shm": "dshm", "/gcs": "shared"}  # NCCL's and the bucket
    csi = volumes["shared"]["csi"]
    assert csi["driver"] == "gcsfuse.csi.storage.gke.io"
    assert csi["volumeAttributes"]["bucketName"] == "my-bucket"
    options = csi["volumeAttributes"]["mountOptions"].split(",")
    assert "implicit-dirs" in options
    # Orbax renames a finished checkpoint's folder; gcsfuse allows that only with a limit.
    (limit,) = [o for o in options if o.startswith("rename-dir-limit=")]
    assert int(limit.split("=")[1]) > 0


def test_gke_mounts_a_persistent_volume_claim():
    pod = _pod(
        _jobset(
            "--image",
            "i",
            "--pvc",
            "filestore",
            *TPU,
            *RUN,
            "--workdir",
            "/mnt/shared/runs/ende_big",
        )
    )
    spec = pod["spec"]
    assert spec["volumes"] == [
        {"name": "shared", "persistentVolumeClaim": {"claimName": "filestore"}}
    ]
    assert spec["containers"][0]["volumeMounts"] == [{"name": "shared", "mountPath": "/mnt/shared"}]
    assert "metadata" not in pod


@pytest.mark.parametrize(
    "flags, workdir, message",
    [
        ([], "/runs/ende_big", "pod's own disk"),
        (["--pvc", "filestore"], "/runs/ende_big", "not under --mount-path /mnt/shared"),
        (["--bucket", "b"], "/mnt/sharedx/run", "not under --mount-path /mnt/shared"),
    ],
)
def test_gke_refuses_a_workdir_that_would_vanish_with_the_pod(flags, workdir, message):
    result = launch("gke", "--image", "i", *flags, *TPU, *RUN, "--workdir", workdir, "--dry-run")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert message in result.stderr and workdir in result.stderr


def test_image_build_pipes_head_to_docker_and_pushes_the_commit_tag():
    commands = shell_commands(dry_run("image", "--accelerator", "cuda", "--registry", "reg/x"))
    (bash, _), (push, _) = commands
    assert bash[:2] == ["bash", "-c"]
    script = bash[2]
    assert script.startswith("set -o pipefail; ")
    archive, build = (
        shlex.split(part) for part in script.removeprefix("set -o pipefail; ").split(" | ")
    )
    assert archive == ["git", "-C", str(REPO), "archive", "--format=tar", "HEAD"]
    tag = f"reg/x/attnmt:cuda-{_head()}"
    assert build == [
        "docker",
        "build",
        "--build-arg",
        "ACCELERATOR=cuda",
        "--platform",
        "linux/amd64",
        "--tag",
        tag,
        "-",
    ]
    assert push == ["docker", "push", tag]
    only_build = shell_commands(
        dry_run("image", "--accelerator", "tpu", "--registry", "r", "--no-push")
    )
    assert len(only_build) == 1


def test_image_build_gives_docker_a_context_with_what_the_dockerfile_copies(tmp_path):
    stubs, log = tmp_path / "bin", tmp_path / "docker.jsonl"
    # A stand-in docker: records its argv and the names in the tar it reads on stdin.
    _stub(
        stubs,
        "docker",
        (
            "import tarfile\n"
            "names = []\n"
            "if sys.argv[1] == 'build':\n"
            "    names = tarfile.open(fileobj=sys.stdin.buffer, mode='r|').getnames()\n"
            f"open({str(log)!r}, 'a').write(json.dumps([sys.argv[1:], names]) + '\\n')"
        ),
    )
    env = {"PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}"}
    result = launch("image", "--accelerator", "tpu", "--registry", "reg", env=env)
    assert result.returncode == 0, result.stderr
    (build, names), (push, _) = _calls(log)
    assert build[:3] == ["build", "--build-arg", "ACCELERATOR=tpu"] and build[-1] == "-"
    assert push == ["push", f"reg/attnmt:tpu-{_head()}"]
    for needed in (
        "Dockerfile",
        "docker/install.sh",
        "pyproject.toml",
        "src/attnmt/cli/main.py",
        "configs/wmt14_ende.py",
    ):
        assert needed in names, needed


def test_tpu_vm_install_unpacks_head_and_installs_it_in_a_venv_on_every_worker(tmp_path):
    env = {"TMPDIR": str(tmp_path)}
    result = launch("tpu_vm", "install", "--tpu", "t", "--zone", "z", "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    (archive, _), (scp, _), (ssh, _) = shell_commands(result.stdout)
    assert "--worker=all" in scp and "--worker=all" in ssh
    # Run what a worker would: make the archive, "copy" it to a home, run the remote command.
    subprocess.run(archive, check=True, capture_output=True)
    home = tmp_path / "home"
    home.mkdir()
    local, remote_name = scp[5], scp[6].split(":", 1)[1]
    (home / remote_name).write_bytes(Path(local).read_bytes())
    stubs, log = tmp_path / "bin", tmp_path / "calls.jsonl"
    _recorder(stubs, "python3", log)
    (home / ".local" / "bin").mkdir(parents=True)
    _recorder(home / ".local" / "bin", "uv", log)  # where `pip install --user uv` puts it
    (remote,) = [w.removeprefix("--command=") for w in ssh if w.startswith("--command=")]
    shell_env = {"HOME": str(home), "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", "-c", remote], check=True, env=shell_env)
    tree = home / "attnmt"
    for needed in ("pyproject.toml", "configs/wmt14_ende.py", "src/attnmt/cli/main.py"):
        assert (tree / needed).is_file(), needed
    venv = home / "attnmt-venv"
    pip_uv, make_venv, install = _calls(log)
    assert pip_uv[:6] == ["python3", "-m", "pip", "install", "--quiet", "--user"]
    assert pip_uv[6].startswith("uv==")
    assert make_venv == ["uv", "venv", "--quiet", "--allow-existing", "--python", "3.11", str(venv)]
    assert install == [
        "uv",
        "pip",
        "install",
        "--quiet",
        "--python",
        f"{venv}/bin/python",
        "--constraint",
        f"{tree}/constraints/tpu.txt",
        "-e",
        f"{tree}[tfds,gcs]",
        "jax[tpu]",
    ]


def _mount_script(*flags: str) -> str:
    ((ssh, _),) = shell_commands(dry_run("tpu_vm", "mount", "--tpu", "t", "--zone", "z", *flags))
    assert "--worker=all" in ssh
    (remote,) = [w.removeprefix("--command=") for w in ssh if w.startswith("--command=")]
    return remote


def _run_mount(tmp_path: Path, remote: str, mounted: bool, installed: bool) -> list[list[str]]:
    stubs, log = tmp_path / "bin", tmp_path / "calls.jsonl"
    for name in ("sudo", "curl", "lsb_release"):
        _recorder(stubs, name, log)
    if installed:
        _recorder(stubs, "gcsfuse", log)
    _stub(stubs, "mountpoint", f"sys.exit(0 if {mounted} else 1)")
    # Only the stand-ins and the shell's basics, so that a real gcsfuse cannot be found.
    basics = {str(Path(shutil.which(tool)).parent) for tool in ("bash", "id")}
    env = {"PATH": os.pathsep.join([str(stubs), *sorted(basics)]), "HOME": str(tmp_path)}
    subprocess.run(["bash", "-c", remote], check=True, env=env, capture_output=True)
    return _calls(log)


def test_tpu_vm_mount_puts_the_bucket_at_the_same_path_on_every_worker(tmp_path):
    remote = _mount_script("--bucket", "gs://my-bucket", "--mount-path", "/mnt/b")
    calls = _run_mount(tmp_path, remote, mounted=False, installed=True)
    assert ["sudo", "mkdir", "-p", "/mnt/b"] in calls
    (gcsfuse,) = [c for c in calls if c[0] == "gcsfuse"]
    assert gcsfuse[-2:] == ["my-bucket", "/mnt/b"]
    assert "--implicit-dirs" in gcsfuse
    assert any(flag.startswith("--rename-dir-limit=") for flag in gcsfuse)
    assert not any("apt-get" in c for c in calls)  # already installed: no apt


def test_tpu_vm_mount_installs_gcsfuse_once_and_leaves_a_mounted_bucket(tmp_path):
    remote = _mount_script("--bucket", "my-bucket")
    calls = _run_mount(tmp_path, remote, mounted=True, installed=False)
    assert ["sudo", "apt-get", "install", "-y", "-qq", "gcsfuse"] in calls
    assert not any(c[0] == "gcsfuse" for c in calls)  # mounted already


def test_tpu_vm_mount_refuses_a_path_for_a_bucket():
    result = launch(
        "tpu_vm", "mount", "--tpu", "t", "--zone", "z", "--bucket", "gs://b/dir", "--dry-run"
    )
    assert result.returncode == 2 and "bucket name" in result.stderr


def test_local_launcher_wants_a_log_dir_for_a_bucket_workdir(tmp_path):
    args = ["--config", "configs/tiny.py", "--workdir", "gs://b/r", "--dry-run"]
    refused = launch("local", *args)
    assert refused.returncode == 2 and "--log-dir" in refused.stderr
    commands = shell_commands(dry_run("local", *args[:-1], "--log-dir", str(tmp_path)))
    assert commands[0][0] == ["mkdir", "-p", str(tmp_path)]
