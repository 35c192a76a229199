"""What scripts/bench_gpu.py and scripts/bench_compile.py share."""
import math
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gx(x):
    return "n/a" if x is None or math.isnan(x) else f"{x:.2f}x"


def log(msg=""):
    print(msg, flush=True)
