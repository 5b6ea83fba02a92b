# attnmt image for GKE JobSets and any container runtime (launch/gke.py uses it by default).
#
#   docker build --build-arg ACCELERATOR=tpu  -t REGISTRY/attnmt:tpu .    # Cloud TPU
#   docker build --build-arg ACCELERATOR=cuda -t REGISTRY/attnmt:cuda .   # NVIDIA GPUs
#   docker build -t attnmt:cpu .                                          # CPU (default)
#   python launch/image.py --accelerator tpu --registry REGISTRY          # build HEAD + push
#
# The nodes are x86-64: from an Arm machine add `--platform linux/amd64` (launch/image.py
# always does), or the image dies on the nodes with "exec format error" (and the TPU one
# does not build at all: libtpu has no aarch64 wheel).
#
# One base image serves all three: the CUDA and TPU runtimes come as pip wheels
# (jax[cuda12] bundles CUDA and cuDNN; jax[tpu] brings libtpu), so only the host's driver
# is needed. The working directory holds configs/, so `--config configs/...` resolves.
# Every version installed is the one constraints/<cpu|cuda12|tpu>.txt pins, resolved for
# Python 3.11: another PYTHON_VERSION needs those files re-resolved (constraints/compile.sh).
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

# cpu | cuda | tpu: which jax wheel docker/install.sh adds to the project's own install.
ARG ACCELERATOR=cpu
# attnmt extras: tfds reads wmt14_translate; gcs (gcsfs) serves gs:// workdirs (attnmt.storage).
ARG EXTRAS=tfds,gcs

# GKE mounts the NVIDIA driver (libcuda.so.1, nvidia-smi) under /usr/local/nvidia; without
# it on the library path the CUDA plugin cannot load and JAX falls back to the CPU.
# Elsewhere the folder is absent and the paths are harmless.
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ATTNMT_ACCELERATOR=${ACCELERATOR} \
    LD_LIBRARY_PATH=/usr/local/nvidia/lib64 \
    PATH=/usr/local/nvidia/bin:${PATH}

WORKDIR /opt/attnmt
COPY pyproject.toml README.md ./
COPY docker/install.sh docker/
COPY constraints/ constraints/
COPY src/ src/
COPY configs/ configs/
RUN sh docker/install.sh "$ACCELERATOR" "$EXTRAS"

ENTRYPOINT ["attnmt"]
CMD ["--help"]
