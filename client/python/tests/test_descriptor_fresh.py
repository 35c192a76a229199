"""The shipped descriptor set must be what scripts/gen_proto.sh produces from proto/ today."""

import os
import shutil
import subprocess

from kiln import proto

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def test_shipped_descriptor_set_is_fresh(tmp_path):
    assert shutil.which("protoc"), "protoc is missing: run scripts/setup.sh (it installs protobuf-compiler)"
    out = tmp_path / "kiln_v1.binpb"
    subprocess.run(["bash", os.path.join(REPO, "scripts", "gen_proto.sh"), str(out)], check=True,
                   timeout=120)
    with open(proto.DESCRIPTOR_SET_PATH, "rb") as f:
        shipped = f.read()
    assert out.read_bytes() == shipped, (
        "client/python/kiln/_proto/kiln_v1.binpb is stale: run scripts/gen_proto.sh")
