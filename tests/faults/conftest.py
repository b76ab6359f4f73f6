"""The fault suite's stack: live workers, the schedule process and a restartable broker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.stacks import FaultStack, fault_stack


@pytest.fixture(scope="module", params=["embedded", "system"])
def faulty(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    """A broker + database pair with live workers, the schedule process and a restartable broker."""
    yield from fault_stack(request.param, tmp_path_factory.mktemp(f"faults-{request.param}"))
