"""`mxq.client`: a Python client of mxq's HTTP API, for notebooks and pipeline code."""

from mxq.client.api import Client, Job

__all__ = ["Client", "Job"]
