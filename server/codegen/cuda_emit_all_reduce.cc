// CudaKernelEmitter (cuda_kernel_emitter.h): the end of a row kernel's phase: pass B of the
// two-pass statistics (online softmax, Welford) over the cached values, with the exps kept for
// later phases (exp_reuse.h), and the all-reduce of each accumulator in the row's layout. A
// softmax over a cluster's blocks (kClusterRow) takes each block's max and sum and folds the
// pairs across the cluster once, instead of two cluster all-reduces (max, then sum): one cluster
// barrier fewer per row; the cached exps are then relative to the block's max and later phases
// scale them by exp(block max - row max).

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/optional.h"
#include "server/codegen/cuda_emitter.h"
#include "server/codegen/cuda_kernel_emitter.h"
#include "server/codegen/exp_reuse.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::codegen::internal {

namespace {

const char* ReduceOp(AccKind k) {
  switch (k) {
    case AccKind::kSum: return "kiln_cuda::SumOp()";
    case AccKind::kProd: return "kiln_cuda::ProdOp()";
    case AccKind::kMax: return "kiln_cuda::MaxOp()";
    case AccKind::kMin: return "kiln_cuda::MinOp()";
    default: return "kiln_cuda::MergeOp()";
  }
}

}  // namespace

void CudaKernelEmitter::PlanExpReuse() {
  for (auto& [id, tp] : two_pass_) {
    if (!tp.reuses_cache) {  // kiln_a<id>: registers of this value alone
      if (k_.accumulators[id].kind == AccKind::kOnlineSoftmax && !smem_arrays_.count(tp.array)) {
        tp.exp_nodes = ExpShiftNodesOf(k_, tp.phase + 1, id, tp.value);
      }
      continue;
    }
    auto smem = smem_arrays_.find(tp.array);
    if (smem != smem_arrays_.end() && kernel::IsHalfType(smem->second)) continue;  // 16-bit slots
    bool alone = true;
    for (const auto& [other, o] : two_pass_) alone &= other == id || o.array != tp.array;
    if (!alone) continue;
    if (k_.accumulators[id].kind != AccKind::kOnlineSoftmax) continue;  // ids index it (verifier)
    absl::optional<std::vector<const ExprNode*>> nodes = ExpShiftNodes(k_, tp.phase + 1, id, tp.key);
    if (nodes && !nodes->empty()) tp.exp_nodes = std::move(*nodes);
  }
}

int CudaKernelEmitter::SoftmaxExpsKeptInRegisters(std::set<const ExprNode*>* exps) const {
  std::map<int, int> folds = FoldCounts(k_);
  int n = 0;
  for (size_t pi = 0; pi < k_.phases.size(); ++pi) {
    for (const Stmt& s : k_.phases[pi].stmts) {
      // As the two-pass plan in EmitRow takes them, with an array of their own (not a load's).
      if (s.kind != StmtKind::kAccumulate || folds[s.acc.id] != 1 || s.acc.kind != AccKind::kOnlineSoftmax ||
          !kernel::IsFloatType(s.acc.dtype) || HeldLoad(s.value.get()) != nullptr) {
        continue;
      }
      const std::vector<const ExprNode*> nodes = ExpShiftNodesOf(k_, pi + 1, s.acc.id, s.value.get());
      if (nodes.empty()) continue;
      exps->insert(nodes.begin(), nodes.end());
      ++n;
    }
  }
  return n;
}

void CudaKernelEmitter::PlanApproxExp() {
  approx_exp_.clear();
  approx_exp_nodes_.clear();
  bool stores = false, half = true;
  auto visit = [&](const std::vector<Stmt>& stmts) {
    for (const Stmt& s : stmts) {
      if (s.kind != StmtKind::kStore) continue;
      stores = true;
      half &= kernel::IsHalfType(s.buffer.dtype);
    }
  };
  for (const kernel::Phase& p : k_.phases) visit(p.stmts);
  visit(k_.body);
  const bool all_half = stores && half;
  for (const auto& [id, tp] : two_pass_) {
    const Accumulator& a = k_.accumulators[id];
    if (a.kind != AccKind::kOnlineSoftmax || !(all_half || a.approx_exp)) continue;
    approx_exp_.insert(id);
    if (!tp.reuses_cache || !tp.exp_nodes.empty()) continue;  // no exps left in later phases
    absl::optional<std::vector<const ExprNode*>> nodes = ExpShiftNodes(k_, tp.phase + 1, id, tp.key);
    if (nodes) approx_exp_nodes_.insert(nodes->begin(), nodes->end());
  }
}

void CudaKernelEmitter::SeedScope() {
  for (const auto& [id, tp] : two_pass_) {
    if (phase_ <= tp.phase) continue;
    std::string slot = Slot(tp.array);
    if (smem_vec_ && plan_ != nullptr && lane_ >= 0) {
      // kSharedRow's vector rows: the chunk's vector, already read from shared memory.
      auto vec = plan_->loads.find(tp.key);
      if (vec != plan_->loads.end()) slot = absl::StrCat(vec->second.name, ".v[", lane_, "]");
    }
    // A cluster's softmax cached exps of the block's max (EmitAllReduces): rescaled to the row's.
    if (FoldsSoftmaxInCluster() && k_.accumulators[id].kind == AccKind::kOnlineSoftmax) {
      slot = absl::StrCat("(", slot, " * kiln_rs", id, ")");
    }
    for (const ExprNode* e : tp.exp_nodes) scopes_.back()[e] = slot;
  }
}

void CudaKernelEmitter::EmitAllReduces(const std::vector<Stmt>& stmts, int64_t chunks,
                                       int64_t total) {
  auto block_allreduce = [&](const std::string& value, const char* op) {
    w_.Linef(value, " = kiln_cuda::block_allreduce<", launch_.block / 32, ">(", value, ", ", op,
             ", kiln_smem);");
  };
  auto allreduce = [&](const std::string& value, const char* op) {
    switch (launch_.layout) {
      case CudaLayout::kWarpPerRow:
        w_.Linef(value, " = kiln_cuda::warp_allreduce(", value, ", ", op, ");");
        break;
      case CudaLayout::kBlockPerRow:
      case CudaLayout::kSharedRow:
        block_allreduce(value, op);
        break;
      case CudaLayout::kClusterRow:
        w_.Linef(value, " = kiln_cuda::cluster_allreduce<", launch_.block / 32, ", ",
                 launch_.cluster, ">(", value, ", ", op, ", kiln_smem, kiln_pub, &kiln_parity);");
        break;
      default:
        if (group_ == 1) break;  // one thread per point (short columns): its rows are all summed
        w_.Linef(value, " = kiln_cuda::column_allreduce<", column_points_, ", ", group_, ">(", value,
                 ", ", op, ", kiln_smem);");
        break;
    }
  };
  std::set<int> done;
  for (const Stmt& s : stmts) {
    if (s.kind != StmtKind::kAccumulate || !done.insert(s.acc.id).second) continue;
    const std::string acc = absl::StrCat("acc", s.acc.id);
    auto two = two_pass_.find(s.acc.id);
    if (launch_.layout == CudaLayout::kColumn && width_ > 1) {  // vector columns: every lane's at once
      if (group_ == 1) continue;  // one thread per point
      w_.Linef("kiln_cuda::column_allreduce_vec<", column_points_, ", ", group_, ">(kiln_acc", s.acc.id,
               ", ", ReduceOp(s.acc.kind), ", kiln_smem);");
      continue;
    }
    if (two == two_pass_.end()) {
      allreduce(acc, ReduceOp(s.acc.kind));
      continue;
    }
    const std::string t = ValueType(s.acc.dtype);
    const bool softmax = s.acc.kind == AccKind::kOnlineSoftmax;
    // A cluster's softmax: the block's max, then the block's sum, then one fold of the (max, sum)
    // pairs across the cluster (FoldsSoftmaxInCluster).
    const bool fold = softmax && FoldsSoftmaxInCluster();
    const bool reuse = softmax && !two->second.exp_nodes.empty();
    if (fold) {
      block_allreduce(acc + ".max", "kiln_cuda::MaxOp()");
    } else if (softmax) {
      allreduce(acc + ".max", "kiln_cuda::MaxOp()");
    } else {
      allreduce(acc + ".mean", "kiln_cuda::SumOp()");
      w_.Linef(acc, ".mean = ", acc, ".mean / static_cast<", t, ">(", total, ");");
    }
    w_.Open("");
    if (softmax && (!reuse || fold)) {
      // An all -inf row (or block's part of it): max -inf, every exp(-inf - 0) = 0, so sum 0 as
      // the online rule.
      w_.Linef("const ", t, " kiln_m = ", acc, ".max == -kiln_cuda::inf<", t, ">() ? ", t,
               "(0) : ", acc, ".max;");
    }
    // Shared slots need no constant index: a loop, not chunks x lanes of straight code.
    w_.Raw(smem_arrays_.count(two->second.array) ? "#pragma unroll 4" : "#pragma unroll");
    w_.Open(absl::StrCat("for (int kiln_e = 0; kiln_e < ", chunks, "; ++kiln_e)"));
    const bool guard = !shifted_ && total % (int64_t{group_} * width_) != 0;
    if (guard) {
      w_.Open(absl::StrCat("if ((static_cast<idx_t>(kiln_e) * ", group_, " + kiln_lane)",
                           width_ == 1 ? "" : absl::StrCat(" * ", width_), " < ", total, ")"));
    }
    auto smem = smem_arrays_.find(two->second.array);
    const bool local = smem_vec_ && smem != smem_arrays_.end();
    if (local) {
      // The chunk's vector read once (and written back once with the exps).
      const std::string slot = absl::StrCat(smem->first, "[kiln_e * ", group_, " + kiln_lane]");
      w_.Linef(two->second.exp_nodes.empty() ? "const " : "", "kiln_cuda::Vec<",
               SmemType(smem->second), ", ", width_, "> kiln_x = ", slot, ";");
      local_vec_array_ = smem->first;
      local_vec_ = "kiln_x";
    }
    auto lane = [&](int j) {
      lane_ = width_ == 1 ? -1 : j;
      const std::string x = SlotValue(two->second.array);
      if (reuse) {
        w_.Linef(x, " = ", PassBExp(s.acc.id), x, " - ", fold ? "kiln_m" : acc + ".max",
                 ");");  // not 16-bit (PlanExpReuse)
        w_.Linef(acc, ".sum += ", x, ";");
      } else if (softmax) {
        w_.Linef(acc, ".sum += ", PassBExp(s.acc.id), x, " - kiln_m);");
      } else {
        w_.Linef("const ", t, " kiln_d", j, " = ", x, " - ", acc, ".mean;");
        w_.Linef(acc, ".m2 += kiln_d", j, " * kiln_d", j, ";");
      }
    };
    if (shifted_) {
      // A chunk within the row folds every lane; the row's first and last chunks only the lanes
      // within the row.
      w_.Linef("const idx_t kiln_rb = (static_cast<idx_t>(kiln_e) * ", group_, " + kiln_lane) * ",
               width_, " - kiln_sh;");
      w_.Open(absl::StrCat("if (kiln_rb >= 0 && kiln_rb + ", width_, " <= ", total, ")"));
      for (int j = 0; j < width_; ++j) lane(j);
      w_.Close();
      EmitShiftedTail(width_, total, lane);
    } else {
      for (int j = 0; j < width_; ++j) lane(j);
    }
    lane_ = -1;
    if (local) {
      if (!two->second.exp_nodes.empty()) {
        w_.Linef(smem->first, "[kiln_e * ", group_, " + kiln_lane] = kiln_x;");
      }
      local_vec_array_.clear();
      local_vec_.clear();
    }
    if (guard) w_.Close();
    w_.Close();
    w_.Close();
    if (fold) {
      block_allreduce(acc + ".sum", "kiln_cuda::SumOp()");
      if (reuse) w_.Linef("const ", t, " kiln_bm", s.acc.id, " = ", acc, ".max;");
      w_.Linef(acc, " = kiln_cuda::cluster_fold<", launch_.cluster, ">(", acc,
               ", kiln_cuda::MergeOp(), kiln_pub, &kiln_parity);");
      if (reuse) {
        // The cached exps are exp(x - the block's max): later phases take them times
        // exp(block max - row max). A block whose part is all -inf cached zeros (kiln_m) and
        // scales them by 0 unless the row's max is -inf or NaN, where exp(-inf - max) is NaN as
        // torch's softmax of such a row.
        w_.Linef("const ", t, " kiln_rs", s.acc.id, " = kiln_bm", s.acc.id, " == -kiln_cuda::inf<",
                 t, ">() && ", acc, ".max > -kiln_cuda::inf<", t, ">() ? ", t,
                 "(0) : kiln_cuda::exp(kiln_bm", s.acc.id, " - ", acc, ".max);");
      }
    } else if (softmax) {
      allreduce(acc + ".sum", "kiln_cuda::SumOp()");
      if (reuse) {
        // The exps are exp(x - max) exactly as later phases compute them (NaN for an all -inf
        // row); the online rule's sum of that row is 0.
        w_.Linef("if (", acc, ".max == -kiln_cuda::inf<", t, ">()) ", acc, ".sum = ", t, "(0);");
      }
    } else {
      allreduce(acc + ".m2", "kiln_cuda::SumOp()");
      w_.Linef(acc, ".count = static_cast<", t, ">(", total, ");");
    }
  }
}

}  // namespace kiln::codegen::internal
