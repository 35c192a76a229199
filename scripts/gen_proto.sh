#!/usr/bin/env bash
# Regenerates the serialized FileDescriptorSet that the Python client loads at run time
# (client/python/kiln/_proto/kiln_v1.binpb). Run from anywhere after editing proto/**/*.proto;
# client/python/tests/test_descriptor_fresh.py fails until the shipped file matches.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-client/python/kiln/_proto/kiln_v1.binpb}"
protoc -I proto --include_imports --descriptor_set_out="$out" \
  proto/kiln/v1/graph.proto proto/kiln/v1/compiler.proto proto/kiln/v1/admin.proto \
  proto/grpc/health/v1/health.proto
