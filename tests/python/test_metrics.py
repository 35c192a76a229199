"""kilnd's Prometheus side door (--metrics_listen): /metrics and /healthz over real HTTP."""
import re
import urllib.error
import urllib.request

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln import proto
from kiln.rpc import KilnClient
from kilnd_server import Kilnd


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.status, reply.headers.get("Content-Type"), reply.read().decode()


def value(text, series):
    match = re.search(r"^" + re.escape(series) + r" (\S+)$", text, re.M)
    assert match, f"{series} not in /metrics:\n{text}"
    return float(match.group(1))


def test_metrics_count_requests_hits_compiles_and_cache_size():
    server = Kilnd("--metrics_listen=127.0.0.1:0")
    try:
        port = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", server.log()).group(1)
        base = f"http://127.0.0.1:{port}"
        status, content_type, text = scrape(base + "/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        assert "# TYPE kiln_requests_total counter" in text
        assert "# TYPE kiln_compile_latency_seconds histogram" in text

        gm = make_fx(lambda x: torch.tanh(x) * 2)(torch.randn(8, 8))
        request = proto.CompileRequest(graph=kiln.serialize_graph(gm),
                                       target=proto.Target(device=proto.DEVICE_KIND_CPU, cpu_isa="x86-64-v2"))
        with KilnClient(server.address) as client:
            assert client.compile(request, timeout=120).source == proto.CACHE_SOURCE_COMPILED
            assert client.compile(request, timeout=60).source == proto.CACHE_SOURCE_MEMORY_HIT
            assert client.lookup(request, timeout=60).source == proto.CACHE_SOURCE_MEMORY_HIT

        _, _, text = scrape(base + "/metrics")
        assert value(text, 'kiln_requests_total{outcome="compiled"}') == 1
        assert value(text, 'kiln_requests_total{outcome="memory_hit"}') == 2
        assert value(text, 'kiln_cache_hits_total{tier="memory"}') == 2
        assert value(text, 'kiln_cache_entries{tier="disk"}') == 1
        assert value(text, 'kiln_cache_bytes{tier="disk"}') > 0
        assert value(text, 'kiln_cache_max_bytes{tier="disk"}') == 10 << 30
        assert value(text, "kiln_compile_latency_seconds_count") == 1
        assert value(text, 'kiln_compile_latency_seconds_bucket{le="+Inf"}') == 1
        assert value(text, 'kiln_cache_evictions_total{tier="disk"}') == 0
        assert value(text, 'kiln_cache_corruptions_total{tier="disk"}') == 0
        assert value(text, "kiln_compile_queue_depth") == 0

        assert scrape(base + "/healthz")[2] == "SERVING\n"
    finally:
        assert server.stop() == 0
