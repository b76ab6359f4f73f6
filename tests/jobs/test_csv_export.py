"""Every CSV mxq writes keeps text as text (issue 43): a cell a spreadsheet would run as a
formula (OWASP's CSV injection: =, +, -, @, tab, CR first) is written with a leading quote, by
`mxq jobs --format csv` and by the predictions' CSV of `mxq results` and the API alike."""

from __future__ import annotations

import csv
import io
from typing import Any, cast

import pytest

from mxq.db.outputs.results import prediction_csv
from mxq.db.records import PredictionRow
from mxq.errors import JobRejected
from mxq.workers.jobs.submit import submit
from tests.conftest import Stack

FORMULA = '=HYPERLINK("http://x","y")'


def test_jobs_csv_writes_a_formula_model_name_as_text(isolated: Stack) -> None:
    """A refused submit records the model name it was given, whatever it is: the export a user
    opens in a spreadsheet shows it, and runs nothing."""
    with pytest.raises(JobRejected) as refused:
        submit(isolated.settings, "infer", {"model": FORMULA, "input": "x.npy"}, "cpu:0",
               allow_offline=True)
    proc = isolated.mxq("jobs", "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    rows = {int(r["id"]): r for r in csv.DictReader(io.StringIO(proc.stdout))}
    row = rows[refused.value.job_id]
    assert row["model"] == "'" + FORMULA
    assert row["status"] == "failed" and row["attempts"] == "0"  # the other cells as they were


def test_the_predictions_csv_writes_text_cells_as_text() -> None:
    """The rows of `mxq results --format csv` and of the API's `format=csv` (one helper): stored
    classes are numbers today, but the rule holds for any text cell; numbers stay numbers."""
    rows = cast(list[PredictionRow], [
        {"index": 0, "predicted_class": "=cmd", "score": -0.5, "top_k": [["@x", 0.25]]},
        {"index": 1, "predicted_class": -3, "score": 0.75, "top_k": [[-3, -0.5]]},
    ])
    written: list[list[Any]] = list(prediction_csv(rows))
    assert written[1] == [0, "'=cmd", "-0.5", "'@x", 0.25]
    assert written[2] == [1, -3, "0.75", -3, -0.5]
