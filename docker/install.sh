#!/bin/sh
# Installs this checkout (with its extras) and the jax wheel for one accelerator, in one pip
# resolve held to that accelerator's tested dependency set (constraints/<set>.txt, made by
# constraints/compile.sh), so that an image gets the versions the suite ran, not whatever
# the index holds on the day of the build.
#   sh docker/install.sh ACCELERATOR [EXTRAS]     ACCELERATOR: cpu | cuda | tpu
set -eu
accelerator="${1:-cpu}"
extras="${2:-}"
case "$accelerator" in
  cpu) jax="jax" set="cpu" ;;
  cuda) jax="jax[cuda12]" set="cuda12" ;;
  tpu) jax="jax[tpu]" set="tpu" ;;
  *)
    echo "docker/install.sh: unknown ACCELERATOR '$accelerator'; use cpu, cuda or tpu" >&2
    exit 2
    ;;
esac
constraints="constraints/$set.txt"
if [ ! -f "$constraints" ]; then
  echo "docker/install.sh: $constraints is missing; run from the checkout's root" >&2
  exit 2
fi
project="."
if [ -n "$extras" ]; then
  project=".[$extras]"
fi
# pip reads PIP_CONSTRAINT as --constraint (for this resolve and for its build environment).
PIP_CONSTRAINT="$(pwd)/$constraints"
export PIP_CONSTRAINT
python -m pip install "$project" "$jax"
