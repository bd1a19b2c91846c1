from __future__ import annotations

from pathlib import Path

import pytest

from tests.server.raw import Tiers


@pytest.fixture(params=["files", "simulated"])
def tiers(request: pytest.FixtureRequest, tmp_path: Path) -> Tiers:
    """Both kinds of tiers (as the server's tests use): FileLog + FileChunkStorage, and the simulated ones."""
    return Tiers(request.param, tmp_path)
