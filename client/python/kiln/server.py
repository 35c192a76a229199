"""Which kilnd the backend talks to, and the embedded one it starts when none is configured.

With ``KILN_SERVER`` (option ``server``) set, that address is used and nothing is ever started.
Otherwise the backend uses the *embedded* kilnd: a local kilnd listening on
``<cache dir>/kilnd.sock`` (cache dir: ``$XDG_CACHE_HOME/kiln``, else ``~/.cache/kiln``, or option
``cache_dir``), sharing its on-disk cache with every process of the user. The first process that
needs it starts it in its own session (it outlives that process), with its log in
``<cache dir>/kilnd.log`` and ``--idle_exit_after`` (default 10m) so that it goes away when unused.
An ``fcntl.flock`` on ``<cache dir>/kilnd.lock`` around "check health / start / wait for SERVING"
keeps two processes from starting it at once; the others find it SERVING and reuse it.

The kilnd binary: ``KILN_KILND`` (option ``kilnd``), else ``kilnd`` on PATH, else the repository's
``bazel-bin/server/kilnd`` when this package is used from a checkout (editable install).
Does not import torch.
"""

import errno
import fcntl
import logging
import os
import pathlib
import shutil
import subprocess
import threading
import time

import grpc

from kiln import options as options_mod
from kiln.rpc import KilnClient

log = logging.getLogger("kiln")

SOCKET_NAME = "kilnd.sock"
LOCK_NAME = "kilnd.lock"
LOG_NAME = "kilnd.log"
PID_NAME = "kilnd.pid"
STARTUP_TIMEOUT_S = 30.0
LOCK_TIMEOUT_S = 60.0
MAX_UNIX_PATH = 107


class ServerError(RuntimeError):
    """kilnd cannot be reached or started; the message says why and what to do."""


def find_kilnd(opts=None, environ=None):
    """The kilnd executable to start, or raises ServerError saying where it looked."""
    environ = os.environ if environ is None else environ
    explicit = (opts.kilnd if opts is not None else "") or environ.get("KILN_KILND", "")
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise ServerError(f"KILN_KILND (option kilnd) is {explicit!r}, which is not an executable file")
    on_path = shutil.which("kilnd", path=environ.get("PATH"))
    if on_path:
        return on_path
    repo = pathlib.Path(__file__).resolve().parents[3]
    candidate = repo / "bazel-bin" / "server" / "kilnd"
    if (repo / "proto" / "kiln" / "v1").is_dir() and os.access(candidate, os.X_OK):
        return str(candidate)
    raise ServerError(
        "no kilnd binary found: set KILN_KILND=/path/to/kilnd, put kilnd on PATH, or build it in the "
        "kiln checkout (`bazel build //server:kilnd`); or point KILN_SERVER at a running kilnd")


def embedded_paths(opts):
    cache_dir = os.path.abspath(opts.resolved_cache_dir())
    return {
        "cache_dir": cache_dir,
        "socket": os.path.join(cache_dir, SOCKET_NAME),
        "lock": os.path.join(cache_dir, LOCK_NAME),
        "log": os.path.join(cache_dir, LOG_NAME),
        "pid": os.path.join(cache_dir, PID_NAME),
    }


def embedded_address(opts):
    return "unix:" + embedded_paths(opts)["socket"]


def health(address, timeout=2.0):
    """"SERVING", "NOT_SERVING", ... or "UNREACHABLE"."""
    try:
        with KilnClient(address) as client:
            return client.health(timeout=timeout)
    except grpc.RpcError:
        return "UNREACHABLE"
    except ValueError:
        return "UNREACHABLE"


class _FileLock:
    def __init__(self, path, timeout):
        self.path, self.timeout, self.fd = path, timeout, None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
            if time.monotonic() > deadline:
                os.close(self.fd)
                raise ServerError(f"another process holds {self.path} for over {self.timeout:.0f} s "
                                  "(starting kilnd?); remove the file if no such process exists")
            time.sleep(0.05)

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        return False


_STARTED = []  # Popen objects of kilnds this process started (reaped by a thread each)


def _reap(proc):
    try:
        proc.wait()
    except Exception:  # pragma: no cover
        pass


def ensure_embedded(opts):
    """Makes sure the embedded kilnd is SERVING and returns its address; starts it if needed.

    Raises ServerError saying what went wrong (no binary, socket path too long, kilnd exited...).
    """
    paths = embedded_paths(opts)
    address = "unix:" + paths["socket"]
    if len(paths["socket"]) > MAX_UNIX_PATH:
        raise ServerError(f"the embedded kilnd socket path {paths['socket']!r} is longer than a unix "
                          f"socket allows ({MAX_UNIX_PATH} bytes); set XDG_CACHE_HOME or KILN_CACHE_DIR "
                          "to a shorter directory, or KILN_SERVER to a running kilnd")
    if health(address) == "SERVING":  # the common case, without taking the lock
        return address
    try:
        os.makedirs(paths["cache_dir"], exist_ok=True)
    except OSError as e:
        raise ServerError(f"cannot create the kiln cache dir {paths['cache_dir']}: {e}") from None
    with _FileLock(paths["lock"], LOCK_TIMEOUT_S):
        if health(address) == "SERVING":
            return address
        binary = find_kilnd(opts)
        args = [binary, f"--listen={address}", f"--cache_dir={paths['cache_dir']}",
                f"--idle_exit_after={options_mod.format_duration(opts.idle_exit_after)}"]
        log.info("kiln: starting the embedded kilnd: %s (log: %s)", " ".join(args), paths["log"])
        with open(paths["log"], "ab") as log_file:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                                    start_new_session=True, close_fds=True, cwd=paths["cache_dir"])
        _STARTED.append(proc)
        threading.Thread(target=_reap, args=(proc,), daemon=True, name="kiln-reap-kilnd").start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            status = health(address, timeout=1.0)
            if status == "SERVING":
                break
            code = proc.poll()
            if code is not None:
                raise ServerError(f"the embedded kilnd ({binary}) exited with status {code} during "
                                  f"startup; see {paths['log']}: {_tail(paths['log'])}")
            if time.monotonic() > deadline:
                raise ServerError(f"the embedded kilnd did not become SERVING within "
                                  f"{STARTUP_TIMEOUT_S:.0f} s; see {paths['log']}")
            time.sleep(0.05)
        with open(paths["pid"], "w") as f:
            f.write(f"{proc.pid}\n")
        log.info("kiln: embedded kilnd pid %d is serving on %s", proc.pid, address)
    return address


def _tail(path, lines=5):
    try:
        with open(path, "r", errors="replace") as f:
            return " | ".join(line.strip() for line in f.readlines()[-lines:])
    except OSError:
        return "(no log)"


class Connection:
    """One client per address, recreated after a connection failure (so a restarted server is
    reached at once, not after gRPC's reconnect backoff)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._clients = {}

    def client(self, address):
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                client = KilnClient(address, options=[("grpc.initial_reconnect_backoff_ms", 100),
                                                      ("grpc.min_reconnect_backoff_ms", 100),
                                                      ("grpc.max_reconnect_backoff_ms", 1000)])
                self._clients[address] = client
            return client

    def drop(self, address, client):
        """Forgets `client` (that failed to connect) so that the next call gets a new one. It is
        not closed here: other threads may still be calling through it (option prefetch_backward's
        Compile beside the forward's); its channel goes when the last of them lets it go. A
        client that was already replaced stays forgotten: the newer one is kept."""
        with self._lock:
            if self._clients.get(address) is client:
                del self._clients[address]

    def close_all(self):
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()


CONNECTIONS = Connection()
