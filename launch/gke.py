"""A JobSet on GKE: one pod per host of a TPU slice or per GPU node, `kubectl apply -f -`.

    python launch/image.py --accelerator tpu --registry $REGISTRY      # once per commit
    python launch/gke.py --registry $REGISTRY --service-account attnmt \
        --tpu-type tpu-v5-lite-podslice --tpu-topology 4x4 --chips-per-host 4 \
        --config configs/wmt14_ende.py:variant=big --workdir gs://BUCKET/runs/ende_big
    python launch/gke.py --image REGISTRY/attnmt:TAG --gpu-type nvidia-h100-80gb \
        --nodes 2 --gpus-per-node 8 --bucket BUCKET --service-account attnmt \
        --config configs/wmt14_ende.py --workdir /mnt/shared/runs/ende

The image defaults to the one launch/image.py builds from this checkout's HEAD for the
accelerator (`<registry>/attnmt:<tpu|cuda>-<commit>`, registry from --registry or
$ATTNMT_REGISTRY); --image names any other. The workdir must outlive the pods: a gs:// path
(attnmt writes the bucket itself), or a path under --mount-path of a volume every pod mounts,
either the bucket through GKE's Cloud Storage FUSE CSI driver (--bucket) or a
ReadWriteMany PersistentVolumeClaim such as Filestore (--pvc). A path on the container's own
disk is refused: it would vanish with the pod. Bucket access goes through the Kubernetes
service account (--service-account) bound to a Google service account by Workload Identity.

One replicated job (one slice) whose Indexed Job runs `hosts` pods at once (parallelism =
completions = hosts; a TPU slice has topology chips / chips-per-host hosts). TPU pods need no
coordinator variables: GKE gives them TPU_WORKER_HOSTNAMES and attnmt reads those. GPU pods get
ATTNMT_COORDINATOR_ADDRESS (pod 0 through the JobSet's headless service),
ATTNMT_NUM_PROCESSES and ATTNMT_PROCESS_ID (the pod's completion index). Any pod failing
restarts the whole set (--max-restarts) and training resumes from the newest checkpoint, so
the workdir must be storage every pod shares (above). The image has attnmt installed and the
repository's configs/ in its working directory (the Dockerfile's WORKDIR; --working-dir
overrides it).

A JobSet needs the JobSet controller in the cluster, which a new GKE cluster does not have
(`kubectl apply` then answers 'no matches for kind "JobSet"'). Install it once per cluster:

    kubectl apply --server-side -f \
        https://github.com/kubernetes-sigs/jobset/releases/download/$JOBSET_VERSION/manifests.yaml
    kubectl get crd jobsets.jobset.x-k8s.io        # present once installed

with JOBSET_VERSION a release from https://github.com/kubernetes-sigs/jobset/releases. A
JobSet rather than a bare Indexed Job: it restarts every pod of the slice when one fails
(a bare Job would leave the others waiting in a collective) and keeps a TPU slice on one
node pool (exclusive topology).

GPU pods get LD_LIBRARY_PATH=/usr/local/nvidia/lib64, where GKE mounts the NVIDIA driver;
without it the CUDA plugin cannot load libcuda.so.1 and JAX runs on the CPU. (The image
puts /usr/local/nvidia/bin on PATH itself; a pod's PATH would replace the image's whole.)
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
    url_scheme,
)
from launch.image import REGISTRY_ENV, default_image

TOOL = "kubectl"
DEFAULT_PROGRAM = "attnmt"
REPLICATED_JOB = "workers"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
STORAGE_VOLUME = "shared"
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
# implicit-dirs: see folders made by other clients. rename-dir-limit: Orbax commits a
# checkpoint by renaming its temporary folder, which gcsfuse refuses by default.
GCSFUSE_MOUNT_OPTIONS = "implicit-dirs,rename-dir-limit=200000"
# Where GKE's GPU nodes mount the NVIDIA driver libraries into every GPU container.
NVIDIA_LIBRARY_PATH = "/usr/local/nvidia/lib64"


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
    given = parse_env(options.env)
    env = [{"name": k, "value": v} for k, v in given.items()]
    if options.gpu_type and "LD_LIBRARY_PATH" not in given:
        env.append({"name": "LD_LIBRARY_PATH", "value": NVIDIA_LIBRARY_PATH})
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


def image(options: argparse.Namespace) -> str:
    return options.image or default_image(options.registry, "cuda" if options.gpu_type else "tpu")


def check_workdir(run: Run, options: argparse.Namespace) -> None:
    """A workdir must outlive the pods: a bucket URL, or a path on the shared volume."""
    if url_scheme(run.workdir) is not None:
        return
    if not (options.bucket or options.pvc):
        raise LaunchError(
            f"workdir {run.workdir} would be on the pod's own disk, which is lost when the pod "
            "ends: use a gs:// workdir, or mount shared storage with --bucket or --pvc"
        )
    mount = options.mount_path.rstrip("/")
    if run.workdir != mount and not run.workdir.startswith(mount + "/"):
        raise LaunchError(
            f"workdir {run.workdir} is not under --mount-path {mount}, where the shared "
            f"volume is mounted: use e.g. {mount}/runs/{run.name}"
        )


def _storage_volume(options: argparse.Namespace) -> dict[str, Any] | None:
    """The bucket through the gcsfuse CSI driver (an inline ephemeral volume), or a PVC."""
    if options.bucket:
        bucket = options.bucket.removeprefix("gs://").rstrip("/")
        attributes = {"bucketName": bucket, "mountOptions": GCSFUSE_MOUNT_OPTIONS}
        csi = {"driver": GCSFUSE_DRIVER, "volumeAttributes": attributes}
        return {"name": STORAGE_VOLUME, "csi": csi}
    if options.pvc:
        return {"name": STORAGE_VOLUME, "persistentVolumeClaim": {"claimName": options.pvc}}
    return None


def _add_volume(pod: dict[str, Any], container: dict[str, Any], volume: dict, path: str) -> None:
    pod.setdefault("volumes", []).append(volume)
    mount = {"name": volume["name"], "mountPath": path}
    container.setdefault("volumeMounts", []).append(mount)


def _pod_spec(run: Run, options: argparse.Namespace, name: str, count: int) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "attnmt",
        "image": image(options),
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
        _add_volume(pod, container, {"name": "dshm", "emptyDir": {"medium": "Memory"}}, "/dev/shm")
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
    storage = _storage_volume(options)
    if storage is not None:
        _add_volume(pod, container, storage, options.mount_path)
    return pod


def manifest(run: Run, options: argparse.Namespace) -> dict[str, Any]:
    """The JobSet as a plain dict (what `kubectl apply` receives)."""
    check_workdir(run, options)
    name = jobset_name(options, run)
    count = hosts(options)
    template: dict[str, Any] = {}
    if options.bucket:
        # Asks GKE to inject the gcsfuse sidecar that serves the CSI volume.
        template["metadata"] = {"annotations": {"gke-gcsfuse/volumes": "true"}}
    template["spec"] = _pod_spec(run, options, name, count)
    job = {
        "parallelism": count,
        "completions": count,
        "completionMode": "Indexed",
        "backoffLimit": 0,  # one failed pod fails the job; the JobSet then restarts all
        "template": template,
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
    parser.add_argument(
        "--image",
        default=None,
        help="container image (default: launch/image.py's image of HEAD in --registry)",
    )
    parser.add_argument(
        "--registry", default=None, help=f"where launch/image.py pushed (default: ${REGISTRY_ENV})"
    )
    storage = parser.add_mutually_exclusive_group()
    storage.add_argument("--bucket", default=None, help="mount this GCS bucket (gcsfuse CSI)")
    storage.add_argument("--pvc", default=None, help="mount this ReadWriteMany PVC (Filestore)")
    parser.add_argument("--mount-path", default="/mnt/shared", help="where --bucket/--pvc mount")
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
