"""Fixtures for the cross-component Python suites."""
import pytest

from kilnd_server import Kilnd


@pytest.fixture
def kilnd():
    server = Kilnd()
    yield server
    server.stop()
