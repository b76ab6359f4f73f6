"""What a worker loads, instead of the MXNet job tasks, for a GPU MXNet cannot run.

MXNet 1.9.1 carries kernels up to sm_86 and no PTX, so it cannot run compute capability 9.0
and later (H100, H200). The launcher still starts a worker for such a GPU when ONNX Runtime
with its CUDA provider is installed (the `gpu-onnx` extra), with MXQ_MXNET_UNUSABLE saying why;
that worker loads `mxq.tasks.inference.infer` (inference on ONNX Runtime) and this module: a start check
that ONNX Runtime can really use its GPU (`onnx_check`: a matmul and a convolution checked
against NumPy's), and `train` and `probe` tasks that fail a job routed
to it with the reason. Nothing here imports MXNet.
"""

from __future__ import annotations

from celery import signals

from mxq.tasks.job_context import JobContext, JobInputError, Outcome
from mxq.tasks.runner import job_task
from mxq.tasks.runtimes import onnx_check, onnx_runtime
from mxq.workers.hardware.start_check import check_or_refuse
from mxq.workers.settings import get_settings


def gpu_problem(device: str) -> str | None:
    """Why ONNX Runtime cannot run on this worker's GPU, else None."""
    if (missing := onnx_runtime.unavailable("gpu")) is not None:
        return (f"{device}: MXNet cannot run it and {missing}: install the gpu-onnx extra "
                "(pip install '.[gpu-onnx]') to serve inference on it")
    return onnx_check.cuda_problem(device)


@signals.worker_init.connect  # type: ignore[untyped-decorator]  # Celery has no types
def _refuse_unusable_gpu(**_: object) -> None:
    """Exit before consuming anything when ONNX Runtime cannot use the pinned GPU, or its check
    does not finish within MXQ_START_CHECK_SECONDS (a hung GPU)."""
    s = get_settings()
    device = s.device
    if device and s.mxnet_unusable:
        check_or_refuse(s.start_check_seconds, lambda: gpu_problem(device), device)


def _refuse(job: JobContext, what: str) -> Outcome:
    raise JobInputError(f"{job.device} cannot run {what}: {job.settings.mxnet_unusable}; this "
                        "device serves inference only (ONNX Runtime)")


@job_task("train")
def train(job: JobContext) -> Outcome:
    return _refuse(job, "training (it runs on MXNet)")


@job_task("probe")
def probe(job: JobContext) -> Outcome:
    return _refuse(job, "probe jobs (they run on MXNet)")
