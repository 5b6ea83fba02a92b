#!/bin/sh
# Installs this checkout (with its extras) and the jax wheel for one accelerator, in one pip
# resolve so that the accelerator's jax obeys the project's own jax pin (pyproject.toml).
#   sh docker/install.sh ACCELERATOR [EXTRAS]     ACCELERATOR: cpu | cuda | tpu
set -eu
accelerator="${1:-cpu}"
extras="${2:-}"
case "$accelerator" in
  cpu) jax="jax" ;;
  cuda) jax="jax[cuda12]" ;;
  tpu) jax="jax[tpu]" ;;
  *)
    echo "docker/install.sh: unknown ACCELERATOR '$accelerator'; use cpu, cuda or tpu" >&2
    exit 2
    ;;
esac
project="."
if [ -n "$extras" ]; then
  project=".[$extras]"
fi
python -m pip install "$project" "$jax"
