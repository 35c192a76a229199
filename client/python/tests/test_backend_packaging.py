"""`pip install ./client/python` ships what the backend needs: the torch_dynamo_backends entry
point and the runtime library's sources (built with runtime/build.sh at first use)."""

import glob
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    if not (REPO / "runtime" / "build.sh").is_file():
        pytest.skip("no runtime/ in this checkout")
    root = tmp_path_factory.mktemp("src")
    shutil.copytree(REPO / "client" / "python", root / "client" / "python",
                    ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "build"))
    shutil.copytree(REPO / "runtime", root / "runtime")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
                    "--no-build-isolation", "--no-deps", "--no-index", "-w", str(out),
                    str(root / "client" / "python")], check=True, timeout=300)
    (path,) = glob.glob(str(out / "kiln-*.whl"))
    return path


def test_wheel_has_the_entry_point_and_the_runtime_sources(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "[torch_dynamo_backends]" in entry_points and "kiln = kiln.backend:kiln_backend" in entry_points
    shipped = {n for n in names if n.startswith("kiln/_runtime/runtime/")}
    expected = {f"kiln/_runtime/runtime/{p.name}" for p in (REPO / "runtime").iterdir()
                if p.is_file() and (p.suffix in (".cc", ".h") or p.name == "build.sh")}
    assert shipped == expected and "kiln/_proto/kiln_v1.binpb" in names


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the runtime")
def test_installed_package_builds_its_runtime_into_the_cache_dir(wheel, tmp_path):
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    code = ("import kiln, kiln.runtime, sys; "
            "assert kiln.__file__.startswith(sys.argv[1]), kiln.__file__; "
            "root = kiln.runtime.source_dir(); assert str(root).startswith(sys.argv[1]), root; "
            "rt = kiln.runtime.load_runtime(sys.argv[2]); print(rt.path)")
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("KILN_RUNTIME_LIB", None)
    out = subprocess.run([sys.executable, "-c", code, str(site), str(tmp_path / "cache")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(tmp_path / "cache" / "runtime"))
