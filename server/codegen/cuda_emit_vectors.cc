// CudaKernelEmitter (cuda_kernel_emitter.h): vector plans along one variable (aligned, or shifted
// to each row's alignment) and the emission of a vector's lanes.

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/optional.h"
#include "server/codegen/cuda_kernel_emitter.h"
#include "server/codegen/exp_reuse.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::codegen::internal {

namespace {

// Masked loads move as vectors only in vectors of at least this many lanes. Over 2 lanes, the
// scalar loads measured faster on the H200 (max_pool2d's forward at 2 bf16 lanes: 58 us scalar,
// 70 as vectors; its backward at 2 lanes: 44 and 46 us); over 8 bf16 lanes (a cat along rows),
// vectors: 4.6 us against 6.2 warm, 7.9 against 8.3 cold (session 29).
constexpr int kMinMaskedVectorLanes = 4;

using Accesses = std::vector<std::pair<Buffer, Index>>;

// The unmasked loads and the stores of `stmts` whose index `keep` admits, and the vector width
// of 16 bytes of the widest element among them (at most 8 lanes; 0 when there are none).
template <typename Keep>
int VectorCandidates(const std::vector<Stmt>& stmts, Keep keep, Accesses* loads, Accesses* stores) {
  for (const ExprNode* l : LoadsOf(stmts)) {
    if (l->args.empty() && keep(l->index)) loads->emplace_back(l->buffer, l->index);
  }
  for (const Stmt& s : stmts) {
    if (s.kind == StmtKind::kStore && keep(s.index)) stores->emplace_back(s.buffer, s.index);
  }
  int widest = 0;
  for (const Accesses* list : {loads, stores}) {
    for (const auto& [b, i] : *list) widest = std::max(widest, kernel::ScalarTypeBytes(b.dtype));
  }
  return widest == 0 ? 0 : std::min(8, 16 / widest);
}

}  // namespace

VecPlan CudaKernelEmitter::PlanVector(const std::vector<Stmt>& stmts, const Var& x, int max_width,
                                      bool masked_loads, bool with_loads) {
  VecPlan plan;
  if (!cuda_.vectorize) return plan;
  Accesses loads, stores;
  auto contiguous = [&](const Index& index) {
    return ConstStride(index, x) == absl::optional<int64_t>(1);
  };
  int width = VectorCandidates(stmts, contiguous, &loads, &stores);
  // Masked loads whose masks hold for the whole vector or for none of it (a window's bounds, a
  // cat's part, a pad's border along other dims): their masks by access (an access also read
  // unmasked needs none).
  std::map<std::string, std::vector<Expr>> masks;
  Accesses masked;
  if (masked_loads) {
    const std::vector<const ExprNode*> all = LoadsOf(stmts);
    std::set<std::string> unmasked, scalar;  // scalar: also loaded under a mask that varies along x
    for (const auto& [b, i] : loads) unmasked.insert(AccessKey(b, i));
    for (const ExprNode* l : all) {
      if (l->args.size() == 1 && !UniformAlong(l->args[0], x)) {
        scalar.insert(AccessKey(l->buffer, l->index));
      }
    }
    int masked_lanes = 8;
    for (const ExprNode* l : all) {
      if (l->args.size() != 1 || !contiguous(l->index)) continue;
      const std::string key = AccessKey(l->buffer, l->index);
      if (unmasked.count(key) || scalar.count(key)) continue;
      if (!masks.count(key)) masked.emplace_back(l->buffer, l->index);
      std::vector<Expr>& mine = masks[key];
      if (std::find(mine.begin(), mine.end(), l->args[0]) == mine.end()) mine.push_back(l->args[0]);
      masked_lanes = std::min(masked_lanes, 16 / kernel::ScalarTypeBytes(l->buffer.dtype));
    }
    // Their elements bound the width as unmasked ones do: the scalar lanes of a wider vector
    // would read them strided across a warp (max_pool2d's backward, its int64 indices under 8
    // bf16 lanes: 149 us; under 2: 44 us).
    if (!masks.empty()) width = width == 0 ? masked_lanes : std::min(width, masked_lanes);
  }
  width = std::min(max_width, width);
  if (width <= 1) return plan;
  if (width >= kMinMaskedVectorLanes) {
    loads.insert(loads.end(), masked.begin(), masked.end());
  } else {
    masks.clear();
  }
  std::set<std::string> checks;
  auto admit = [&](const Buffer& b, const Index& index, std::map<std::string, VecAccess>* into,
                   const char* prefix) {
    const std::string key = AccessKey(b, index);
    if (into->count(key)) return;
    std::vector<std::string> mine;
    const absl::optional<int64_t> off = index.offset.AsConst();
    if (off) {
      if (*off % width != 0) return;
    } else {
      mine.push_back(absl::StrCat("(", SizeCode(index.offset), ") % ", width, " == 0"));
    }
    for (const IndexTerm& t : index.terms) {
      if (t.var == x) continue;
      const absl::optional<int64_t> st = t.stride.AsConst();
      if (st) {
        if (*st % width != 0) return;
      } else {
        mine.push_back(absl::StrCat(SizeCode(t.stride), " % ", width, " == 0"));
      }
    }
    mine.push_back(absl::StrCat("kiln_cuda::aligned(b", b.index, ", ",
                                width * kernel::ScalarTypeBytes(b.dtype), ")"));
    for (std::string& c : mine) checks.insert(std::move(c));
    auto m = masks.find(key);
    (*into)[key] = VecAccess{b, index, absl::StrCat(prefix, into->size()),
                             m == masks.end() ? std::vector<Expr>() : m->second};
  };
  if (with_loads) {
    for (const auto& [b, i] : loads) admit(b, i, &plan.loads, "kiln_lv");
  }
  for (const auto& [b, i] : stores) admit(b, i, &plan.stores, "kiln_sv");
  if (plan.loads.empty() && plan.stores.empty()) return VecPlan();
  plan.width = width;
  plan.checks.assign(checks.begin(), checks.end());
  return plan;
}

VecPlan CudaKernelEmitter::PlanShiftedVector(const std::vector<Stmt>& stmts, const Var& x) {
  VecPlan plan;
  if (!cuda_.vectorize) return plan;
  Accesses loads, stores;
  const int width =
      VectorCandidates(stmts, [&](const Index& index) { return ConstantAlong(index, x); }, &loads, &stores);
  if (width <= 1) return plan;
  const auto& [anchor_buffer, anchor_index] = loads.empty() ? stores.front() : loads.front();
  const std::map<std::string, int64_t> anchor_residues = Residues(anchor_index, x, width);
  std::set<std::string> checks;
  auto admit = [&](const Buffer& b, const Index& index, std::map<std::string, VecAccess>* into,
                   const char* prefix) {
    const std::string key = AccessKey(b, index);
    if (into->count(key) || Residues(index, x, width) != anchor_residues) return;
    if (b.index != anchor_buffer.index) {
      checks.insert(absl::StrCat("kiln_cuda::misalign(b", b.index, ", ", width,
                                 ") == kiln_cuda::misalign(b", anchor_buffer.index, ", ", width, ")"));
    }
    (*into)[key] = VecAccess{b, index, absl::StrCat(prefix, into->size())};
  };
  for (const auto& [b, i] : loads) admit(b, i, &plan.loads, "kiln_lv");
  for (const auto& [b, i] : stores) admit(b, i, &plan.stores, "kiln_sv");
  plan.width = width;
  plan.checks.assign(checks.begin(), checks.end());
  plan.shift = ShiftCode(anchor_buffer, anchor_index, x, width);
  return plan;
}

bool ConstantAlong(const Index& index, const Var& x) {
  if (ConstStride(index, x) != absl::optional<int64_t>(1) || !index.offset.AsConst()) return false;
  for (const IndexTerm& t : index.terms) {
    if (!t.stride.AsConst()) return false;
  }
  return true;
}

std::map<std::string, int64_t> Residues(const Index& index, const Var& x, int width) {
  std::map<std::string, int64_t> r;
  r["offset"] = (*index.offset.AsConst() % width + width) % width;
  for (const IndexTerm& t : index.terms) {
    if (t.var == x) continue;
    int64_t& v = r[kernel::VarName(t.var)];
    v = ((v + *t.stride.AsConst()) % width + width) % width;
  }
  for (auto it = r.begin(); it != r.end();) it = it->second == 0 && it->first != "offset" ? r.erase(it) : ++it;
  return r;
}

std::string CudaKernelEmitter::ShiftCode(const Buffer& b, const Index& index, const Var& x, int width) {
  std::vector<IndexTerm> rest;
  for (const IndexTerm& t : index.terms) {
    if (!(t.var == x)) rest.push_back(t);
  }
  return absl::StrCat("static_cast<idx_t>((kiln_cuda::misalign(b", b.index, ", ", width, ") + (",
                      IndexCode(kernel::MakeIndex(index.offset, rest)), ") % ", width, ") % ", width, ")");
}

std::string CudaKernelEmitter::VecFlag(const VecPlan& plan) {
  if (plan.width <= 1) return "false";
  return plan.checks.empty() ? "true" : absl::StrJoin(plan.checks, " && ");
}

void CudaKernelEmitter::EmitVectorLanes(const std::vector<Stmt>& stmts, const VecPlan& full_plan,
                                        const Var& x, const std::string& base,
                                        absl::FunctionRef<void(const std::string&, int)> lane_decl) {
  // Only the accesses of these statements; none for loads that come from cached registers.
  VecPlan plan;
  plan.width = full_plan.width;
  for (const ExprNode* l : LoadsOf(stmts)) {
    const std::string key = AccessKey(l->buffer, l->index);
    auto it = full_plan.loads.find(key);
    if (it == full_plan.loads.end()) continue;
    auto cached = cache_.find(key);
    if (cached != cache_.end() && cached->second.first_phase != phase_ && !smem_vec_) continue;
    plan.loads.insert(*it);
  }
  for (const Stmt& s : stmts) {
    if (s.kind != StmtKind::kStore) continue;
    auto it = full_plan.stores.find(AccessKey(s.buffer, s.index));
    if (it != full_plan.stores.end()) plan.stores.insert(*it);
  }
  w_.Open("");
  w_.Linef("const idx_t ", kernel::VarName(x), " = ", base, ";");
  PushScope();  // the masks of masked vector loads, which the lanes test again
  for (const auto& [key, a] : plan.loads) {
    auto cached = cache_.find(key);
    if (smem_vec_ && cached != cache_.end()) {
      // kSharedRow's vector rows: the chunk's slot in shared memory, read once.
      w_.Linef("const kiln_cuda::Vec<", SmemType(a.buffer.dtype), ", ", plan.width, "> ", a.name,
               " = ", cached->second.name, "[kiln_e * ", group_, " + kiln_lane];");
      continue;
    }
    // A masked vector is read when one of its masks holds (they hold for every lane or for
    // none), else zeros.
    std::vector<std::string> conds;
    for (const Expr& m : a.masks) conds.push_back(ExprCode(m));
    const std::string load =
        conds.empty() ? absl::StrCat("kiln_cuda::load_vec<", plan.width, ">(")
                      : absl::StrCat("kiln_cuda::load_vec_if<", plan.width, ">(",
                                     absl::StrJoin(conds, " || "), ", ");
    w_.Linef("const kiln_cuda::Vec<", StorageType(a.buffer.dtype), ", ", plan.width, "> ", a.name,
             " = ", load, "b", a.buffer.index, " + (", IndexCode(a.index), "));");
  }
  for (const auto& [key, a] : plan.stores) {
    w_.Linef("kiln_cuda::Vec<", StorageType(a.buffer.dtype), ", ", plan.width, "> ", a.name, ";");
  }
  if (EmitPackedMax(stmts, plan)) {
    PopScope();
    w_.Close();
    return;
  }
  plan_ = &plan;
  for (int j = 0; j < plan.width; ++j) {
    w_.Open("");
    lane_decl(absl::StrCat(base, " + ", j), j);
    EmitLane(j, stmts);
    w_.Close();
  }
  plan_ = nullptr;
  for (const auto& [key, a] : plan.stores) {
    w_.Linef("kiln_cuda::store_vec<", plan.width, ">(b", a.buffer.index, " + (", IndexCode(a.index),
             "), ", a.name, ");");
  }
  PopScope();
  w_.Close();
}

bool CudaKernelEmitter::EmitPackedMax(const std::vector<Stmt>& stmts, const VecPlan& plan) {
  // Shared rows only: their slots are filled before the phase (register caches fill per lane).
  if (!smem_vec_ || stmts.empty() || !plan.stores.empty() || plan.width % 2 != 0) return false;
  std::vector<std::pair<int, const VecAccess*>> folds;
  for (const Stmt& s : stmts) {
    if (s.kind != StmtKind::kAccumulate || s.acc.kind != AccKind::kOnlineSoftmax) return false;
    auto two = two_pass_.find(s.acc.id);
    if (two == two_pass_.end() || !two->second.reuses_cache || s.acc.dtype != ScalarType::kFloat32) {
      return false;
    }
    const ExprNode* load = HeldLoad(s.value.get());
    if (load == nullptr || load == s.value.get() || !kernel::IsHalfType(load->buffer.dtype)) return false;
    auto vec = plan.loads.find(AccessKey(load->buffer, load->index));
    if (vec == plan.loads.end()) return false;
    folds.emplace_back(s.acc.id, &vec->second);
  }
  for (const auto& [id, vec] : folds) {
    w_.Linef("acc", id, ".max = kiln_cuda::max_nan(acc", id, ".max, kiln_cuda::max_nan_half<",
             vec->buffer.dtype == ScalarType::kBFloat16 ? "true" : "false", ", ", plan.width, ">(",
             vec->name, "));");
  }
  return true;
}

void CudaKernelEmitter::EmitLane(int j, const std::vector<Stmt>& stmts) {
  lane_ = j;
  filled_.clear();
  PushScope();
  SeedScope();
  for (const Stmt& s : stmts) EmitCudaStmt(s);
  PopScope();
  lane_ = -1;
}

void CudaKernelEmitter::EmitShiftedChunk(const std::vector<Stmt>& stmts, const VecPlan& plan,
                                         int64_t total) {
  const int width = plan.width;
  w_.Open(absl::StrCat("if (kiln_rb >= 0 && kiln_rb + ", width, " <= ", total, ")"));
  EmitVectorLanes(stmts, plan, Var{VarKind::kReduce, 0}, "kiln_rb", [&](const std::string& value, int) {
    w_.Linef("const idx_t kiln_r = ", value, ";");
    w_.Line("const idx_t r0 = kiln_r;");
  });
  w_.Close();
  EmitShiftedTail(width, total, [&](int j) { EmitLane(j, stmts); });
}

void CudaKernelEmitter::EmitShiftedTail(int width, int64_t total, absl::FunctionRef<void(int)> lane) {
  w_.Open(absl::StrCat("else if (kiln_rb < ", total, ")"));
  for (int j = 0; j < width; ++j) {
    w_.Open("");
    w_.Linef("const idx_t kiln_r = kiln_rb + ", j, ";");
    w_.Open(absl::StrCat("if (kiln_r >= 0 && kiln_r < ", total, ")"));
    w_.Line("const idx_t r0 = kiln_r;");
    lane(j);
    w_.Close();
    w_.Close();
  }
  w_.Close();
}

}  // namespace kiln::codegen::internal
