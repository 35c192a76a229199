#include "server/codegen/cuda_emitter.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/types/optional.h"
#include "kernels/cuda/embedded_headers.h"
#include "server/codegen/code_writer.h"
#include "server/codegen/cpu_emitter.h"
#include "server/codegen/cuda_kernel_emitter.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::codegen {

using kernel::Expr;
using kernel::ExprKind;
using kernel::ExprNode;
using kernel::Index;
using kernel::IndexTerm;
using kernel::Kernel;
using kernel::Stmt;
using kernel::StmtKind;
using kernel::Var;
using kernel::VarKind;

const char* CudaLayoutName(CudaLayout layout) {
  switch (layout) {
    case CudaLayout::kPointwise: return "pointwise";
    case CudaLayout::kWarpPerRow: return "warp_per_row";
    case CudaLayout::kBlockPerRow: return "block_per_row";
    case CudaLayout::kColumn: return "column";
    case CudaLayout::kTiled: return "tiled";
    case CudaLayout::kClusterRow: return "cluster_row";
    case CudaLayout::kSharedRow: return "shared_row";
  }
  return "?";
}

absl::StatusOr<int64_t> CudaGridSize(const CudaLaunch& launch, const std::vector<int64_t>& scalars) {
  const absl::optional<int64_t> work = launch.work.Evaluate(scalars);
  if (!work) return absl::InvalidArgumentError("cuda launch: work size needs missing scalars");
  if (launch.work_per_block <= 0 || launch.max_grid <= 0 || launch.cluster <= 0) {
    return absl::InvalidArgumentError("cuda launch: bad work_per_block, max_grid or cluster");
  }
  const int64_t blocks = *work <= 0 ? 1 : (*work - 1) / launch.work_per_block + 1;
  const int64_t grid = std::max<int64_t>(1, std::min(blocks, launch.max_grid));
  return (grid + launch.cluster - 1) / launch.cluster * launch.cluster;
}

namespace {

// Pointwise kernels whose stores are all contiguous along an outer dim other than the innermost
// (a torch output that follows a transposed input's layout: `a.t() + b` is column-major): the
// same kernel with that dim moved innermost, so that threads (and vectors, and the y/x tiles of
// kTiled) run along the stores. Every point of a pointwise kernel is independent, so the order
// of the outer loops is free; the permuted kernel is only emitted, never printed or keyed.
class OuterPermuter {
 public:
  // new_of_old[i]: the position of old outer dim i.
  explicit OuterPermuter(std::vector<int32_t> new_of_old) : new_of_old_(std::move(new_of_old)) {}

  Index Map(const Index& index) const {
    std::vector<IndexTerm> terms;
    for (const IndexTerm& t : index.terms) terms.push_back(IndexTerm{MapVar(t.var), t.stride});
    return kernel::MakeIndex(index.offset, std::move(terms));
  }

  Expr Map(const Expr& e) {
    auto it = memo_.find(e.get());
    if (it != memo_.end()) return it->second;
    auto n = std::make_shared<ExprNode>(*e);
    if (n->kind == ExprKind::kLoad) n->index = Map(n->index);
    if (n->kind == ExprKind::kLoopVar) n->var = MapVar(n->var);
    for (Expr& a : n->args) a = Map(a);
    Expr out = n;
    memo_[e.get()] = out;
    return out;
  }

 private:
  Var MapVar(const Var& v) const {
    return v.kind == VarKind::kOuter ? Var{VarKind::kOuter, new_of_old_[v.index]} : v;
  }
  std::vector<int32_t> new_of_old_;
  std::map<const ExprNode*, Expr> memo_;  // keeps shared subexpressions shared (emitter CSE)
};

absl::optional<Kernel> StoreOrderedPointwise(const Kernel& k) {
  const int n = static_cast<int>(k.outer.size());
  if (!k.is_pointwise() || n < 2) return absl::nullopt;
  int dim = -1;
  for (const Stmt& s : k.body) {
    if (s.kind != StmtKind::kStore) continue;
    int d = -1;
    for (const IndexTerm& t : s.index.terms) {
      if (t.var.kind == VarKind::kOuter && t.stride.AsConst() == absl::optional<int64_t>(1) &&
          !k.outer[t.var.index].is_const(1)) {
        d = t.var.index;
      }
    }
    if (d < 0 || (dim >= 0 && d != dim)) return absl::nullopt;
    dim = d;
  }
  if (dim < 0 || dim == n - 1) return absl::nullopt;
  std::vector<int32_t> new_of_old(n);
  for (int i = 0, next = 0; i < n; ++i) new_of_old[i] = i == dim ? n - 1 : next++;
  OuterPermuter perm(new_of_old);
  Kernel out = k;
  for (int i = 0; i < n; ++i) out.outer[new_of_old[i]] = k.outer[i];
  for (Stmt& s : out.body) {
    s.index = perm.Map(s.index);
    s.value = perm.Map(s.value);
  }
  return out;
}

}  // namespace

std::string CudaKernelSymbol(const CudaEmitOptions& options, int index) {
  return absl::StrCat(options.symbol_prefix, index);
}

absl::StatusOr<CudaSource> EmitCudaSource(absl::Span<const Kernel> kernels,
                                          const CudaEmitOptions& options) {
  if (options.pointwise_block <= 0 || options.pointwise_block % 32 != 0 ||
      options.pointwise_block > 1024 || options.pointwise_waves <= 0) {
    return absl::InvalidArgumentError("cuda emitter: bad options");
  }
  if (options.symbol_prefix.empty() || options.symbol_prefix.size() > 64 ||
      !std::all_of(options.symbol_prefix.begin(), options.symbol_prefix.end(),
                   [](char c) { return absl::ascii_isalnum(c) || c == '_'; }) ||
      absl::ascii_isdigit(options.symbol_prefix[0])) {
    return absl::InvalidArgumentError(
        "cuda emitter: symbol_prefix must be 1-64 letters, digits or '_', not starting with a digit");
  }
  CudaSource out;
  CodeWriter w;
  w.Line("// Generated by kiln's CUDA emitter. Do not edit.");
  w.Line(absl::StrCat("// extern \"C\" __global__ void ", options.symbol_prefix, "<i>(b0, b1, ..., int64_t n0, ...);"));
  if (options.include_prelude) w.Raw(kiln::kernels::CudaPrelude());
  std::string source = w.Take();
  out.prelude = source;
  for (size_t i = 0; i < kernels.size(); ++i) {
    const absl::optional<Kernel> permuted = StoreOrderedPointwise(kernels[i]);
    internal::CudaKernelEmitter emitter(permuted ? *permuted : kernels[i], static_cast<int>(i),
                                        options);
    absl::StatusOr<std::string> fn = emitter.Emit();
    if (!fn.ok()) {
      return absl::Status(fn.status().code(),
                          absl::StrCat("kernel ", i, ": ", fn.status().message()));
    }
    absl::StrAppend(&source, "\n", *fn);
    out.symbols.push_back(CudaKernelSymbol(options, static_cast<int>(i)));
    out.kernel_sources.push_back(*std::move(fn));
    out.launches.push_back(emitter.launch());
  }
  out.source = std::move(source);
  return out;
}

}  // namespace kiln::codegen
