"""The README's first command, after scripts/demo.sh has installed and built everything.

Starts kilnd on the embedded default (a unix socket under the cache dir, the local disk cache, no
other service), or reuses one already running there, and checks its health over grpc.health.v1.
"""
import argparse
import os
import pathlib
import subprocess
import sys
import time

import grpc

HEALTH_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "kiln"


def health(address: str, timeout: float = 2.0) -> str:
    with grpc.insecure_channel(address) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        reply = check(b"", timeout=timeout)  # HealthCheckRequest{} is empty on the wire
    # HealthCheckResponse{status = 1}: one varint field.
    return HEALTH_STATUS.get(reply[1] if len(reply) == 2 and reply[0] == 0x08 else 0, "UNKNOWN")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kilnd", required=True, help="path to the kilnd binary")
    args = parser.parse_args()

    cache = cache_dir()
    socket_path = cache / "kilnd.sock"
    address = f"unix:{socket_path}"
    started = None
    try:
        status = health(address)
        print(f"[kiln] reusing the kilnd already serving on {address}: {status}")
    except grpc.RpcError:
        print(f"[kiln] starting kilnd on {address} (cache dir {cache})")
        log = open(cache.parent / "kilnd-demo.log", "w") if cache.parent.exists() else subprocess.DEVNULL
        started = subprocess.Popen([args.kilnd, f"--listen={address}", f"--cache_dir={cache}"],
                                   stdout=log, stderr=log)
        deadline = time.time() + 10
        status = "UNKNOWN"
        while time.time() < deadline:
            if started.poll() is not None:
                print(f"[kiln] kilnd exited with status {started.returncode}; see "
                      f"{cache.parent / 'kilnd-demo.log'}", file=sys.stderr)
                return 1
            try:
                status = health(address)
                break
            except grpc.RpcError:
                time.sleep(0.05)
        print(f"[kiln] kilnd health: {status}")
    try:
        if status != "SERVING":
            print("[kiln] kilnd is not serving", file=sys.stderr)
            return 1
        print("[kiln] NOTE: kiln's compiler and its torch.compile backend are not built yet, so this "
              "demo stops after starting kilnd and checking its health. It will compile an "
              "example model once they exist.")
        return 0
    finally:
        if started is not None:
            started.terminate()
            started.wait(timeout=30)
            print(f"[kiln] stopped kilnd (exit status {started.returncode})")


if __name__ == "__main__":
    sys.exit(main())
