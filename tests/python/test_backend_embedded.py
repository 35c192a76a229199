"""The embedded kilnd: with KILN_SERVER unset, the first compile starts a local kilnd on
<cache dir>/kilnd.sock (or reuses the one there), in its own session so that it outlives the
process, shared by every process of the user, gone after its idle timeout."""
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings

import pytest
import torch

import kiln
import kiln.backend
from kiln.rpc import KilnClient
from kilnd_server import kilnd_path

logging.getLogger("torch.__trace").addFilter(lambda record: False)

CHILD = textwrap.dedent("""
    import json, os, sys, time, warnings
    if len(sys.argv) > 1:  # a barrier, so that several processes start kilnd at the same moment
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.01)
    import torch, kiln, kiln.options, kiln.server

    def f(x):
        return torch.relu(x) * 3 + 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = torch.randn(4, 8)
        assert torch.allclose(torch.compile(f, backend="kiln")(x), f(x))
    paths = kiln.server.embedded_paths(kiln.options.resolve())
    print(json.dumps({
        "stats": kiln.stats(),
        "started": [p.pid for p in kiln.server._STARTED],
        "pid_file": int(open(paths["pid"]).read()),
        "socket": paths["socket"],
        "warnings": [str(w.message) for w in caught if issubclass(w.category, kiln.KilnWarning)],
    }))
""")


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def cache_home():
    """A short XDG_CACHE_HOME (unix socket paths are limited to 108 bytes); stops the embedded
    kilnd the test made (by the pid it recorded) afterwards."""
    home = tempfile.mkdtemp(prefix="kiln-xdg-")
    yield home
    pid_file = os.path.join(home, "kiln", "kilnd.pid")
    if os.path.exists(pid_file):
        pid = int(open(pid_file).read())
        if alive(pid):
            os.kill(pid, signal.SIGTERM)
            wait_gone(pid, 30)


def child_env(home, **extra):
    env = dict(os.environ, XDG_CACHE_HOME=home, KILN_KILND=kilnd_path(), **extra)
    for var in ("KILN_SERVER", "KILN_CACHE_DIR", "KILN_CACHE_ONLY", "KILN_FALLBACK"):
        env.pop(var, None)
    return env


def run_child(tmp_path, env, barrier=None):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return subprocess.Popen([sys.executable, str(script)] + ([barrier] if barrier else []), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(proc):
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_started_once_shared_by_processes_and_outlives_them(tmp_path, cache_home):
    env = child_env(cache_home)
    barrier = str(tmp_path / "go")
    procs = [run_child(tmp_path, env, barrier) for _ in range(2)]
    time.sleep(1.0)
    open(barrier, "w").close()
    first, second = (result(p) for p in procs)
    # Exactly one of the two started kilnd (the file lock), and both used it.
    assert len(first["started"]) + len(second["started"]) == 1
    pid = (first["started"] or second["started"])[0]
    assert first["pid_file"] == second["pid_file"] == pid
    assert first["socket"] == second["socket"] == os.path.join(cache_home, "kiln", "kilnd.sock")
    for r in (first, second):
        assert r["stats"]["requests"] == 1
        assert r["stats"]["graph_fallbacks"] == 0, r["stats"]["fallbacks_by_cause"]
        assert r["stats"]["compiles"] + r["stats"]["hits"] == 1  # compiles include joined ones
    # The starters have exited; kilnd lives on, in its own session, and a third process reuses it.
    assert alive(pid) and os.getsid(pid) == pid
    third = result(run_child(tmp_path, env))
    assert third["started"] == [] and third["pid_file"] == pid
    # ... and gets the graph from the shared cache, per its own kiln.stats().
    assert third["stats"]["hits"] == 1 and third["stats"]["compiles"] == 0, third["stats"]
    assert third["stats"]["graph_fallbacks"] == 0
    with KilnClient("unix:" + first["socket"]) as c:
        stats = c.get_stats()
    assert sum(stats.requests.values()) == 3  # all three processes were served by this kilnd
    assert stats.cache_dir == os.path.join(cache_home, "kiln")
    assert os.path.getsize(os.path.join(cache_home, "kiln", "kilnd.log")) > 0


def test_the_embedded_kilnd_exits_when_idle(tmp_path, cache_home):
    r = result(run_child(tmp_path, child_env(cache_home, KILN_IDLE_EXIT_AFTER="1s")))
    pid = r["started"][0]
    assert wait_gone(pid, 20), "the embedded kilnd did not exit after its idle timeout"
    assert "idle" in open(os.path.join(cache_home, "kiln", "kilnd.log")).read()


def test_in_process_start_and_restart_after_it_exits(cache_home, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", cache_home)
    monkeypatch.setenv("KILN_KILND", kilnd_path())
    monkeypatch.delenv("KILN_SERVER", raising=False)
    torch._dynamo.reset()
    kiln.backend.reset()
    kiln.reset_stats()

    def f(x):
        return x.sin() * 2

    x = torch.randn(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.compile(f, backend="kiln")(x)
        pid = int(open(os.path.join(cache_home, "kiln", "kilnd.pid")).read())
        os.kill(pid, signal.SIGTERM)  # e.g. its idle timeout passed while training paused
        assert wait_gone(pid, 30)
        torch._dynamo.reset()
        torch.compile(lambda x: x.cos() + 1, backend="kiln")(x)
    new_pid = int(open(os.path.join(cache_home, "kiln", "kilnd.pid")).read())
    assert new_pid != pid and alive(new_pid)
    s = kiln.stats()
    assert set(s["fallbacks_by_cause"]) <= {"unimplemented"}, s["fallbacks_by_cause"]
    torch._dynamo.reset()


def test_no_kilnd_binary_is_a_clear_warning_and_runs_eagerly(cache_home, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", cache_home)
    monkeypatch.setenv("KILN_KILND", os.path.join(cache_home, "no-such-kilnd"))
    monkeypatch.delenv("KILN_SERVER", raising=False)
    torch._dynamo.reset()
    kiln.backend.reset()
    kiln.reset_stats()
    x = torch.randn(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(lambda x: x.tanh() * 2, backend="kiln")(x)
    torch.testing.assert_close(got, x.tanh() * 2)
    messages = [str(w.message) for w in caught if issubclass(w.category, kiln.KilnWarning)]
    assert len(messages) == 1 and "KILN_KILND" in messages[0] and "runs eagerly" in messages[0]
    assert kiln.stats()["fallbacks_by_cause"] == {"server_start": 1}
    torch._dynamo.reset()
