"""A job as the API describes it (`Job`, made by the `Client`): its record, and what asks the
API again about it: `refresh`, `wait` (with the CLI's progress bar, when asked), its
predictions (a page of `PAGE` at a time, as NumPy, pandas or pyarrow), stored values, lineage
and log.

Imports (of mxq): core.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal, overload

from mxq.client.answers import json_int, json_object, json_objects
from mxq.errors import UserError
from mxq.json_types import JsonObject
from mxq.status import FINISHED

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pandas as pd
    import pyarrow as pa

    from mxq.client.api import Client

PAGE = 100_000  # predictions fetched per request (the API's most)
LOG_PAGE = 10_000  # log lines fetched per request (the API's most)


class Job:
    """A job as the API last described it (`record`); `refresh`, `wait` and `predictions` ask
    again."""

    def __init__(self, client: Client, record: JsonObject) -> None:
        self.client, self.record = client, record

    def __repr__(self) -> str:
        return f"Job({self.id}, {self.kind}, {self.status})"

    def __len__(self) -> int:
        """The samples it processed (0 until it has)."""
        return json_int(self.record.get("samples") or 0)

    @property
    def id(self) -> int:
        return json_int(self.record["id"])

    @property
    def kind(self) -> str:
        return str(self.record["kind"])

    @property
    def status(self) -> str:
        return str(self.record["status"])

    @property
    def error(self) -> str | None:
        error = self.record.get("error")
        return None if error is None else str(error)

    @property
    def replayed(self) -> bool:
        """Submitted before with the same idempotency key: this is the job that submit made."""
        return bool(self.record.get("replayed"))

    @property
    def published(self) -> bool | None:
        """False when the server's broker did not take the job's message in time (the job is
        queued; the reconciler publishes it); None for a replay or a job read back later."""
        published = self.record.get("published")
        return published if published is None else bool(published)

    def refresh(self) -> Job:
        self.record = json_object(self.client.request("GET", f"/jobs/{self.id}"))
        return self

    def wait(self, timeout: float | None = None, progress: bool = False) -> Job:
        """Poll until the job is over (TimeoutError past `timeout` seconds); with `progress`,
        a progress bar on stderr."""
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = None
        if progress:
            from mxq.client.progress import JobBar  # (Rich, only when a bar is asked for)

            bar = JobBar(self.id)
        with bar or contextlib.nullcontext():
            while self.refresh().status not in FINISHED:
                if bar:
                    progress_done = self.record.get("progress")
                    bar.show(self.status, progress_done if isinstance(progress_done, int | float) else None)
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {self.id} still {self.status} after {timeout:g} s")
                time.sleep(self.client.poll_seconds)
        return self

    def rows(self) -> Iterator[JsonObject]:
        """Every stored prediction (`index`, `predicted_class`, `score`, `top_k`), paged."""
        offset = 0
        while True:
            page = json_object(self.client.request("GET", f"/jobs/{self.id}/predictions",
                                               params={"offset": offset, "limit": PAGE}))
            items = json_objects(page["items"])
            yield from items
            offset += len(items)
            if not items or offset >= json_int(page["total"]):
                return

    def values(self, output: str | None = None) -> npt.NDArray[np.float32]:
        """One output's stored values (an embedding's, regression values, one of several
        outputs by `output`'s name) as a NumPy array, (rows, width) float32, fetched a page
        at a time (`GET /jobs/ID/values`)."""
        import io

        import numpy as np

        pages, offset = [], 0
        while True:
            answer = self.client.download(f"/jobs/{self.id}/values", offset=offset, limit=PAGE,
                                          **({"output": output} if output else {}))
            page = np.load(io.BytesIO(answer.content), allow_pickle=False)
            pages.append(page)
            offset += len(page)
            if not len(page) or offset >= int(answer.headers.get("X-Total-Rows", offset)):
                return np.concatenate(pages) if len(pages) > 1 else page

    def lineage(self) -> JsonObject:
        """What produced this inference job's output (`mxq lineage JOB`): model, version,
        variant, engine, the input's identity, the output's location, mxq's version, the
        schedule fire that made it."""
        return json_object(self.client.request("GET", f"/jobs/{self.id}/lineage"))

    def logs(self, follow: bool = False) -> Iterator[dict[str, object]]:
        """What the job printed, line by line (`seq`, `at`, `source`: worker, child or mxq,
        `text`); with `follow`, each new line as it comes until the job ended, as `mxq logs
        --follow`."""
        from mxq.client.follow import lines

        def read(after: int) -> JsonObject:
            return json_object(self.client.request("GET", f"/jobs/{self.id}/logs",
                                               params={"after": after, "limit": LOG_PAGE}))

        for line in lines(read, follow):
            yield dict(line)

    @overload
    def predictions(self, format: Literal["numpy"] = "numpy") -> npt.NDArray[np.void]: ...
    @overload
    def predictions(self, format: Literal["pandas"]) -> pd.DataFrame: ...
    @overload
    def predictions(self, format: Literal["arrow"]) -> pa.Table: ...

    def predictions(self, format: Literal["numpy", "pandas", "arrow"] = "numpy"
                    ) -> npt.NDArray[np.void] | pd.DataFrame | pa.Table:
        """The predictions as a NumPy structured array (`index`, `predicted_class`, `score`), a
        pandas DataFrame or a pyarrow Table (those two with `top_k` when stored)."""
        rows = list(self.rows())
        if format == "numpy":
            import numpy as np

            out = np.zeros(len(rows), dtype=[("index", "i8"), ("predicted_class", "i8"), ("score", "f4")])
            for i, r in enumerate(rows):
                out[i] = (r["index"], r["predicted_class"], r["score"])
            return out
        columns = {key: [r[key] for r in rows] for key in ("index", "predicted_class", "score", "top_k")}
        if format == "arrow":
            import pyarrow as pa

            return pa.table(columns)
        if format == "pandas":
            import pandas as pd  # not a dependency of mxq: its `pandas` extra pins one that fits numpy

            return pd.DataFrame(columns)
        raise UserError(f"format {format!r}: expected numpy, pandas or arrow")
