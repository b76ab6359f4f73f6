# The mxq image: the official python:3.11-slim-bookworm image, mxq with the `gpu` extra (or, with
# MXQ_EXTRA=gpu-onnx, the `gpu-onnx` one) in a venv at /opt/mxq, a non-root user `mxq`. No nvidia/cuda base image: those tags reach end of life and
# get deleted, and the CUDA 11 / cuDNN 8 / NCCL libraries already come from the `gpu` extra's
# nvidia-*-cu11 wheels, which mxq loads by absolute path before MXNet (tasks/runtimes/cuda.py; no
# LD_LIBRARY_PATH), so a CUDA image would only add a second copy of CUDA and cuDNN (gigabytes)
# beside them. The driver (libcuda.so.1, nvidia-smi) is not in the image: the NVIDIA container
# toolkit mounts it into a container given a GPU, for the capabilities NVIDIA_DRIVER_CAPABILITIES
# names (compute: libcuda; utility: nvidia-smi and NVML, which the launcher uses to find GPUs).
# The base image sets no NVIDIA_VISIBLE_DEVICES, so a container gets GPUs only where they are
# asked for (the `worker` service of docker-compose.yml reserves them).
#
# The build stage installs every wheel into the venv; the final stage, from the same base image
# (so the venv's interpreter links are valid), adds only what MXNet needs from the system and
# the venv: no compiler, no pip cache, no build tools.
#
# No secret is set here: passwords and the API token come from the environment at run time.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# The extra the image carries, one per engine (never both in one venv: their NVIDIA wheels own
# some of the same files): `gpu` (MXNet on CUDA 11: training and inference, GPUs up to Ada) or
# `gpu-onnx` (ONNX Runtime on CUDA 12: inference on every GPU, Hopper and later included, no
# MXNet). A node whose GPUs MXNet cannot run (H100, H200) builds with MXQ_EXTRA=gpu-onnx.
ARG MXQ_EXTRA=gpu

FROM ${PYTHON_IMAGE} AS build
ARG MXQ_EXTRA
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/mxq
WORKDIR /src
# Dependencies first (from pyproject.toml alone), so a source change does not download the
# MXNet and CUDA wheels again (4.3 GB installed).
COPY pyproject.toml ./
RUN case "${MXQ_EXTRA}" in gpu|gpu-onnx) ;; \
      *) echo "MXQ_EXTRA=${MXQ_EXTRA}: allowed gpu or gpu-onnx"; exit 1;; esac \
 && python -c "import sys, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies'][sys.argv[1]]))" "${MXQ_EXTRA}" \
      > requirements.txt \
 && /opt/mxq/bin/pip install -r requirements.txt
# What pip needs to build mxq itself: the metadata, the readme it names, and the folders of the
# package `mxq` ([tool.setuptools.package-dir]: core/ is `mxq`, the others its subpackages).
COPY README.md setup.py ./
COPY core core
COPY api api
COPY cli cli
COPY client client
COPY db db
COPY tasks tasks
COPY workers workers
RUN /opt/mxq/bin/pip install ".[${MXQ_EXTRA}]"

FROM ${PYTHON_IMAGE}
ARG MXQ_UID=1000
# libgomp1: OpenMP, which libmxnet.so and its bundled OpenBLAS link; libquadmath0: needed by the
# libgfortran.so.3 that the MXNet wheel bundles. Everything else comes with the base image.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libgomp1 libquadmath0 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/mxq /opt/mxq
# Fail the build here, not at run time, if MXNet or a CUDA wheel misses a system library: every
# library they need must resolve, except the driver's libcuda.so.1 (mounted at run time). The
# wheels' lib folders are searched for this check only; at run time tasks/runtimes/cuda.py loads them.
RUN cd "$(/opt/mxq/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
 && engine="$(ls mxnet/*.so* onnxruntime/capi/libonnxruntime_providers_cuda.so 2>/dev/null || true)" \
 && missing="$(LD_LIBRARY_PATH="$(echo "$PWD"/nvidia/*/lib | tr ' ' ':')" \
      ldd $engine nvidia/*/lib/*.so* | grep 'not found' | grep -v 'libcuda\.so\.1' | sort -u)" \
 && if [ -n "$missing" ]; then echo "missing system libraries:"; echo "$missing"; exit 1; fi \
 && /opt/mxq/bin/mxq --help > /dev/null
RUN groupadd --gid "${MXQ_UID}" mxq \
 && useradd --uid "${MXQ_UID}" --gid mxq --create-home --shell /usr/sbin/nologin mxq \
 && mkdir -p /var/lib/mxq /data \
 && chown mxq:mxq /var/lib/mxq
ENV PATH=/opt/mxq/bin:${PATH} \
    VIRTUAL_ENV=/opt/mxq \
    PYTHONUNBUFFERED=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    MXQ_HOME=/var/lib/mxq \
    MXQ_DATA_ROOT=/data
# /var/lib/mxq is the shared store (docker-compose.yml mounts a named volume there, NFS with more
# than one node): a fresh named volume takes this folder's owner, so `mxq` can write to it.
USER mxq
WORKDIR /data
ENTRYPOINT ["mxq"]
CMD ["--help"]
