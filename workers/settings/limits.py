"""The limits on what a request may ask: input and image sizes, batch sizes, epochs, a probe's
work, a request body, a job's log, a schedule's glob. Each stops a typo or a hostile value from
tying up a device, the API or the database."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from mxq.workers.settings.part import HOUR, Part

# A probe (environment check) may do at most this much work (matrix multiply and convolution,
# warm-up rounds included): about 4 s of multiply on a 2-core CPU at 24 GFLOP/s, about 15 s if
# all of it were convolution at 7 GFLOP/s, milliseconds on a GPU. The default probe is 14 GFLOP.
DEFAULT_MAX_PROBE_GFLOP = 100
# Inputs are memory-mapped a batch at a time, so this only stops a wrong path (a disk image, a
# dump) from tying up a device for hours; raise it for genuinely larger inputs.
DEFAULT_MAX_INPUT_BYTES = 64 * 2**30
DEFAULT_JOB_LOG_BYTES = 256 * 2**10
# Largest image, in pixels, judged from its header before decoding (an 8K frame is 33 million).
DEFAULT_MAX_IMAGE_PIXELS = 50_000_000
# A schedule's dataset glob stops past this many folder entries, or this many seconds.
DEFAULT_GLOB_MAX_ENTRIES = 100_000
DEFAULT_GLOB_SECONDS = 10.0
# A batch this large already fills a big GPU with a small model; more is almost surely a typo.
DEFAULT_MAX_BATCH_SIZE = 65536
# Training longer than this many epochs is a typo (an extra zero), not a plan.
DEFAULT_MAX_EPOCHS = 10000
# Job and schedule requests are a few hundred bytes of JSON; 1 MiB leaves room for long lists
# while a client cannot make the API buffer gigabytes.
DEFAULT_MAX_BODY_BYTES = 2**20


class LimitFields(Part):
    max_input_bytes: int = Field(DEFAULT_MAX_INPUT_BYTES, ge=1, le=2**50,
                                 description="Largest inference input (file or folder) accepted.")
    job_log_bytes: int = Field(DEFAULT_JOB_LOG_BYTES, ge=16 * 2**10, le=2**30,
                               description="Most a job's log keeps in SQL (its first and latest "
                               "lines; a note says how many between were dropped).")
    glob_max_entries: int = Field(DEFAULT_GLOB_MAX_ENTRIES, ge=1, le=10**9, description="Most folder "
                                  "entries a schedule's dataset glob may look at.")
    glob_seconds: float = Field(DEFAULT_GLOB_SECONDS, gt=0, le=HOUR, description="Longest a schedule's "
                                "dataset glob may search, in seconds.")
    max_image_pixels: int = Field(DEFAULT_MAX_IMAGE_PIXELS, ge=1, le=2**34,
                                  description="Largest image (width x height) an input may hold.")
    max_batch_size: int = Field(DEFAULT_MAX_BATCH_SIZE, ge=1, le=2**24, description="Largest batch size.")
    max_epochs: int = Field(DEFAULT_MAX_EPOCHS, ge=1, le=10**6, description="Most epochs a training may ask.")
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1, le=2**30,
                                description="Largest HTTP API request body, in bytes.")
    max_probe_gflop: int = Field(DEFAULT_MAX_PROBE_GFLOP, ge=1, le=10**7,
                                 description="Most work (GFLOP, warm-up included) one probe job "
                                 "may ask: size, batch and repeat beyond it are refused at submit.")

    @property
    def limits(self) -> Limits:
        """The limits alone, for the code that checks a request against them."""
        return Limits(self.max_input_bytes, self.job_log_bytes, self.glob_max_entries,
                      self.glob_seconds, self.max_image_pixels, self.max_batch_size,
                      self.max_epochs, self.max_body_bytes, self.max_probe_gflop)


@dataclass(frozen=True)
class Limits:
    """The limits' values (each the `MXQ_` setting of the same name)."""

    max_input_bytes: int
    job_log_bytes: int
    glob_max_entries: int
    glob_seconds: float
    max_image_pixels: int
    max_batch_size: int
    max_epochs: int
    max_body_bytes: int
    max_probe_gflop: int
