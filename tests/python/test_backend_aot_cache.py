"""Option aot_cache (kiln.aot_cache): AOTAutograd's cache keeps kiln's graphs, so that a second
process skips AOTAutograd for them and still runs kiln's plans (kilnd cache hits), matching eager.
Each run is a fresh process (aot_cache_child.py) against one real kilnd, sharing a torch cache dir."""
import json
import os
import subprocess
import sys

import pytest

from kiln import aot_cache
from kilnd_server import Kilnd

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(not aot_cache.available(),
                                reason="this torch lacks OutputCode or the AOTAutograd cache flags")


def run_child(address, torch_cache, device="cpu", timeout=300, dynamic=False):
    """aot_cache_child.py on `device` against kilnd at `address`, with this process's sys.path
    (tests/gpu imports this from a checkout whose client is not installed); its JSON line."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=torch_cache, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("KILN_SERVER", None)
    extra = ["dynamic"] if dynamic else []
    p = subprocess.run([sys.executable, os.path.join(HERE, "aot_cache_child.py"), address, device, *extra],
                       capture_output=True, text=True, env=env, timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_kiln_graphs_from_aotautograds_cache(tmp_path):
    server = Kilnd()
    try:
        first = run_child(server.address, str(tmp_path / "torch-cache"))
        second = run_child(server.address, str(tmp_path / "torch-cache"))
    finally:
        assert server.stop() == 0
    for run in (first, second):
        assert run["match"] and run["fallbacks"] == 0 and run["plan_calls"] >= 3, run
    # First process: AOTAutograd traced and stored the training and inference graphs' results.
    assert first["aot"].get("autograd_cache_miss", 0) >= 2 and first["aot"].get("autograd_cache_saved", 0) >= 2, first
    # Second: loaded from that cache, no AOTAutograd trace; kiln's plans came from kilnd's cache.
    assert second["aot"].get("autograd_cache_hit", 0) >= 2, second
    assert second["aot"].get("autograd_cache_miss", 0) == 0, second
    assert second["compiles"] == 0 and second["hits"] >= 3, second


def test_loaded_graphs_run_eagerly_when_kilnd_is_gone(tmp_path):
    """Graphs loaded from AOTAutograd's cache ask kilnd for their plans again; when kilnd is
    unreachable by then, they run eagerly (cause unavailable) and still match eager."""
    server = Kilnd()
    try:
        first = run_child(server.address, str(tmp_path / "torch-cache"))
    finally:
        assert server.stop() == 0
    second = run_child(server.address, str(tmp_path / "torch-cache"))
    assert first["match"] and first["fallbacks"] == 0, first
    assert second["aot"].get("autograd_cache_hit", 0) >= 2, second
    assert second["match"] and second["plan_calls"] == 0 and second["eager_calls"] >= 3, second
    assert set(second["fallbacks_by_cause"]) == {"unavailable"}, second


def test_a_second_process_loads_symbolic_graphs_and_compiles_them_per_shape(tmp_path):
    """dynamic=True: AOTAutograd's cache keeps the symbolic graphs; the second process loads them,
    and kiln compiles each batch size's static specialization (kilnd cache hits there too)."""
    server = Kilnd()
    try:
        first = run_child(server.address, str(tmp_path / "torch-cache"), dynamic=True)
        second = run_child(server.address, str(tmp_path / "torch-cache"), dynamic=True)
    finally:
        assert server.stop() == 0
    for run in (first, second):
        assert run["match"] and run["fallbacks"] == 0 and run["eager_calls"] == 0, run
        assert run["plan_calls"] == 5 and run["kernel_steps"] > 0, run  # 2 x (forward, backward), inference
    # (Dynamo restarts the frame's first dynamic=True analysis: that attempt's AOTAutograd call
    # misses in every process, never stored; the graphs that run are hits.)
    assert second["aot"].get("autograd_cache_hit", 0) >= 2, second
    assert second["compiles"] == 0, second
