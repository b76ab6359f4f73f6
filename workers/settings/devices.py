"""The devices' settings: how many CPU devices a GPU-less host plans, how GPUs are found and
named, the MXNet build and the ONNX environment, a worker's memory cap, and what the launcher
sets for each worker process it starts (its device, the GPU's model, why MXNet cannot run it)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Self

from pydantic import Field, field_validator, model_validator

from mxq.workers.settings.part import Part

# Two CPU "devices" let data-parallel code and routing run on any laptop.
DEFAULT_CPU_DEVICES = 2
# Each CPU device is a worker process pinned to its own cores: more devices than cores only
# plans processes that fight for them. MXQ_MAX_CPU_DEVICES raises the bound, never past this.
MAX_CPU_DEVICES = 1024
# MXQ_EXPECTED_GPUS's bound: more GPUs than any one host carries is a typo.
MAX_GPUS = 1024


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, as a container or taskset limits
    it), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class DeviceFields(Part):
    cpu_devices: int = Field(DEFAULT_CPU_DEVICES, description="CPU devices on a GPU-less host: "
                             "at most the cores this process may use (or 2), or MXQ_MAX_CPU_DEVICES.")
    max_cpu_devices: int | None = Field(
        None, ge=1, le=MAX_CPU_DEVICES, description="Allow MXQ_CPU_DEVICES up to this many "
        "(unset: the cores this process may use, at least 2).")
    nvidia_smi: str = Field("nvidia-smi", description="The nvidia-smi program to query GPUs.")
    expect_gpus: bool = Field(False, description="Fail instead of starting CPU devices when "
                              "nvidia-smi fails (also the case wherever /dev/nvidia0 exists).")
    expected_gpus: int | None = Field(
        None, ge=1, le=MAX_GPUS, description="How many GPUs nvidia-smi should list on this host: "
        "each one it does not list shows as missing (`mxq devices`, /metrics, device.out) and is "
        "looked for again on the launcher's probe cadence; implies MXQ_EXPECT_GPUS.")
    worker_memory_mb: int | None = Field(
        None, ge=1, le=2**24, description="Host memory cap (RLIMIT_DATA, MiB) of each device worker; unset = "
        "no cap. A batch that does not fit fails with out-of-memory and is retried halved."
    )
    host_gpus: str | None = Field(
        None, description="Host indexes of the GPUs this process sees, in order (e.g. '1' in a "
        "container given only host GPU 1), so devices keep their host names."
    )
    cuda_visible_devices: str | None = Field(
        None, validation_alias="CUDA_VISIBLE_DEVICES", max_length=4096,
        description="CUDA's own variable, read by the launcher: the GPUs (nvidia-smi indexes or "
        "UUIDs, comma-separated, in order) mxq may use on this host; empty or -1: none (CPU "
        "devices). Each worker still gets its one GPU in its own CUDA_VISIBLE_DEVICES.")
    onnx_python: str | None = Field(
        None, max_length=4096,
        description="Python of a second environment holding the gpu-onnx extra (a host with GPUs "
        "MXNet cannot run beside GPUs it runs): the launcher starts the former's workers with it. "
        "Unset: this environment's own, when it has ONNX Runtime for GPUs.")
    mxnet_build: str | None = Field(
        None, description="MXNet build to assume (e.g. mxnet-cu112); default: the installed one."
    )
    # Set by the launcher for each worker process it starts, never by hand.
    device: str | None = Field(None, description="The device a worker process is pinned to.")
    device_model: str | None = Field(None, description="Its GPU's model (name and compute "
                                     "capability): engine and precision figures are kept per model.")
    mxnet_unusable: str | None = Field(
        None, description="Why MXNet cannot run this worker's GPU (set by the launcher): the worker "
        "serves inference with ONNX Runtime only and refuses training.")

    @field_validator("cpu_devices")
    @classmethod
    def _at_least_one_cpu(cls, value: int) -> int:
        if value < 1:
            raise ValueError(
                f"MXQ_CPU_DEVICES must be at least 1 (got {value}): "
                "a host without GPUs needs at least one CPU device to run jobs"
            )
        return value

    @model_validator(mode="after")
    def _cpu_devices_fit_the_machine(self) -> Self:
        """Each CPU device is a worker process pinned to its own cores: 10,000 of them on two
        cores would only fight for them (and exhaust the process table)."""
        limit = self.max_cpu_devices or max(usable_cores(), DEFAULT_CPU_DEVICES)
        if self.cpu_devices > limit:
            origin = ("MXQ_MAX_CPU_DEVICES" if self.max_cpu_devices else
                      f"this machine's {usable_cores()} usable cores; set MXQ_MAX_CPU_DEVICES "
                      f"(at most {MAX_CPU_DEVICES}) to plan more")
            raise ValueError(f"MXQ_CPU_DEVICES={self.cpu_devices}: at most {limit} ({origin})")
        return self

    @field_validator("host_gpus")
    @classmethod
    def _host_gpus_are_indexes(cls, value: str | None) -> str | None:
        if value is not None and not all(p.strip().isdigit() for p in value.split(",")):
            raise ValueError(f"MXQ_HOST_GPUS {value!r} must be comma-separated GPU indexes, "
                             "such as 1 or 0,2")
        return value

    @property
    def host_gpu_ids(self) -> list[int] | None:
        return [int(p) for p in self.host_gpus.split(",")] if self.host_gpus else None

    @property
    def devices(self) -> DeviceSettings:
        """What device discovery and the launcher's plan need of the settings."""
        return DeviceSettings(self.cpu_devices, self.max_cpu_devices, self.nvidia_smi, self.expect_gpus,
                              self.expected_gpus, self.worker_memory_mb, _tuple(self.host_gpu_ids),
                              self.cuda_visible_devices,
                              self.onnx_python, self.mxnet_build, self.device, self.device_model,
                              self.mxnet_unusable)


@dataclass(frozen=True)
class DeviceSettings:
    """The devices' settings (each the `MXQ_` setting of the same name; `host_gpu_ids` is
    MXQ_HOST_GPUS parsed)."""

    cpu_devices: int
    max_cpu_devices: int | None
    nvidia_smi: str
    expect_gpus: bool
    expected_gpus: int | None
    worker_memory_mb: int | None
    host_gpu_ids: tuple[int, ...] | None
    cuda_visible_devices: str | None
    onnx_python: str | None
    mxnet_build: str | None
    device: str | None
    device_model: str | None
    mxnet_unusable: str | None


def _tuple(ids: list[int] | None) -> tuple[int, ...] | None:
    return None if ids is None else tuple(ids)
