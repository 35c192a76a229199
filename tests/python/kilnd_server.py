"""A real kilnd child process for the cross-component Python suites."""
import os
import pathlib
import signal
import subprocess
import tempfile
import time

import grpc
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


# The client options (kiln/options.py) the backend suites clear before each test, so that a
# developer's environment cannot change what they test.
CLIENT_ENV = ("KILN_SERVER", "KILN_FALLBACK", "KILN_CACHE_ONLY", "KILN_DEBUG", "KILN_DEBUG_DIR",
              "KILN_CUDA_GRAPHS", "KILN_CPU_ISA", "KILN_DETERMINISTIC", "KILN_DISABLE_FUSION",
              "KILN_PREFETCH_BACKWARD", "KILN_AOT_CACHE")


def fresh_kiln(monkeypatch):
    """Body of an autouse fixture (`yield from fresh_kiln(monkeypatch)`): CLIENT_ENV unset, Dynamo,
    kiln's backend and kiln's stats reset before the test, Dynamo again after it; torch's caches
    (AOTAutograd's, where option aot_cache keeps kiln's graphs) in a directory of the test's own,
    so that no test loads what another compiled."""
    import shutil

    import torch

    import kiln
    import kiln.backend

    for var in CLIENT_ENV:
        monkeypatch.delenv(var, raising=False)
    torch_cache = tempfile.mkdtemp(prefix="kiln-test-torch-cache-")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", torch_cache)
    torch._dynamo.reset()
    kiln.backend.reset()
    kiln.reset_stats()
    try:
        yield
    finally:
        torch._dynamo.reset()
        shutil.rmtree(torch_cache, ignore_errors=True)


def server_requests(address: str) -> dict:
    """kilnd's requests by outcome (compiled, joined, memory_hit, disk_hit, miss...)."""
    from kiln.rpc import KilnClient

    with KilnClient(address) as c:
        return dict(c.get_stats().requests)


def kilnd_path() -> str:
    path = os.environ.get("KILND") or str(REPO / "bazel-bin" / "server" / "kilnd")
    if not os.access(path, os.X_OK):
        pytest.fail(f"kilnd binary not found at {path}: run `bazel build //server:kilnd` or set KILND")
    return path


def health_status(address: str, timeout: float = 2.0) -> int:
    with grpc.insecure_channel(address) as channel:
        reply = channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=timeout)
    return reply[1] if len(reply) == 2 else 0


class Kilnd:
    """A kilnd child process listening on a unix socket in a fresh temp dir."""

    def __init__(self, *flags: str, cache_dir: str = None, binary: str = None):
        # Short paths: unix socket paths are limited to 108 bytes.
        self.dir = tempfile.mkdtemp(prefix="kiln-py-")
        self.cache_dir = cache_dir or os.path.join(self.dir, "cache")
        self.address = f"unix:{self.dir}/kilnd.sock"
        self.log_path = os.path.join(self.dir, "kilnd.log")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [binary or kilnd_path(), f"--listen={self.address}", f"--cache_dir={self.cache_dir}", *flags],
            stdout=self._log, stderr=self._log)
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kilnd exited during startup:\n{self.log()}")
            try:
                if health_status(self.address) == 1:
                    return
            except grpc.RpcError:
                time.sleep(0.02)
        raise RuntimeError(f"kilnd did not become SERVING within 20 s:\n{self.log()}")

    def log(self) -> str:
        return pathlib.Path(self.log_path).read_text()

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
