// CudaKernelEmitter (cuda_kernel_emitter.h): kSharedRow's store phases whose stores lie
// differently from the row's loads. The shifted vector plan (PlanShiftedVector) aligns a row's
// chunks to its anchor, the first load: softmax(x[:, 1:]) reads x from offset 1 with a row stride
// of cols + 1 and writes a contiguous output, which would then go element by element (2-byte
// stores for bf16: partial L2 sectors; 4.4 times the time of vector stores, bf16 4096 x 50257 on
// an H200). The row is in shared memory by then, so such a phase walks the output's own chunks
// instead and reads the cache wherever their elements sit.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/codegen/cuda_kernel_emitter.h"
#include "server/codegen/exp_reuse.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::codegen::internal {

VecPlan CudaKernelEmitter::PlanRealignedStores(const std::vector<Stmt>& stmts, const VecPlan& plan) {
  if (launch_.layout != CudaLayout::kSharedRow || !smem_vec_ || plan.shift.empty()) return VecPlan();
  for (const auto& [id, tp] : two_pass_) {
    if (!tp.reuses_cache) return VecPlan();  // values in registers, at the loads' positions
  }
  for (const ExprNode* l : LoadsOf(stmts)) {
    const std::string key = AccessKey(l->buffer, l->index);
    if (l->args.empty() && plan.loads.count(key) && !cache_.count(key)) return VecPlan();
  }
  const Var x{VarKind::kReduce, 0};
  const Stmt* anchor = nullptr;
  for (const Stmt& s : stmts) {
    if (s.kind != StmtKind::kStore || plan.stores.count(AccessKey(s.buffer, s.index))) return VecPlan();
    if (anchor == nullptr && ConstantAlong(s.index, x)) anchor = &s;
  }
  if (anchor == nullptr) return VecPlan();
  VecPlan stores;
  stores.width = plan.width;
  stores.shift = ShiftCode(anchor->buffer, anchor->index, x, plan.width);
  const std::map<std::string, int64_t> residues = Residues(anchor->index, x, plan.width);
  for (const Stmt& s : stmts) {
    const std::string key = AccessKey(s.buffer, s.index);
    if (s.buffer.index != anchor->buffer.index || stores.stores.count(key) || !ConstantAlong(s.index, x) ||
        Residues(s.index, x, plan.width) != residues) {
      continue;  // another buffer (it may lie differently) or another residue: scalar lanes
    }
    stores.stores[key] = VecAccess{s.buffer, s.index, absl::StrCat("kiln_sv", stores.stores.size())};
  }
  return stores;
}

void CudaKernelEmitter::EmitRealignedStores(const std::vector<Stmt>& stmts, const VecPlan& stores,
                                            int64_t chunks, int64_t total) {
  const int width = stores.width;
  const int64_t slots = chunks * group_;  // chunks per cache array
  // The windows read other threads' slots. Before: unless the phase before ended in an
  // all-reduce (barriers) after every write of the cache (its fill and pass B; none fills here).
  bool ordered = false;
  if (phase_ > 0) {
    for (const Stmt& s : k_.phases[phase_ - 1].stmts) ordered |= s.kind == StmtKind::kAccumulate;
  }
  for (const auto& [key, e] : cache_) ordered &= e.first_phase != phase_;
  if (!ordered) w_.Line("__syncthreads();  // the cache is whole: the windows read other threads' slots");
  // The cached loads of the phase, each read as one window a chunk (`lanes`: the vector chunks,
  // with their stores; `edges`: the scalar lanes at the row's ends).
  VecPlan lanes = stores, edges;
  lanes.width = edges.width = width;
  for (const ExprNode* l : LoadsOf(stmts)) {
    const std::string key = AccessKey(l->buffer, l->index);
    auto cached = cache_.find(key);
    if (!l->args.empty() || cached == cache_.end() || lanes.loads.count(key)) continue;
    lanes.loads[key] = VecAccess{l->buffer, l->index, absl::StrCat("kiln_lv", lanes.loads.size())};
  }
  edges.loads = lanes.loads;
  w_.Open("");
  // Element r of the row: cache element r + kiln_sh, and element r + kiln_so of the stores'
  // chunks; a store chunk q's first element is cache element q * width + kiln_sd - width.
  w_.Linef("const idx_t kiln_so = ", stores.shift, ";  // the stores' shift");
  w_.Linef("const idx_t kiln_sd = kiln_sh - kiln_so + ", width, ";  // in [1, ", 2 * width, ")");
  w_.Linef("const idx_t kiln_wq = kiln_sd / ", width, " - 1;  // the window's first chunk, from q");
  w_.Linef("const int kiln_wo = static_cast<int>(kiln_sd % ", width, ");  // its first element there");
  w_.Raw(chunks <= 4 ? "#pragma unroll" : "#pragma unroll 4");
  w_.Open(absl::StrCat("for (int kiln_e = 0; kiln_e < ", chunks, "; ++kiln_e)"));
  w_.Linef("const idx_t kiln_q = static_cast<idx_t>(kiln_e) * ", group_, " + kiln_lane;");
  w_.Linef("const idx_t kiln_rb = kiln_q * ", width, " - kiln_so;");
  // Within the row both chunks are filled; at its ends the clamped chunks' lanes lie outside it.
  w_.Line("const idx_t kiln_w0 = kiln_q + kiln_wq < 0 ? 0 : kiln_q + kiln_wq;");
  w_.Linef("const idx_t kiln_w1 = kiln_q + kiln_wq + 1 > ", slots - 1, " ? ", slots - 1,
           " : kiln_q + kiln_wq + (kiln_wo != 0 ? 1 : 0);");
  for (const auto& [key, a] : lanes.loads) {
    const std::string& array = cache_.at(key).name;
    w_.Linef("const kiln_cuda::Vec<", SmemType(a.buffer.dtype), ", ", width, "> ", a.name,
             " = kiln_cuda::window(", array, "[kiln_w0], ", array, "[kiln_w1], kiln_wo);");
  }
  w_.Open(absl::StrCat("if (kiln_rb >= 0 && kiln_rb + ", width, " <= ", total, ")"));
  w_.Line("const idx_t r0 = kiln_rb;");
  for (const auto& [key, a] : lanes.stores) {
    w_.Linef("kiln_cuda::Vec<", StorageType(a.buffer.dtype), ", ", width, "> ", a.name, ";");
  }
  plan_ = &lanes;
  for (int j = 0; j < width; ++j) {
    w_.Open("");
    w_.Linef("const idx_t kiln_r = kiln_rb + ", j, ";");
    w_.Line("const idx_t r0 = kiln_r;");
    EmitLane(j, stmts);
    w_.Close();
  }
  for (const auto& [key, a] : lanes.stores) {
    w_.Linef("kiln_cuda::store_vec<", width, ">(b", a.buffer.index, " + (", IndexCode(a.index), "), ", a.name,
             ");");
  }
  w_.Close();
  plan_ = &edges;
  EmitShiftedTail(width, total, [&](int j) { EmitLane(j, stmts); });
  plan_ = nullptr;
  w_.Close();
  w_.Close();
  // After: the next fill of this cache (a later phase's, the next row's) writes slots that
  // other threads' windows may still read.
  w_.Line("__syncthreads();  // every window is read before the cache is filled again");
}

}  // namespace kiln::codegen::internal
