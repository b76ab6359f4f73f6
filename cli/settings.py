"""The settings of the running command, loaded when it first asks for them: pydantic-settings
takes a tenth of a second to import, which `mxq --help` and a usage error should never pay.

Every command gets the broker and database of its home's stack (`$MXQ_HOME/stack.json`) where
the shell sets none, and is refused in one line where the shell sets others
(`workers.stack_record.with_recorded_stack`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mxq.workers.settings import Settings


def get_settings(own: bool = False, node: str | None = None) -> Settings:
    """The command's settings. `own`: for `mxq up` / `mxq worker`, which record the stack anew,
    so the broker and database they are given win over the recorded ones; `node` overrides
    MXQ_NODE (`mxq worker --node`)."""
    from mxq.workers.settings import Settings as Loaded
    from mxq.workers.settings import get_settings as load
    from mxq.workers.stack_record import with_recorded_stack

    if not own and node is None:
        return load()
    return with_recorded_stack(Loaded(node=node) if node else Loaded(), own=own)
