"""Correctness corpus: aten graphs compiled by ONE real kilnd, run through kiln's executor on fresh
random inputs, compared with the same graph module run eagerly (per-dtype tolerances in
corpus_util.TOLERANCES; ints and bools exact; NaN positions must match). Every graph is its own test
id; compiles are submitted as soon as each graph is traced, so they overlap. A summary table
(graphs, kernels, extern steps, op fallbacks) is printed at the end of the module.
"""
import concurrent.futures
import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from corpus_util import (DEVICE, OK_SOURCES, SUMMARIES, Summary, compare, flatten, fresh_like, random_tensor,
                         request_for, run_plan, to_device, upcast)
from kiln import proto
from kiln.rpc import KilnClient
from kilnd_server import Kilnd

f32, f64, bf16, f16 = torch.float32, torch.float64, torch.bfloat16, torch.float16
i32, i64, u8, b8 = torch.int32, torch.int64, torch.uint8, torch.bool

# -- input specs: gen -> tensor ------------------------------------------------------------------


def r(*shape, dtype=f32, low=-20, high=20):
    return lambda g: random_tensor(shape, dtype, g, low, high)


def pos(*shape, dtype=f32):
    return lambda g: (random_tensor(shape, f64, g).abs() + 0.1).to(dtype)


def nonzero(*shape, dtype=i64):  # integer divisors: |x| in 1..9, both signs
    def make(g):
        sign = torch.randint(0, 2, shape, generator=g) * 2 - 1
        return (torch.randint(1, 10, shape, generator=g) * sign).to(dtype)
    return make


def special(*shape, dtype=f32):  # NaN, inf and -inf at fixed places
    def make(g):
        t = random_tensor(shape, dtype, g).flatten()
        t[0], t[3 % t.numel()], t[5 % t.numel()] = float("nan"), float("inf"), float("-inf")
        return t.reshape(shape)
    return make


def tr(*shape, dtype=f32):  # the last two dims transposed (non-contiguous)
    return lambda g: random_tensor(shape[:-2] + (shape[-1], shape[-2]), dtype, g).transpose(-1, -2)


def sl(*shape, dtype=f32):  # every other element of a larger last dim, at an offset
    return lambda g: random_tensor(shape[:-1] + (shape[-1] * 2 + 1,), dtype, g)[..., 1::2]


def ex(shape, base, dtype=f32):  # expanded: stride-0 dims
    return lambda g: random_tensor(base, dtype, g).expand(shape)


# -- the corpus ---------------------------------------------------------------------------------

CASES = {}  # name -> (mode, fn, specs); mode "fx" (make_fx), "fw"/"bw" (AOTAutograd graphs)


def case(name, fn, *specs, mode="fx"):
    assert name not in CASES, name
    CASES[name] = (mode, fn, specs)


def block(name, fn, *specs):
    case(name + "-fw", fn, *specs, mode="fw")
    case(name + "-bw", fn, *specs, mode="bw")


A = r(6, 7)
for op in ["neg", "abs", "exp", "exp2", "expm1", "log", "log1p", "log2", "sqrt", "rsqrt", "reciprocal",
           "sin", "cos", "tanh", "sigmoid", "erf", "relu", "floor", "ceil", "round", "trunc", "sign",
           "isnan", "isinf", "logical_not"]:
    case(op, getattr(torch, op), A)
case("silu", lambda x: F.silu(x), A)
case("gelu", F.gelu, A)
case("gelu-tanh", lambda x: F.gelu(x, approximate="tanh"), A)
case("bitwise_not", torch.bitwise_not, r(5, 4, dtype=i64))
case("bitwise_not-bool", torch.bitwise_not, r(5, 4, dtype=b8))
case("leaky_relu", lambda x: F.leaky_relu(x, 0.2), A)
case("hardtanh", lambda x: F.hardtanh(x, -0.5, 0.5), A)
case("clamp", lambda x: torch.clamp(x, -0.5, 0.7), A)
case("clamp_min", lambda x: torch.clamp_min(x, 0.1), A)
case("clamp_max", lambda x: torch.clamp_max(x, 0.1), A)
case("clamp-tensor", lambda x, lo, hi: torch.clamp(x, lo, hi), A, r(6, 1), r(7))
case("pow-2", lambda x: x ** 2, A)
case("pow-3", lambda x: x ** 3, A)
case("pow-half", lambda x: x ** 0.5, A)
case("pow-tensor", lambda x, y: torch.pow(x, y), pos(6, 7), A)
case("pow-scalar-base", lambda x: torch.pow(2.0, x), A)
case("unary-special", lambda x: torch.stack([x.exp(), x.log(), x.sqrt(), x.tanh(), x.sigmoid(), x.relu(),
                                             x.floor(), x.sign(), x.isnan(), x.isinf()]).float(), special(4, 5))
B2 = (r(6, 7), r(6, 7))
for op in ["add", "sub", "mul", "div", "maximum", "minimum", "remainder", "fmod", "atan2"]:
    case(op, getattr(torch, op), *B2)
for op in ["eq", "ne", "lt", "le", "gt", "ge"]:
    case(op, getattr(torch, op), *B2)
    case(op + "-scalar", (lambda _op: lambda x: getattr(torch, _op)(x, 0.25))(op), A)
case("add-alpha", lambda x, y: torch.add(x, y, alpha=2.5), *B2)
case("sub-alpha", lambda x, y: torch.sub(x, y, alpha=-3), *B2)
case("rsub", lambda x: 1.5 - x, A)
case("div-scalar", lambda x: x / 3.0, A)
case("div-trunc", lambda x, y: torch.div(x, y, rounding_mode="trunc"), *B2)
case("div-floor", lambda x, y: torch.div(x, y, rounding_mode="floor"), *B2)
case("int-div-trunc", lambda x, y: torch.div(x, y, rounding_mode="trunc"), r(6, 7, dtype=i64), nonzero(6, 7))
case("int-div-floor", lambda x, y: torch.div(x, y, rounding_mode="floor"), r(6, 7, dtype=i64), nonzero(6, 7))
case("int-true-div", lambda x, y: x / y, r(6, 7, dtype=i64), nonzero(6, 7))
case("int-remainder", torch.remainder, r(6, 7, dtype=i64), nonzero(6, 7))
case("int32-remainder", torch.remainder, r(6, 7, dtype=i32), nonzero(6, 7, dtype=i32))
case("int-fmod", torch.fmod, r(6, 7, dtype=i64), nonzero(6, 7))
case("int-floor_divide", torch.floor_divide, r(6, 7, dtype=i64), nonzero(6, 7))
case("int-remainder-scalar", lambda x: torch.remainder(x, -3), r(6, 7, dtype=i64))
case("int-floordiv-scalar", lambda x: x // 4, r(6, 7, dtype=i64))
case("float-remainder-neg", lambda x: torch.remainder(x, -0.75), A)
case("maximum-nan", torch.maximum, special(4, 5), r(4, 5))
case("minimum-nan", torch.minimum, r(4, 5), special(4, 5))
case("clamp-nan", lambda x: x.clamp(-1, 1), special(4, 5))
case("logical_and", torch.logical_and, r(5, 6, dtype=b8), r(5, 6, dtype=b8))
case("logical_or", torch.logical_or, r(5, 6), r(5, 6, dtype=b8))
case("logical_xor", torch.logical_xor, r(5, 6, dtype=i64), r(5, 6, dtype=b8))
for op in ["bitwise_and", "bitwise_or", "bitwise_xor"]:
    case(op, getattr(torch, op), r(5, 6, dtype=i64), r(5, 6, dtype=i64))
case("bitwise_and-bool", torch.bitwise_and, r(5, 6, dtype=b8), r(5, 6, dtype=b8))
case("where", torch.where, r(5, 6, dtype=b8), r(5, 6), r(5, 6))
case("where-scalar", lambda c, x: torch.where(c, x, 0.5), r(5, 6, dtype=b8), r(5, 6))
case("masked_fill", lambda x, m: x.masked_fill(m, -1e4), r(5, 6), r(5, 6, dtype=b8))
case("masked_fill-bcast", lambda x, m: x.masked_fill(m, float("-inf")), r(2, 5, 6), r(5, 1, dtype=b8))
case("addcmul", lambda a, b, c: torch.addcmul(a, b, c, value=0.5), *B2, r(6, 7))
case("addcdiv", lambda a, b, c: torch.addcdiv(a, b, c, value=-2), *B2, pos(6, 7))
case("lerp", lambda a, b: torch.lerp(a, b, 0.3), *B2)
case("lerp-tensor", torch.lerp, *B2, r(6, 7))
case("threshold_backward", lambda g, x: torch.ops.aten.threshold_backward(g, x, 0.0), *B2)
case("sigmoid_backward", lambda g, y: torch.ops.aten.sigmoid_backward(g, y), *B2)
case("tanh_backward", lambda g, y: torch.ops.aten.tanh_backward(g, y), *B2)
case("silu_backward", lambda g, x: torch.ops.aten.silu_backward(g, x), *B2)
case("gelu_backward", lambda g, x: torch.ops.aten.gelu_backward(g, x), *B2)
case("gelu_backward-tanh", lambda g, x: torch.ops.aten.gelu_backward(g, x, approximate="tanh"), *B2)
case("dropout_backward", lambda g, m: torch.ops.aten.native_dropout_backward(g, m, 2.0), r(6, 7), r(6, 7, dtype=b8))
# losses: mse_loss (reduction 1 mean by default, 2 sum, 0 none) and its backward
case("mse_loss", lambda a, b: torch.ops.aten.mse_loss(a, b), *B2)
case("mse_loss-sum", lambda a, b: torch.ops.aten.mse_loss(a, b, 2), *B2)
case("mse_loss-long", lambda a, b: torch.ops.aten.mse_loss(a, b), r(64, 4096), r(64, 4096))  # split: partial sums
case("mse_loss-none", lambda a, b: torch.ops.aten.mse_loss(a, b, 0), *B2)
case("mse_loss-broadcast", lambda a, b: torch.ops.aten.mse_loss(a, b), r(6, 1), r(5, 1, 7))
case("mse_loss-none-broadcast", lambda a, b: torch.ops.aten.mse_loss(a, b, 0), r(6, 7), r(7))
case("mse_loss-0d", lambda a, b: torch.ops.aten.mse_loss(a, b, 2), r(), r())
case("mse_loss-bf16", lambda a, b: torch.ops.aten.mse_loss(a, b), r(6, 7, dtype=bf16), r(6, 7, dtype=bf16))
case("mse_loss_backward", lambda g, a, b: torch.ops.aten.mse_loss_backward(g, a, b, 1), r(), *B2)
case("mse_loss_backward-sum", lambda g, a, b: torch.ops.aten.mse_loss_backward(g, a, b, 2), r(), *B2)
NLL_T = r(6, dtype=i64, low=0, high=10)  # class indices of 6 rows of 10 classes (class 3 below: ignored)
nll_bw = torch.ops.aten.nll_loss_backward
case("nll_loss_backward", lambda g, x, t, tw: nll_bw(g, x, t, None, 1, -100, tw), r(), r(6, 10), NLL_T, pos())
case("nll_loss_backward-ignore-sum", lambda g, x, t, tw: nll_bw(g, x, t, None, 2, 3, tw), r(), r(6, 10), NLL_T, pos())
case("nll_loss_backward-none-weight", lambda g, x, t, w, tw: nll_bw(g, x, t, w, 0, -100, tw),
     r(6), r(6, 10), NLL_T, pos(10), pos())
case("nll_loss_backward-1d", lambda g, x, t, tw: nll_bw(g, x, t, None, 1, -100, tw),
     r(), r(10), r(dtype=i64, low=0, high=10), pos())
case("mse_loss_backward-none", lambda g, a, b: torch.ops.aten.mse_loss_backward(g, a, b, 0), r(6, 7), *B2)
# casts and factories
case("to-f64", lambda x: x.to(f64), A)
case("to-bf16", lambda x: x.to(bf16), A)
case("to-f16", lambda x: x.to(f16), A)
case("to-int", lambda x: (x * 10).to(i64), A)
case("to-int32-from-int64", lambda x: x.to(i32), r(6, 7, dtype=i64))
case("to-uint8", lambda x: x.to(u8), r(6, 7, dtype=i64, low=0, high=255))
case("to-bool", lambda x: x.to(b8), r(6, 7, dtype=i64, low=-2, high=2))
case("bool-to-float", lambda x: x.to(f32), r(6, 7, dtype=b8))
case("clone", lambda x: x.clone() + 0, A)
case("clone-contig", lambda x: x.clone(memory_format=torch.contiguous_format), tr(6, 7))
case("copy", lambda x, y: torch.ops.aten.copy(x, y), r(6, 7), r(7, dtype=f64))
case("fill", lambda x: torch.ops.aten.fill(x, 3.5), A)
case("zeros_like", lambda x: torch.zeros_like(x) + x, A)
case("ones_like", lambda x: torch.ones_like(x, dtype=i64), A)
case("full_like", lambda x: torch.full_like(x, -2.0) * x, A)
case("full", lambda x: torch.full((6, 7), 1.25) + x, A)
case("zeros", lambda x: torch.zeros(3, 6, 7) + x, A)
case("arange", lambda x: x + torch.arange(7), A)
case("arange-start-step", lambda x: x * torch.arange(1, 15, 2, dtype=f32), A)
case("arange-int", lambda x: x + torch.arange(-3, 4), r(6, 7, dtype=i64))
case("scalar_tensor", lambda x: x + torch.ops.aten.scalar_tensor(2.5), A)
case("new_ones", lambda x: x.new_ones(6, 7) - x, A)
# reductions
R3 = r(4, 5, 6)
case("sum", torch.sum, R3)
case("sum-dim", lambda x: x.sum(1), R3)
case("sum-dims-keepdim", lambda x: x.sum((0, 2), keepdim=True), R3)
case("sum-int32", lambda x: x.sum(-1), r(4, 5, dtype=i32))
case("sum-bool", lambda x: x.sum(0), r(4, 5, dtype=b8))
case("sum-bf16", lambda x: x.sum(-1), r(4, 64, dtype=bf16))
case("mean", lambda x: x.mean(-1), R3)
case("mean-all", torch.mean, R3)
case("mean-f64", lambda x: x.mean((0, 1)), r(4, 5, 6, dtype=f64))
case("prod", lambda x: x.prod(1), r(4, 5, 6))
case("prod-int", lambda x: x.prod(1), r(4, 5, dtype=i64, low=-3, high=4))
case("amax", lambda x: x.amax(-1), R3)
case("amin", lambda x: x.amin((0, 2)), R3)
case("max-all", torch.max, R3)
case("min-all", torch.min, R3)
case("max-dim", lambda x: x.max(1), R3)
case("min-dim-keepdim", lambda x: x.min(2, keepdim=True), R3)
case("argmax", lambda x: x.argmax(-1), R3)
case("argmin", lambda x: x.argmin(0), R3)
case("argmax-all", torch.argmax, R3)
case("amax-nan", lambda x: x.amax(-1), special(4, 6))
case("max-dim-nan", lambda x: x.max(-1), special(4, 6))
case("argmax-nan", lambda x: x.argmax(-1), special(4, 6))
case("sum-nan-inf", lambda x: x.sum(-1), special(4, 6))
case("argmax-ties", lambda x: x.argmax(-1), r(5, 9, dtype=i64, low=0, high=3))
case("max-int", lambda x: x.amax(0), r(5, 9, dtype=i64))
case("any", lambda x: x.any(-1), r(4, 5, dtype=b8))
case("all", lambda x: x.all(), r(4, 5, dtype=b8))
case("any-float", lambda x: (x > 1.5).any(0), r(4, 5))
case("var", lambda x: x.var(-1), R3)
case("var-unbiased-0", lambda x: x.var(1, correction=0), R3)
case("std", lambda x: x.std(-1), R3)
case("var_mean", lambda x: torch.var_mean(x, (0, 2)), R3)
case("softmax", lambda x: torch.softmax(x, -1), R3)
case("softmax-dim0", lambda x: torch.softmax(x, 0), R3)
case("log_softmax", lambda x: torch.log_softmax(x, -1), R3)
case("softmax-inf", lambda x: torch.softmax(x, -1), special(4, 6))
case("softmax_backward", lambda g, y: torch.ops.aten._softmax_backward_data(g, y, -1, f32), R3, R3)
case("log_softmax_backward", lambda g, y: torch.ops.aten._log_softmax_backward_data(g, y, 1, f32), R3, R3)
case("layer_norm", lambda x, w, b: F.layer_norm(x, (6,), w, b), R3, r(6), r(6))
case("layer_norm-2d", lambda x: F.layer_norm(x, (5, 6)), R3)
case("layer_norm_backward", lambda g, x, m, rs, w, b: torch.ops.aten.native_layer_norm_backward(
    g, x, [6], m, rs, w, b, [True, True, True]), R3, R3, r(4, 5, 1), pos(4, 5, 1), r(6), r(6))
case("batch_norm-eval", lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, False),
     r(4, 3, 5, 5), r(3), pos(3), r(3), r(3))
case("cumsum", lambda x: x.cumsum(1), R3)
# indexing, shapes
case("cat", lambda x, y: torch.cat([x, y], 1), r(4, 3), r(4, 5))
case("cat-3", lambda x, y, z: torch.cat([x, y, z]), r(2, 3), r(1, 3), r(4, 3))
case("stack", lambda x, y: torch.stack([x, y], -1), *B2)
case("pad", lambda x: F.pad(x, (1, 2, 0, 3), value=-1.0), A)
case("pad-negative", lambda x: F.pad(x, (-1, 2)), A)
case("select_backward", lambda g: torch.ops.aten.select_backward(g, [4, 6, 7], 0, 2), r(6, 7))
case("slice_backward", lambda g: torch.ops.aten.slice_backward(g, [6, 9], 1, 1, 8, 2), r(6, 4))
case("tril", lambda x: torch.tril(x, 1), A)
case("triu", lambda x: torch.triu(x, -1), r(3, 6, 7))
case("index_select", lambda x, i: x.index_select(0, i), r(6, 7), lambda g: torch.randint(0, 6, (4,), generator=g))
case("embedding", lambda i, w: F.embedding(i, w), lambda g: torch.randint(0, 10, (3, 4), generator=g), r(10, 5))
case("gather", lambda x, i: x.gather(1, i), r(4, 7), lambda g: torch.randint(0, 7, (4, 3), generator=g))
case("views", lambda x: x.view(6, 4, 5).permute(2, 0, 1).reshape(5, 24).t().unsqueeze(0) * 2, r(4, 6, 5))
case("slice-select", lambda x: x[1:5:2, 3] + x[0, ::3].sum(), r(6, 7))
case("expand-view", lambda x: x.expand(4, 6, 7) + 1, r(1, 7))
case("split", lambda x: [t * 2 for t in torch.split(x, 3, 1)], r(4, 8))
case("unbind", lambda x: [t + 1 for t in x.unbind(0)], r(3, 4))
case("narrow-squeeze", lambda x: x.narrow(1, 2, 1).squeeze(1).exp(), r(4, 5))
case("as_strided", lambda x: x.as_strided((3, 3), (1, 4), 1) * 2, r(4, 4))
case("repeat", lambda x: x.repeat(2, 3), r(3, 4))
case("slice_scatter", lambda x, y: torch.slice_scatter(x, y, 1, 0, 7, 2), r(3, 7), r(3, 4))
case("select_scatter", lambda x, y: torch.select_scatter(x, y, 0, 1), r(3, 7), r(7))
case("mm", torch.mm, r(5, 8), r(8, 3))
case("bmm", torch.bmm, r(2, 5, 8), r(2, 8, 3))
case("addmm", lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2), r(3), r(5, 8), r(8, 3))
# GEMMs as cuBLASLt library steps on CUDA: transposed operands, bias epilogues, scales, bf16; a
# sliced operand (no unit stride) stays an aten step
case("mm-transposed", torch.mm, tr(5, 8), tr(8, 3))
case("mm-sliced", torch.mm, sl(5, 8), r(8, 3))
case("linear-bias", F.linear, r(6, 8), r(4, 8), r(4))
case("linear-bias-bf16", F.linear, r(6, 8, dtype=bf16), r(4, 8, dtype=bf16), r(4, dtype=bf16))
case("addmm-matrix", lambda c, x, w: torch.addmm(c, x, w, beta=0.5, alpha=2), r(5, 3), r(5, 8), tr(8, 3))
case("bmm-transposed", torch.bmm, r(2, 5, 8), tr(2, 8, 3))
case("baddbmm", lambda c, x, y: torch.baddbmm(c, x, y, beta=0.5, alpha=2), r(2, 5, 3), r(2, 5, 8), r(2, 8, 3))
case("mm-relu", lambda x, w: torch.relu(x @ w.t()) * 2, r(5, 8), r(3, 8))
case("conv2d", lambda x, w, b: F.conv2d(x, w, b, padding=1), r(1, 3, 6, 6), r(4, 3, 3, 3), r(4))
case("avg_pool2d", lambda x: F.avg_pool2d(x, 2), r(1, 3, 6, 6))
case("max_pool2d", lambda x: F.max_pool2d(x, 2), r(1, 3, 6, 6))
# max_pool2d_with_indices is lowered (windows read masked): padding, strides, dilation, ceil_mode,
# NaN/inf (NaN wins; the index of the last NaN, as torch), indices, channels-last bf16
case("max_pool2d-pad-stride", lambda x: F.max_pool2d(x, 3, 2, 1), r(2, 4, 9, 9))
case("max_pool2d-indices-nan", lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), special(2, 3, 7, 7))
case("max_pool2d-dilation-ceil", lambda x: F.max_pool2d(x, 2, 2, 0, dilation=2, ceil_mode=True, return_indices=True),
     r(1, 2, 7, 8))
case("max_pool2d-nhwc-bf16", lambda x: F.max_pool2d(x, 3, 2, 1),
     lambda g: random_tensor((2, 5, 8, 8), bf16, g).contiguous(memory_format=torch.channels_last))
case("max_pool2d-ties", lambda x: F.max_pool2d(x, 2, 1, return_indices=True), lambda g: torch.ones(1, 1, 4, 4))
# max_pool2d_with_indices_backward is lowered as a gather over each input element's windows when
# the stride divides H and W (lower_pool.cc); else torch's kernel runs it (the -odd block)
block("max_pool2d-pad-stride", lambda x: F.max_pool2d(x, 3, 2, 1), r(2, 4, 8, 8))
block("max_pool2d-dilation-ceil", lambda x: F.max_pool2d(x, 2, 2, 0, dilation=2, ceil_mode=True), r(1, 2, 8, 10))
block("max_pool2d-overlap-ties", lambda x: F.max_pool2d(x, 2, 1), lambda g: torch.ones(1, 1, 4, 4))
block("max_pool2d-stride3-nhwc", lambda x: F.max_pool2d(x, (3, 2), (3, 2), (1, 1)),
      lambda g: random_tensor((2, 5, 9, 8), f32, g).contiguous(memory_format=torch.channels_last))
block("max_pool2d-odd", lambda x: F.max_pool2d(x, 3, 2, 1), r(2, 3, 9, 9))
# layouts: broadcasting, transposed / sliced / expanded inputs
case("bcast-row-col", torch.add, r(4, 1), r(1, 5))
case("bcast-rank", torch.mul, r(3), r(2, 4, 3))
case("bcast-3d", lambda x, y: torch.where(x > 0, x, y), r(2, 1, 5), r(3, 1))
case("transposed-in", lambda x, y: x * y + 1, tr(6, 7), r(6, 7))
case("transposed-both", lambda x, y: (x - y).exp(), tr(6, 7), tr(6, 7))
case("transposed-3d", lambda x: x.softmax(-1), tr(3, 6, 7))
case("transposed-sum", lambda x: x.sum(0), tr(6, 7))
case("sliced-in", lambda x, y: x / (y.abs() + 1), sl(5, 6), r(5, 6))
case("sliced-reduce", lambda x: x.amax(-1), sl(5, 6))
case("expanded-in", lambda x, y: x + y, ex((5, 6), (1, 6)), r(5, 6))
case("expanded-col", lambda x: x.relu().sum(1), ex((5, 6), (5, 1)))
case("expanded-all", lambda x: x * 2, ex((3, 4), ()))
case("size1-dims", lambda x, y: (x * y).sum(1), r(1, 1, 5), r(4, 1, 1))
case("size1-leading", lambda x: x.new_zeros(1, 1, 12) + x, r(12))
case("size1-leading-where", lambda c, x, y: torch.where(c, x, y), r(2, dtype=b8), r(), r(1, 1))
case("size1-leading-pad", lambda x: F.pad(x, (1, 2), value=1.0), r(1, 3))
case("hardtanh-int", lambda x: F.hardtanh(x), r(4, 5, dtype=i64, low=-3, high=3))
case("bf16-div-trunc", lambda x, y: torch.div(x, y, rounding_mode="trunc"), r(5, 10, dtype=bf16), r(10, dtype=bf16))
case("size1-reduce", lambda x: x.softmax(1), r(3, 1, 4))
case("zero-size", lambda x, y: x + y, r(0, 5), r(5))
case("zero-size-sum", lambda x: x.sum(0), r(0, 5))
case("zero-size-mid", lambda x: x.exp().sum(-1), r(3, 0, 4))
case("zero-size-cat", lambda x, y: torch.cat([x, y]) * 2, r(0, 4), r(3, 4))
case("zero-d", lambda x, y: x * y + 1, r(), r())
case("zero-d-bcast", lambda x, y: x - y, r(), r(4, 5))
case("zero-d-sum", lambda x: x.sum() * x.mean(), r(4, 5))
case("zero-d-int", lambda x, y: x * y, r(dtype=i64), r(4, dtype=i64))
# mixed dtypes
case("mixed-int-float", torch.add, r(4, 5, dtype=i64), r(4, 5))
case("mixed-int-scalar-float", lambda x: x * 1.5, r(4, 5, dtype=i64))
case("mixed-int32-int64", torch.mul, r(4, 5, dtype=i32), r(4, 5, dtype=i64))
case("mixed-bool-float", torch.add, r(4, 5, dtype=b8), r(4, 5))
case("mixed-bf16-f32", torch.add, r(4, 5, dtype=bf16), r(4, 5))
case("mixed-f16-f64", torch.mul, r(4, 5, dtype=f16), r(4, 5, dtype=f64))
case("mixed-0d-f64-f32", torch.add, r(dtype=f64), r(4, 5))
case("mixed-uint8-int8", torch.add, r(4, 5, dtype=u8), r(4, 5, dtype=torch.int8))
case("bf16-chain", lambda x, y: (x * y + 1).relu().exp(), r(4, 5, dtype=bf16), r(4, 5, dtype=bf16))
case("f16-chain", lambda x: x.sigmoid() * x, r(4, 5, dtype=f16))
case("f64-chain", lambda x, y: (x / y).tanh() + x.log1p(), r(4, 5, dtype=f64), pos(4, 5, dtype=f64))
case("bf16-softmax", lambda x: x.softmax(-1), r(4, 32, dtype=bf16))
case("bf16-layer_norm", lambda x: F.layer_norm(x, (32,)), r(4, 32, dtype=bf16))
case("f64-var", lambda x: x.var(0), r(6, 5, dtype=f64))
# long rows (sm_90: a row over the blocks of a thread-block cluster, kept in their registers) and
# few long rows (split over a cluster); odd lengths like a 50257 vocabulary
case("softmax-vocab-odd", lambda x: x.softmax(-1), r(3, 50257))
case("bf16-softmax-vocab-odd", lambda x: x.softmax(-1), r(2, 50257, dtype=bf16))
case("log_softmax-131072", lambda x: x.log_softmax(-1), r(2, 131072))
case("bf16-layer_norm-65536", lambda x, w: F.layer_norm(x, (65536,), w), r(2, 65536, dtype=bf16),
     r(65536, dtype=bf16))
case("sum-few-long-rows", lambda x: x.sum(-1), r(4, 262144))
case("bf16-sum-full-long", lambda x: x.sum(), r(1 << 20, dtype=bf16, low=-1, high=1))
# Few outputs over many elements: partials over the GPU, then the same reduction over them.
case("split-sum-2d-full", lambda x: x.sum(), r(512, 1024))
case("split-mean-bf16-full", lambda x: (x * 2).mean(), r(256, 4096, dtype=bf16, low=-1, high=1))
case("split-amax-full", lambda x: x.amax(), r(1 << 18))
case("split-amin-dims-keepdim", lambda x: x.amin((0, 2), keepdim=True), r(300, 3, 1024))
case("split-sum-dims", lambda x: x.sum((0, 2)), r(300, 3, 1024))
case("split-prod-near-one", lambda x: (1 + x * 1e-6).prod(), r(1 << 17))
case("split-int-sum-full", lambda x: x.sum(), r(1 << 17, dtype=i32))
case("split-sum-unsplit-dim", lambda x: x.sum(), r(200, 4096))
case("split-sum-then-pointwise", lambda x, y: x.sum(-1) * 2 + y, r(3, 1 << 17), r(3))
case("argmax-few-long-rows", lambda x: x.argmax(-1), r(3, 70001))
# Softmaxes over few long rows: on GPUs partials of each row, a log-sum-exp per row, then pointwise
# (SplitFewRowSoftmax); -inf entries, a row of -inf only (NaN, as torch) and a NaN in a row.
case("softmax-split-few-long-rows", lambda x: x.softmax(-1), r(4, 262144))
case("bf16-softmax-split-few-long-rows", lambda x: x.softmax(-1), r(2, 131072, dtype=bf16))
case("log_softmax-split-dim0", lambda x: x.log_softmax(0), r(65536, 3))
case("log_softmax-split-scaled", lambda x: (x / 0.7).log_softmax(-1), r(4, 131072))
# 32+ f32 rows that a thread-block cluster holds: on sm_90 one row op (a cluster per row: each
# block's max and sum, folded across the cluster), split as above on sm_80. A row of -inf only
# (NaN), a row of -inf but its first element (the cluster's other blocks see only -inf), NaNs.
case("softmax-cluster-rows", lambda x: torch.cat([
    torch.full_like(x[:1], float("-inf")),
    torch.cat([x[1:2, :1], torch.full_like(x[1:2, 1:], float("-inf"))], 1),
    x[2:].masked_fill(x[2:] > 19.99, float("nan"))]).softmax(-1), r(40, 65536))
case("log_softmax-cluster-rows", lambda x: x.log_softmax(-1), r(32, 131072))
# +inf in a row makes it NaN in torch (exp(inf - inf)); some rows here have one, some none.
case("softmax-pos-inf-rows", lambda x: x.masked_fill(x > 19.9, float("inf")).softmax(-1), r(64, 300))
case("log_softmax-pos-inf-long-row", lambda x: x.masked_fill(x > 19.99, float("inf")).log_softmax(-1),
     r(3, 70001))
case("softmax-split-pos-inf", lambda x: x.masked_fill(x > 19.9995, float("inf")).softmax(-1), r(4, 65536))
case("softmax-split-inf-rows", lambda x: torch.cat([x[:1].masked_fill(x[:1] > 1, float("-inf")),
                                                    torch.full_like(x[1:2], float("-inf")),
                                                    x[2:].masked_fill(x[2:] > 3.5, float("nan"))]).softmax(-1),
     r(3, 65536))
case("int-sum-mixed", lambda x, y: x.sum(-1) + y, r(4, 5, dtype=i32), r(4))


# -- blocks, forward and backward (AOTAutograd) ---------------------------------------------------


def mlp(x, w1, b1, w2, b2):
    return F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)


def mlp_gelu(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def attention(q, k, v):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return s.softmax(-1) @ v


def attention_masked(q, k, v):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
    return s.masked_fill(~mask, float("-inf")).softmax(-1) @ v


def conv_bn_relu(x, w, gamma, beta):
    y = F.conv2d(x, w, padding=1)
    return F.relu(F.batch_norm(y, None, None, gamma, beta, training=True))


def transformer_block(x, w, b, wq, wo):
    h = F.layer_norm(x, (x.shape[-1],), w, b)
    q = h @ wq
    a = (q @ q.transpose(-1, -2) / 4.0).softmax(-1) @ q
    return x + F.gelu(a @ wo)


block("mlp", mlp, r(8, 16), r(32, 16), r(32), r(4, 32), r(4))
block("mlp-gelu", mlp_gelu, r(8, 16), r(32, 16), r(32), r(4, 32), r(4))
block("attention", attention, r(2, 6, 8), r(2, 6, 8), r(2, 6, 8))
block("attention-masked", attention_masked, r(2, 6, 8), r(2, 6, 8), r(2, 6, 8))
block("layer_norm", lambda x, w, b: F.layer_norm(x, (16,), w, b), r(4, 5, 16), r(16), r(16))
block("softmax", lambda x: x.softmax(-1) * x, r(4, 16))
block("log_softmax", lambda x: x.log_softmax(-1), r(4, 16))
block("gelu", F.gelu, r(4, 16))
block("gelu-tanh", lambda x: F.gelu(x, approximate="tanh"), r(4, 16))
block("silu-sigmoid-tanh", lambda x: F.silu(x) + x.sigmoid() * x.tanh(), r(4, 16))
block("conv-bn-relu", conv_bn_relu, r(2, 3, 6, 6), r(4, 3, 3, 3), pos(4), r(4))
# ResNet's stem: the indices computed by kiln feed torch's max_pool2d_with_indices_backward
block("conv-relu-maxpool", lambda x, w: F.max_pool2d(F.relu(F.conv2d(x, w, padding=1)), 3, 2, 1),
      r(2, 3, 8, 8), r(4, 3, 3, 3))
# Inference batch norm inside a training graph: on CUDA its save_mean/save_invstd are per channel.
block("bn-eval-relu", lambda x, rm, rv, w, b: F.relu(F.batch_norm(x, rm.detach(), rv.detach(), w, b, training=False)),
      r(2, 4, 5, 5), r(4), pos(4), r(4), r(4))
block("transformer", transformer_block, r(2, 4, 16), pos(16), r(16), r(16, 16), r(16, 16))
block("cross-entropy-free", lambda x, t: -(x.log_softmax(-1) * t).sum(-1).mean(), r(4, 10), r(4, 10))
block("cross-entropy", lambda x, t: F.cross_entropy(x, t), r(6, 10), NLL_T)
block("cross-entropy-weighted", lambda x, t, w: F.cross_entropy(x, t, weight=w.detach(), ignore_index=3),
      r(6, 10), NLL_T, pos(10))
block("mse-loss", lambda x, w, t: F.mse_loss(x @ w, t), r(4, 8), r(8, 6), r(4, 6))
block("var-mean", lambda x: (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True) + 1e-5).sqrt(), r(4, 16))


# -- capture, compile, run ------------------------------------------------------------------------


def capture_aot(fn, inputs):
    from torch._functorch.aot_autograd import aot_function, make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    graphs = {}

    def compiler(kind):
        def compile_fn(gm, example_inputs):
            graphs[kind] = (gm, list(example_inputs))
            inner = make_boxed_func(gm)

            def run(args):  # the first call's integer tensors replace the fake ones (see trace)
                examples = graphs[kind][1]
                graphs[kind] = (gm, [a.detach().clone() if isinstance(e, torch._subclasses.FakeTensor)
                                     and e.dtype == torch.int64 else e for e, a in zip(examples, args)])
                return inner(args)

            run._boxed_call = True
            return run
        return compile_fn

    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    f = aot_function(fn, fw_compiler=compiler("fw"), bw_compiler=compiler("bw"),
                     partition_fn=min_cut_rematerialization_partition)
    out = f(*leaves)
    outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if o.requires_grad]
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    return graphs


def trace(name):
    mode, fn, specs = CASES[name]
    g = torch.Generator().manual_seed(0)
    inputs = [to_device(s(g)) for s in specs]
    with torch.device(DEVICE):  # factory calls in the cases (arange, ones, ...) land on DEVICE
        if mode == "fx":
            gm = make_fx(fn, tracing_mode="fake")(*inputs)  # "real" records views at offset 0
            kind = proto.GRAPH_KIND_INFERENCE
        else:
            gm, inputs = capture_aot(fn, inputs)[mode]
            kind = proto.GRAPH_KIND_FORWARD if mode == "fw" else proto.GRAPH_KIND_BACKWARD
    g1 = torch.Generator().manual_seed(1)
    if mode == "fx":
        fresh = [to_device(s(g1)) for s in specs]
    else:
        # Integer tensors of these graphs are positions (max_pool2d's saved indices, class
        # targets): those of the capture's real run, where random values would make torch's own
        # kernels read out of bounds, and indices outside their window would be scattered by
        # torch's CPU kernel but ignored by its CUDA kernel (and kiln's, which gather).
        fresh = [t.clone() if isinstance(t, torch.Tensor) and t.dtype == torch.int64 else fresh_like(t, g1)
                 for t in inputs]
    return gm, request_for(gm, name, kind), fresh


# Every graph also compiles for these CUDA architectures with NVRTC (no GPU needed: kilnd
# compiles for GPUs it does not have). Their numerics are checked on the GPU machine (tests/gpu/).
CUDA_ARCHS = ("sm_80", "sm_90")
# Cases whose CUDA plan has two more kernels than the CPU plan (SplitFewRowSoftmax; a pointwise
# producer of the logits fuses into the partials and the pointwise pass, as into the CPU's row).
SPLIT_SOFTMAX = {"log_softmax-131072", "softmax-split-few-long-rows", "bf16-softmax-split-few-long-rows",
                 "log_softmax-split-dim0", "softmax-split-inf-rows", "log_softmax-split-scaled",
                 "softmax-split-pos-inf"}
# Cases split so only where the arch has no clusters (sm_80; LowerOptions::gpu_clusters).
SPLIT_SOFTMAX_WITHOUT_CLUSTERS = {"softmax-cluster-rows", "log_softmax-cluster-rows"}
NVRTC = os.environ.get("KILN_NVRTC_PATH", "")
REQUIRE_NVRTC = os.environ.get("KILN_REQUIRE_NVRTC") == "1"
if DEVICE.startswith("cuda"):  # eager references in full fp32, like kiln's kernels
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def cuda_request(request, arch):
    cuda = proto.CompileRequest()
    cuda.CopyFrom(request)
    cuda.target.Clear()
    cuda.target.device = proto.DEVICE_KIND_CUDA
    cuda.target.cuda_arch = arch
    return cuda


class Corpus:
    def __init__(self):
        self.server = Kilnd("--compile_workers=2")
        self.client = KilnClient(self.server.address)
        self.pool = concurrent.futures.ThreadPoolExecutor(4)
        self.entries = {}
        self.cuda = {}  # name -> {arch: future}
        self.summary = Summary()
        for name in CASES:
            try:
                gm, request, fresh = trace(name)
            except Exception as e:  # a capture problem is this graph's failure, not the module's
                self.entries[name] = e
                continue
            future = self.pool.submit(self.client.compile, request, timeout=300)
            self.entries[name] = (gm, request, fresh, future)
        if (NVRTC or REQUIRE_NVRTC) and DEVICE == "cpu":
            for name, entry in self.entries.items():
                if not isinstance(entry, Exception):
                    self.cuda[name] = {arch: self.pool.submit(self.client.compile, cuda_request(entry[1], arch),
                                                              timeout=300) for arch in CUDA_ARCHS}

    def close(self):
        self.pool.shutdown()
        self.client.close()
        SUMMARIES.append(self.summary.table())
        return self.server.stop()


@pytest.fixture(scope="module")
def corpus():
    c = Corpus()
    yield c
    assert c.close() == 0


def test_corpus_size():
    assert len(CASES) >= 150, len(CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_graph(corpus, name):
    entry = corpus.entries[name]
    if isinstance(entry, Exception):
        raise entry
    gm, request, fresh, future = entry
    response = future.result()
    assert response.source in OK_SOURCES, proto.CacheSource.Name(response.source)
    corpus.summary.add(response.artifact.plan)
    want = gm(*[t.clone() if isinstance(t, torch.Tensor) else t for t in fresh])
    got = run_plan(response, request, fresh)
    wide = upcast(fresh)
    compare(got, want, name, gold=(lambda: gold_run(gm, wide)) if wide is not None else None)


def gold_run(gm, wide):
    """The graph on float64 inputs. Some CUDA kernels refuse mixed dtypes that the CPU ones accept
    (e.g. _softmax_backward_data's float32 input_dtype with float64 tensors): then on the CPU."""
    try:
        return gm(*wide)
    except RuntimeError:
        if DEVICE == "cpu":
            raise
        out = gm(*[t.cpu() if isinstance(t, torch.Tensor) else t for t in wide])
        return [o.to(DEVICE) if isinstance(o, torch.Tensor) else o for o in flatten(out)]


GEMMS = ("aten.mm.default", "aten.bmm.default", "aten.addmm.default", "aten.baddbmm.default")
GEMM_DTYPES = (proto.DTYPE_FLOAT32, proto.DTYPE_FLOAT16, proto.DTYPE_BFLOAT16)


def _ints(xs):
    return [x.constant for x in xs]


def _plain_matrix(meta):
    """Contiguous, or contiguous with its last two dims swapped (t(), transpose(-2, -1))."""
    sizes, strides = _ints(meta.sizes), _ints(meta.strides)
    want = torch.empty(sizes, device="meta").stride()
    swapped = torch.empty(sizes[:-2] + sizes[-2:][::-1], device="meta").transpose(-2, -1).stride()
    return all(sizes) and (tuple(strides) in (tuple(want), tuple(swapped)) or 1 in sizes[-2:])


def cublas_expected(cpu_plan, step):
    """Whether kilnd must plan this CPU aten GEMM as a cuBLASLt library step for CUDA: its operands
    are plain matrices of one float dtype, and addmm's self is a bias vector (beta 1) or the
    result's shape (a subset of what gemm_step.h accepts)."""
    if step.target not in GEMMS:
        return False
    values = [cpu_plan.values[int(a.node[1:])] for a in step.args if a.WhichOneof("value") == "node"]
    if len({v.meta.dtype for v in values}) != 1 or values[0].meta.dtype not in GEMM_DTYPES:
        return False
    for kw in step.kwargs:  # beta, alpha
        kind = kw.value.WhichOneof("value")
        if kind not in ("int_value", "float_value") or getattr(kw.value, kind) != 1:
            return False
    if step.target.startswith("aten.add") or step.target.startswith("aten.badd"):
        self_sizes = _ints(values[0].meta.sizes)
        out_sizes = _ints(cpu_plan.values[step.outputs[0]].meta.sizes)
        if not (self_sizes == out_sizes and _plain_matrix(values[0].meta) and
                _ints(values[0].meta.strides) == list(torch.empty(out_sizes, device="meta").stride())):
            if len(self_sizes) != 1 or _ints(values[0].meta.strides) != [1] or step.target != GEMMS[2]:
                return False
        values = values[1:]
    return all(_plain_matrix(v.meta) for v in values)


def check_library_step(plan, step, cpu_plan, cpu_step, where):
    """A cuBLASLt step in place of the CPU plan's aten GEMM: same result shape and dtype, params
    that agree with it."""
    lib = step.library
    assert lib.function == "cublasLt.matmul", where
    assert len(lib.int_params) == 18 and len(lib.float_params) == 2 and len(lib.args) == 5, where
    d = plan.values[lib.args[0]].meta
    want = cpu_plan.values[cpu_step.outputs[0]].meta
    assert _ints(d.sizes) == _ints(want.sizes) and d.dtype == want.dtype, where
    batch, m, n = lib.int_params[:3]
    assert [batch, m, n][3 - len(d.sizes):] == _ints(d.sizes) and lib.int_params[4] == d.dtype, where
    assert plan.values[lib.args[0]].storage in (proto.PlanValue.STORAGE_OUTPUT, proto.PlanValue.STORAGE_WORKSPACE)


@pytest.mark.parametrize("name", list(CASES))
def test_graph_compiles_for_cuda(corpus, name):
    """The same graph compiled for sm_80 and sm_90: cubins, the steps of the CPU plan (with cuBLASLt
    library steps in place of the aten GEMMs that cuBLASLt can express), and a launch (grid,
    block) for every kernel step."""
    if name not in corpus.cuda:
        if isinstance(corpus.entries[name], Exception):
            raise corpus.entries[name]
        if DEVICE != "cpu":
            pytest.skip("the corpus runs on CUDA itself here (KILN_CORPUS_DEVICE)")
        pytest.skip("KILN_NVRTC_PATH is not set: kilnd has no NVRTC here (CI sets it)")
    cpu_plan = corpus.entries[name][3].result().artifact.plan
    for arch, future in corpus.cuda[name].items():
        response = future.result()
        assert response.source in OK_SOURCES, proto.CacheSource.Name(response.source)
        artifact = response.artifact
        plan = artifact.plan
        # Kernel steps may be more on GPUs (softmaxes over few long rows split in three); the
        # other steps line up one to one.
        kernels = [s for s in plan.steps if s.WhichOneof("kind") == "kernel"]
        cpu_kernels = [c for c in cpu_plan.steps if c.WhichOneof("kind") == "kernel"]
        split = name in SPLIT_SOFTMAX or (name in SPLIT_SOFTMAX_WITHOUT_CLUSTERS and arch == "sm_80")
        expected = len(cpu_kernels) + (2 if split else 0)
        assert len(kernels) == expected, (arch, len(kernels), expected)
        steps = [s for s in plan.steps if s.WhichOneof("kind") != "kernel"]
        cpu_steps = [c for c in cpu_plan.steps if c.WhichOneof("kind") != "kernel"]
        assert len(steps) == len(cpu_steps), arch
        for i, (s, c) in enumerate(zip(steps, cpu_steps)):
            kind, cpu_kind = s.WhichOneof("kind"), c.WhichOneof("kind")
            where = f"{arch} step {i}: {cpu_kind} {c.aten.target if cpu_kind == 'aten' else ''}"
            if kind == "library":
                assert cpu_kind == "aten" and c.aten.target in GEMMS, where
                check_library_step(plan, s, cpu_plan, c.aten, where)
            else:
                assert kind == cpu_kind, where
                assert not (kind == "aten" and cublas_expected(cpu_plan, c.aten)), f"{where}: cuBLASLt expected"
        assert all(b.kind == proto.Binary.KIND_CUBIN and b.data[:4] == b"\x7fELF" for b in artifact.binaries)
        for s in plan.steps:
            if s.WhichOneof("kind") == "kernel":
                k = s.kernel
                assert 0 <= k.binary < len(artifact.binaries), (arch, k.symbol)
                assert k.symbol.encode() in artifact.binaries[k.binary].data, (arch, k.symbol)
                assert len(k.grid) == 1 and k.grid[0] >= 1 and len(k.block) == 1 and k.block[0] % 32 == 0
