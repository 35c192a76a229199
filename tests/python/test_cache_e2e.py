"""The artifact cache seen through a real kilnd that really compiles (CPU, g++), and kilnctl
against it: single-flight, restart, corruption, bounds, and every kilnctl command (text and --json).
"""
import concurrent.futures
import json
import os
import pathlib
import subprocess

import grpc
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln import proto
from kiln.rpc import KilnClient
from kilnd_server import REPO, Kilnd, kilnd_path

CPU = proto.Target(device=proto.DEVICE_KIND_CPU, cpu_isa="x86-64-v2")


def kilnctl_path():
    path = os.environ.get("KILNCTL") or str(REPO / "bazel-bin" / "client" / "kilnctl" / "kilnctl")
    if not os.access(path, os.X_OK):
        pytest.fail(f"kilnctl not found at {path}: bazel build //client/kilnctl or set KILNCTL")
    return path


def kilnctl(server, *args, expect=0):
    proc = subprocess.run([kilnctl_path(), f"--server={server.address}", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == expect, (args, proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def pointwise_request(rows=64, cols=32, scale=2.0):
    def f(x, y):
        return torch.relu(x * scale + y).exp()

    gm = make_fx(f)(torch.randn(rows, cols), torch.randn(rows, cols))
    graph = kiln.serialize_graph(gm, kind=proto.GRAPH_KIND_INFERENCE, debug_name=f"pointwise {rows}x{cols}")
    return proto.CompileRequest(graph=graph, target=CPU, options=proto.CompileOptions(keep_source=True))


def compile_or_skip(client, request):
    try:
        return client.compile(request, timeout=120)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.UNIMPLEMENTED:
            pytest.skip(f"this kilnd does not compile yet: {e.details()}")
        raise


def test_64_concurrent_identical_requests_compile_once(tmp_path):
    server = Kilnd("--compile_workers=2")
    try:
        request = pointwise_request(rows=96)
        with KilnClient(server.address) as client:
            compile_or_skip(client, pointwise_request(rows=3))  # warm up (and skip if no compiler)
            with concurrent.futures.ThreadPoolExecutor(64) as pool:
                replies = list(pool.map(lambda _: client.compile(request, timeout=120), range(64)))
            stats = client.get_stats()
        sources = [r.source for r in replies]
        assert sources.count(proto.CACHE_SOURCE_COMPILED) == 1, sources
        assert all(s in (proto.CACHE_SOURCE_COMPILED, proto.CACHE_SOURCE_JOINED,
                         proto.CACHE_SOURCE_MEMORY_HIT, proto.CACHE_SOURCE_DISK_HIT) for s in sources)
        blobs = {r.artifact.SerializeToString() for r in replies}
        assert len(blobs) == 1, "all 64 replies must carry the same artifact"
        assert stats.requests["compiled"] == 2  # the warm-up and this one
    finally:
        assert server.stop() == 0


def test_restart_keeps_entries_and_corrupt_entries_are_recompiled(tmp_path):
    cache_dir = str(tmp_path / "cache")
    request = pointwise_request(rows=17)
    server = Kilnd("--memory_cache_max_bytes=0", cache_dir=cache_dir)
    try:
        with KilnClient(server.address) as client:
            first = compile_or_skip(client, request)
        assert first.source == proto.CACHE_SOURCE_COMPILED
    finally:
        assert server.stop() == 0

    server = Kilnd("--memory_cache_max_bytes=0", cache_dir=cache_dir)
    try:
        with KilnClient(server.address) as client:
            again = client.compile(request, timeout=60)
            assert again.source == proto.CACHE_SOURCE_DISK_HIT
            assert again.artifact == first.artifact
            # Flip bytes in the stored entry: it must never be served, but recompiled.
            entry = pathlib.Path(cache_dir, "artifacts", first.key[:2], first.key)
            data = bytearray(entry.read_bytes())
            data[len(data) // 2] ^= 0xFF
            entry.write_bytes(bytes(data))
            recompiled = client.compile(request, timeout=120)
            assert recompiled.source == proto.CACHE_SOURCE_COMPILED
            assert recompiled.artifact.checksum == first.artifact.checksum
            assert client.get_stats().corruptions >= 1
    finally:
        assert server.stop() == 0


def test_a_rebuilt_kilnd_does_not_serve_entries_another_build_made(tmp_path):
    """kilnd's code generates what it caches and kiln's version string does not change with every
    build, so kilnd's build (its GNU build-id, the linker's hash of the executable) is part of
    every key (compiler.kilnd_build). A "rebuilt" kilnd (a copy whose build-id differs by one
    byte) on the same cache dir compiles the graph again under another key, explain-miss names
    the component, and the first build still hits its own entry."""
    def version(binary):
        return subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()

    cache_dir = str(tmp_path / "cache")
    original = version(kilnd_path())
    assert original.startswith("kilnd ") and "(build gnu:" in original, original
    build_id = bytes.fromhex(original.split("(build gnu:")[1].rstrip(")"))
    data = pathlib.Path(kilnd_path()).read_bytes()
    assert data.count(build_id) == 1
    rebuilt = tmp_path / "kilnd"
    rebuilt.write_bytes(data.replace(build_id, bytes([build_id[0] ^ 0xFF]) + build_id[1:]))
    rebuilt.chmod(0o755)
    assert version(str(rebuilt)) not in ("", original)
    request = pointwise_request(rows=19)
    replies = []
    for binary in (None, str(rebuilt), None):
        server = Kilnd(cache_dir=cache_dir, binary=binary)
        try:
            with KilnClient(server.address) as client:
                replies.append(compile_or_skip(client, request))
            if binary is not None:
                diff = kilnctl(server, "explain-miss", replies[0].key, replies[1].key)
        finally:
            assert server.stop() == 0
    first, other, again = replies
    assert first.source == other.source == proto.CACHE_SOURCE_COMPILED and other.key != first.key
    assert "compiler.kilnd_build" in diff, diff
    assert again.source == proto.CACHE_SOURCE_DISK_HIT and again.key == first.key


def test_kilnctl_commands_against_a_compiling_kilnd(tmp_path):
    server = Kilnd()
    try:
        with KilnClient(server.address) as client:
            small = compile_or_skip(client, pointwise_request(rows=8))
            big = client.compile(pointwise_request(rows=256), timeout=120)
        keys = {small.key, big.key}

        assert "SERVING" in kilnctl(server, "health")
        assert json.loads(kilnctl(server, "--json", "health"))["status"] == "SERVING"

        stats_text = kilnctl(server, "stats")
        assert "entries" in stats_text and "requests: compiled" in stats_text
        stats = json.loads(kilnctl(server, "--json", "stats"))
        assert int(stats["entries"]) == 2 and int(stats["requests"]["compiled"]) == 2

        listing = kilnctl(server, "ls")
        assert small.key[:16] in listing and big.key[:16] in listing
        assert "2 of 2 entries shown" in listing and "cpu:x86-64-v2" in listing
        entries = json.loads(kilnctl(server, "--json", "ls", "--sort=size"))["entries"]
        assert [e["key"] for e in entries][0] == big.key  # biggest first
        assert json.loads(kilnctl(server, "--json", "ls", "--device=cuda"))["entries"] == []
        assert len(json.loads(kilnctl(server, "--json", "ls", f"--prefix={small.key[:10]}"))["entries"]) == 1

        shown = kilnctl(server, "show", small.key[:12])
        assert small.key in shown and "--- graph ---" in shown and "--- plan ---" in shown
        source = kilnctl(server, "show", small.key, "--source")
        assert 'extern "C"' in source
        assert "--- compile log ---" in kilnctl(server, "show", small.key, "--log")
        record = kilnctl(server, "show", small.key, "--key_record")
        assert "target" in record
        entry = json.loads(kilnctl(server, "--json", "show", small.key, "--timings"))
        assert entry["summary"]["key"] == small.key and entry["timings"]

        diff = kilnctl(server, "explain-miss", small.key, big.key)
        assert "hashed components differ" in diff and "[8, 32]" in diff and "[256, 32]" in diff
        diff_json = json.loads(kilnctl(server, "--json", "explain-miss", small.key, big.key))
        assert diff_json["differences"]

        bundle = tmp_path / "entries.kbundle"
        assert "exported" in kilnctl(server, "export", str(bundle))
        assert bundle.stat().st_size > 0

        kilnctl(server, "evict", small.key)
        kilnctl(server, "show", small.key, expect=1)
        assert json.loads(kilnctl(server, "--json", "ls"))["total"] == "1"
        assert "purged 0 entries" in kilnctl(server, "purge", "--older_than=1h")
        assert "purged 1 entries" in kilnctl(server, "purge", "--all")

        imported = kilnctl(server, "import", str(bundle))
        assert "imported 2 entries" in imported
        assert json.loads(kilnctl(server, "--json", "verify"))["ok"] == "2"
        assert "checked 2 entries: 2 ok, 0 corrupt" in kilnctl(server, "verify")

        # A tampered bundle is refused, not imported.
        data = bytearray(bundle.read_bytes())
        data[len(data) // 2] ^= 0x01
        bad = tmp_path / "bad.kbundle"
        bad.write_bytes(bytes(data))
        kilnctl(server, "purge", "--all")
        kilnctl(server, "import", str(bad), expect=1)
        assert json.loads(kilnctl(server, "--json", "ls"))["total"] == "0"

        kilnctl(server, "show", "zz", expect=2)
        kilnctl(server, "ls", "--sort=color", expect=2)
    finally:
        assert server.stop() == 0
    # Unreachable server: exit 3 with a message naming the address.
    proc = subprocess.run([kilnctl_path(), "--server=unix:/nonexistent/kilnd.sock", "stats"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "no kilnd answers" in proc.stderr
