# The mxq image: CUDA 11.2 runtime (cuDNN 8, Ubuntu 20.04), Python 3.11, mxq with the `gpu`
# extra (mxnet-cu112 plus CUDA 11 / cuDNN 8 / NCCL as nvidia-*-cu11 wheels; the launcher puts
# their lib folders first on each GPU worker's LD_LIBRARY_PATH). The GPU driver (libcuda.so.1,
# nvidia-smi) comes from the NVIDIA container runtime: the CUDA base image sets
# NVIDIA_DRIVER_CAPABILITIES=compute,utility, so both are mounted into a container given a GPU,
# and its CUDA 11.2 libraries back up any the wheels do not carry.
#
# Python 3.11 on Ubuntu 20.04 (which ships 3.8): the interpreter is copied from the official
# python:3.11 image built on Debian 11 "bullseye". Bullseye has the same glibc as Ubuntu 20.04
# (2.31) and links the same library sonames that 20.04 ships (libssl.so.1.1, libffi.so.7, ...),
# so the copy runs unchanged; a bookworm-based image (glibc 2.36) would not. This needs only
# Docker Hub and Ubuntu's archive at build time, unlike the deadsnakes PPA (Launchpad, and focal
# is past its standard support there). The build stage also installs every wheel into a venv,
# so the final stage has no compiler, no pip cache and no build tools.
#
# No secret is set here: passwords and the API token come from the environment at run time.

ARG PYTHON_IMAGE=python:3.11-slim-bullseye
ARG CUDA_IMAGE=nvidia/cuda:11.2.2-cudnn8-runtime-ubuntu20.04

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/mxq
WORKDIR /src
# Dependencies first (from pyproject.toml alone), so a source change does not download the
# ~2 GB of MXNet and CUDA wheels again.
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['gpu']))" > requirements.txt \
 && /opt/mxq/bin/pip install -r requirements.txt
COPY README.md ./
COPY api api
COPY cli cli
COPY db db
COPY tasks tasks
COPY workers workers
RUN /opt/mxq/bin/pip install '.[gpu]'

FROM ${CUDA_IMAGE}
ARG MXQ_UID=1000
# Runtime libraries of the copied interpreter (Ubuntu 20.04 names), and libgomp for MXNet.
# Nothing comes from NVIDIA's apt repository, so its list is dropped first: older CUDA images
# carry a signing key NVIDIA has since rotated, and `apt-get update` would fail on it.
RUN rm -f /etc/apt/sources.list.d/cuda*.list /etc/apt/sources.list.d/nvidia-ml*.list \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates tzdata libgomp1 libssl1.1 libffi7 libsqlite3-0 libbz2-1.0 liblzma5 zlib1g \
      libexpat1 libuuid1 libreadline8 libncursesw6 libgdbm6 libgdbm-compat4 libdb5.3 libnsl2 \
      libtirpc3 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/ /usr/local/
COPY --from=build /opt/mxq /opt/mxq
# Fail the build here, not at run time, if the copied interpreter misses a library.
RUN ldconfig \
 && /opt/mxq/bin/python -c "import ssl, sqlite3, ctypes, lzma, bz2, zlib, uuid, decimal, readline" \
 && /opt/mxq/bin/mxq --help > /dev/null
RUN groupadd --gid "${MXQ_UID}" mxq \
 && useradd --uid "${MXQ_UID}" --gid mxq --create-home --shell /usr/sbin/nologin mxq \
 && mkdir -p /var/lib/mxq /data \
 && chown mxq:mxq /var/lib/mxq
ENV PATH=/opt/mxq/bin:${PATH} \
    VIRTUAL_ENV=/opt/mxq \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    MXQ_HOME=/var/lib/mxq \
    MXQ_DATA_ROOT=/data
# /var/lib/mxq is the shared store (docker-compose.yml mounts a named volume there, NFS with more
# than one node): a fresh named volume takes this folder's owner, so `mxq` can write to it.
USER mxq
WORKDIR /data
ENTRYPOINT ["mxq"]
CMD ["--help"]
