"""Your own architecture's code on its way in (`mxq arch add`, `POST /archs`): the file staged
under `$MXQ_HOME/staging` and the `arch` job queued, whose trial runs on a device worker, in a
child process (`mxq.tasks.training.arch_job`). Neither the CLI nor the API imports the code."""

from __future__ import annotations

import re
import shutil
import uuid

from mxq.errors import UserError
from mxq.status import JobKind
from mxq.workers.jobs.kinds.arch import MAX_ARCH_BYTES, ArchParams
from mxq.workers.jobs.kinds.params import validated
from mxq.workers.jobs.submit import submit
from mxq.workers.paths import staging_dir
from mxq.workers.settings import Settings

FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\.py$")


class ArchFileError(UserError):
    """An architecture's file that cannot be registered as given (its name, its size)."""


def queue_trial(settings: Settings, name: str, code: bytes, file_name: str, factory: str,
                classes: int, input_shape: list[int], owner: str) -> int:
    """Stage `code` and queue its trial (the `arch` job, registering NAME once it passes): the
    job's id. Its parameters are checked here, before anything is staged."""
    if not FILE_NAME.match(file_name):
        raise ArchFileError(f"arch {name}: file name {file_name!r}: expected a Python file such as "
                            "my_net.py (letters, digits, . _ -)")
    if not code or len(code) > MAX_ARCH_BYTES:
        raise ArchFileError(f"arch {name}: {file_name} is {len(code)} bytes: expected 1 to "
                            f"{MAX_ARCH_BYTES}")
    folder = staging_dir(settings.home_path) / uuid.uuid4().hex
    params = validated(ArchParams, {"name": name, "file": str(folder / file_name),
                                    "file_name": file_name, "factory": factory, "classes": classes,
                                    "input_shape": input_shape, "added_by": owner})
    folder.mkdir(parents=True)
    try:
        (folder / file_name).write_bytes(code)
        return submit(settings, JobKind.ARCH, params, owner=owner)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
