"""One data root per stack: what `mxq up` started with, recorded in $MXQ_HOME and used by every
process, whatever the submitting shell sets; a default that lets a new user infer over a file in
their home folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mxq.workers.paths import PathError, confine
from mxq.workers.settings import Settings
from mxq.workers.stack_record import STACK_RECORD, record_stack, with_recorded_stack
from tests.conftest import Stack


def test_default_root_is_the_home_folder_on_loopback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    (tmp_path / "user" / "data").mkdir(parents=True)
    np.save(tmp_path / "user" / "data" / "x.npy", np.zeros((2, 3)))
    s = Settings(home=tmp_path / "state", data_root=None)
    assert s.own_data_root == (tmp_path / "user").resolve()
    x = tmp_path / "user" / "data" / "x.npy"
    assert confine(s, x) == x.resolve()
    exposed = Settings(home=tmp_path / "state", data_root=None, api_host="0.0.0.0")
    assert exposed.own_data_root == (tmp_path / "state" / "data").resolve()  # not the home folder
    with pytest.raises(PathError, match=r"lies outside the data root .*state/data \(the default; set "
                                        r"MXQ_DATA_ROOT\)"):
        confine(exposed, tmp_path / "user" / "data" / "x.npy")


def test_the_recorded_root_wins_over_the_shell(tmp_path: Path) -> None:
    stack_root, shell_root = tmp_path / "stack-data", tmp_path / "shell-data"
    for root in (stack_root, shell_root):
        root.mkdir()
        np.save(root / "x.npy", np.zeros((2, 3)))
    record_stack(Settings(home=tmp_path / "state", data_root=stack_root))
    assert json.loads((tmp_path / "state" / STACK_RECORD).read_text())["data_root"] == str(stack_root)
    shell = Settings(home=tmp_path / "state", data_root=shell_root)
    assert shell.inputs_root == stack_root
    assert confine(shell, stack_root / "x.npy") == stack_root / "x.npy"
    with pytest.raises(PathError) as refused:
        confine(shell, shell_root / "x.npy")
    message = str(refused.value)
    assert str(shell_root / "x.npy") in message and str(stack_root) in message
    assert f"recorded by `mxq up` in {tmp_path / 'state' / STACK_RECORD}" in message
    assert "restart the stack with MXQ_DATA_ROOT=FOLDER" in message


def test_a_restart_without_the_setting_keeps_the_stacks_and_a_new_one_is_announced(
        tmp_path: Path) -> None:
    """`mxq down; mxq up` without MXQ_DATA_ROOT (or the S3 settings) keeps what the stack was
    started with (it moved to the default, and the next job failed); a value given anew wins,
    in one line. Every process of the home that leaves them unset uses the recorded ones."""
    home, first, second = tmp_path / "state", tmp_path / "first", tmp_path / "second"
    assert record_stack(Settings(home=home, data_root=first, s3_allowed="team-data/in",
                                 s3_endpoint_url="http://127.0.0.1:9")) == []
    again = with_recorded_stack(Settings(home=home), own=True)  # `mxq up` with neither set
    assert (again.data_root, again.s3_allowed, again.s3_endpoint_url) == (
        first, "team-data/in", "http://127.0.0.1:9")
    assert record_stack(again) == []
    assert json.loads((home / STACK_RECORD).read_text())["data_root"] == str(first.resolve())
    moved = with_recorded_stack(Settings(home=home, data_root=second), own=True)
    notes = record_stack(moved)
    assert notes == [f"MXQ_DATA_ROOT={second.resolve()} replaces the stack's data_root "
                     f"{first.resolve()} (recorded in {STACK_RECORD})"]
    assert with_recorded_stack(Settings(home=home)).inputs_root == second.resolve()


def test_a_shell_with_another_root_submits_inside_the_stacks(workers: Stack, mlp: dict,
                                                             tmp_path: Path) -> None:
    inside = workers.home / "data" / "root-inside.npy"
    np.save(inside, np.random.default_rng(0).normal(size=(20, 64)).astype(np.float32))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    np.save(elsewhere / "x.npy", np.zeros((20, 64), dtype=np.float32))
    shell = {"MXQ_DATA_ROOT": str(elsewhere)}  # what a new user's shell might set
    proc = workers.mxq("infer", "mlp64", str(inside), "--wait", "--json", env=shell)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "succeeded"
    refused = workers.mxq("infer", "mlp64", str(elsewhere / "x.npy"), env=shell)
    assert refused.returncode == 1  # refused: recorded as a failed job
    assert f"lies outside the data root {workers.home / 'data'}" in refused.stderr
    assert "recorded by `mxq up`" in refused.stderr


def test_another_broker_or_database_given_anew_is_announced_without_its_password(
        tmp_path: Path) -> None:
    """`mxq up` given a broker or database other than the recorded one moves the stack there, and
    says so in one line each, as for the data root (it was used without a word); the URLs are
    shown as stack.json keeps them, without their password."""
    home, db = tmp_path / "state", f"sqlite:///{tmp_path / 'first.db'}"
    first = Settings(home=home, database_url=db)
    assert record_stack(first) == []
    assert record_stack(with_recorded_stack(Settings(home=home), own=True)) == []  # neither given
    moved = with_recorded_stack(Settings(home=home, broker_url="redis://:hidden@127.0.0.1:6379/3",
                                         database_url="postgresql://mxq:secret@db.example:5432/mxq"),
                                own=True)
    notes = record_stack(moved)
    assert notes == [
        f"MXQ_BROKER_URL=redis://127.0.0.1:6379/3 replaces the stack's broker {first.broker} "
        f"(recorded in {STACK_RECORD})",
        f"MXQ_DATABASE_URL=postgresql://mxq@db.example:5432/mxq replaces the stack's database {db} "
        f"(recorded in {STACK_RECORD})"]
    assert "hidden" not in str(notes) and "secret" not in str(notes)
