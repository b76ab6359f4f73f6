# A worker / tool image: Python 3.11, mxq with the gpu extra (mxnet-cu112 plus the CUDA 11 and
# cuDNN 8 libraries as nvidia-*-cu11 wheels; the launcher puts them on LD_LIBRARY_PATH).
# The GPU driver (libcuda.so.1, nvidia-smi) comes from the NVIDIA container runtime.
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY cli cli
COPY db db
COPY workers workers
COPY tasks tasks
RUN pip install --no-cache-dir '.[gpu]'
ENV MXQ_HOME=/var/lib/mxq
ENTRYPOINT ["mxq"]
