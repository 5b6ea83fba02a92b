#!/bin/sh
# Re-resolves constraints/{cpu,cuda12,tpu}.txt with uv (pip install uv). Each file is
# pyproject.toml's dependencies with the tfds, gcs and viz extras plus that accelerator's jax
# (<name>.in), for the images' and the TPU VMs' Python (3.11) on x86-64 Linux with glibc
# 2.31 or later (libtpu's wheels need 2.31; python:3.11-slim and the TPU VM runtime have more).
# The pins already in a file are kept where they still resolve (uv prefers an existing
# output), so an update moves only what must move; delete a file to re-resolve it from
# scratch. tests/launch/test_dependency_sets.py checks the files against pyproject.toml and,
# with network, against the package index.
#   sh constraints/compile.sh [uv arguments, e.g. --upgrade-package jax]
set -eu
cd "$(dirname "$0")/.."
for accelerator in cpu cuda12 tpu; do
  uv pip compile pyproject.toml "constraints/$accelerator.in" \
    --extra tfds --extra gcs --extra viz \
    --python-version 3.11 --python-platform x86_64-manylinux_2_31 \
    --quiet -o "constraints/$accelerator.txt" "$@"
done
