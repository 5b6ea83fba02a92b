"""Each launcher's --dry-run: well-formed commands carrying the right attnmt train command."""

import shlex
import sys

import yaml

from launch.common import REPO_ROOT
from tests.launch.helpers import dry_run, launch, shell_commands, train_part

RUN = shlex.split("--config configs/tiny.py:vocab_size=32 --workdir /mnt/bucket/runs/demo")
OVERRIDES = ["--config.model.d_ff=128", "--config.train.num_steps", "7"]
EXPECTED_TRAIN = [
    "train",
    "--config",
    "configs/tiny.py:vocab_size=32",
    "--workdir",
    "/mnt/bucket/runs/demo",
    "--config.model.d_ff=128",
    "--config.train.num_steps=7",
]
GCLOUD_TPU = ["gcloud", "compute", "tpus", "tpu-vm"]


def _dry(script, text, *more):
    """Dry-run commands of `script` with flags written as one shell string."""
    return shell_commands(dry_run(script, *shlex.split(text), *more))


def _remote(words):
    """The --command=... of a gcloud ssh."""
    (command,) = [w for w in words if w.startswith("--command=")]
    return command[len("--command=") :]


def test_local_starts_one_process_per_id_with_a_shared_coordinator():
    commands = _dry("local", "--processes 2 --devices-per-process 4", *RUN, *OVERRIDES)
    assert commands[0][0] == ["mkdir", "-p", "/mnt/bucket/runs/demo/logs"]
    assert commands[-1][0] == ["wait"]
    processes = [words for words, _ in commands[1:-1]]
    assert len(processes) == 2
    coordinators = set()
    for process_id, words in enumerate(processes):
        program = words.index(sys.executable)
        env = dict(w.split("=", 1) for w in words[:program])
        assert env["ATTNMT_PROCESS_ID"] == str(process_id)
        assert env["ATTNMT_NUM_PROCESSES"] == "2"
        assert env["ATTNMT_LOCAL_DEVICE_COUNT"] == "4"
        assert env["JAX_PLATFORMS"] == "cpu"
        # The test suite's forced device count must not reach the processes.
        assert "xla_force_host_platform_device_count" not in env.get("XLA_FLAGS", "")
        coordinators.add(env["ATTNMT_COORDINATOR_ADDRESS"])
        assert words[program + 1 : words.index("train")] == ["-m", "attnmt.cli.main"]
        assert train_part(words) == EXPECTED_TRAIN
        log = f"/mnt/bucket/runs/demo/logs/process_{process_id}.log"
        assert words[-4:] == [">", log, "2>&1", "&"]
    (coordinator,) = coordinators
    host, port = coordinator.split(":")
    assert host == "127.0.0.1" and 0 < int(port) < 65536


def test_tpu_vm_run_starts_training_on_all_workers_under_nohup():
    flags = "run --tpu ende --zone us-central2-b --project p --env 'ATTNMT_X=/data/m 30k'"
    ((words, stdin),) = _dry("tpu_vm", flags, *RUN, *OVERRIDES)
    assert stdin is None
    assert words[:6] == [*GCLOUD_TPU, "ssh", "ende"]
    assert {"--zone=us-central2-b", "--project=p", "--worker=all"} <= set(words)
    text = _remote(words)
    remote = shlex.split(text)
    nohup = remote.index("nohup")
    # Only nohup goes to the background, so that the pid recorded is the training's.
    assert remote[nohup - 2 : nohup] == ["{", "ATTNMT_X=/data/m 30k"]
    assert remote[nohup + 1 : remote.index("train")] == ["python3", "-m", "attnmt.cli.main"]
    assert train_part(remote) == EXPECTED_TRAIN
    assert '>> "$HOME/attnmt-logs/demo.log" 2>&1 < /dev/null &' in text
    assert 'echo $! > "$HOME/attnmt-logs/demo.pid"; }' in text


def test_tpu_vm_create_install_logs_stop_delete():
    slice_ = "--tpu ende --zone z"
    ((create, _),) = _dry("tpu_vm", f"create {slice_} --accelerator-type v5litepod-16 --spot")
    assert create == [
        *GCLOUD_TPU,
        *shlex.split("create ende --zone=z --accelerator-type=v5litepod-16"),
        "--version=v2-alpha-tpuv5-lite",
        "--spot",
    ]
    install = _dry("tpu_vm", f"install {slice_}")
    assert install[0][0][:4] == ["git", "-C", str(REPO_ROOT), "archive"]
    assert [words[4] for words, _ in install[1:]] == ["scp", "ssh"]
    assert all("--worker=all" in words for words, _ in install[1:])
    assert "pip install" in _remote(install[2][0])

    git = _dry("tpu_vm", f"install {slice_} --source git --git-url https://x.org/a.git --ref v1")
    remote = _remote(git[0][0])
    assert "git clone --quiet https://x.org/a.git" in remote
    assert "git fetch --quiet origin v1" in remote

    ((logs, _),) = _dry("tpu_vm", f"logs {slice_} --name demo --follow")
    assert "--worker=0" in logs
    assert shlex.split(_remote(logs))[:4] == ["tail", "-n", "100", "-F"]
    ((stop, _),) = _dry("tpu_vm", f"stop {slice_} --name demo")
    assert _remote(stop).startswith("kill -TERM")
    ((delete, _),) = _dry("tpu_vm", f"delete {slice_}")
    assert delete == [*GCLOUD_TPU, "delete", "ende", "--zone=z", "--quiet"]


# The workdir of RUN on a shared volume (a Filestore claim) mounted at /mnt/bucket.
GKE_STORAGE = "--pvc filestore --mount-path /mnt/bucket"


def _jobset(flags, *more):
    ((words, manifest),) = _dry("gke", f"--image reg/attnmt:1 {GKE_STORAGE} {flags}", *more)
    assert words == ["kubectl", "apply", "-f", "-"]
    return yaml.safe_load(manifest)


def test_gke_tpu_jobset_has_a_pod_per_host_of_the_slice():
    tpu = "--tpu-type tpu-v5-lite-podslice --tpu-topology 4x4 --chips-per-host 4"
    jobset = _jobset(tpu, *RUN, *OVERRIDES)
    assert jobset["kind"] == "JobSet" and jobset["apiVersion"].startswith("jobset.x-k8s.io/")
    assert jobset["metadata"]["name"] == "attnmt-demo"
    (replicated,) = jobset["spec"]["replicatedJobs"]
    assert replicated["replicas"] == 1  # one slice
    job = replicated["template"]["spec"]
    assert job["parallelism"] == job["completions"] == 4  # 16 chips, 4 per host
    assert job["completionMode"] == "Indexed"
    pod = job["template"]["spec"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "4x4",
    }
    (container,) = pod["containers"]
    assert container["image"] == "reg/attnmt:1"
    assert container["resources"]["limits"] == {"google.com/tpu": 4}
    assert container["command"] == ["attnmt", *EXPECTED_TRAIN]
    assert "env" not in container  # JAX finds TPU peers from GKE's TPU_WORKER_* variables


def test_gke_gpu_jobset_names_the_coordinator_and_each_process():
    gpu = "--gpu-type nvidia-h100-80gb --nodes 3 --gpus-per-node 8 --spot --env NCCL_DEBUG=WARN"
    job = _jobset(gpu, *RUN)["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["parallelism"] == job["completions"] == 3
    pod = job["template"]["spec"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
        "cloud.google.com/gke-spot": "true",
    }
    (container,) = pod["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}
    env = {item["name"]: item for item in container["env"]}
    assert env["NCCL_DEBUG"]["value"] == "WARN"
    assert env["ATTNMT_NUM_PROCESSES"]["value"] == "3"
    # Pod 0 of the JobSet, through the headless service JobSet names after itself.
    coordinator = env["ATTNMT_COORDINATOR_ADDRESS"]["value"]
    assert coordinator == "attnmt-demo-workers-0-0.attnmt-demo:1234"
    path = env["ATTNMT_PROCESS_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert "job-completion-index" in path


def test_slurm_script_has_the_directives_and_the_srun_line():
    flags = "--nodes 2 --gpus-per-node 4 --partition gpu --time 2:00:00 --requeue"
    commands = _dry("slurm", flags, "--setup", "source ~/venv/bin/activate", *RUN, *OVERRIDES)
    (mkdir, _), (sbatch, script) = commands
    assert mkdir == ["mkdir", "-p", "slurm-logs"]
    assert sbatch == ["sbatch"]
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert {
        "#SBATCH --job-name=demo",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",  # one process per GPU
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=2:00:00",
        "#SBATCH --output=slurm-logs/%x-%j.out",
        "#SBATCH --requeue",
    } <= set(lines)
    assert "source ~/venv/bin/activate" in lines
    (srun,) = [shlex.split(line) for line in lines if line.startswith("srun ")]
    assert srun[srun.index("train") - 1] == "attnmt"
    assert train_part(srun) == EXPECTED_TRAIN
    assert '  scontrol requeue "$SLURM_JOB_ID"' in lines


def test_slurm_one_task_per_node():
    ((_, _), (_, script)) = _dry("slurm", "--tasks node --gpus-per-node 8", *RUN)
    assert "#SBATCH --ntasks-per-node=1" in script.splitlines()


def test_cloud_launchers_refuse_to_run_without_their_cli(tmp_path):
    # An empty PATH: whatever is installed here is never called.
    empty = {"PATH": str(tmp_path)}
    for script, args in (
        ("gke", ["--image", "i", "--gpu-type", "g", *shlex.split(GKE_STORAGE), *RUN]),
        ("slurm", RUN),
        ("tpu_vm", ["delete", "--tpu", "t", "--zone", "z"]),
    ):
        result = launch(script, *args, env=empty)
        assert result.returncode == 2, (script, result.stderr)
        assert "not installed" in result.stderr


def test_bad_arguments_are_reported_without_a_traceback():
    flags = f"--image i --tpu-type t --tpu-topology 3x3 {GKE_STORAGE}"
    result = launch("gke", *shlex.split(flags), *RUN)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "3x3" in result.stderr
