"""A training's log through real workers: its child prints a line per epoch, `mxq logs --follow`
started with the job prints them as they come and ends when the job ends, and a plain `mxq logs`
reads back the same lines between the attempt's notes."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from mxq.db.outputs import logs
from mxq.workers.jobs.submit import submit
from tests.conftest import ROOT, Stack

EPOCH = re.compile(r"^epoch (\d)/3: loss \d+\.\d{4} train_accuracy \d\.\d{4} val_accuracy \d\.\d{4} "
                   r"\(\d+ samples/s\)$")


@pytest.mark.slow  # a real training of three epochs
def test_a_trainings_epoch_lines_are_followed_until_it_ends(workers: Stack) -> None:
    job_id = submit(workers.settings, "train", {"arch": "mlp", "dataset": "digits", "name": "logged",
                                                "epochs": 3}, "cpu:0")
    follow = subprocess.Popen([sys.executable, "-m", "mxq.cli", "logs", str(job_id), "--follow"],
                              cwd=ROOT, env=workers.environ(), text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    out, err = follow.communicate(timeout=300)  # it ends by itself once the job's log ended
    assert follow.returncode == 0, err
    assert workers.job(job_id)["status"] == "succeeded"
    printed = out.splitlines()
    epochs = [m.group(1) for line in printed if (m := EPOCH.match(line))]
    assert epochs == ["1", "2", "3"], printed
    assert printed[0].startswith("[mxq] attempt 1 started on cpu:0") and printed[-1] == logs.ended_note(1)

    again = workers.mxq("logs", str(job_id), "--json")
    assert again.returncode == 0, again.stderr
    assert [line for line in again.stdout.splitlines() if '"source": "child"' in line and "epoch " in line]
    plain = workers.mxq("logs", str(job_id))
    assert plain.stdout.splitlines() == printed  # followed or not, the same lines


def test_the_logs_of_a_job_that_is_not_there(workers: Stack) -> None:
    done = workers.mxq("logs", "999999999")
    assert done.returncode == 2 and "999999999" in done.stderr
