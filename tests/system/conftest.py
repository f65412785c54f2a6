"""Fixtures of the system suites."""

from __future__ import annotations

import pytest
from support.terraform import find_terraform


@pytest.fixture(scope="module")
def terraform() -> str:
    """Terraform's CLI (or OpenTofu): `make test` provides it, elsewhere a skip without it."""
    return find_terraform()
