"""The package store (Compiler.PutPackage / GetPackage) through a real kilnd: round trips, misses,
errors and limits, a restart on the same cache dir, and kilnctl ls / show / verify / export /
import on package entries.
"""
import hashlib
import json
import os
import subprocess

import grpc
import pytest

from kiln import proto
from kiln.rpc import KilnClient
from kilnd_server import REPO, Kilnd


def client_key(name):
    return hashlib.sha256(name.encode()).hexdigest()


def expected_store_key(key):
    return hashlib.sha256(b"kiln.package.v1\0" + key.encode()).hexdigest()


def kilnctl(server, *args, expect=0):
    path = os.environ.get("KILNCTL") or str(REPO / "bazel-bin" / "client" / "kilnctl" / "kilnctl")
    if not os.access(path, os.X_OK):
        pytest.fail(f"kilnctl not found at {path}: bazel build //client/kilnctl or set KILNCTL")
    proc = subprocess.run([path, f"--server={server.address}", *args], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == expect, (args, proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def rpc_error(call):
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_put_then_get_returns_the_same_bytes(kilnd):
    key = client_key("roundtrip")
    data = bytes(range(256)) * 1000 + b"\0\n\xff"
    with KilnClient(kilnd.address) as client:
        put = client.put_package(key, data, target="cuda:sm_90", debug_name="Block.forward",
                                 summary="2 graphs\ntorch 2.13")
        assert put.store_key == expected_store_key(key)
        assert put.store_key != key
        got = client.get_package(key)
        assert got.found
        assert got.data == data
        assert got.source == proto.CACHE_SOURCE_MEMORY_HIT
        assert got.store_key == put.store_key

        # Put again replaces; the store key does not change.
        assert client.put_package(key, b"v2").store_key == put.store_key
        assert client.get_package(key).data == b"v2"

        requests = dict(client.get_stats().requests)
        assert requests["package_put"] == 2
        assert requests["package_memory_hit"] == 2
        assert "memory_hit" not in requests  # package calls do not count as graph hits


def test_unknown_key_is_a_miss_not_an_error(kilnd):
    with KilnClient(kilnd.address) as client:
        got = client.get_package(client_key("never stored"))
        assert not got.found
        assert got.data == b""
        assert got.source == proto.CACHE_SOURCE_MISS
        assert got.store_key == expected_store_key(client_key("never stored"))
        assert client.get_stats().requests["package_miss"] == 1


@pytest.mark.parametrize("bad", ["", "abc", "A" * 64, "g" * 64, "a" * 65])
def test_bad_keys_are_invalid_argument(kilnd, bad):
    with KilnClient(kilnd.address) as client:
        for call in (lambda: client.put_package(bad, b"data"), lambda: client.get_package(bad)):
            e = rpc_error(call)
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "package key" in e.details() and "64 lowercase hex" in e.details(), e.details()


def test_empty_data_and_bytes_that_are_not_a_request_are_invalid_argument(kilnd):
    with KilnClient(kilnd.address) as client:
        e = rpc_error(lambda: client.put_package(client_key("empty"), b""))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "empty" in e.details()
    with grpc.insecure_channel(kilnd.address) as channel:
        for method in ("PutPackage", "GetPackage"):
            call = channel.unary_unary(f"/kiln.v1.Compiler/{method}")
            e = rpc_error(lambda: call(b"\x0a\x80\x10" + b"x" * 10, timeout=5))
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"kiln.v1.{method}Request" in e.details(), e.details()


def test_data_over_the_limit_is_resource_exhausted():
    server = Kilnd("--max_package_bytes=1000")
    try:
        with KilnClient(server.address) as client:
            client.put_package(client_key("fits"), b"x" * 1000)
            e = rpc_error(lambda: client.put_package(client_key("too big"), b"x" * 1001))
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            for part in ("1001 bytes", "1000 bytes", "--max_package_bytes"):
                assert part in e.details(), e.details()
            assert not client.get_package(client_key("too big")).found
            assert client.get_stats().requests["package_resource_exhausted"] == 1
    finally:
        assert server.stop() == 0


def test_packages_off_is_failed_precondition():
    server = Kilnd("--max_package_bytes=0")
    try:
        with KilnClient(server.address) as client:
            for call in (lambda: client.put_package(client_key("off"), b"data"),
                         lambda: client.get_package(client_key("off"))):
                e = rpc_error(call)
                assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "--max_package_bytes" in e.details(), e.details()
    finally:
        assert server.stop() == 0


def test_a_negative_limit_is_refused_at_startup():
    proc = subprocess.run([str(os.environ.get("KILND") or REPO / "bazel-bin" / "server" / "kilnd"),
                           "--max_package_bytes=-1"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "--max_package_bytes" in proc.stderr


def test_restart_on_the_same_cache_dir_is_a_disk_hit(tmp_path):
    cache_dir = str(tmp_path / "cache")
    key = client_key("restart")
    data = os.urandom(300_000)
    server = Kilnd(cache_dir=cache_dir)
    try:
        with KilnClient(server.address) as client:
            client.put_package(key, data, summary="before the restart")
    finally:
        assert server.stop() == 0
    server = Kilnd(cache_dir=cache_dir)
    try:
        with KilnClient(server.address) as client:
            got = client.get_package(key)
            assert got.found and got.data == data
            assert got.source == proto.CACHE_SOURCE_DISK_HIT
            again = client.get_package(key)  # promoted to memory by the disk hit
            assert again.source == proto.CACHE_SOURCE_MEMORY_HIT and again.data == data
            assert client.get_stats().requests["package_disk_hit"] == 1
    finally:
        assert server.stop() == 0


def test_kilnctl_shows_verifies_exports_and_imports_packages(kilnd, tmp_path):
    key = client_key("kilnctl")
    data = b"pickled function" * 100
    with KilnClient(kilnd.address) as client:
        store_key = client.put_package(key, data, target="cuda:sm_90", debug_name="Block.forward",
                                       summary="Block.forward, torch 2.13").store_key

    listing = kilnctl(kilnd, "ls", "--wide")
    assert store_key in listing
    assert "Block.forward: package: Block.forward, torch 2.13" in listing
    assert "cuda:sm_90" in listing
    entries = json.loads(kilnctl(kilnd, "--json", "ls"))["entries"]
    assert [e["graph_summary"] for e in entries] == ["package: Block.forward, torch 2.13"]

    shown = kilnctl(kilnd, "show", store_key[:12])
    assert "package: Block.forward, torch 2.13" in shown
    assert f"({len(data)} bytes) of opaque client data" in shown
    assert "--- plan ---" not in shown and "--- graph ---" not in shown
    for flag in ("--plan", "--source", "--log", "--key_record", "--timings"):
        assert "opaque client data" in kilnctl(kilnd, "show", store_key, flag)
    entry = json.loads(kilnctl(kilnd, "--json", "show", store_key))
    assert int(entry["package_bytes"]) == len(data)
    kilnctl(kilnd, "explain-miss", store_key, store_key, expect=2)

    assert "1 ok, 0 corrupt" in kilnctl(kilnd, "verify")
    with KilnClient(kilnd.address) as client:
        assert client.get_package(key).data == data  # verify kept it

    bundle = str(tmp_path / "packages.kiln")
    kilnctl(kilnd, "export", bundle)
    other = Kilnd()
    try:
        assert "imported 1 entries" in kilnctl(other, "import", bundle)
        with KilnClient(other.address) as client:
            got = client.get_package(key)
            assert got.found and got.data == data
        assert "package: Block.forward, torch 2.13" in kilnctl(other, "ls")
    finally:
        assert other.stop() == 0

    kilnctl(kilnd, "evict", store_key)
    with KilnClient(kilnd.address) as client:
        assert not client.get_package(key).found
