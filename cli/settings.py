"""The settings of the running command, loaded when it first asks for them: pydantic-settings
takes a tenth of a second to import, which `mxq --help` and a usage error should never pay."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mxq.workers.settings import Settings


def get_settings() -> Settings:
    from mxq.workers.settings import get_settings as load

    return load()
