"""The folder of a new version in the store, made once per version: a crashed add's leftover is
cleared, a concurrent add's is a conflict.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from mxq.db import registry

LEFTOVER_SECONDS = 120.0  # a version folder with no row, older than this, is a crashed add's


def new_folder(folder: Path, name: str, version: int) -> Path:
    """The empty folder of a new version. One left by an add that died before its row (older
    than LEFTOVER_SECONDS) is cleared; a younger one is a concurrent add's: a conflict."""
    try:
        folder.mkdir(parents=True)
        return folder
    except FileExistsError:
        if time.time() - folder.stat().st_mtime < LEFTOVER_SECONDS:
            raise registry.ModelConflict(f"model {name} version {version} is being added by "
                                         "another command; add it again in a moment") from None
    shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder
