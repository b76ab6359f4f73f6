"""A device, parsed once: `gpu:0`, `cpu:1`, or on a named node, `cpu:0@node-a`.

Labels cross every layer as text (queues, SQL rows, leases, messages); code that needs the kind,
the index or the node parses the label with `Device.parse` instead of splitting it by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("gpu", "cpu")
_LABEL = re.compile(r"^(gpu|cpu):(\d+)(?:@([^@\s]+))?$")


@dataclass(frozen=True, order=True)
class Device:
    """Ordered by kind, then index, then node (`cpu:2` before `cpu:10`)."""

    kind: str
    index: int
    node: str | None = None

    @classmethod
    def parse(cls, text: str) -> Device:
        """`gpu:0`, `cpu:1` or `cpu:1@node`; a ValueError names the text and the forms allowed."""
        m = _LABEL.match(text.strip().lower()) if isinstance(text, str) else None
        if m is None:
            raise ValueError(f"invalid device {text!r}: expected gpu:N or cpu:N, optionally @NODE")
        return cls(m.group(1), int(m.group(2)), m.group(3))

    @property
    def label(self) -> str:
        """`gpu:0`: the device on its own node, as queues, leases and job rows name it."""
        return f"{self.kind}:{self.index}"

    @property
    def is_gpu(self) -> bool:
        return self.kind == "gpu"

    def __str__(self) -> str:
        return f"{self.label}@{self.node}" if self.node else self.label
