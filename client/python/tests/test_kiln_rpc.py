"""kiln.rpc: address parsing, and the client's wire behaviour against a stand-in gRPC server.

The stand-in is a real grpc.server in this process that answers on kilnd's method paths; it checks
what the client sends (paths, message types, streams, deadlines, size limits). It is not kilnd:
the tests against a real kilnd live under tests/.
"""

import time
from concurrent import futures

import grpc
import pytest

from kiln import proto
from kiln.rpc import DEFAULT_MAX_MESSAGE_BYTES, KilnClient, parse_address


@pytest.mark.parametrize("address, target", [
    ("localhost:50051", "localhost:50051"),
    ("kilnd.example.com:1", "kilnd.example.com:1"),
    ("10.0.0.7:65535", "10.0.0.7:65535"),
    ("[::1]:50051", "[::1]:50051"),
    ("[fe80::1%eth0]:7000", "[fe80::1%eth0]:7000"),
    ("unix:/run/kilnd.sock", "unix:/run/kilnd.sock"),
    ("unix:///run/kilnd.sock", "unix:/run/kilnd.sock"),
])
def test_accepted_addresses(address, target):
    assert parse_address(address) == target


@pytest.mark.parametrize("address, why", [
    ("", "expected"), ("localhost", "host:port"), (":50051", "host:port"), ("localhost:", "port"),
    ("localhost:0", "port"), ("localhost:65536", "port"), ("localhost:http", "port"),
    ("::1:50051", "brackets"), ("[::1]", r"\[ipv6\]:port"), ("[::1]50051", r"\[ipv6\]:port"),
    ("[]:1", "not an IPv6"), ("[localhost]:1", "not an IPv6"),
    ("unix:run/kilnd.sock", "absolute"), ("unix://run/kilnd.sock", "absolute"), ("unix:", "absolute"),
    ("unix:/", "absolute"), ("http://localhost:1", "schemes"), ("dns:///localhost:1", "schemes"),
    ("local host:1", "not a host name"), ("-bad:1", "not a host name"),
])
def test_rejected_addresses(address, why):
    with pytest.raises(ValueError, match=why):
        parse_address(address)


def test_client_options_are_checked():
    with pytest.raises(ValueError, match="unknown timeout kinds"):
        KilnClient("localhost:1", timeouts={"compiel": 1})
    with pytest.raises(ValueError, match="address"):
        KilnClient("localhost")
    with KilnClient("localhost:1", timeouts={"health": 0.5}) as c:
        assert c.timeouts["health"] == 0.5 and c.timeouts["compile"] > 60
    assert DEFAULT_MAX_MESSAGE_BYTES == 256 << 20


def test_unreachable_server_raises_rpc_error(tmp_path):
    with KilnClient(f"unix:{tmp_path}/nothing.sock") as client:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            client.health(timeout=2)
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert time.monotonic() - started < 10


def test_a_dropped_connection_stays_usable_by_threads_still_holding_it(tmp_path):
    """kiln.server.Connection.drop forgets a client that failed to connect without closing it:
    a concurrent call through it (another graph's Compile) must see UNAVAILABLE, not a closed
    channel (ValueError, which the backend counted as a kiln bug)."""
    from kiln.server import Connection

    address = f"unix:{tmp_path}/nothing.sock"
    connections = Connection()
    first = connections.client(address)
    connections.drop(address, first)
    second = connections.client(address)
    assert second is not first
    with pytest.raises(grpc.RpcError) as err:
        first.health(timeout=2)
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    connections.drop(address, first)  # stale: the newer client stays
    assert connections.client(address) is second
    connections.close_all()


class StandIn:
    """Records requests and answers on kilnd's method paths."""

    def __init__(self):
        self.seen = []

    def handlers(self):
        def unary(req_cls, fn):
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=req_cls.FromString, response_serializer=lambda m: m.SerializeToString())

        def compile_(req, ctx):
            self.seen.append(("Compile", req, ctx.time_remaining()))
            if req.graph.debug_name == "bad":
                ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "node 'x': bad graph")
            return proto.CompileResponse(key="ab" * 32, source=proto.CACHE_SOURCE_COMPILED,
                                         server_version=str(len(req.graph.nodes)))

        def lookup(req, ctx):
            self.seen.append(("Lookup", req, ctx.time_remaining()))
            return proto.CompileResponse(source=proto.CACHE_SOURCE_MISS)

        def health(req, ctx):
            self.seen.append(("Check", req, ctx.time_remaining()))
            status = {"": proto.HealthCheckResponse.SERVING, "kiln.v1.Compiler": proto.HealthCheckResponse.NOT_SERVING}
            return proto.HealthCheckResponse(status=status.get(req.service, proto.HealthCheckResponse.SERVICE_UNKNOWN))

        def stats(req, ctx):
            return proto.Stats(server_version="standin", requests={"compiled": 1})

        def evict(req, ctx):
            ctx.abort(grpc.StatusCode.NOT_FOUND, f"{req.key} is not cached")

        def export(req, ctx):
            for k in req.keys:
                yield proto.BundleChunk(data=k.encode())

        def import_(chunks, ctx):
            data = b"".join(c.data for c in chunks)
            return proto.ImportResponse(imported=len(data))

        return [
            grpc.method_handlers_generic_handler("kiln.v1.Compiler", {
                "Compile": unary(proto.CompileRequest, compile_), "Lookup": unary(proto.CompileRequest, lookup)}),
            grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
                "Check": unary(proto.HealthCheckRequest, health)}),
            grpc.method_handlers_generic_handler("kiln.v1.Admin", {
                "GetStats": unary(proto.GetStatsRequest, stats), "Evict": unary(proto.EvictRequest, evict),
                "Export": grpc.unary_stream_rpc_method_handler(
                    export, request_deserializer=proto.ExportRequest.FromString,
                    response_serializer=lambda m: m.SerializeToString()),
                "Import": grpc.stream_unary_rpc_method_handler(
                    import_, request_deserializer=proto.BundleChunk.FromString,
                    response_serializer=lambda m: m.SerializeToString())}),
        ]


@pytest.fixture
def standin(tmp_path):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", 64 << 20)])
    fake = StandIn()
    server.add_generic_rpc_handlers(fake.handlers())
    address = f"unix:{tmp_path}/standin.sock"
    server.add_insecure_port(address)
    server.start()
    yield fake, address
    server.stop(None)


def test_calls_reach_the_right_methods(standin):
    fake, address = standin
    with KilnClient(address, timeouts={"compile": 30}) as client:
        assert client.health() == "SERVING"
        assert client.health(service="kiln.v1.Compiler") == "NOT_SERVING"
        assert client.health(service="other") == "SERVICE_UNKNOWN"
        req = proto.CompileRequest()
        req.graph.nodes.add(name="x")
        reply = client.compile(req)
        assert reply.source == proto.CACHE_SOURCE_COMPILED and reply.server_version == "1"
        assert client.lookup(req, timeout=3).source == proto.CACHE_SOURCE_MISS
        assert client.get_stats().requests["compiled"] == 1
        assert b"".join(c.data for c in client.export(proto.ExportRequest(keys=["ab", "cd"]))) == b"abcd"
        chunks = [proto.BundleChunk(data=b"x" * 10), proto.BundleChunk(data=b"y" * 5)]
        assert client.import_bundle(chunks).imported == 15
    kinds = [(name, remaining) for name, _, remaining in fake.seen]
    # Every call carried a deadline: the configured, default or per-call one.
    compile_left = next(r for n, r in kinds if n == "Compile")
    lookup_left = next(r for n, r in kinds if n == "Lookup")
    assert 20 < compile_left <= 31 and 0 < lookup_left <= 3.5  # gRPC rounds deadlines up a little
    assert all(r is not None and r <= 5.5 for n, r in kinds if n == "Check")


def test_errors_surface_with_code_and_details(standin):
    _, address = standin
    with KilnClient(address) as client:
        with pytest.raises(grpc.RpcError) as err:
            client.compile(proto.CompileRequest(graph=proto.Graph(debug_name="bad")))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == "node 'x': bad graph"
        with pytest.raises(grpc.RpcError) as err:
            client.evict(proto.EvictRequest(key="k1"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and "k1" in err.value.details()


def test_message_size_limits(standin):
    _, address = standin
    big = proto.CompileRequest()
    big.graph.constants.add(name="w", data=b"\0" * (2 << 20))
    with KilnClient(address, max_message_bytes=1 << 20) as client:
        with pytest.raises(grpc.RpcError) as err:
            client.compile(big)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with KilnClient(address) as client:  # 256 MiB default: the same request goes through
        assert client.compile(big).source == proto.CACHE_SOURCE_COMPILED
