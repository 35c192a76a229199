#!/bin/sh
echo "coverage reports are not available in kiln's offline Bazel build" >&2
exit 1
