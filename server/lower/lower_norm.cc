// Normalization ops -> RowOps: native_layer_norm_backward, batch norm (training, functional
// running-stat updates, inference) and its backward (see lower.h and op_graph.h).

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/graph/op_registry.h"
#include "server/base/status_macros.h"
#include "server/lower/lower_internal.h"

namespace kiln::lower::internal {

using graph::Arg;
using graph::Node;
using graph::Type;
using k::AccField;
using k::AccKind;
using k::ExprOr;
using k::ScalarType;

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?, mask):
// grad_input is one kernel per row (sums of g and g * xhat, g = grad_out * weight); grad_weight
// and grad_bias are one column reduction over the leading dims (sums of grad_out * xhat, grad_out),
// split into partials as a sum's (SplitFewOutputReduction) where its rows are many.
absl::Status LowerLayerNormBackward(Lowerer& l, int32_t node_index) {
  const Node& n = l.graph().nodes[node_index];
  if (n.args.size() < 8 || n.args[2].kind != Arg::Kind::kList || n.type.kind != Type::Kind::kList ||
      n.type.items.size() != 3) {
    return absl::UnimplementedError("layer norm backward arguments");
  }
  KILN_ASSIGN_OR_RETURN(const int32_t go, l.KernelValueOf(n.args[0]));
  KILN_ASSIGN_OR_RETURN(const int32_t x, l.KernelValueOf(n.args[1]));
  KILN_ASSIGN_OR_RETURN(const int32_t mean, l.KernelValueOf(n.args[3]));
  KILN_ASSIGN_OR_RETURN(const int32_t rstd, l.KernelValueOf(n.args[4]));
  int32_t w = -1;
  if (n.args[5].kind == Arg::Kind::kValue) {
    KILN_ASSIGN_OR_RETURN(w, l.KernelValueOf(n.args[5]));
  }
  // Copies: the first row op's Finish adds values, which may move l.g().values.
  const std::vector<int64_t> in_sizes = l.g().values[x].sizes;
  const ScalarType in_dtype = l.g().values[x].dtype;
  const int rank = static_cast<int>(in_sizes.size());
  const int nd = static_cast<int>(n.args[2].list.size());
  if (!k::IsFloatType(in_dtype) || nd < 1 || nd >= rank || l.g().values[go].sizes != in_sizes) {
    return absl::UnimplementedError("layer norm backward shapes");
  }
  for (int32_t s : {mean, rstd}) {
    if (l.g().values[s].sizes.size() != in_sizes.size()) return absl::UnimplementedError("layer norm stats rank");
  }
  int64_t count = 1;
  for (int d = rank - nd; d < rank; ++d) count *= in_sizes[d];
  const ScalarType ct = ComputeType(in_dtype);
  const std::vector<int64_t> ms = l.g().values[mean].sizes, rs = l.g().values[rstd].sizes;
  const std::vector<int64_t> ws = w >= 0 ? l.g().values[w].sizes : std::vector<int64_t>{};
  const ElemFn xhat = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> ExprOr {
    return k::Mul(k::Sub(LoadAs(x, ct)(ctx, idx), LoadAs(mean, ct)(ctx, BroadcastIndex(ms, idx))),
                  LoadAs(rstd, ct)(ctx, BroadcastIndex(rs, idx)));
  };
  const ElemFn gw = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> ExprOr {
    ExprOr g = LoadAs(go, ct)(ctx, idx);
    if (w >= 0) g = k::Mul(g, LoadAs(w, ct)(ctx, BroadcastIndex(ws, idx)));
    return g;
  };
  std::vector<int32_t> items(3, -1);
  auto wants = [&](int i) {
    return n.type.items[i].kind == Type::Kind::kTensor && n.args[7].kind == Arg::Kind::kList &&
           static_cast<int>(n.args[7].list.size()) == 3 && n.args[7].list[i].b;
  };
  std::vector<int32_t> inputs = {go, x, mean, rstd};
  if (w >= 0) inputs.push_back(w);
  if (wants(0)) {
    RowBuilder a{l, node_index, n, RowOp{}, {}};
    a.row.name = "native_layer_norm_backward";
    a.row.domain = in_sizes;
    for (int d = rank - nd; d < rank; ++d) a.row.reduce_dims.push_back(d);
    a.row.inputs = inputs;
    a.row.composite = true;
    a.row.accs.push_back({AccKind::kSum, ct, gw});
    a.row.accs.push_back({AccKind::kSum, ct, [=](LoadContext& ctx, const std::vector<Affine>& idx) {
                            return k::Mul(gw(ctx, idx), xhat(ctx, idx));
                          }});
    auto st = ToScalarType(n.type.items[0].tensor.dtype);
    if (!st) return absl::UnimplementedError("grad_input dtype");
    const ScalarType out = *st;
    KILN_RETURN_IF_ERROR(a.Output(0, true, [=](LoadContext& ctx, const AccReader& acc, const std::vector<Affine>& idx) {
      const ExprOr nn = LiteralF(ct, static_cast<double>(count));
      const ExprOr inner = k::Sub(k::Sub(k::Mul(nn, gw(ctx, idx)), acc(0, AccField::kValue)),
                                  k::Mul(xhat(ctx, idx), acc(1, AccField::kValue)));
      return k::Cast(out, k::Mul(k::Div(LoadAs(rstd, ct)(ctx, BroadcastIndex(rs, idx)), nn), inner));
    }));
    std::vector<int32_t> ids;
    KILN_RETURN_IF_ERROR(a.Finish(&ids));
    items[0] = ids[0];
  }
  if (wants(1) || wants(2)) {
    RowBuilder c{l, node_index, n, RowOp{}, {}};
    c.row.name = "native_layer_norm_backward_params";
    c.row.domain = in_sizes;
    for (int d = 0; d < rank - nd; ++d) c.row.reduce_dims.push_back(d);
    c.row.inputs = inputs;
    c.row.accs.push_back({AccKind::kSum, ct, [=](LoadContext& ctx, const std::vector<Affine>& idx) {
                            return k::Mul(LoadAs(go, ct)(ctx, idx), xhat(ctx, idx));
                          }});
    c.row.accs.push_back({AccKind::kSum, ct, LoadAs(go, ct)});
    std::vector<int> which;
    for (int i : {1, 2}) {
      if (!wants(i)) continue;
      auto st = ToScalarType(n.type.items[i].tensor.dtype);
      if (!st) return absl::UnimplementedError("grad_weight dtype");
      const ScalarType out = *st;
      const int acc_index = i - 1;
      KILN_RETURN_IF_ERROR(c.Output(i, false, [=](LoadContext&, const AccReader& acc, const std::vector<Affine>&) {
        return k::Cast(out, acc(acc_index, AccField::kValue));
      }));
      which.push_back(i);
    }
    KILN_RETURN_IF_ERROR(SplitFewOutputReduction(l, c));  // few columns, or GPU columns over many rows
    std::vector<int32_t> ids;
    KILN_RETURN_IF_ERROR(c.Finish(&ids));
    for (size_t j = 0; j < which.size(); ++j) items[which[j]] = ids[j];
  }
  l.SetItems(node_index, items);
  return absl::OkStatus();
}

namespace {

// A training batch norm's per-channel statistics over [N, C, H, ...] (N >= 2, at least 2
// spatial elements) take two row ops: partials over the spatial dims, per (n, c) and chunk of
// H / S rows, then per channel over the N * S partials; the per-element result is a pointwise op.
// One row op per channel gives a GPU only C rows (64 at a ResNet's stem) of N * H * W elements,
// and a channels-last input (option training_layouts on CUDA, conv_layout.h) turns it into a
// column reduction over C points. The partials of a channels-last input are a column reduction
// too, over N * S * C points, and N * C (2048 at ResNet-50's first stage, batch 32) cannot fill
// 132 SMs with blocks that read whole 128-byte lines: on GPUs S is the smallest divisor of H that
// gives SampleSplit's points (32768 forward, 8192 backward), unless a partial would keep fewer
// than 256 elements (then the largest S that keeps them). CPUs take S = 1 (their rows spread over
// the cores as well).
bool SplitsPerSample(const std::vector<int64_t>& sizes) {
  if (sizes.size() < 3 || sizes[0] < 2) return false;
  int64_t spatial = 1;
  for (size_t d = 2; d < sizes.size(); ++d) spatial *= sizes[d];
  return spatial >= 2;
}

// The cut of x [N, C, H, ...] into a split batch norm's partials: S chunks of H (see above).
struct SampleSplit {
  // Partials wanted (N * S * C). The forward's single Welford over one input gets 4x more than
  // the backward's sums over two: on the H200 (ResNet-50 bf16 training, B32), the forward's
  // 32 x 256 x 56 x 56 partials took 30 us a launch at 8192 (a block row narrowed to 64 bytes
  // to fill the SMs) and 22 us at 32768, while the backward's went from 24 to 31 us.
  static constexpr int64_t kForwardPoints = 32768;
  static constexpr int64_t kBackwardPoints = 8192;
  static constexpr int64_t kMinElements = 256;  // elements a partial keeps at least

  std::vector<int64_t> sizes;  // x's
  int64_t chunks = 1;          // S, a divisor of H

  SampleSplit(const std::vector<int64_t>& x_sizes, bool gpu, int64_t points) : sizes(x_sizes) {
    if (!gpu) return;
    const int64_t h = sizes[2], samples_by_channels = sizes[0] * sizes[1];
    int64_t row = 1;  // elements per row of H
    for (size_t d = 3; d < sizes.size(); ++d) row *= sizes[d];
    // The divisors s of H in turn, while the points are too few and (H / s) * row >= 256.
    for (int64_t s = 2; samples_by_channels * chunks < points && s * kMinElements <= h * row; ++s) {
      if (h % s == 0) chunks = s;
    }
  }

  // The partial row op's domain, its first Outer() dims parallel: [N, C, H, ...], or with S > 1
  // [N, S, C, H / S, ...] (C the last outer dim: the stride-1 dim of channels-last loads).
  std::vector<int64_t> Domain() const {
    std::vector<int64_t> d = sizes;
    if (chunks > 1) {
      d[2] /= chunks;
      d.insert(d.begin() + 1, chunks);
    }
    return d;
  }
  int Outer() const { return chunks > 1 ? 3 : 2; }
  // The partials' shape: [N, C] or [N, S, C].
  std::vector<int64_t> Partials() const {
    const std::vector<int64_t> d = Domain();
    return {d.begin(), d.begin() + Outer()};
  }
  // Elements per partial.
  int64_t Count() const {
    int64_t c = 1;
    for (size_t d = 2; d < sizes.size(); ++d) c *= sizes[d];
    return c / chunks;
  }
  // f, which reads at x's index, at a domain index: [n, s, c, h, ...] -> [n, c, s * H / S + h, ...].
  ElemFn AtDomain(ElemFn f) const {
    if (chunks == 1) return f;
    return [f = std::move(f), rows = sizes[2] / chunks](LoadContext& ctx, const std::vector<Affine>& idx) {
      std::vector<Affine> at = {idx[0], idx[2], AffAdd(AffScale(idx[1], rows), idx[3])};
      at.insert(at.end(), idx.begin() + 4, idx.end());
      return f(ctx, at);
    };
  }
};

// The partial row op of a split batch norm: over x ([N, C, spatial...]) cut as `split` says, the
// accumulators `accs` (at x's index); `fields` (accumulator, field) become split.Partials() values
// of `dtype`.
absl::StatusOr<std::vector<int32_t>> PerSamplePartials(Lowerer& l, int32_t node_index, const Node& n,
                                                       const SampleSplit& split, std::vector<int32_t> inputs,
                                                       std::vector<RowAcc> accs,
                                                       const std::vector<std::pair<int, AccField>>& fields,
                                                       graph::DType dtype, const std::string& name) {
  RowBuilder pb{l, node_index, n, RowOp{}, {}};
  pb.row.name = name;
  pb.row.domain = split.Domain();
  for (int d = split.Outer(); d < static_cast<int>(pb.row.domain.size()); ++d) pb.row.reduce_dims.push_back(d);
  pb.row.inputs = std::move(inputs);
  for (RowAcc& a : accs) a.value = split.AtDomain(std::move(a.value));
  pb.row.accs = std::move(accs);
  for (const auto& [acc, field] : fields) {
    KILN_ASSIGN_OR_RETURN(LValue v, NewRowValue(l, pb, dtype, split.Partials(), name));
    pb.outs.push_back(std::move(v));
    RowOutput o;
    o.fn = [acc = acc, field = field](LoadContext&, const AccReader& a, const std::vector<Affine>&) { return a(acc, field); };
    pb.row.outputs.push_back(std::move(o));
  }
  std::vector<int32_t> ids;
  KILN_RETURN_IF_ERROR(pb.Finish(&ids));
  return ids;
}

// The per-channel combine of a split batch norm: a row op over the partials `inputs`
// (split.Partials(), read at the domain's index), folding all but the channel dim (the last) into
// the accumulators `accs`; the caller adds its outputs ([C], at their own index).
RowBuilder PerChannelCombine(Lowerer& l, int32_t node_index, const Node& n, const SampleSplit& split,
                             const std::string& name, std::vector<int32_t> inputs, std::vector<RowAcc> accs) {
  RowBuilder cb{l, node_index, n, RowOp{}, {}};
  cb.row.name = name;
  cb.row.domain = split.Partials();
  for (int d = 0; d + 1 < split.Outer(); ++d) cb.row.reduce_dims.push_back(d);
  cb.row.inputs = std::move(inputs);
  cb.row.accs = std::move(accs);
  return cb;
}

}  // namespace

// Batch norm over the channel dim 1 of [N, C, ...]: the statistics reduce every other dim.
//   _native_batch_norm_legit_functional(x, w?, b?, running_mean, running_var, training, momentum,
//     eps) -> (out, save_mean, save_invstd, new_running_mean, new_running_var): one kernel per
//     channel (Welford in phase 0, out in phase 1, the per-channel results in the body);
//   _native_batch_norm_legit_no_training(x, w?, b?, rm, rv, momentum, eps) -> (out, empty, empty):
//     pointwise (the empty results are not values);
//   native_batch_norm_backward(go, x, w?, rm?, rv?, save_mean?, save_invstd?, train, eps, mask)
//     -> (grad_input, grad_weight, grad_bias): one kernel per channel (sums of go, go * xhat).
absl::Status LowerBatchNorm(Lowerer& l, int32_t node_index) {
  const Node& n = l.graph().nodes[node_index];
  const std::string& name = n.op->schema.name;
  const bool bwd = name == "native_batch_norm_backward";
  const size_t want_items = name == "_native_batch_norm_legit_functional" ? 5 : 3;
  if (n.type.kind != Type::Kind::kList || n.type.items.size() != want_items) {
    return absl::UnimplementedError("batch norm result");
  }
  auto opt = [&](int i) -> absl::StatusOr<int32_t> {
    if (i >= static_cast<int>(n.args.size()) || n.args[i].kind == Arg::Kind::kNone) return -1;
    return l.KernelValueOf(n.args[i]);
  };
  auto real = [&](int i) -> double {
    const Arg& a = n.args[i];
    return a.kind == Arg::Kind::kFloat ? a.f : static_cast<double>(a.i);
  };
  const int xi = bwd ? 1 : 0;
  KILN_ASSIGN_OR_RETURN(const int32_t x, l.KernelValueOf(n.args[xi]));
  // Copies: adding values (l.Add, RowBuilder::Finish) may move l.g().values.
  const std::vector<int64_t> in_sizes = l.g().values[x].sizes;
  const ScalarType in_dtype = l.g().values[x].dtype;
  const int rank = static_cast<int>(in_sizes.size());
  if (rank < 2 || !k::IsFloatType(in_dtype)) return absl::UnimplementedError("batch norm input");
  const int64_t channels = in_sizes[1];
  int64_t count = 1;
  std::vector<int> reduce;
  for (int d = 0; d < rank; ++d) {
    if (d == 1) continue;
    reduce.push_back(d);
    count *= in_sizes[d];
  }
  const ScalarType ct = ComputeType(in_dtype);
  // Per-channel vectors are read at [c]: from a domain index, or from a body index [c] / [1, c, 1..].
  auto chan = [](const std::vector<Affine>& idx) { return std::vector<Affine>{idx.size() == 1 ? idx[0] : idx[1]}; };
  auto per_channel = [&](int32_t v) -> bool {
    return v < 0 || l.g().values[v].sizes == std::vector<int64_t>{channels};
  };
  auto out_type = [&](int i) -> absl::StatusOr<ScalarType> {
    if (n.type.items[i].kind != Type::Kind::kTensor) return absl::UnimplementedError("batch norm item");
    auto st = ToScalarType(n.type.items[i].tensor.dtype);
    if (!st) return absl::UnimplementedError("batch norm dtype");
    return *st;
  };
  if (!bwd) {
    KILN_ASSIGN_OR_RETURN(const int32_t w, opt(1));
    KILN_ASSIGN_OR_RETURN(const int32_t b, opt(2));
    KILN_ASSIGN_OR_RETURN(const int32_t rm, opt(3));
    KILN_ASSIGN_OR_RETURN(const int32_t rv, opt(4));
    const bool training = name == "_native_batch_norm_legit_functional";
    if (training && n.args[5].kind == Arg::Kind::kBool && !n.args[5].b) {
      return absl::UnimplementedError("functional batch norm with training=False");
    }
    const double momentum = real(training ? 6 : 5), eps = real(training ? 7 : 6);
    if (!per_channel(w) || !per_channel(b) || rm < 0 || rv < 0 || !per_channel(rm) || !per_channel(rv)) {
      return absl::UnimplementedError("batch norm parameter shapes");
    }
    KILN_ASSIGN_OR_RETURN(const ScalarType out, out_type(0));
    auto affine = [=](LoadContext& ctx, const std::vector<Affine>& idx, ExprOr y) -> ExprOr {
      if (w >= 0) y = k::Mul(y, LoadAs(w, ct)(ctx, chan(idx)));
      if (b >= 0) y = k::Add(y, LoadAs(b, ct)(ctx, chan(idx)));
      return k::Cast(out, y);
    };
    if (!training) {
      KILN_ASSIGN_OR_RETURN(LValue v, l.NewValue(node_index, n.type.items[0].tensor, ValueKind::kPointwise));
      if (v.sizes != in_sizes) return absl::UnimplementedError("batch norm output shape");
      v.op = "batch_norm";
      v.inputs = {x, rm, rv};
      if (w >= 0) v.inputs.push_back(w);
      if (b >= 0) v.inputs.push_back(b);
      v.elem = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> ExprOr {
        const ExprOr invstd = k::Unary(k::UnaryOp::kRsqrt, k::Add(LoadAs(rv, ct)(ctx, chan(idx)), LiteralF(ct, eps)));
        return affine(ctx, idx, k::Mul(k::Sub(LoadAs(x, ct)(ctx, idx), LoadAs(rm, ct)(ctx, chan(idx))), invstd));
      };
      std::vector<int32_t> items = {l.Add(std::move(v)), -1, -1};
      // save_mean / save_invstd: empty on CPU; on CUDA (torch's own rule) the running mean and
      // 1 / sqrt(running_var + eps), per channel.
      for (int i : {1, 2}) {
        if (n.type.items[i].kind != Type::Kind::kTensor) continue;
        KILN_ASSIGN_OR_RETURN(LValue e, l.NewValue(node_index, n.type.items[i].tensor, ValueKind::kPointwise));
        const ScalarType et = e.dtype;
        if (e.numel() == 0) {
          e.op = "empty";
          e.cheap = true;
          e.elem = [et](LoadContext&, const std::vector<Affine>&) { return k::Cast(et, k::ConstInt(ScalarType::kInt64, 0)); };
        } else if (e.sizes == std::vector<int64_t>{channels} && k::IsFloatType(et)) {
          e.op = i == 1 ? "batch_norm_save_mean" : "batch_norm_save_invstd";
          e.inputs = {i == 1 ? rm : rv};
          if (i == 1) {
            e.elem = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> ExprOr {
              return k::Cast(et, LoadAs(rm, ct)(ctx, chan(idx)));
            };
          } else {
            e.elem = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> ExprOr {
              const ExprOr sd = k::Unary(k::UnaryOp::kSqrt, k::Add(LoadAs(rv, ct)(ctx, chan(idx)), LiteralF(ct, eps)));
              return k::Cast(et, k::Div(LiteralF(ct, 1.0), sd));
            };
          }
        } else {
          return absl::UnimplementedError("inference batch norm statistics of an unexpected shape");
        }
        items[i] = l.Add(std::move(e));
      }
      l.SetItems(node_index, items);
      return absl::OkStatus();
    }
    std::vector<ScalarType> types;
    for (int i = 1; i < 5; ++i) {
      KILN_ASSIGN_OR_RETURN(ScalarType t, out_type(i));
      types.push_back(t);
    }
    const double unbias = count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1) : 1.0;
    // The per-channel results from the batch's mean and (biased) variance (AccReader -> expression).
    using Stat = std::function<ExprOr(const AccReader&)>;
    auto outputs = [=](RowBuilder& rb, const Stat& mean, const Stat& var) -> absl::Status {
      auto invstd = [=](const AccReader& a) { return k::Unary(k::UnaryOp::kRsqrt, k::Add(var(a), LiteralF(ct, eps))); };
      KILN_RETURN_IF_ERROR(rb.Output(1, false, [=](LoadContext&, const AccReader& a, const std::vector<Affine>&) {
        return k::Cast(types[0], mean(a));
      }));
      KILN_RETURN_IF_ERROR(rb.Output(2, false, [=](LoadContext&, const AccReader& a, const std::vector<Affine>&) {
        return k::Cast(types[1], invstd(a));
      }));
      KILN_RETURN_IF_ERROR(rb.Output(3, false, [=](LoadContext& ctx, const AccReader& a, const std::vector<Affine>& idx) {
        return k::Cast(types[2], k::Add(k::Mul(LiteralF(ct, 1 - momentum), LoadAs(rm, ct)(ctx, chan(idx))),
                                        k::Mul(LiteralF(ct, momentum), mean(a))));
      }));
      return rb.Output(4, false, [=](LoadContext& ctx, const AccReader& a, const std::vector<Affine>& idx) {
        return k::Cast(types[3], k::Add(k::Mul(LiteralF(ct, 1 - momentum), LoadAs(rv, ct)(ctx, chan(idx))),
                                        k::Mul(LiteralF(ct, momentum * unbias), var(a))));
      });
    };
    const std::optional<graph::DType> acc_dtype = ToDType(ct);
    if (SplitsPerSample(in_sizes) && acc_dtype) {
      // 1. Per (n, c) and chunk of H: Welford over the spatial dims (each over the same count).
      const SampleSplit split(in_sizes, l.options().gpu, SampleSplit::kForwardPoints);
      KILN_ASSIGN_OR_RETURN(std::vector<int32_t> parts,
                            PerSamplePartials(l, node_index, n, split, {x}, {{AccKind::kWelford, ct, LoadAs(x, ct)}},
                                              {{0, AccField::kMean}, {0, AccField::kM2}}, *acc_dtype,
                                              "batch_norm_partial"));
      // 2. Per channel, over n and the chunks: the mean of the partial means (Welford over them),
      //    and M2 = sum of the partial M2s + spatial * sum of (partial mean - mean)^2, spatial
      //    being a partial's element count.
      const double spatial = static_cast<double>(split.Count());
      RowBuilder cb = PerChannelCombine(l, node_index, n, split, "batch_norm_stats",
                                        {parts[0], parts[1], rm, rv},
                                        {{AccKind::kWelford, ct, LoadAs(parts[0], ct)}, {AccKind::kSum, ct, LoadAs(parts[1], ct)}});
      KILN_RETURN_IF_ERROR(outputs(cb, [](const AccReader& a) { return a(0, AccField::kMean); }, [=](const AccReader& a) {
        return k::Div(k::Add(a(1, AccField::kValue), k::Mul(LiteralF(ct, spatial), a(0, AccField::kM2))),
                      LiteralF(ct, static_cast<double>(count)));
      }));
      std::vector<int32_t> stats;  // save_mean, save_invstd, new running mean and var
      KILN_RETURN_IF_ERROR(cb.Finish(&stats));
      // 3. The normalized result, pointwise.
      KILN_ASSIGN_OR_RETURN(LValue v, l.NewValue(node_index, n.type.items[0].tensor, ValueKind::kPointwise));
      if (v.sizes != in_sizes) return absl::UnimplementedError("batch norm output shape");
      v.op = "batch_norm";
      v.inputs = {x, stats[0], stats[1]};
      if (w >= 0) v.inputs.push_back(w);
      if (b >= 0) v.inputs.push_back(b);
      const int32_t mean = stats[0], invstd = stats[1];
      v.elem = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> ExprOr {
        return affine(ctx, idx, k::Mul(k::Sub(LoadAs(x, ct)(ctx, idx), LoadAs(mean, ct)(ctx, chan(idx))),
                                       LoadAs(invstd, ct)(ctx, chan(idx))));
      };
      std::vector<int32_t> items = {l.Add(std::move(v))};
      items.insert(items.end(), stats.begin(), stats.end());
      l.SetItems(node_index, items);
      return absl::OkStatus();
    }
    RowBuilder rb{l, node_index, n, RowOp{}, {}};
    rb.row.name = "batch_norm";
    rb.row.domain = in_sizes;
    rb.row.reduce_dims = reduce;
    rb.row.inputs = {x, rm, rv};
    if (w >= 0) rb.row.inputs.push_back(w);
    if (b >= 0) rb.row.inputs.push_back(b);
    rb.row.composite = true;
    rb.row.accs.push_back({AccKind::kWelford, ct, LoadAs(x, ct)});
    auto var = [=](const AccReader& a) { return k::Div(a(0, AccField::kM2), a(0, AccField::kCount)); };
    auto invstd = [=](const AccReader& a) { return k::Unary(k::UnaryOp::kRsqrt, k::Add(var(a), LiteralF(ct, eps))); };
    KILN_RETURN_IF_ERROR(rb.Output(0, true, [=](LoadContext& ctx, const AccReader& a, const std::vector<Affine>& idx) {
      return affine(ctx, idx, k::Mul(k::Sub(LoadAs(x, ct)(ctx, idx), a(0, AccField::kMean)), invstd(a)));
    }));
    KILN_RETURN_IF_ERROR(outputs(rb, [](const AccReader& a) { return a(0, AccField::kMean); }, var));
    return rb.Finish();
  }
  // Backward.
  KILN_ASSIGN_OR_RETURN(const int32_t go, l.KernelValueOf(n.args[0]));
  KILN_ASSIGN_OR_RETURN(const int32_t w, opt(2));
  KILN_ASSIGN_OR_RETURN(const int32_t rm, opt(3));
  KILN_ASSIGN_OR_RETURN(const int32_t rv, opt(4));
  KILN_ASSIGN_OR_RETURN(const int32_t sm, opt(5));
  KILN_ASSIGN_OR_RETURN(const int32_t si, opt(6));
  if (n.args.size() < 10 || n.args[7].kind != Arg::Kind::kBool || n.args[9].kind != Arg::Kind::kList ||
      n.args[9].list.size() != 3 || l.g().values[go].sizes != in_sizes) {
    return absl::UnimplementedError("batch norm backward arguments");
  }
  const bool train = n.args[7].b;
  const double eps = real(8);
  const int32_t mean = train ? sm : rm, stat = train ? si : rv;
  if (mean < 0 || stat < 0 || !per_channel(mean) || !per_channel(stat) || !per_channel(w)) {
    return absl::UnimplementedError("batch norm backward statistics");
  }
  auto invstd = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> ExprOr {
    const ExprOr s = LoadAs(stat, ct)(ctx, chan(idx));
    return train ? s : k::Unary(k::UnaryOp::kRsqrt, k::Add(s, LiteralF(ct, eps)));
  };
  const ElemFn xhat = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> ExprOr {
    return k::Mul(k::Sub(LoadAs(x, ct)(ctx, idx), LoadAs(mean, ct)(ctx, chan(idx))), invstd(ctx, idx));
  };
  const ElemFn dot = [=](LoadContext& ctx, const std::vector<Affine>& idx) {
    return k::Mul(LoadAs(go, ct)(ctx, idx), xhat(ctx, idx));
  };
  // grad_input at idx, of type `out`, from sum(go) and sum(go * xhat) (read only in training).
  using Sum = std::function<ExprOr()>;
  auto grad_input = [=](LoadContext& ctx, const std::vector<Affine>& idx, const Sum& sum_go, const Sum& sum_dot,
                        ScalarType out) -> ExprOr {
    ExprOr scale = invstd(ctx, idx);
    if (w >= 0) scale = k::Mul(scale, LoadAs(w, ct)(ctx, chan(idx)));
    ExprOr g = LoadAs(go, ct)(ctx, idx);
    if (train) {
      const ExprOr nn = LiteralF(ct, static_cast<double>(count));
      g = k::Sub(k::Sub(g, k::Div(sum_go(), nn)), k::Mul(xhat(ctx, idx), k::Div(sum_dot(), nn)));
    }
    return k::Cast(out, k::Mul(scale, g));
  };
  // The requested items' types (checked before anything is added).
  std::vector<std::optional<ScalarType>> wanted(3);
  for (int i = 0; i < 3; ++i) {
    if (!n.args[9].list[i].b || n.type.items[i].kind != Type::Kind::kTensor) continue;
    KILN_ASSIGN_OR_RETURN(wanted[i], out_type(i));
  }
  if (!wanted[0] && !wanted[1] && !wanted[2]) return absl::UnimplementedError("batch norm backward computes nothing");
  const std::optional<graph::DType> acc_dtype = ToDType(ct);
  if (train && SplitsPerSample(in_sizes) && acc_dtype) {
    // 1. Per (n, c) and chunk of H: the sums of go and go * xhat over the spatial dims.
    const SampleSplit split(in_sizes, l.options().gpu, SampleSplit::kBackwardPoints);
    KILN_ASSIGN_OR_RETURN(std::vector<int32_t> parts,
                          PerSamplePartials(l, node_index, n, split, {go, x, mean, stat},
                                            {{AccKind::kSum, ct, LoadAs(go, ct)}, {AccKind::kSum, ct, dot}},
                                            {{0, AccField::kValue}, {1, AccField::kValue}}, *acc_dtype,
                                            "batch_norm_backward_partial"));
    // 2. Per channel, over n and the chunks: sum(go) (grad_bias) and sum(go * xhat) (grad_weight).
    RowBuilder cb = PerChannelCombine(l, node_index, n, split, "batch_norm_backward_sums", parts,
                                      {{AccKind::kSum, ct, LoadAs(parts[0], ct)}, {AccKind::kSum, ct, LoadAs(parts[1], ct)}});
    for (int acc : {0, 1}) {  // the sums themselves, for grad_input
      KILN_ASSIGN_OR_RETURN(LValue v, NewRowValue(l, cb, *acc_dtype, {channels}, cb.row.name));
      cb.outs.push_back(std::move(v));
      RowOutput o;
      o.fn = [acc](LoadContext&, const AccReader& a, const std::vector<Affine>&) { return a(acc, AccField::kValue); };
      cb.row.outputs.push_back(std::move(o));
    }
    std::vector<int> which;
    for (int i : {1, 2}) {
      if (!wanted[i]) continue;
      const ScalarType out = *wanted[i];
      const int acc = i == 1 ? 1 : 0;  // grad_weight = sum(go * xhat), grad_bias = sum(go)
      which.push_back(i);
      KILN_RETURN_IF_ERROR(cb.Output(i, false, [=](LoadContext&, const AccReader& a, const std::vector<Affine>&) {
        return k::Cast(out, a(acc, AccField::kValue));
      }));
    }
    std::vector<int32_t> ids;  // sum(go), sum(go * xhat), then the requested items
    KILN_RETURN_IF_ERROR(cb.Finish(&ids));
    std::vector<int32_t> items(3, -1);
    for (size_t j = 0; j < which.size(); ++j) items[which[j]] = ids[2 + j];
    // 3. grad_input, pointwise.
    if (wanted[0]) {
      const ScalarType out = *wanted[0];
      KILN_ASSIGN_OR_RETURN(LValue v, l.NewValue(node_index, n.type.items[0].tensor, ValueKind::kPointwise));
      v.op = "batch_norm_backward";
      v.inputs = {go, x, mean, stat, ids[0], ids[1]};
      if (w >= 0) v.inputs.push_back(w);
      const int32_t sum_go = ids[0], sum_dot = ids[1];
      v.elem = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> ExprOr {
        return grad_input(
            ctx, idx, [&] { return LoadAs(sum_go, ct)(ctx, chan(idx)); },
            [&] { return LoadAs(sum_dot, ct)(ctx, chan(idx)); }, out);
      };
      items[0] = l.Add(std::move(v));
    }
    l.SetItems(node_index, items);
    return absl::OkStatus();
  }
  RowBuilder rb{l, node_index, n, RowOp{}, {}};
  rb.row.name = "batch_norm_backward";
  rb.row.domain = in_sizes;
  rb.row.reduce_dims = reduce;
  rb.row.inputs = {go, x, mean, stat};
  if (w >= 0) rb.row.inputs.push_back(w);
  rb.row.accs.push_back({AccKind::kSum, ct, LoadAs(go, ct)});
  rb.row.accs.push_back({AccKind::kSum, ct, dot});
  std::vector<int32_t> items(3, -1);
  std::vector<int> which;
  for (int i = 0; i < 3; ++i) {
    if (!wanted[i]) continue;
    const ScalarType out = *wanted[i];
    which.push_back(i);
    if (i == 0) {
      rb.row.composite = true;
      KILN_RETURN_IF_ERROR(rb.Output(0, true, [=](LoadContext& ctx, const AccReader& a, const std::vector<Affine>& idx) {
        return grad_input(
            ctx, idx, [&] { return a(0, AccField::kValue); }, [&] { return a(1, AccField::kValue); }, out);
      }));
    } else {
      const int acc = i == 1 ? 1 : 0;  // grad_weight = sum(go * xhat), grad_bias = sum(go)
      KILN_RETURN_IF_ERROR(rb.Output(i, false, [=](LoadContext&, const AccReader& a, const std::vector<Affine>&) {
        return k::Cast(out, a(acc, AccField::kValue));
      }));
    }
  }
  std::vector<int32_t> ids;
  KILN_RETURN_IF_ERROR(rb.Finish(&ids));
  for (size_t j = 0; j < which.size(); ++j) items[which[j]] = ids[j];
  l.SetItems(node_index, items);
  return absl::OkStatus();
}

}  // namespace kiln::lower::internal
