"""A JobSet on GKE: one pod per host of a TPU slice or per GPU node, `kubectl apply -f -`.

    python launch/gke.py --image REGISTRY/attnmt:TAG \
        --tpu-type tpu-v5-lite-podslice --tpu-topology 4x4 --chips-per-host 4 \
        --config configs/wmt14_ende.py:variant=big --workdir /mnt/runs/ende_big
    python launch/gke.py --image REGISTRY/attnmt:TAG --gpu-type nvidia-h100-80gb \
        --nodes 2 --gpus-per-node 8 --config configs/wmt14_ende.py --workdir /mnt/runs/ende

One replicated job (one slice) whose Indexed Job runs `hosts` pods at once (parallelism =
completions = hosts; a TPU slice has topology chips / chips-per-host hosts). TPU pods need no
coordinator variables: GKE gives them TPU_WORKER_HOSTNAMES and JAX reads those. GPU pods get
ATTNMT_COORDINATOR_ADDRESS (pod 0 through the JobSet's headless service),
ATTNMT_NUM_PROCESSES and ATTNMT_PROCESS_ID (the pod's completion index). Any pod failing
restarts the whole set (--max-restarts) and training resumes from the newest checkpoint, so
the workdir must be shared storage mounted in every pod (a gcsfuse bucket or a Filestore/NFS
volume). The image must have attnmt installed and the repository's configs/ in its working
directory (--working-dir).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python launch/gke.py`: make `launch` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launch.common import (
    Command,
    LaunchError,
    Run,
    command,
    parse_env,
    single_run_main,
    slug,
)

TOOL = "kubectl"
DEFAULT_PROGRAM = "attnmt"
REPLICATED_JOB = "workers"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def hosts(options: argparse.Namespace) -> int:
    """Pods in the slice: TPU chips in the topology / chips per host, or GPU nodes."""
    if options.gpu_type:
        return options.nodes
    try:
        chips = math.prod(int(size) for size in options.tpu_topology.split("x"))
    except ValueError:
        raise LaunchError(
            f"--tpu-topology must look like 2x4 or 4x4x4, got {options.tpu_topology}"
        ) from None
    if chips < options.chips_per_host or chips % options.chips_per_host:
        raise LaunchError(
            f"topology {options.tpu_topology} ({chips} chips) is not a whole number of hosts "
            f"of {options.chips_per_host} chips"
        )
    return chips // options.chips_per_host


def jobset_name(options: argparse.Namespace, run: Run) -> str:
    # Pod hostnames are <jobset>-workers-<i>-<j> and must stay within 63 characters.
    return slug(options.jobset.replace("{run}", run.name), max_length=40)


def _environment(options: argparse.Namespace, name: str, count: int) -> list[dict[str, Any]]:
    env = [{"name": k, "value": v} for k, v in parse_env(options.env).items()]
    if options.gpu_type and count > 1:
        coordinator = f"{name}-{REPLICATED_JOB}-0-0.{name}:{options.coordinator_port}"
        env += [
            {"name": "ATTNMT_COORDINATOR_ADDRESS", "value": coordinator},
            {"name": "ATTNMT_NUM_PROCESSES", "value": str(count)},
            {
                "name": "ATTNMT_PROCESS_ID",
                "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}},
            },
        ]
    return env


def _pod_spec(run: Run, options: argparse.Namespace, name: str, count: int) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "attnmt",
        "image": options.image,
        "command": run.train_argv(shlex.split(options.program)),
    }
    env = _environment(options, name, count)
    if env:
        container["env"] = env
    if options.working_dir:
        container["workingDir"] = options.working_dir
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        # Time for the SIGTERM checkpoint before the pod is killed.
        "terminationGracePeriodSeconds": options.grace_seconds,
        "containers": [container],
    }
    if options.gpu_type:
        selector = {"cloud.google.com/gke-accelerator": options.gpu_type}
        container["resources"] = {"limits": {"nvidia.com/gpu": options.gpus_per_node}}
        # NCCL needs more shared memory than a container's default 64 MB.
        container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
        pod["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    else:
        selector = {
            "cloud.google.com/gke-tpu-accelerator": options.tpu_type,
            "cloud.google.com/gke-tpu-topology": options.tpu_topology,
        }
        container["resources"] = {"limits": {"google.com/tpu": options.chips_per_host}}
    if options.spot:
        selector["cloud.google.com/gke-spot"] = "true"
    pod["nodeSelector"] = selector
    if options.service_account:
        pod["serviceAccountName"] = options.service_account
    return pod


def manifest(run: Run, options: argparse.Namespace) -> dict[str, Any]:
    """The JobSet as a plain dict (what `kubectl apply` receives)."""
    name = jobset_name(options, run)
    count = hosts(options)
    job = {
        "parallelism": count,
        "completions": count,
        "completionMode": "Indexed",
        "backoffLimit": 0,  # one failed pod fails the job; the JobSet then restarts all
        "template": {"spec": _pod_spec(run, options, name, count)},
    }
    metadata: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/name": "attnmt"}}
    if options.namespace:
        metadata["namespace"] = options.namespace
    if options.tpu_type:
        # Each replicated job gets a whole node pool, i.e. one TPU slice.
        metadata["annotations"] = {
            "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"
        }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": metadata,
        "spec": {
            "failurePolicy": {"maxRestarts": options.max_restarts},
            "network": {"enableDNSHostnames": True},
            "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1, "template": {"spec": job}}],
        },
    }


def to_yaml(document: dict[str, Any]) -> str:
    """YAML via PyYAML when installed; otherwise JSON, which is YAML too."""
    try:
        import yaml
    except ImportError:
        return json.dumps(document, indent=2) + "\n"
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def commands_for_run(run: Run, options: argparse.Namespace) -> list[Command]:
    return [command("kubectl", "apply", "-f", "-", stdin=to_yaml(manifest(run, options)))]


def add_launcher_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image", required=True, help="container image with attnmt installed")
    parser.add_argument("--jobset", default="attnmt-{run}", help="JobSet name; {run} = run name")
    parser.add_argument("--namespace", default=None)
    accelerator = parser.add_mutually_exclusive_group(required=True)
    accelerator.add_argument("--tpu-type", default=None, help="e.g. tpu-v5-lite-podslice")
    accelerator.add_argument("--gpu-type", default=None, help="e.g. nvidia-h100-80gb")
    parser.add_argument("--tpu-topology", default="2x4", help="TPU slice topology, e.g. 4x4")
    parser.add_argument("--chips-per-host", type=int, default=4, help="TPU chips per node")
    parser.add_argument("--nodes", type=int, default=1, help="GPU nodes")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--coordinator-port", type=int, default=1234)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the pods")
    parser.add_argument("--working-dir", default=None, help="container directory with configs/")
    parser.add_argument("--service-account", default=None, help="Kubernetes service account")
    parser.add_argument("--spot", action="store_true", help="schedule on Spot nodes")
    parser.add_argument("--max-restarts", type=int, default=3)
    parser.add_argument("--grace-seconds", type=int, default=120)


def main(argv: list[str] | None = None) -> int:
    return single_run_main(
        argv,
        prog="launch/gke.py",
        description=__doc__,
        add_launcher_arguments=add_launcher_arguments,
        commands_for_run=commands_for_run,
        tool=TOOL,
        purpose="submit the JobSet to the cluster",
        program=DEFAULT_PROGRAM,
    )


if __name__ == "__main__":
    sys.exit(main())
