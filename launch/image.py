"""Build the attnmt image of this checkout's HEAD and push it: the image launch/gke.py runs.

    python launch/image.py --accelerator tpu  --registry us-docker.pkg.dev/PROJECT/REPO
    python launch/image.py --accelerator cuda --registry us-docker.pkg.dev/PROJECT/REPO
    python launch/image.py --accelerator cpu  --registry local --no-push --dry-run

The tag is <registry>/attnmt:<accelerator>-<12 hex digits of HEAD>, and the build context
is `git archive HEAD` (piped to `docker build -`), so a tag always names the code inside it;
commit first. launch/gke.py computes the same tag from --registry (or $ATTNMT_REGISTRY)
when --image is not given, so a JobSet runs the image of the commit it was launched from.
The registry must be one the cluster's nodes can pull from (Artifact Registry in the same
project needs nothing more; `gcloud auth configure-docker REGION-docker.pkg.dev` lets this
machine push).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python launch/image.py`: make `launch` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launch.common import (
    REPO_ROOT,
    Command,
    LaunchError,
    add_dry_run_argument,
    command,
    execute,
    main_guard,
    require_tool,
    warn_if_uncommitted,
)

IMAGE_NAME = "attnmt"
REGISTRY_ENV = "ATTNMT_REGISTRY"
ACCELERATORS = ("cpu", "cuda", "tpu")  # the Dockerfile's ACCELERATOR values
# GKE's GPU and TPU nodes are x86-64. Named always, so that a build on an Arm laptop makes an
# image the nodes can run (docker then emulates or cross-builds) instead of one that fails
# there with "exec format error"; the TPU image cannot build for Arm at all (no libtpu).
PLATFORM = "linux/amd64"


def head_commit() -> str:
    """The short hash of this checkout's HEAD, which names the image built from it."""
    result = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--short=12", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise LaunchError(f"cannot name the image: {REPO_ROOT} is not a git checkout with a HEAD")
    return result.stdout.strip()


def image_tag(registry: str, accelerator: str) -> str:
    if accelerator not in ACCELERATORS:
        raise LaunchError(f"accelerator {accelerator!r}: use one of {', '.join(ACCELERATORS)}")
    return f"{registry.rstrip('/')}/{IMAGE_NAME}:{accelerator}-{head_commit()}"


def default_image(registry: str | None, accelerator: str) -> str:
    """The image launch/image.py builds for `accelerator` from HEAD, in --registry or
    $ATTNMT_REGISTRY; without either, a message that says how to build one."""
    registry = registry or os.environ.get(REGISTRY_ENV)
    if not registry:
        raise LaunchError(
            f"no image: pass --image, or --registry / ${REGISTRY_ENV} for the image of this "
            f"commit, built and pushed with: python launch/image.py --accelerator {accelerator} "
            "--registry REGISTRY"
        )
    return image_tag(registry, accelerator)


def build_commands(options: argparse.Namespace) -> list[Command]:
    """`git archive HEAD | docker build -` with the accelerator's build argument, then push."""
    tag = image_tag(options.registry, options.accelerator)
    archive = shlex.join(["git", "-C", str(REPO_ROOT), "archive", "--format=tar", "HEAD"])
    build = ["docker", "build", "--build-arg", f"ACCELERATOR={options.accelerator}"]
    if options.extras is not None:
        build += ["--build-arg", f"EXTRAS={options.extras}"]
    build += ["--platform", PLATFORM, "--tag", tag, "-"]
    # pipefail: a failed `git archive` must fail the build, not feed it an empty context.
    commands = [command("bash", "-c", f"set -o pipefail; {archive} | {shlex.join(build)}")]
    if options.push:
        commands.append(command("docker", "push", tag))
    return commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch/image.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--accelerator", choices=ACCELERATORS, required=True)
    parser.add_argument(
        "--registry",
        default=os.environ.get(REGISTRY_ENV),
        help=f"e.g. us-docker.pkg.dev/PROJECT/REPO (default: ${REGISTRY_ENV})",
    )
    parser.add_argument(
        "--extras",
        default=None,
        help="attnmt extras (Dockerfile default: tfds,gcs; keep gcs for gs:// workdirs)",
    )
    parser.add_argument("--no-push", dest="push", action="store_false", help="build only")
    add_dry_run_argument(parser)
    return parser


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if not args.registry:
        raise LaunchError(f"--registry (or ${REGISTRY_ENV}) is needed to name the image")
    commands = build_commands(args)
    if not args.dry_run:
        require_tool("docker", "build the image")
        warn_if_uncommitted("the image")
    return execute(commands, args.dry_run)


def main(argv: list[str] | None = None) -> int:
    return main_guard(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
