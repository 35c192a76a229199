"""kiln.compile (kiln.packages): the Dynamo capture kept in kilnd. A second process against the
same real kilnd loads the package (no Dynamo trace, no kiln compile) and matches eager; a changed
source file makes the package stale; a graph break, a guard miss and a kilnd that refuses packages
each take the documented way out."""
import json
import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch

import kiln
from kiln import packages
from kilnd_server import Kilnd, fresh_kiln

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(not packages.available(), reason="this torch has no aot_compile / AOTAutograd cache hooks")

BLOCK = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    def act(x):
        return F.gelu(x){extra}


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(32)
            self.fc = nn.Linear(32, 32)

        def forward(self, x):
            return act(self.fc(self.ln(x))).softmax(-1)
''')


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    yield from fresh_kiln(monkeypatch)


def write_model(model_dir, extra=""):
    path = os.path.join(model_dir, "blockmod.py")
    with open(path, "w") as f:
        f.write(BLOCK.format(extra=extra))
    return path


def run_child(address, model_dir, torch_cache):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=torch_cache, PYTHONDONTWRITEBYTECODE="1")
    env.pop("KILN_SERVER", None)
    p = subprocess.run([sys.executable, os.path.join(HERE, "compile_api_child.py"), address, model_dir],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_package_and_skips_dynamo(tmp_path):
    model_dir = str(tmp_path)
    write_model(model_dir)
    server = Kilnd()
    try:
        # Separate torch cache dirs: the second process cannot use AOTAutograd's local cache.
        first = run_child(server.address, model_dir, str(tmp_path / "torch1"))
        second = run_child(server.address, model_dir, str(tmp_path / "torch2"))
        write_model(model_dir, extra=" * 2")  # act() changes: both packages are stale
        third = run_child(server.address, model_dir, str(tmp_path / "torch3"))
    finally:
        assert server.stop() == 0
    for run in (first, second, third):
        assert run["match"] and run["fallbacks"] == 0 and not run["package_fallbacks"], run
    # First: captured (training and no-grad variants) and stored both.
    assert first["packages"]["captured"] == 2 and first["packages"]["stored"] == 2, first
    assert first["dynamo_frames"] >= 2 and first["compiles"] >= 2, first
    # Second: both loaded from kilnd; Dynamo traced nothing, kilnd compiled nothing.
    assert second["packages"]["loaded"] == 2 and second["packages"]["captured"] == 0, second
    assert second["dynamo_frames"] == 0 and second["compiles"] == 0 and second["hits"] >= 3, second
    # CPU plans: nothing for option prewarm to warm (tests/gpu/test_cuda_backend.py has CUDA's).
    assert second["prewarm"]["threads"] == 0 and second["prewarm"]["errors"] == 0, second
    # Third: the traced source changed, so the packages were stale and captured again.
    assert third["packages"]["stale"] == 2 and third["packages"]["captured"] == 2, third


def test_new_input_shapes_get_a_package_of_their_own(monkeypatch):
    from kiln import prewarm

    waits = []
    def wait(timeout=None):
        waits.append(timeout)
        time.sleep(0.01)

    monkeypatch.setattr(prewarm, "wait", wait)
    server = Kilnd()
    try:
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
        compiled = kiln.compile(model, options={"server": server.address})
        with torch.no_grad():
            for rows in (4, 9, 4):
                x = torch.randn(rows, 16)
                torch.testing.assert_close(compiled(x), model(x))
        s = kiln.stats()
        assert s["packages"]["captured"] == 2 and s["packages"]["stored"] == 2, s["packages"]
        assert len(compiled._variants) == 2 and s["graph_fallbacks"] == 0, s
        # The call that made each package waited for warm-ups (kiln.prewarm); the third did not.
        assert len(waits) == 2, waits
        assert s["client_time_s"]["prewarm_wait"] >= 0.02, s["client_time_s"]  # counted in the call
    finally:
        assert server.stop() == 0


def test_a_graph_break_falls_back_to_torch_compile_with_a_warning():
    server = Kilnd()
    try:
        def fn(x):
            y = x.sin()
            torch._dynamo.graph_break()
            return y.cos()

        compiled = kiln.compile(fn, options={"server": server.address})
        x = torch.randn(5)
        with pytest.warns(kiln.KilnWarning, match="could not be captured whole"):
            out = compiled(x)
        torch.testing.assert_close(out, fn(x))
        torch.testing.assert_close(compiled(x), fn(x))  # the fallback keeps serving
        assert kiln.stats()["package_fallbacks"] == {"capture": 1}
        assert "could not be captured whole" in compiled.fallback_reason
    finally:
        assert server.stop() == 0


def test_a_kilnd_that_refuses_packages_still_runs_the_function():
    server = Kilnd("--max_package_bytes=0")
    try:
        model = torch.nn.Linear(8, 8)
        compiled = kiln.compile(model, options={"server": server.address})
        x = torch.randn(3, 8)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.no_grad():
                out = compiled(x)
        torch.testing.assert_close(out, model(x))
        assert any("did not store the package" in str(w.message) and "FAILED_PRECONDITION" in str(w.message)
                   for w in caught), [str(w.message) for w in caught]
        s = kiln.stats()["packages"]
        assert s["captured"] == 1 and s["stored"] == 0 and s["errors"] >= 1, s
    finally:
        assert server.stop() == 0


def test_compile_rejects_what_is_not_callable():
    with pytest.raises(TypeError, match="expected an nn.Module or a function"):
        kiln.compile(42)


def test_a_function_with_keyword_arguments_and_a_train_eval_switch():
    server = Kilnd()
    try:
        def fn(x, *, scale):
            return (x * scale).tanh()

        compiled = kiln.compile(fn, options={"server": server.address})
        x = torch.randn(4, 6)
        torch.testing.assert_close(compiled(x, scale=2.0), fn(x, scale=2.0))
        torch.testing.assert_close(compiled(x, scale=3.0), fn(x, scale=3.0))  # a constant: a second package

        model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Dropout(0.5))
        cmodel = kiln.compile(model, options={"server": server.address})
        with torch.no_grad():
            model.eval()
            torch.testing.assert_close(cmodel(x), model(x))
            model.train()  # dropout on: the eval package's guards fail, a training-mode package is made
            out = cmodel(x)
        assert (out == 0).any() and len(cmodel._variants) == 2
        s = kiln.stats()
        assert s["packages"]["captured"] == 4 and s["graph_fallbacks"] == 0, s
    finally:
        assert server.stop() == 0


def test_load_hooks_swap_torch_attributes_only_during_a_load():
    """The two hooks a package load runs under (terse guard descriptions, one FakeTensorMode for
    guard tensors) change torch only inside the load and put torch's own functions back."""
    from torch._dynamo import guards

    original_describe = guards.get_verbose_code_part
    original_unpickle = guards.GuardsStatePickler.__dict__.get("_unpickle_tensor")
    with packages._guard_descriptions_without_source_lines(), packages._one_fake_mode_for_guard_tensors():
        assert guards.get_verbose_code_part("x.size(0) == 8", None) == "x.size(0) == 8"
        assert guards.get_verbose_code_part is not original_describe
    assert guards.get_verbose_code_part is original_describe
    assert guards.GuardsStatePickler.__dict__.get("_unpickle_tensor") is original_unpickle
