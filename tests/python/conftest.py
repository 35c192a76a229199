"""Fixtures for the cross-component Python suites."""
import pytest

from kilnd_server import Kilnd


@pytest.fixture
def kilnd():
    server = Kilnd()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def no_compile_server():
    """A kilnd that serves cached artifacts only (--no_compile): tests that plant hand-made
    artifacts through Admin.Import use it, so that kilnd's own compiler does not get there first."""
    server = Kilnd("--no_compile")
    yield server
    assert server.stop() == 0
