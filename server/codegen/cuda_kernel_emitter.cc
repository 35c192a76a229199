// CudaKernelEmitter's core (cuda_kernel_emitter.h): construction, the function head (and the
// 32-bit instance guarded by a run-time check), the expression and statement spellings shared by
// every layout, and the helpers of the other files.

#include "server/codegen/cuda_kernel_emitter.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/types/optional.h"
#include "server/codegen/code_writer.h"
#include "server/codegen/cpu_emitter.h"
#include "server/codegen/cuda_emitter.h"
#include "server/codegen/exp_reuse.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::codegen::internal {

namespace {

// Slack added to every size before deciding on 32-bit indices: grid-stride steps and vector
// chunks may run past the last element by less than this.
constexpr int64_t kIndexSlack = int64_t{1} << 22;

void CollectLoads(const Expr& e, std::set<const ExprNode*>* seen, std::vector<const ExprNode*>* out) {
  if (!seen->insert(e.get()).second) return;
  for (const Expr& a : e->args) CollectLoads(a, seen, out);
  if (e->kind == ExprKind::kLoad) out->push_back(e.get());
}

bool ReadsVar(const Expr& e, const Var& var, std::set<const ExprNode*>* seen) {
  if (!seen->insert(e.get()).second) return false;
  if (e->kind == ExprKind::kLoopVar && e->var == var) return true;
  for (const Expr& a : e->args) {
    if (ReadsVar(a, var, seen)) return true;
  }
  return false;
}

// Whether `e` reads memory, an accumulator or (when `x` is given) the loop variable *x itself.
bool ReadsMemoryOrVar(const Expr& e, const Var* x) {
  if (e->kind == ExprKind::kLoad || e->kind == ExprKind::kAccRead) return true;
  if (x != nullptr && e->kind == ExprKind::kLoopVar && e->var == *x) return true;
  for (const Expr& a : e->args) {
    if (ReadsMemoryOrVar(a, x)) return true;
  }
  return false;
}

}  // namespace

bool ReadsVarValue(const std::vector<Stmt>& stmts, const Var& var) {
  std::set<const ExprNode*> seen;
  for (const Stmt& s : stmts) {
    if (ReadsVar(s.value, var, &seen)) return true;
  }
  return false;
}

bool UniformAlong(const Expr& e, const Var& x) { return !ReadsMemoryOrVar(e, &x); }

bool ReadsMemory(const Expr& e) { return ReadsMemoryOrVar(e, nullptr); }

Size Product(const std::vector<Size>& sizes) {
  Size p = Size::Const(1);
  for (const Size& s : sizes) p = p * s;
  return p;
}

absl::optional<int64_t> ConstStride(const Index& index, const Var& var) {
  for (const IndexTerm& t : index.terms) {
    if (t.var == var) return t.stride.AsConst();
  }
  return int64_t{0};
}

std::vector<const ExprNode*> LoadsOf(const std::vector<Stmt>& stmts, const std::set<const ExprNode*>& skip) {
  std::set<const ExprNode*> seen = skip;
  std::vector<const ExprNode*> out;
  for (const Stmt& s : stmts) CollectLoads(s.value, &seen, &out);
  return out;
}

CudaKernelEmitter::CudaKernelEmitter(const Kernel& kernel, int index,
                                     const CudaEmitOptions& options)
    : CpuKernelEmitter(kernel, index, CpuOptions()), cuda_(options) {
  num_sms_ = options.num_sms > 0 ? options.num_sms
                                 : (options.arch.rfind("sm_8", 0) == 0 ? 108 : 132);
  long_rows_ = index >= 0 && static_cast<size_t>(index) < options.kernel_long_rows.size()
                   ? options.kernel_long_rows[index]
                   : options.long_rows;
}

CpuEmitOptions CudaKernelEmitter::CpuOptions() {
  CpuEmitOptions o;
  o.block = kIndexSlack;  // Emit() decides 32-bit indices with this slack
  o.include_prelude = false;
  return o;
}

std::string CudaKernelEmitter::Retarget(const std::string& code) {
  return absl::StrReplaceAll(code, {{"kiln_cpu::", "kiln_cuda::"}, {"std::", "kiln_cuda::"}});
}

std::string CudaKernelEmitter::ConstCode(const ExprNode& e) const {
  return Retarget(CpuKernelEmitter::ConstCode(e));
}

std::string CudaKernelEmitter::UnaryCode(kernel::UnaryOp op, ScalarType t,
                                         const std::string& x) const {
  // torch's CUDA rsqrt (and its batch norms' invstd) is CUDA's rsqrtf, 2 ulp; the CPU form, an
  // IEEE square root and division, is a subroutine per element (kiln_cuda_math.cuh).
  if (op == kernel::UnaryOp::kRsqrt && kernel::IsFloatType(t)) {
    return absl::StrCat("kiln_cuda::rsqrt(", x, ")");
  }
  return Retarget(CpuKernelEmitter::UnaryCode(op, t, x));
}

std::string CudaKernelEmitter::UnaryNodeCode(const ExprNode& e, const std::string& x) const {
  if (approx_exp_nodes_.count(&e)) return absl::StrCat("kiln_cuda::exp_approx(", x, ")");
  return UnaryCode(e.unary_op, e.args[0]->type, x);
}

std::string CudaKernelEmitter::BinaryCode(kernel::BinaryOp op, ScalarType t, const std::string& a,
                                          const std::string& b) const {
  return Retarget(CpuKernelEmitter::BinaryCode(op, t, a, b));
}

std::string CudaKernelEmitter::CastCode(ScalarType from, ScalarType to,
                                        const std::string& x) const {
  return Retarget(CpuKernelEmitter::CastCode(from, to, x));
}

std::string CudaKernelEmitter::WidenLane(const Buffer& b, const std::string& vec, int lane,
                                         int width) const {
  if (b.dtype == ScalarType::kBFloat16 && width % 2 == 0 && lane >= 0) {
    return absl::StrCat("kiln_cuda::bf16_lane<", lane, ", ", width, ">(", vec, ")");
  }
  return Widen(b, absl::StrCat(vec, ".v[", lane, "]"));
}

std::string CudaKernelEmitter::Widen(const Buffer& b, const std::string& raw) const {
  if (b.dtype == ScalarType::kBFloat16) return absl::StrCat("kiln_cuda::bf16_to_f32(", raw, ")");
  if (b.dtype == ScalarType::kFloat16) return absl::StrCat("kiln_cuda::f16_to_f32(", raw, ")");
  return raw;
}

std::string CudaKernelEmitter::Narrow(const Buffer& b, const std::string& v) const {
  if (b.dtype == ScalarType::kBFloat16) return absl::StrCat("kiln_cuda::f32_to_bf16(", v, ")");
  if (b.dtype == ScalarType::kFloat16) return absl::StrCat("kiln_cuda::f32_to_f16(", v, ")");
  return v;
}

std::string CudaKernelEmitter::LoadCode(const Buffer& b, const std::string& index) const {
  return Widen(b, absl::StrCat("b", b.index, "[", index, "]"));
}

std::string CudaKernelEmitter::LoadExprCode(const ExprNode& e) {
  const std::string key = AccessKey(e.buffer, e.index);
  // The access's vector in the lanes of a vector plan (EmitVectorLanes), or none.
  const VecAccess* vec = nullptr;
  if (plan_ != nullptr && lane_ >= 0) {
    auto it = plan_->loads.find(key);
    if (it != plan_->loads.end()) vec = &it->second;
  }
  if (tiled_) {  // a staged access (masked ones under the same mask: EmitTiled)
    auto tile = tiles_.find(key);
    if (tile != tiles_.end()) return absl::StrCat(tile->second, "[kiln_xl][kiln_i]");
  }
  if (!e.args.empty()) {  // masked: uncached; a lane of a vector load when the plan has one
    return vec != nullptr ? WidenLane(e.buffer, vec->name, lane_, plan_->width)
                          : CpuKernelEmitter::LoadExprCode(e);
  }
  if (body_lane_ >= 0) {
    auto pf = prefetched_.find(key);
    if (pf != prefetched_.end()) return Widen(e.buffer, absl::StrCat(pf->second, "[", body_lane_, "]"));
  }
  std::string code = vec != nullptr ? WidenLane(e.buffer, vec->name, lane_, plan_->width) : "";
  auto cached = cache_.find(key);
  if (cached == cache_.end()) {
    return code.empty() ? CpuKernelEmitter::LoadExprCode(e) : code;
  }
  if (smem_arrays_.count(cached->second.name)) {
    // kSharedRow: the slot is in shared memory; f16/bf16 as their bit patterns. Vector rows:
    // filled before the load's first phase (EmitSharedFill), `code` the chunk's vector read
    // from shared memory once (EmitVectorLanes).
    if (smem_vec_) return code.empty() ? SlotValue(cached->second.name) : code;
    const std::string slot = Slot(cached->second.name);
    if (phase_ != cached->second.first_phase || !filled_.insert(key).second) return SlotValue(cached->second.name);
    const std::string raw =
        vec != nullptr ? absl::StrCat(vec->name, ".v[", lane_, "]")
                       : absl::StrCat("b", e.buffer.index, "[", IndexCode(e.index), "]");
    const std::string v = absl::StrCat("v", next_value_++);
    w_.Linef("const ", SmemType(e.buffer.dtype), " ", v, " = ", raw, ";");
    w_.Linef(slot, " = ", v, ";");
    return Widen(e.buffer, v);
  }
  const std::string slot =
      width_ == 1 ? absl::StrCat(cached->second.name, "[kiln_e]")
                  : absl::StrCat(cached->second.name, "[kiln_e * ", width_, " + ", lane_, "]");
  if (phase_ == cached->second.first_phase && filled_.insert(key).second) {
    if (code.empty()) code = CpuKernelEmitter::LoadExprCode(e);
    w_.Linef(slot, " = ", code, ";");
  }
  return slot;
}

void CudaKernelEmitter::EmitFunction() {
  // Sizes over scalars: a 32-bit instance guarded by a run-time check (see below). Loop
  // variables read as values are widened to int64_t in both instances, as with idx32_.
  const std::string fits = idx32_ ? "" : Int32Check();
  if (!fits.empty()) idx32_ = true;
  PushScope();
  if (k_.is_pointwise()) {
    EmitPointwise();
  } else {
    EmitRows();
  }
  PopScope();
  CodeWriter head;
  head.Linef("// ", CudaKernelSymbol(cuda_, index_), ": ", CudaLayoutName(launch_.layout), ", ",
             k_.outer.size(), " outer dims, ", k_.reduce.size(), " reduction dims, ",
             k_.phases.size(), " phases, vector width ", launch_.vector_width, ", ",
             launch_.cached_values, " cached values per thread",
             launch_.layout == CudaLayout::kSharedRow
                 ? absl::StrCat(", ", launch_.shared_bytes, " bytes of shared row cache per block")
                 : "");
  std::vector<std::string> params;
  for (const Buffer& b : k_.buffers) {
    const std::string t = StorageType(b.dtype);
    switch (b.access) {
      case kernel::Access::kRead:
        params.push_back(absl::StrCat("const ", t, "* __restrict__ b", b.index));
        break;
      case kernel::Access::kWrite:
        params.push_back(absl::StrCat(t, "* __restrict__ b", b.index));
        break;
      case kernel::Access::kReadWrite:
        params.push_back(absl::StrCat(t, "* b", b.index));
        break;
    }
  }
  for (int i = 0; i < k_.num_scalars; ++i) params.push_back(absl::StrCat("int64_t n", i));
  if (fits.empty()) {
    head.Open(absl::StrCat("extern \"C\" __global__ void ", KernelAttributes(),
                           CudaKernelSymbol(cuda_, index_), "(", absl::StrJoin(params, ", "), ")"));
    head.Linef("using idx_t = ", idx32_ ? "int32_t" : "int64_t", ";");
    if (smem_bytes_ > 0) head.Line(SmemDeclaration());
    result_ = head.Take();
    result_ += hoisted_.str();
    result_ += w_.str();
    result_ += "}\n";
    return;
  }
  // Sizes over scalars: the body is a template on the index type, and the kernel takes the
  // 32-bit instance when the scalars make every size fit (the common case), else 64-bit.
  std::vector<std::string> args;
  for (const Buffer& b : k_.buffers) args.push_back(absl::StrCat("b", b.index));
  for (int i = 0; i < k_.num_scalars; ++i) args.push_back(absl::StrCat("n", i));
  std::vector<std::string> body_params = params;
  if (smem_bytes_ > 0) {
    body_params.push_back("unsigned char* kiln_smem");
    args.push_back("kiln_smem");
  }
  const std::string body = absl::StrCat(CudaKernelSymbol(cuda_, index_), "_body");
  head.Line("template <typename idx_t>");
  head.Open(absl::StrCat("KILN_DEV void ", body, "(", absl::StrJoin(body_params, ", "), ")"));
  result_ = head.Take();
  result_ += hoisted_.str();
  result_ += w_.str();
  result_ += "}\n";
  CodeWriter kernel;
  kernel.Open(absl::StrCat("extern \"C\" __global__ void ", KernelAttributes(),
                           CudaKernelSymbol(cuda_, index_), "(", absl::StrJoin(params, ", "), ")"));
  if (smem_bytes_ > 0) kernel.Line(SmemDeclaration());
  kernel.Open(absl::StrCat("if (", fits, ")"));
  kernel.Linef(body, "<int32_t>(", absl::StrJoin(args, ", "), ");");
  kernel.Close();
  kernel.Open("else");
  kernel.Linef(body, "<int64_t>(", absl::StrJoin(args, ", "), ");");
  kernel.Close();
  result_ += kernel.Take();
  result_ += "}\n";
}

std::string CudaKernelEmitter::KernelAttributes() const {
  if (launch_.layout == CudaLayout::kSharedRow) {
    // As many blocks per SM as their shared memory allows (registers: 65536 / that many).
    return absl::StrCat("__launch_bounds__(", launch_.block, ", ", shared_blocks_per_sm_, ") ");
  }
  if (launch_.layout != CudaLayout::kClusterRow) {
    return absl::StrCat("__launch_bounds__(", launch_.block, ") ");
  }
  // <= 64 registers a thread (what 1024 threads have): two blocks of 512 per SM.
  return absl::StrCat("__cluster_dims__(", launch_.cluster, ", 1, 1) __launch_bounds__(",
                      launch_.block, ", ", std::max(1, 1024 / launch_.block), ") ");
}

std::string CudaKernelEmitter::SmemDeclaration() const {
  if (launch_.layout == CudaLayout::kClusterRow) {
    return absl::StrCat("unsigned char* const kiln_smem = kiln_cuda::cluster_smem<", smem_bytes_,
                        ">();");
  }
  return absl::StrCat("alignas(16) __shared__ unsigned char kiln_smem[", smem_bytes_, "];");
}

std::string CudaKernelEmitter::Int32Check() const {
  const Size work = Product(k_.outer) * Product(k_.reduce);
  std::vector<Size> sizes = {work};
  for (const Buffer& b : k_.buffers) sizes.push_back(b.num_elements);
  std::vector<std::string> conds;
  const int64_t limit = std::numeric_limits<int32_t>::max() - kIndexSlack;
  for (const Size& s : sizes) {
    if (const absl::optional<int64_t> c = s.AsConst()) {
      if (*c < 0 || *c > limit) return "";
      continue;
    }
    std::vector<std::string> terms;
    for (const Size::Monomial& m : s.terms()) {
      std::vector<std::string> f;
      f.push_back(absl::StrCat(m.coeff, ".0"));
      for (int32_t p : m.params) f.push_back(absl::StrCat("static_cast<double>(n", p, ")"));
      terms.push_back(absl::StrJoin(f, " * "));
    }
    const std::string cond = absl::StrCat(absl::StrJoin(terms, " + "), " <= ", limit, ".0");
    if (std::find(conds.begin(), conds.end(), cond) == conds.end()) conds.push_back(cond);
  }
  if (conds.empty()) return "";
  return absl::StrJoin(conds, " && ");
}

void CudaKernelEmitter::EmitCudaStmt(const Stmt& s) {
  // A store of cast<f16/bf16>(x) to a buffer of that type narrows x once: the cast's rounding
  // (round_bf16: to a float) and the store's narrowing give the same bits as narrowing alone.
  const bool narrow_arg = s.kind == StmtKind::kStore && s.value->kind == ExprKind::kCast &&
                          kernel::IsHalfType(s.buffer.dtype) && s.value->type == s.buffer.dtype &&
                          (s.value->args[0]->type == ScalarType::kFloat32 ||
                           s.value->args[0]->type == s.buffer.dtype);
  const std::string v = ExprCode(narrow_arg ? s.value->args[0] : s.value);
  if (s.kind == StmtKind::kStore) {
    const std::string key = AccessKey(s.buffer, s.index);
    if (plan_ != nullptr && lane_ >= 0) {
      auto it = plan_->stores.find(key);
      if (it != plan_->stores.end()) {
        w_.Linef(it->second.name, ".v[", lane_, "] = ", Narrow(s.buffer, v), ";");
        return;
      }
    }
    w_.Linef("b", s.buffer.index, "[", IndexCode(s.index), "] = ", Narrow(s.buffer, v), ";");
    return;
  }
  const int id = s.acc.id;
  auto two = two_pass_.find(id);
  if (two != two_pass_.end()) {
    // Pass A of a two-pass reduction: keep the value, fold the first statistic.
    if (!two->second.reuses_cache) w_.Linef(Slot(two->second.array), " = ", v, ";");
    if (s.acc.kind == AccKind::kOnlineSoftmax) {
      w_.Linef("acc", id, ".max = kiln_cuda::max_nan(acc", id, ".max, ", v, ");");
    } else {
      w_.Linef("acc", id, ".mean += ", v, ";");
    }
    return;
  }
  switch (s.acc.kind) {
    case AccKind::kSum: w_.Linef("acc", id, " += ", v, ";"); break;
    case AccKind::kProd: w_.Linef("acc", id, " *= ", v, ";"); break;
    case AccKind::kMax: w_.Linef("acc", id, " = kiln_cuda::maximum(acc", id, ", ", v, ");"); break;
    case AccKind::kMin: w_.Linef("acc", id, " = kiln_cuda::minimum(acc", id, ", ", v, ");"); break;
    case AccKind::kArgMax: case AccKind::kArgMin:
      w_.Linef("acc", id, ".Update(", v, ", static_cast<int64_t>(kiln_r));");
      break;
    case AccKind::kWelford: case AccKind::kOnlineSoftmax:
      w_.Linef("acc", id, ".Update(", v, ");");
      break;
  }
}

}  // namespace kiln::codegen::internal
