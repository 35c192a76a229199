"""A thin gRPC client for kilnd: the Compiler and Admin services and grpc.health.v1.

Built on ``channel.unary_unary`` and friends with the message classes of ``kiln.proto``; no
generated stubs. Every call has a deadline (the per-call ``timeout`` argument, else the client's
default for that kind of call). Errors are not handled here: a failed call raises ``grpc.RpcError``
whose ``code()`` and ``details()`` say what happened; the caller decides what to do.

Addresses: ``host:port``, ``[ipv6]:port``, ``unix:/abs/path`` or ``unix:///abs/path``.
"""

import re

import grpc

from kiln import proto

DEFAULT_MAX_MESSAGE_BYTES = 256 << 20

# Seconds.
DEFAULT_TIMEOUTS = {
    "compile": 600.0,  # a cold compile of a large graph; the server has its own per-graph limit
    "lookup": 30.0,
    "health": 5.0,
    "admin": 60.0,
    "bundle": 1800.0,  # Export / Import stream whole caches
    "package": 60.0,  # PutPackage / GetPackage: one blob of up to --max_package_bytes
}

_HOST_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.\-_]*[A-Za-z0-9])?$")
_IPV6_RE = re.compile(r"^[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.\-]+)?$")


def _port(text, address):
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"kiln address {address!r}: port must be a number from 1 to 65535")
    return int(text)


def parse_address(address):
    """Checks a kilnd address and returns the gRPC target for it.

    Accepted: "host:port", "[ipv6]:port", "unix:/abs/path", "unix:///abs/path".
    Raises ValueError, saying what is wrong, for anything else.
    """
    if not isinstance(address, str) or not address:
        raise ValueError(f"kiln address {address!r}: expected host:port, [ipv6]:port or unix:/abs/path")
    if address.startswith("unix:"):
        path = address[len("unix:"):]
        if path.startswith("//"):
            path = path[2:]  # unix:///abs/path; unix://host/... is not a unix socket path
            if not path.startswith("/"):
                raise ValueError(f"kiln address {address!r}: unix:// must be followed by an absolute path")
        if not path.startswith("/") or path == "/":
            raise ValueError(f"kiln address {address!r}: a unix socket needs an absolute path")
        return "unix:" + path
    if address.startswith("["):
        close = address.find("]")
        if close < 0 or address[close + 1:close + 2] != ":":
            raise ValueError(f"kiln address {address!r}: expected [ipv6]:port")
        host = address[1:close]
        if not host or ":" not in host or not _IPV6_RE.match(host):
            raise ValueError(f"kiln address {address!r}: {host!r} is not an IPv6 address")
        return f"[{host}]:{_port(address[close + 2:], address)}"
    if "://" in address:
        raise ValueError(f"kiln address {address!r}: URL schemes other than unix: are not accepted")
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"kiln address {address!r}: expected host:port")
    if ":" in host:
        raise ValueError(f"kiln address {address!r}: write an IPv6 address in brackets, [addr]:port")
    if not _HOST_RE.match(host):
        raise ValueError(f"kiln address {address!r}: {host!r} is not a host name or IPv4 address")
    return f"{host}:{_port(port, address)}"


def _serializer(message):
    return message.SerializeToString()


class KilnClient:
    """Calls kilnd's services over one channel. Use as a context manager or call close()."""

    def __init__(self, address, *, max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES, timeouts=None,
                 credentials=None, options=()):
        """address: see parse_address. max_message_bytes: the send and receive limit of the channel.
        timeouts: overrides of DEFAULT_TIMEOUTS (keys "compile", "lookup", "health", "admin",
        "bundle", "package"). credentials: grpc.ChannelCredentials for TLS; None = insecure channel.
        options: extra channel options, (name, value) pairs."""
        self.target = parse_address(address)
        if int(max_message_bytes) <= 0:
            raise ValueError("max_message_bytes must be positive")
        self.timeouts = dict(DEFAULT_TIMEOUTS)
        unknown = set(timeouts or ()) - set(DEFAULT_TIMEOUTS)
        if unknown:
            raise ValueError(f"unknown timeout kinds {sorted(unknown)}; known: {sorted(DEFAULT_TIMEOUTS)}")
        self.timeouts.update(timeouts or {})
        opts = [("grpc.max_send_message_length", int(max_message_bytes)),
                ("grpc.max_receive_message_length", int(max_message_bytes))] + list(options)
        if credentials is None:
            self._channel = grpc.insecure_channel(self.target, options=opts)
        else:
            self._channel = grpc.secure_channel(self.target, credentials, options=opts)
        self._calls = {}

    # -- plumbing -------------------------------------------------------------------------------

    def _call(self, service, method, kind):
        key = (service, method)
        if key not in self._calls:
            desc = proto.service(service).methods_by_name[method]
            response_cls = getattr(proto, desc.output_type.name)
            factory = getattr(self._channel, kind)
            self._calls[key] = factory(f"/{service}/{method}", request_serializer=_serializer,
                                       response_deserializer=response_cls.FromString)
        return self._calls[key]

    def _timeout(self, timeout, kind):
        return self.timeouts[kind] if timeout is None else timeout

    def _admin(self, method, request, timeout):
        return self._call("kiln.v1.Admin", method, "unary_unary")(
            request, timeout=self._timeout(timeout, "admin"))

    # -- Compiler -------------------------------------------------------------------------------

    def compile(self, request, timeout=None):
        """Compiler.Compile(CompileRequest) -> CompileResponse."""
        return self._call("kiln.v1.Compiler", "Compile", "unary_unary")(
            request, timeout=self._timeout(timeout, "compile"))

    def lookup(self, request, timeout=None):
        """Compiler.Lookup(CompileRequest) -> CompileResponse (source CACHE_SOURCE_MISS on a miss)."""
        return self._call("kiln.v1.Compiler", "Lookup", "unary_unary")(
            request, timeout=self._timeout(timeout, "lookup"))

    def put_package(self, key, data, *, target="", debug_name="", summary="", timeout=None):
        """Compiler.PutPackage: stores `data` (bytes, opaque to kilnd) under the client's `key` (64
        lowercase hex) -> PutPackageResponse (its store_key names the cache entry, as kilnctl lists
        it). target, debug_name and summary are only shown by kilnctl."""
        request = proto.PutPackageRequest(key=key, data=bytes(data), target=target,
                                          debug_name=debug_name, summary=summary)
        return self._call("kiln.v1.Compiler", "PutPackage", "unary_unary")(
            request, timeout=self._timeout(timeout, "package"))

    def get_package(self, key, timeout=None):
        """Compiler.GetPackage -> GetPackageResponse: found and data, or found=False (source
        CACHE_SOURCE_MISS) when kilnd has no package under `key`; a miss is not an error."""
        return self._call("kiln.v1.Compiler", "GetPackage", "unary_unary")(
            proto.GetPackageRequest(key=key), timeout=self._timeout(timeout, "package"))

    # -- grpc.health.v1 -------------------------------------------------------------------------

    def health(self, timeout=None, service=""):
        """grpc.health.v1.Health/Check -> "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN"."""
        response = self._call("grpc.health.v1.Health", "Check", "unary_unary")(
            proto.HealthCheckRequest(service=service), timeout=self._timeout(timeout, "health"))
        return proto.HealthCheckResponse.ServingStatus.Name(response.status)

    # -- Admin ----------------------------------------------------------------------------------

    def get_stats(self, request=None, timeout=None):
        return self._admin("GetStats", request or proto.GetStatsRequest(), timeout)

    def list_entries(self, request=None, timeout=None):
        return self._admin("ListEntries", request or proto.ListEntriesRequest(), timeout)

    def get_entry(self, request, timeout=None):
        return self._admin("GetEntry", request, timeout)

    def evict(self, request, timeout=None):
        return self._admin("Evict", request, timeout)

    def purge(self, request, timeout=None):
        return self._admin("Purge", request, timeout)

    def verify(self, request=None, timeout=None):
        return self._admin("Verify", request or proto.VerifyRequest(), timeout)

    def export(self, request=None, timeout=None):
        """Admin.Export: an iterator of BundleChunk; concatenating their `data` gives the bundle."""
        return self._call("kiln.v1.Admin", "Export", "unary_stream")(
            request or proto.ExportRequest(), timeout=self._timeout(timeout, "bundle"))

    def import_bundle(self, chunks, timeout=None):
        """Admin.Import from an iterable of BundleChunk -> ImportResponse."""
        return self._call("kiln.v1.Admin", "Import", "stream_unary")(
            iter(chunks), timeout=self._timeout(timeout, "bundle"))

    # -- lifetime -------------------------------------------------------------------------------

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
