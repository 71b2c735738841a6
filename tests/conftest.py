"""Fixtures shared by every test folder."""

from __future__ import annotations

import pytest

from smartgo.testing import free_port


@pytest.fixture
def port() -> int:
    return free_port()
