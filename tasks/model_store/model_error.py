"""The one error of the model store: a version that cannot be stored or loaded, said in one line
(a `UserError`: the command or the job fails with it).
"""

from __future__ import annotations

from mxq.errors import UserError


class ModelError(UserError):
    """A model that cannot be stored or loaded; the message says which file and why."""
