"""Fixtures for the cross-component Python suites."""
import pytest

from kilnd_server import Kilnd


@pytest.fixture
def kilnd():
    server = Kilnd()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server():
    """One kilnd for a test module (a module wanting one per test defines its own `server`)."""
    s = Kilnd()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def no_compile_server():
    """A kilnd that serves cached artifacts only (--no_compile): tests that plant hand-made
    artifacts through Admin.Import use it, so that kilnd's own compiler does not get there first."""
    server = Kilnd("--no_compile")
    yield server
    assert server.stop() == 0


def pytest_terminal_summary(terminalreporter):
    """test_corpus.py's table: graphs, kernels, extern steps, op fallbacks."""
    import corpus_util

    if corpus_util.SUMMARIES:
        terminalreporter.section("kiln correctness corpus")
        for text in corpus_util.SUMMARIES:
            terminalreporter.write_line(text)
