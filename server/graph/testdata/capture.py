"""Regenerates the graph corpus in this folder: real AOTAutograd forward/backward graphs of small
models, serialized by the kiln Python client (stack traces dropped to keep the files small).

    .venv/bin/python server/graph/testdata/capture.py server/graph/testdata          # CPU graphs
    python3 capture.py OUT_DIR cuda     # on a CUDA machine: CUDA graphs, files named *_cuda_*

Needs torch (2.13.0 CPU here) and client/python. After regenerating, run
//server/graph:corpus_test and copy the key lines it prints into keys.txt if the change is intended.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../client/python"))
from kiln import proto
from kiln.serialize import serialize_graph
from torch._dynamo.backends.common import aot_autograd
from functorch.compile import make_boxed_func

OUT = sys.argv[1]
DEVICE = sys.argv[2] if len(sys.argv) > 2 else "cpu"
torch.set_default_device(DEVICE)
graphs = []

def make_backend(tag):
    def compiler(kind):
        def fn(gm, example_inputs):
            g = serialize_graph(gm, example_inputs, kind=kind, debug_name=f"{tag} {len(graphs)}")
            req = proto.CompileRequest()
            req.graph.CopyFrom(g)
            if DEVICE == "cuda":
                req.target.device = proto.DEVICE_KIND_CUDA
                req.target.cuda_arch = "sm_90"
            else:
                req.target.device = proto.DEVICE_KIND_CPU
                req.target.cpu_isa = "x86-64-v3"
            for n in req.graph.nodes:
                n.debug.stack_trace = ""
            name = tag + ("_cuda" if DEVICE == "cuda" else "") + ("_fwd" if kind == proto.GRAPH_KIND_FORWARD else "_bwd")
            graphs.append(name)
            with open(os.path.join(OUT, name + ".binpb"), "wb") as f:
                f.write(req.SerializeToString())
            return make_boxed_func(gm.forward)
        return fn
    return aot_autograd(fw_compiler=compiler(proto.GRAPH_KIND_FORWARD), bw_compiler=compiler(proto.GRAPH_KIND_BACKWARD))

class Mlp(nn.Module):
    def __init__(s):
        super().__init__(); s.a = nn.Linear(64, 128); s.b = nn.Linear(128, 10); s.d = nn.Dropout(0.1)
    def forward(s, x): return F.log_softmax(s.b(s.d(F.gelu(s.a(x)))), -1)

class Block(nn.Module):
    def __init__(s, d=64, h=4):
        super().__init__(); s.h = h; s.ln1 = nn.LayerNorm(d); s.qkv = nn.Linear(d, 3 * d); s.o = nn.Linear(d, d)
        s.ln2 = nn.LayerNorm(d); s.f1 = nn.Linear(d, 4 * d); s.f2 = nn.Linear(4 * d, d)
    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=-1)
        q = q.view(B, T, s.h, C // s.h).transpose(1, 2)
        k = k.view(B, T, s.h, C // s.h).transpose(1, 2)
        v = v.view(B, T, s.h, C // s.h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (C // s.h) ** 0.5)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + s.o(y)
        return x + s.f2(F.silu(s.f1(s.ln2(x))))

class Conv(nn.Module):
    def __init__(s):
        super().__init__(); s.c1 = nn.Conv2d(3, 16, 3, padding=1); s.bn = nn.BatchNorm2d(16); s.c2 = nn.Conv2d(16, 8, 3, stride=2)
        s.fc = nn.Linear(8, 10)
    def forward(s, x):
        x = F.max_pool2d(F.relu(s.bn(s.c1(x))), 2)
        x = F.relu(s.c2(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return s.fc(x)

class Emb(nn.Module):
    def __init__(s):
        super().__init__(); s.e = nn.Embedding(100, 32); s.l = nn.Linear(32, 100)
    def forward(s, idx, tgt):
        h = s.e(idx)
        h = h - h.mean(-1, keepdim=True)
        h = h * torch.rsqrt(h.var(-1, keepdim=True, unbiased=False) + 1e-5)
        logits = s.l(h)
        return F.cross_entropy(logits.view(-1, 100), tgt.view(-1))

def run(tag, model, *inputs, dynamic=False):
    torch._dynamo.reset()
    m = torch.compile(model, backend=make_backend(tag), dynamic=dynamic)
    out = m(*inputs)
    out = out if isinstance(out, torch.Tensor) else out[0]
    out.float().sum().backward()

torch.manual_seed(0)
run("mlp", Mlp(), torch.randn(32, 64))
run("block", Block(), torch.randn(2, 16, 64))
run("conv", Conv(), torch.randn(4, 3, 32, 32))
run("conv_cl", Conv().to(memory_format=torch.channels_last), torch.randn(4, 3, 32, 32).to(memory_format=torch.channels_last))
run("emb", Emb(), torch.randint(0, 100, (4, 8)), torch.randint(0, 100, (4, 8)))
run("block_bf16", Block().to(torch.bfloat16), torch.randn(2, 16, 64, dtype=torch.bfloat16))
run("mlp_dyn", Mlp(), torch.randn(32, 64), dynamic=True)
run("block_dyn", Block(), torch.randn(2, 16, 64), dynamic=True)
def fn_zoo1(x, y, i):
    a = torch.where(x > 0, x, 0.5 * y) + x.pow(2).mean(-1, keepdim=True).rsqrt()
    b = torch.clamp(a, min=-1.0, max=2) * F.gelu(y, approximate="tanh") - torch.sigmoid(x) / (y.abs() + 1)
    c = torch.cat([a, b], dim=1).softmax(0) + torch.stack([x, y], 2).sum(2)[:, :1].expand(-1, 16).repeat(1, 2)
    d = torch.gather(c, 1, i) + c.argmax(1, keepdim=True).float() + c.cumsum(1)[:, -1:]
    e = x[:, ::2] * y[:, 1::2] + x.t().contiguous().t()[:, :8] + x.unsqueeze(0).squeeze(0)[:, 8:]
    f = (x.int() // 3 + (x.long() % 5)).float() + x.to(torch.float16).float() + torch.maximum(x, y) + x.lerp(y, 0.3)
    return d.sum() + e.sum() + f.sum() + torch.addcmul(x, x, y, value=0.5).amax() + x.var(0, correction=1).sum() + x.std().sum()

def fn_zoo2(x, w, t):
    h = F.conv_transpose2d(x, w, stride=2, padding=1)
    g = F.group_norm(h, 2)
    p = F.avg_pool2d(g, 2) + F.max_pool2d(g, 3, stride=2, padding=1)[..., :p_size(g), :p_size(g)] if False else F.avg_pool2d(g, 2)
    q = F.silu(p).flatten(1)
    loss = F.cross_entropy(q[:, :10], t, label_smoothing=0.1, ignore_index=3)
    return loss + F.mse_loss(q, torch.zeros_like(q)) + F.softplus(q).mean() + F.leaky_relu(q, 0.2).sum() + F.hardtanh(q).sum()

def fn_zoo3(x, idx, m):
    a = x[idx] + x.index_select(0, idx)
    b = x.masked_fill(m, 0.0).tril(1).triu(-1)
    c = torch.bmm(x.unsqueeze(0).expand(3, -1, -1), x.t().unsqueeze(0).expand(3, -1, -1))
    u = x.unbind(0)
    ch = x.chunk(4, dim=1)
    s = x.split([3, 13], dim=1)
    n = x.narrow(1, 2, 5).select(0, 1)
    return a.sum() + b.sum() + c.sum() + u[1].sum() + ch[2].sum() + s[1].sum() + n.sum() + torch.einsum("ij,kj->ik", x, x).sum() + F.normalize(x, dim=-1).sum() + x.logsumexp(-1).sum() + x.max(1).values.sum() + x.min().sum() + (x != 0).any().float() + x.prod(1).sum()

def fn_bn_eval(x, bn):
    return F.relu(bn(x)).mean((2, 3))

def grad(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, requires_grad=True)
run("zoo1", fn_zoo1, grad(8, 16), grad(8, 16), torch.randint(0, 32, (8, 3)))
run("zoo2", fn_zoo2, grad(2, 4, 8, 8), grad(4, 6, 3, 3), torch.randint(0, 10, (2,)))
run("zoo3", fn_zoo3, grad(16, 16), torch.randint(0, 16, (5,)), torch.rand(16, 16) > 0.5)
bn = nn.BatchNorm2d(3).eval()
run("bn_eval", lambda x: fn_bn_eval(x, bn), grad(2, 3, 4, 4))
run("zoo1_dyn", fn_zoo1, grad(8, 16), grad(8, 16), torch.randint(0, 32, (8, 3)), dynamic=True)
run("zoo3_dyn", fn_zoo3, grad(16, 16), torch.randint(0, 16, (5,)), torch.rand(16, 16) > 0.5, dynamic=True)
class Attn(nn.Module):
    def __init__(s):
        super().__init__(); s.m = nn.MultiheadAttention(32, 4, batch_first=True); s.n = nn.RMSNorm(32) if hasattr(nn, "RMSNorm") else nn.LayerNorm(32)
    def forward(s, x):
        y, _ = s.m(x, x, x, need_weights=False)
        return s.n(x + y)

class Sdpa(nn.Module):
    def __init__(s):
        super().__init__(); s.q = nn.Linear(32, 96)
    def forward(s, x):
        q, k, v = s.q(x).view(2, 8, 3, 4, 8).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 8, 32)

class Rnn(nn.Module):
    def __init__(s):
        super().__init__(); s.c = nn.GRUCell(16, 16); s.l = nn.LSTMCell(16, 16)
    def forward(s, x):
        h = torch.zeros(4, 16); c = torch.zeros(4, 16)
        for t in range(3):
            h = s.c(x[:, t], h); h2, c = s.l(x[:, t], (h, c))
        return h + h2

def autocast_mlp(x, w1, w2):
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        return (F.relu(x @ w1) @ w2).float().softmax(-1)

def infer_fn(x, w):
    return F.layer_norm(F.linear(x, w).gelu() if False else F.gelu(F.linear(x, w)), (16,)).sum(-1)

run("attn", Attn(), torch.randn(2, 8, 32))
run("sdpa", Sdpa(), torch.randn(2, 8, 32))
run("rnn", Rnn(), torch.randn(4, 3, 16))
run("autocast", autocast_mlp, grad(8, 16), grad(16, 32), grad(32, 8))
with torch.no_grad():
    torch._dynamo.reset()
    m = torch.compile(infer_fn, backend=make_backend("inference"))
    m(torch.randn(4, 8), torch.randn(16, 8))
x = torch.randn(6, 16, 64); torch._dynamo.mark_dynamic(x, 0)
run("block_batchdyn", Block(), x)
print("\n".join(graphs))
