"""`mxq.client`: a Python client of mxq's HTTP API, for notebooks and pipeline code.

`Client` and `Job` are loaded on first use (PEP 562), so that importing `mxq.client.progress`
(the CLI does, at its start) does not load httpx.

Imports (of mxq): core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mxq.client.api import Client
    from mxq.client.job import Job

__all__ = ["Client", "Job"]


def __getattr__(name: str) -> object:
    if name in __all__:
        from mxq.client import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
