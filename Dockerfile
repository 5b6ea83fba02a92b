# attnmt image for GKE JobSets and any container runtime (launch/gke.py uses it by default).
#
#   docker build --build-arg ACCELERATOR=tpu  -t REGISTRY/attnmt:tpu .    # Cloud TPU
#   docker build --build-arg ACCELERATOR=cuda -t REGISTRY/attnmt:cuda .   # NVIDIA GPUs
#   docker build -t attnmt:cpu .                                          # CPU (default)
#   python launch/image.py --accelerator tpu --registry REGISTRY          # build HEAD + push
#
# One base image serves all three: the CUDA and TPU runtimes come as pip wheels
# (jax[cuda12] bundles CUDA and cuDNN; jax[tpu] brings libtpu), so only the host's driver
# is needed. The working directory holds configs/, so `--config configs/...` resolves.
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

# cpu | cuda | tpu: which jax wheel docker/install.sh adds to the project's own install.
ARG ACCELERATOR=cpu
# attnmt extras: tfds reads wmt14_translate; gcs (gcsfs) serves gs:// workdirs (attnmt.storage).
ARG EXTRAS=tfds,gcs

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ATTNMT_ACCELERATOR=${ACCELERATOR}

WORKDIR /opt/attnmt
COPY pyproject.toml README.md ./
COPY docker/install.sh docker/
COPY src/ src/
COPY configs/ configs/
RUN sh docker/install.sh "$ACCELERATOR" "$EXTRAS"

ENTRYPOINT ["attnmt"]
CMD ["--help"]
