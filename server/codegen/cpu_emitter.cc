#include "server/codegen/cpu_emitter.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/embedded_headers.h"
#include "server/base/status_macros.h"
#include "server/kernel/verifier.h"

namespace kiln::codegen {

using kernel::AccField;
using kernel::AccKind;
using kernel::Accumulator;
using kernel::BinaryOp;
using kernel::Buffer;
using kernel::Expr;
using kernel::ExprKind;
using kernel::ExprNode;
using kernel::Index;
using kernel::IndexTerm;
using kernel::Kernel;
using kernel::ScalarType;
using kernel::Size;
using kernel::Stmt;
using kernel::StmtKind;
using kernel::UnaryOp;
using kernel::Var;
using kernel::VarKind;

namespace {

constexpr int64_t kInt32Limit = std::numeric_limits<int32_t>::max();

Size Product(const std::vector<Size>& sizes, size_t begin, size_t end) {
  Size p = Size::Const(1);
  for (size_t i = begin; i < end; ++i) p = p * sizes[i];
  return p;
}

bool FitsInt32(const Size& s) {
  const absl::optional<int64_t> c = s.AsConst();
  return c && *c >= 0 && *c <= kInt32Limit;
}

bool IsFloatingValue(ScalarType t) { return kernel::IsFloatType(t); }

const char* AccName(AccKind k) {
  switch (k) {
    case AccKind::kArgMax: return "ArgMax";
    case AccKind::kArgMin: return "ArgMin";
    case AccKind::kWelford: return "Welford";
    case AccKind::kOnlineSoftmax: return "OnlineSoftmax";
    default: return "";
  }
}

}  // namespace

std::string CpuKernelSymbol(int index) { return absl::StrCat("kiln_kernel_", index); }

CpuKernelEmitter::CpuKernelEmitter(const Kernel& kernel, int index, const CpuEmitOptions& options)
    : k_(kernel), index_(index), options_(options) {}

absl::StatusOr<std::string> CpuKernelEmitter::Emit() {
  KILN_RETURN_IF_ERROR(kernel::VerifyKernel(k_));
  if (options_.block <= 0 || options_.parallel_threshold < 0) {
    return absl::InvalidArgumentError("cpu emitter: bad options");
  }
  // 32-bit indices when every size is a constant small enough that no index, unit count or
  // flattened reduction index can pass 2^31 - 1.
  idx32_ = Allows32BitIndices() && k_.num_scalars == 0;
  const Size rows = Product(k_.outer, 0, k_.outer.size());
  const Size work = rows * Product(k_.reduce, 0, k_.reduce.size());
  if (!FitsInt32(work + Size::Const(options_.block))) idx32_ = false;
  for (const Buffer& b : k_.buffers) {
    if (!FitsInt32(b.num_elements + Size::Const(options_.block))) idx32_ = false;
  }
  EmitFunction();
  return result_;
}

void CpuKernelEmitter::EmitFunction() {
  const std::string idx = idx32_ ? "int32_t" : "int64_t";
  // The body first (it decides which sizes are hoisted), then the head.
  PushScope();
  const bool columns = UseColumnLayout();
  if (k_.is_pointwise()) {
    EmitPointwiseLoops();
  } else if (columns) {
    EmitColumnLoops();
  } else {
    EmitRowLoops();
  }
  PopScope();
  CodeWriter head;
  head.Linef("// ", CpuKernelSymbol(index_), ": ",
             k_.is_pointwise() ? "pointwise" : columns ? "columns" : "rows", ", ",
             k_.outer.size(), " outer dims, ", k_.reduce.size(), " reduction dims, ",
             k_.phases.size(), " phases");
  head.Open(absl::StrCat("extern \"C\" __attribute__((visibility(\"default\"))) void ",
                         CpuKernelSymbol(index_),
                         "(void* const* kiln_buffers, const int64_t* kiln_scalars)"));
  if (k_.buffers.empty()) head.Line("(void)kiln_buffers;");
  if (k_.num_scalars == 0) head.Line("(void)kiln_scalars;");
  head.Linef("using idx_t = ", idx, ";");
  for (const Buffer& b : k_.buffers) {
    const std::string type = StorageType(b.dtype);
    const std::string cv = b.access == kernel::Access::kRead ? "const " : "";
    head.Linef(cv, type, "* b", b.index, " = static_cast<", cv, type, "*>(kiln_buffers[", b.index,
               "]);");
  }
  for (int i = 0; i < k_.num_scalars; ++i) head.Linef("const int64_t n", i, " = kiln_scalars[", i, "];");
  result_ = head.Take();
  result_ += hoisted_.str();
  result_ += w_.str();
  result_ += "}\n";
}

std::string CpuKernelEmitter::ParallelPragma(const Size& work) {
  const absl::optional<int64_t> c = work.AsConst();
  if (c) {
    return *c >= options_.parallel_threshold ? "#pragma omp parallel for schedule(static)" : "";
  }
  return absl::StrCat("#pragma omp parallel for schedule(static) if (", SizeCode(work),
                      " >= ", options_.parallel_threshold, ")");
}

void CpuKernelEmitter::EmitDecompose(const std::string& unit, int num_dims, const std::vector<int>& skip) {
  std::vector<int> dims;
  for (int i = 0; i < num_dims; ++i) {
    if (std::find(skip.begin(), skip.end(), i) == skip.end()) dims.push_back(i);
  }
  if (dims.empty()) return;
  if (dims.size() == 1) {
    w_.Linef("const idx_t o", dims[0], " = ", unit, ";");
    return;
  }
  w_.Linef("idx_t kiln_rest = ", unit, ";");
  for (size_t j = dims.size() - 1; j >= 1; --j) {
    const std::string e = SizeCode(k_.outer[dims[j]]);
    w_.Linef("const idx_t o", dims[j], " = kiln_rest % ", e, ";");
    w_.Linef("kiln_rest /= ", e, ";");
  }
  w_.Linef("const idx_t o", dims[0], " = kiln_rest;");
}

void CpuKernelEmitter::EmitPointwiseLoops() {
  const int k = static_cast<int>(k_.outer.size());
  if (k == 0) {
    for (const Stmt& s : k_.body) EmitStmt(s);
    return;
  }
  const int last = k - 1;
  const Size& inner = k_.outer[last];
  const Size rows = Product(k_.outer, 0, last);
  const Size total = rows * inner;
  const absl::optional<int64_t> inner_c = inner.AsConst();
  const bool blocked = !(inner_c && *inner_c <= options_.block);
  const std::string inner_code = SizeCode(inner);
  std::string units;
  if (blocked) {
    const std::string blocks =
        inner_c ? absl::StrCat((*inner_c + options_.block - 1) / options_.block)
                : absl::StrCat("((", inner_code, " + ", options_.block - 1, ") / ", options_.block, ")");
    w_.Linef("const idx_t kiln_blocks = ", blocks, ";");
    units = rows.is_const(1) ? "kiln_blocks" : absl::StrCat(SizeCode(rows), " * kiln_blocks");
  } else {
    units = SizeCode(rows);
  }
  const bool single_unit = !blocked && rows.is_const(1);
  if (!single_unit) {
    const std::string pragma = ParallelPragma(total);
    if (!pragma.empty()) w_.Raw(pragma);
    w_.Open(absl::StrCat("for (idx_t kiln_u = 0; kiln_u < ", units, "; ++kiln_u)"));
  }
  std::string begin = "0", end = inner_code;
  if (blocked) {
    w_.Line("const idx_t kiln_block = kiln_u % kiln_blocks;");
    if (last > 0) EmitDecompose("kiln_u / kiln_blocks", last);
    w_.Linef("const idx_t kiln_begin = kiln_block * ", options_.block, ";");
    w_.Linef("const idx_t kiln_end = kiln_cpu::imin<idx_t>(kiln_begin + ", options_.block, ", ",
             inner_code, ");");
    begin = "kiln_begin";
    end = "kiln_end";
  } else if (!single_unit) {
    EmitDecompose("kiln_u", last);
  }
  const bool unit_scope = single_unit && last > 0;  // one unit: the dims before the last have extent 1
  if (unit_scope) {
    w_.Open("");
    for (int i = 0; i < last; ++i) w_.Linef("const idx_t o", i, " = 0;");
  }
  w_.Open(absl::StrCat("for (idx_t o", last, " = ", begin, "; o", last, " < ", end, "; ++o", last,
                       ")"));
  PushScope();
  for (const Stmt& s : k_.body) EmitStmt(s);
  PopScope();
  w_.Close();
  if (!single_unit || unit_scope) w_.Close();
}

void CpuKernelEmitter::EmitRowLoops() {
  const int k = static_cast<int>(k_.outer.size());
  const Size rows = Product(k_.outer, 0, k);
  const Size work = rows * Product(k_.reduce, 0, k_.reduce.size());
  const bool single = rows.is_const(1);
  if (!single) {
    const std::string pragma = ParallelPragma(work);
    if (!pragma.empty()) w_.Raw(pragma);
    w_.Open(absl::StrCat("for (idx_t kiln_u = 0; kiln_u < ", SizeCode(rows), "; ++kiln_u)"));
    EmitDecompose("kiln_u", k);
  } else {
    w_.Open("");
    for (int i = 0; i < k; ++i) w_.Linef("const idx_t o", i, " = 0;");
  }
  PushScope();
  for (const Accumulator& a : k_.accumulators) {
    const std::string t = ValueType(a.dtype);
    switch (a.kind) {
      case AccKind::kSum: w_.Linef(t, " acc", a.id, " = 0;"); break;
      case AccKind::kProd: w_.Linef(t, " acc", a.id, " = 1;"); break;
      case AccKind::kMax: w_.Linef(t, " acc", a.id, " = kiln_cpu::lowest<", t, ">();"); break;
      case AccKind::kMin: w_.Linef(t, " acc", a.id, " = kiln_cpu::highest<", t, ">();"); break;
      default: w_.Linef("kiln_cpu::", AccName(a.kind), "<", t, "> acc", a.id, ";"); break;
    }
  }
  PlanSoftmaxTwoPass();
  for (const SoftmaxTwoPass& tp : two_pass_) {
    w_.Linef(ValueType(tp.stmt->acc.dtype), " ", tp.array, "[", tp.length, "];");
  }
  for (size_t p = 0; p < k_.phases.size(); ++p) {
    auto tp = std::find_if(two_pass_.begin(), two_pass_.end(),
                           [&](const SoftmaxTwoPass& t) { return t.phase == p; });
    if (tp != two_pass_.end()) {
      EmitSoftmaxTwoPass(*tp);
    } else {
      EmitPhase(p);
    }
    // A Welford accumulator holds the whole row only once its pending blocks are folded in.
    std::vector<int> welford;
    for (const Stmt& s : k_.phases[p].stmts) {
      if (s.kind == StmtKind::kAccumulate && s.acc.kind == AccKind::kWelford &&
          std::find(welford.begin(), welford.end(), s.acc.id) == welford.end()) {
        welford.push_back(s.acc.id);
      }
    }
    for (int id : welford) w_.Linef("acc", id, ".Flush();");
  }
  for (const Stmt& s : k_.body) EmitStmt(s);
  two_pass_.clear();
  PopScope();
  w_.Close();
}

namespace {

// The identity of a scalar accumulator of type `t`, or "" for kinds that are structs.
std::string ScalarIdentity(AccKind kind, const std::string& t) {
  switch (kind) {
    case AccKind::kSum: return "0";
    case AccKind::kProd: return "1";
    case AccKind::kMax: return absl::StrCat("kiln_cpu::lowest<", t, ">()");
    case AccKind::kMin: return absl::StrCat("kiln_cpu::highest<", t, ">()");
    default: return "";
  }
}

void CollectLoads(const Expr& e, std::vector<const ExprNode*>* out) {
  if (e->kind == ExprKind::kLoad) out->push_back(e.get());
  for (const Expr& a : e->args) CollectLoads(a, out);
}

bool DependsOnReduction(const Expr& e) {
  if (e->kind == ExprKind::kLoopVar && e->var.kind == VarKind::kReduce) return true;
  if (e->kind == ExprKind::kLoad) {
    for (const IndexTerm& t : e->index.terms) {
      if (t.var.kind == VarKind::kReduce) return true;
    }
  }
  for (const Expr& a : e->args) {
    if (DependsOnReduction(a)) return true;
  }
  return false;
}

// The stride of `var` in `index` (0 when the index does not use it).
Size StrideOf(const Index& index, const Var& var) {
  for (const IndexTerm& t : index.terms) {
    if (t.var == var) return t.stride;
  }
  return Size::Const(0);
}

// The lane helper for an accumulator kind, or nullptr if the kind has none.
const char* LanesName(AccKind k) {
  switch (k) {
    case AccKind::kWelford: return "WelfordLanes";
    case AccKind::kOnlineSoftmax: return "OnlineSoftmaxLanes";
    case AccKind::kMax: return "MaxLanes";
    case AccKind::kMin: return "MinLanes";
    default: return nullptr;
  }
}

}  // namespace

void CpuKernelEmitter::HoistInvariantExpr(const Expr& e) {
  switch (e->kind) {
    case ExprKind::kConst: case ExprKind::kScalar: case ExprKind::kLoopVar: case ExprKind::kAccRead:
      return;  // already names or literals
    default: break;
  }
  if (!DependsOnReduction(e)) {
    ExprCode(e);
    return;
  }
  for (const Expr& a : e->args) HoistInvariantExpr(a);
}

void CpuKernelEmitter::HoistInvariants(const std::vector<Stmt>& stmts) {
  for (const Stmt& s : stmts) HoistInvariantExpr(s.value);
}

bool CpuKernelEmitter::UseColumnLayout() const {
  if (options_.column_block <= 1 || k_.is_pointwise() || k_.outer.empty() || k_.reduce.empty() ||
      k_.phases.size() != 1) {
    return false;
  }
  for (const Accumulator& a : k_.accumulators) {
    if (ScalarIdentity(a.kind, "").empty()) return false;
  }
  const absl::optional<int64_t> width = k_.outer.back().AsConst();
  if (width && *width < 16) return false;  // too narrow to fill a vector
  const Var o_last{VarKind::kOuter, static_cast<int32_t>(k_.outer.size() - 1)};
  const Var r_last{VarKind::kReduce, static_cast<int32_t>(k_.reduce.size() - 1)};
  int across = 0;  // loads contiguous across outer points, strided along the reduction
  for (const Stmt& s : k_.phases[0].stmts) {
    std::vector<const ExprNode*> loads;
    CollectLoads(s.value, &loads);
    for (const ExprNode* load : loads) {
      const Size so = StrideOf(load->index, o_last);
      const Size sr = StrideOf(load->index, r_last);
      if (sr.is_const(1) && !so.is_const(0)) return false;  // a row layout reads it contiguously
      if (so.is_const(1) && !sr.is_const(0)) ++across;
    }
  }
  return across > 0;
}

void CpuKernelEmitter::EmitColumnLoops() {
  const int last = static_cast<int>(k_.outer.size()) - 1;
  const int m = static_cast<int>(k_.reduce.size());
  const Size& inner = k_.outer[last];
  const Size rows = Product(k_.outer, 0, last);
  const std::string inner_code = SizeCode(inner);
  const absl::optional<int64_t> inner_c = inner.AsConst();
  const absl::optional<int64_t> rows_c = rows.AsConst();
  int64_t block = options_.column_block;
  while (block > 16 && inner_c && rows_c && *rows_c * ((*inner_c + block - 1) / block) < 8) {
    block /= 2;  // narrow: smaller blocks, so that several threads get units
  }
  const std::string blocks =
      inner_c ? absl::StrCat((*inner_c + block - 1) / block)
              : absl::StrCat("((", inner_code, " + ", block - 1, ") / ", block, ")");
  w_.Linef("const idx_t kiln_blocks = ", blocks, ";");
  const std::string pragma =
      ParallelPragma(rows * inner * Product(k_.reduce, 0, k_.reduce.size()));
  if (!pragma.empty()) w_.Raw(pragma);
  w_.Open(absl::StrCat("for (idx_t kiln_u = 0; kiln_u < ",
                       rows.is_const(1) ? "kiln_blocks" : absl::StrCat(SizeCode(rows), " * kiln_blocks"),
                       "; ++kiln_u)"));
  w_.Line("const idx_t kiln_block = kiln_u % kiln_blocks;");
  if (last > 0) EmitDecompose("kiln_u / kiln_blocks", last);
  w_.Linef("const idx_t kiln_begin = kiln_block * ", block, ";");
  w_.Linef("const idx_t kiln_end = kiln_cpu::imin<idx_t>(kiln_begin + ", block, ", ", inner_code, ");");
  for (const Accumulator& a : k_.accumulators) {
    const std::string t = ValueType(a.dtype);
    w_.Linef(t, " acc", a.id, "_c[", block, "];");
    w_.Linef("for (int kiln_j = 0; kiln_j < ", block, "; ++kiln_j) acc", a.id, "_c[kiln_j] = ",
             ScalarIdentity(a.kind, t), ";");
  }
  const std::string o = absl::StrCat("o", last);
  const std::string points = absl::StrCat("for (idx_t ", o, " = kiln_begin; ", o, " < kiln_end; ++",
                                          o, ")");
  w_.Line("// phase 0 (columns)");
  for (int i = 0; i < m; ++i) {
    w_.Open(absl::StrCat("for (idx_t r", i, " = 0; r", i, " < ", SizeCode(k_.reduce[i]), "; ++r",
                         i, ")"));
  }
  w_.Open(points);
  w_.Linef("const idx_t kiln_j = ", o, " - kiln_begin;");
  column_mode_ = true;
  PushScope();
  for (const Stmt& s : k_.phases[0].stmts) EmitStmt(s);
  PopScope();
  column_mode_ = false;
  for (int i = 0; i <= m; ++i) w_.Close();
  w_.Open(points);
  w_.Linef("const idx_t kiln_j = ", o, " - kiln_begin;");
  for (const Accumulator& a : k_.accumulators) {
    w_.Linef("const ", ValueType(a.dtype), " acc", a.id, " = acc", a.id, "_c[kiln_j];");
  }
  PushScope();
  for (const Stmt& s : k_.body) EmitStmt(s);
  PopScope();
  w_.Close();
  w_.Close();
}

void CpuKernelEmitter::EmitLanePhase(size_t p) {
  const std::vector<Stmt>& stmts = k_.phases[p].stmts;
  const int lanes = options_.reduction_lanes;
  const int m = static_cast<int>(k_.reduce.size());
  w_.Linef("// phase ", p, " (", lanes, " lanes)");
  w_.Open("");
  PushScope();  // the hoisted values live in this block
  HoistInvariants(stmts);
  std::vector<int> accs;
  for (const Stmt& s : stmts) {
    if (s.kind == StmtKind::kAccumulate &&
        std::find(accs.begin(), accs.end(), s.acc.id) == accs.end()) {
      accs.push_back(s.acc.id);
      w_.Linef("kiln_cpu::", LanesName(s.acc.kind), "<", ValueType(s.acc.dtype), ", ", lanes,
               "> acc", s.acc.id, "_l;");
    }
  }
  for (int i = 0; i < m - 1; ++i) {
    w_.Open(absl::StrCat("for (idx_t r", i, " = 0; r", i, " < ", SizeCode(k_.reduce[i]), "; ++r",
                         i, ")"));
  }
  const std::string last = absl::StrCat("r", m - 1);
  const std::string extent = SizeCode(k_.reduce[m - 1]);
  w_.Linef("const idx_t kiln_full = ", extent, " - ", extent, " % ", lanes, ";");
  w_.Open(absl::StrCat("for (idx_t kiln_base = 0; kiln_base < kiln_full; kiln_base += ", lanes, ")"));
  // A constant trip count (kiln_base + lanes could wrap under -fwrapv): one vector per iteration.
  w_.Open(absl::StrCat("for (int kiln_lane = 0; kiln_lane < ", lanes, "; ++kiln_lane)"));
  w_.Linef("const idx_t ", last, " = kiln_base + kiln_lane;");
  lane_mode_ = true;
  PushScope();
  SeedExpReuse(p);
  for (const Stmt& s : stmts) EmitStmt(s);
  PopScope();
  lane_mode_ = false;
  w_.Close();
  w_.Close();
  w_.Open(absl::StrCat("for (idx_t ", last, " = kiln_full; ", last, " < ", extent, "; ++", last, ")"));
  PushScope();
  SeedExpReuse(p);
  for (const Stmt& s : stmts) EmitStmt(s);
  PopScope();
  w_.Close();
  for (int i = 0; i < m - 1; ++i) w_.Close();
  for (int id : accs) w_.Linef("acc", id, "_l.CombineInto(acc", id, ");");
  PopScope();
  w_.Close();
}

void CpuKernelEmitter::EmitPhase(size_t p) {
  const std::vector<Stmt>& stmts = k_.phases[p].stmts;
  // Lanes: every accumulator folded here has a lane helper, and the innermost loop is long enough.
  if (options_.reduction_lanes > 1 && !k_.reduce.empty()) {
    bool lanes_ok = false;
    for (const Stmt& s : stmts) {
      if (s.kind != StmtKind::kAccumulate) continue;
      lanes_ok = LanesName(s.acc.kind) != nullptr;
      if (!lanes_ok) break;
    }
    const absl::optional<int64_t> e = k_.reduce.back().AsConst();
    if (e && *e < 2 * options_.reduction_lanes) lanes_ok = false;
    if (lanes_ok) {
      EmitLanePhase(p);
      return;
    }
  }
  // Sum/prod-only float phases may reassociate (as torch's own reductions do): omp simd.
  std::vector<std::string> simd;
  bool only_sums = true;
  for (const Stmt& s : stmts) {
    if (s.kind != StmtKind::kAccumulate) continue;
    if (s.acc.kind == AccKind::kSum || s.acc.kind == AccKind::kProd) {
      const std::string item =
          absl::StrCat(s.acc.kind == AccKind::kSum ? "+" : "*", ":acc", s.acc.id);
      if (std::find(simd.begin(), simd.end(), item) == simd.end()) simd.push_back(item);
    } else {
      only_sums = false;
    }
  }
  w_.Linef("// phase ", p);
  const int m = static_cast<int>(k_.reduce.size());
  HoistInvariants(stmts);
  if (m == 0) w_.Open("");
  // A single row (a full reduction) would run on one thread: split its outermost reduction loop
  // across threads instead (sum/prod only; the result then depends on the thread count, as
  // torch's own CPU reductions do).
  const bool sums = only_sums && !simd.empty();
  const std::string reductions =
      sums ? absl::StrCat("reduction(", absl::StrJoin(simd, ") reduction("), ")") : "";
  std::string split;
  if (sums && m > 0 && Product(k_.outer, 0, k_.outer.size()).is_const(1)) {
    split = ParallelPragma(Product(k_.reduce, 0, k_.reduce.size()));
    if (!split.empty()) {
      if (m == 1) split.replace(split.find("parallel for"), 12, "parallel for simd");
      split = absl::StrCat(split, " ", reductions);
    }
  }
  for (int i = 0; i < m; ++i) {
    if (i == 0 && !split.empty()) {
      w_.Raw(split);
    } else if (i == m - 1 && sums) {
      w_.Raw(absl::StrCat("#pragma omp simd ", reductions));
    }
    w_.Open(absl::StrCat("for (idx_t r", i, " = 0; r", i, " < ", SizeCode(k_.reduce[i]), "; ++r",
                         i, ")"));
  }
  PushScope();
  SeedExpReuse(p);
  for (const Stmt& s : stmts) EmitStmt(s);
  PopScope();
  for (int i = 0; i < std::max(m, 1); ++i) w_.Close();
}

void CpuKernelEmitter::EmitStmt(const Stmt& s) {
  const std::string v = ExprCode(s.value);
  if (s.kind == StmtKind::kStore) {
    std::string value = v;
    if (s.buffer.dtype == ScalarType::kBFloat16) value = absl::StrCat("kiln_cpu::f32_to_bf16(", v, ")");
    if (s.buffer.dtype == ScalarType::kFloat16) value = absl::StrCat("kiln_cpu::f32_to_f16(", v, ")");
    if (s.buffer.dtype == ScalarType::kBool && BoolStoredAsBytes()) value = absl::StrCat("static_cast<uint8_t>(", v, ")");
    w_.Linef("b", s.buffer.index, "[", IndexCode(s.index), "] = ", value, ";");
    return;
  }
  const int id = s.acc.id;
  if (lane_mode_) {
    w_.Linef("acc", id, "_l.Update(kiln_lane, ", v, ");");
    return;
  }
  if (column_mode_) {
    const std::string a = absl::StrCat("acc", id, "_c[kiln_j]");
    switch (s.acc.kind) {
      case AccKind::kSum: w_.Linef(a, " += ", v, ";"); break;
      case AccKind::kProd: w_.Linef(a, " *= ", v, ";"); break;
      case AccKind::kMax: w_.Linef(a, " = kiln_cpu::maximum(", a, ", ", v, ");"); break;
      case AccKind::kMin: w_.Linef(a, " = kiln_cpu::minimum(", a, ", ", v, ");"); break;
      default: break;  // UseColumnLayout admits scalar accumulators only
    }
    return;
  }
  switch (s.acc.kind) {
    case AccKind::kSum: w_.Linef("acc", id, " += ", v, ";"); break;
    case AccKind::kProd: w_.Linef("acc", id, " *= ", v, ";"); break;
    case AccKind::kMax: w_.Linef("acc", id, " = kiln_cpu::maximum(acc", id, ", ", v, ");"); break;
    case AccKind::kMin: w_.Linef("acc", id, " = kiln_cpu::minimum(acc", id, ", ", v, ");"); break;
    case AccKind::kArgMax: case AccKind::kArgMin: {
      std::vector<Var> vars;
      for (size_t i = 0; i < k_.reduce.size(); ++i) {
        vars.push_back(Var{VarKind::kReduce, static_cast<int32_t>(i)});
      }
      const std::string flat = IndexCode(kernel::ContiguousIndex(vars, k_.reduce));
      w_.Linef("acc", id, ".Update(", v, ", static_cast<int64_t>(", flat, "));");
      break;
    }
    case AccKind::kWelford: case AccKind::kOnlineSoftmax:
      w_.Linef("acc", id, ".Update(", v, ");");
      break;
  }
}

std::string CpuKernelEmitter::SizeCode(const Size& s) {
  if (const absl::optional<int64_t> c = s.AsConst()) return absl::StrCat(*c);
  if (s.terms().size() == 1 && s.terms()[0].coeff == 1 && s.terms()[0].params.size() == 1) {
    return absl::StrCat("n", s.terms()[0].params[0]);
  }
  const std::string text = s.ToString();
  auto it = sizes_.find(text);
  if (it != sizes_.end()) return it->second;
  std::vector<std::string> terms;
  for (const Size::Monomial& m : s.terms()) {
    std::vector<std::string> f;
    if (m.coeff != 1 || m.params.empty()) f.push_back(absl::StrCat(m.coeff));
    for (int32_t p : m.params) f.push_back(absl::StrCat("n", p));
    terms.push_back(absl::StrJoin(f, " * "));
  }
  const std::string name = absl::StrCat("z", next_size_++);
  hoisted_.Linef("const int64_t ", name, " = ", absl::StrJoin(terms, " + "), ";");
  sizes_[text] = name;
  return name;
}

std::string CpuKernelEmitter::IndexCode(const Index& index) {
  std::vector<std::string> parts;
  for (const IndexTerm& t : index.terms) {
    const std::string var = kernel::VarName(t.var);
    parts.push_back(t.stride.is_const(1) ? var : absl::StrCat(var, " * ", SizeCode(t.stride)));
  }
  const absl::optional<int64_t> off = index.offset.AsConst();
  if (off && *off < 0 && !parts.empty()) {  // masked loads may have negative offsets
    return absl::StrCat(absl::StrJoin(parts, " + "), " - ", -*off);
  }
  if (!index.offset.is_const(0) || parts.empty()) parts.push_back(SizeCode(index.offset));
  return absl::StrJoin(parts, " + ");
}

std::string CpuKernelEmitter::LoadExprCode(const ExprNode& e) {
  return LoadCode(e.buffer, IndexCode(e.index));
}

std::string CpuKernelEmitter::LoadCode(const Buffer& b, const std::string& index) const {
  const std::string raw = absl::StrCat("b", b.index, "[", index, "]");
  if (b.dtype == ScalarType::kBFloat16) return absl::StrCat("kiln_cpu::bf16_to_f32(", raw, ")");
  if (b.dtype == ScalarType::kFloat16) return absl::StrCat("kiln_cpu::f16_to_f32(", raw, ")");
  if (b.dtype == ScalarType::kBool && BoolStoredAsBytes()) return absl::StrCat("(", raw, " != 0)");
  return raw;
}

std::string CpuKernelEmitter::ExprCode(const Expr& e) {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    auto found = it->find(e.get());
    if (found != it->end()) return found->second;
  }
  std::string code;
  switch (e->kind) {
    case ExprKind::kConst:
      return ConstCode(*e);
    case ExprKind::kScalar:
      return absl::StrCat("n", e->scalar);
    case ExprKind::kLoopVar:
      return idx32_ ? absl::StrCat("static_cast<int64_t>(", kernel::VarName(e->var), ")")
                    : kernel::VarName(e->var);
    case ExprKind::kAccRead: {
      const std::string acc = absl::StrCat("acc", e->acc.id);
      switch (e->field) {
        case AccField::kValue:
          return e->acc.kind == AccKind::kArgMax || e->acc.kind == AccKind::kArgMin
                     ? absl::StrCat(acc, ".value") : acc;
        case AccField::kIndex: return absl::StrCat(acc, ".index");
        case AccField::kMean: return absl::StrCat(acc, ".mean");
        case AccField::kM2: return absl::StrCat(acc, ".m2");
        case AccField::kCount: return absl::StrCat(acc, ".count");
        case AccField::kMax: return absl::StrCat(acc, ".max");
        case AccField::kSum: return absl::StrCat(acc, ".sum");
      }
      return acc;
    }
    case ExprKind::kLoad:
      code = LoadExprCode(*e);
      if (!e->args.empty()) {  // masked: no memory access where the mask is false
        code = absl::StrCat(ExprCode(e->args[0]), " ? ", code, " : ", ValueType(e->type), "(0)");
      }
      break;
    case ExprKind::kUnary:
      code = UnaryNodeCode(*e, ExprCode(e->args[0]));
      break;
    case ExprKind::kBinary: {
      const std::string a = ExprCode(e->args[0]);
      const std::string b = ExprCode(e->args[1]);
      code = BinaryCode(e->binary_op, e->args[0]->type, a, b);
      break;
    }
    case ExprKind::kSelect: {
      const std::string c = ExprCode(e->args[0]);
      const std::string a = ExprCode(e->args[1]);
      const std::string b = ExprCode(e->args[2]);
      code = absl::StrCat(c, " ? ", a, " : ", b);
      break;
    }
    case ExprKind::kCast: {
      const std::string x = ExprCode(e->args[0]);
      code = CastCode(e->args[0]->type, e->type, x);
      if (code == x) {  // a change of type only (f16/bf16 -> f32 values are floats already)
        scopes_.back()[e.get()] = x;
        return x;
      }
      break;
    }
  }
  const std::string name = absl::StrCat("v", next_value_++);
  w_.Linef("const ", ValueType(e->type), " ", name, " = ", code, ";");
  scopes_.back()[e.get()] = name;
  return name;
}

std::string CpuKernelEmitter::ValueType(ScalarType t) const {
  switch (t) {
    case ScalarType::kBool: return "bool";
    case ScalarType::kInt8: return "int8_t";
    case ScalarType::kUInt8: return "uint8_t";
    case ScalarType::kInt32: return "int32_t";
    case ScalarType::kInt64: return "int64_t";
    case ScalarType::kFloat16: case ScalarType::kBFloat16: case ScalarType::kFloat32: return "float";
    case ScalarType::kFloat64: return "double";
  }
  return "void";
}

std::string CpuKernelEmitter::StorageType(ScalarType t) const {
  if (t == ScalarType::kBool && BoolStoredAsBytes()) return "uint8_t";
  return kernel::IsHalfType(t) ? "uint16_t" : ValueType(t);
}

std::string CpuKernelEmitter::ConstCode(const ExprNode& e) const {
  const std::string t = ValueType(e.type);
  if (!IsFloatingValue(e.type)) {
    if (e.type == ScalarType::kBool) return e.int_value ? "true" : "false";
    if (e.type == ScalarType::kInt64 && e.int_value == std::numeric_limits<int64_t>::min()) {
      return "kiln_cpu::lowest<int64_t>()";
    }
    return absl::StrCat(t, "{", e.int_value, "}");
  }
  const double v = e.float_value;
  if (std::isnan(v)) return absl::StrCat("kiln_cpu::nan<", t, ">()");
  if (std::isinf(v)) return absl::StrCat(v < 0 ? "(-" : "", "kiln_cpu::inf<", t, ">()", v < 0 ? ")" : "");
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%a", v);
  const std::string lit = absl::StrCat(buf, e.type == ScalarType::kFloat64 ? "" : "f");
  return std::signbit(v) ? absl::StrCat("(", lit, ")") : lit;
}

std::string CpuKernelEmitter::UnaryCode(UnaryOp op, ScalarType t, const std::string& x) const {
  const bool fl = IsFloatingValue(t);
  const std::string T = ValueType(t);
  auto call = [&](const char* f) { return absl::StrCat(f, "(", x, ")"); };
  switch (op) {
    case UnaryOp::kNeg: return absl::StrCat("static_cast<", T, ">(-", x, ")");
    case UnaryOp::kAbs: return call("kiln_cpu::abs");
    case UnaryOp::kExp: return call("kiln_cpu::exp");  // vectorizable (kiln_math.h)
    case UnaryOp::kExp2: return call("kiln_cpu::exp2");
    case UnaryOp::kExpm1: return call("kiln_cpu::expm1");
    case UnaryOp::kLog: return call("kiln_cpu::log");
    case UnaryOp::kLog1p: return call("kiln_cpu::log1p");
    case UnaryOp::kLog2: return call("kiln_cpu::log2");
    case UnaryOp::kSqrt: return call("kiln_cpu::sqrt");
    case UnaryOp::kRsqrt: return absl::StrCat(T, "(1) / kiln_cpu::sqrt(", x, ")");
    case UnaryOp::kReciprocal: return absl::StrCat(T, "(1) / ", x);
    case UnaryOp::kSin: return call("kiln_cpu::sin");
    case UnaryOp::kCos: return call("kiln_cpu::cos");
    case UnaryOp::kTanh: return call("kiln_cpu::tanh");
    case UnaryOp::kSigmoid: return call("kiln_cpu::sigmoid");
    case UnaryOp::kErf: return call("kiln_cpu::erf");  // vectorizable (kiln_math.h)
    case UnaryOp::kRelu: return call("kiln_cpu::relu");
    case UnaryOp::kGelu: return call("kiln_cpu::gelu");
    case UnaryOp::kGeluTanh: return call("kiln_cpu::gelu_tanh");
    case UnaryOp::kSilu: return call("kiln_cpu::silu");
    case UnaryOp::kFloor: return fl ? call("kiln_cpu::floor") : x;
    case UnaryOp::kCeil: return fl ? call("kiln_cpu::ceil") : x;
    case UnaryOp::kRound: return fl ? call("kiln_cpu::nearbyint") : x;
    case UnaryOp::kTrunc: return fl ? call("kiln_cpu::trunc") : x;
    case UnaryOp::kSign: return call("kiln_cpu::sign");
    case UnaryOp::kIsNan: return fl ? absl::StrCat("(", x, " != ", x, ")") : "false";
    case UnaryOp::kIsInf: return fl ? call("kiln_cpu::is_inf") : "false";
    case UnaryOp::kLogicalNot: return absl::StrCat("(", x, " == ", T, "(0))");
    case UnaryOp::kBitwiseNot:
      return t == ScalarType::kBool ? absl::StrCat("!", x)
                                    : absl::StrCat("static_cast<", T, ">(~", x, ")");
  }
  return x;
}

bool CpuKernelEmitter::IsRowDivisor(const std::string& b) {
  if (b.rfind("acc", 0) != 0) return false;
  size_t i = 3;
  while (i < b.size() && b[i] >= '0' && b[i] <= '9') ++i;
  if (i == 3) return false;
  const std::string field = b.substr(i);
  return field == ".sum" || field == ".count";
}

std::string CpuKernelEmitter::BinaryCode(BinaryOp op, ScalarType t, const std::string& a,
                                         const std::string& b) const {
  const std::string T = ValueType(t);
  if (op == BinaryOp::kTrueDiv && (t == ScalarType::kFloat32 || t == ScalarType::kFloat64) &&
      IsRowDivisor(b)) {
    // x / s for a row's softmax sum (>= 1, or 0 / NaN) or Welford count (>= 1): x * (1 / s), as
    // torch's own softmax does, the reciprocal hoisted out of the row's loop; within 1.5 ulp of
    // x / s, and a multiply per element instead of a division.
    return absl::StrCat(a, " * (", T, "(1) / ", b, ")");
  }
  auto infix = [&](const char* o) {
    // Narrow integers promote to int in C++: convert back (wraps, with -fwrapv semantics).
    if (t == ScalarType::kInt8 || t == ScalarType::kUInt8) {
      return absl::StrCat("static_cast<", T, ">(", a, " ", o, " ", b, ")");
    }
    return absl::StrCat(a, " ", o, " ", b);
  };
  auto call = [&](const char* f) { return absl::StrCat(f, "<", T, ">(", a, ", ", b, ")"); };
  auto truthy = [&](const std::string& x) {
    return t == ScalarType::kBool ? x : absl::StrCat("(", x, " != ", T, "(0))");
  };
  switch (op) {
    case BinaryOp::kAdd: return infix("+");
    case BinaryOp::kSub: return infix("-");
    case BinaryOp::kMul: return infix("*");
    case BinaryOp::kTrueDiv: return infix("/");
    case BinaryOp::kTruncDiv: return call("kiln_cpu::div_trunc");
    case BinaryOp::kFloorDiv: return call("kiln_cpu::div_floor");
    case BinaryOp::kRemainder: return call("kiln_cpu::remainder");
    case BinaryOp::kFmod: return call("kiln_cpu::fmod");
    case BinaryOp::kPow: return call("kiln_cpu::pow");
    case BinaryOp::kMaximum: return call("kiln_cpu::maximum");
    case BinaryOp::kMinimum: return call("kiln_cpu::minimum");
    case BinaryOp::kEq: return absl::StrCat(a, " == ", b);
    case BinaryOp::kNe: return absl::StrCat(a, " != ", b);
    case BinaryOp::kLt: return absl::StrCat(a, " < ", b);
    case BinaryOp::kLe: return absl::StrCat(a, " <= ", b);
    case BinaryOp::kGt: return absl::StrCat(a, " > ", b);
    case BinaryOp::kGe: return absl::StrCat(a, " >= ", b);
    case BinaryOp::kLogicalAnd: return absl::StrCat(truthy(a), " && ", truthy(b));
    case BinaryOp::kLogicalOr: return absl::StrCat(truthy(a), " || ", truthy(b));
    case BinaryOp::kLogicalXor: return absl::StrCat(truthy(a), " != ", truthy(b));
    case BinaryOp::kBitwiseAnd:
    case BinaryOp::kBitwiseOr:
    case BinaryOp::kBitwiseXor: {
      const char* o = op == BinaryOp::kBitwiseAnd ? "&" : op == BinaryOp::kBitwiseOr ? "|" : "^";
      return absl::StrCat("static_cast<", T, ">(", a, " ", o, " ", b, ")");
    }
    case BinaryOp::kShiftLeft: return call("kiln_cpu::shift_left");
    case BinaryOp::kShiftRight: return call("kiln_cpu::shift_right");
  }
  return a;
}

std::string CpuKernelEmitter::CastCode(ScalarType from, ScalarType to, const std::string& x) const {
  const std::string T = ValueType(to);
  if (to == ScalarType::kBFloat16 || to == ScalarType::kFloat16) {
    const char* round = to == ScalarType::kBFloat16 ? "kiln_cpu::round_bf16" : "kiln_cpu::round_f16";
    if (from == ScalarType::kFloat32 || kernel::IsHalfType(from)) return absl::StrCat(round, "(", x, ")");
    return absl::StrCat(round, "(static_cast<float>(", x, "))");
  }
  if (to == ScalarType::kBool) return absl::StrCat(x, " != ", ValueType(from), "(0)");
  if (IsFloatingValue(from) && kernel::IsIntType(to)) {
    return absl::StrCat("kiln_cpu::float_to_int<", T, ">(", x, ")");
  }
  if (ValueType(from) == T) return x;  // f16/bf16 -> f32: already a float
  return absl::StrCat("static_cast<", T, ">(", x, ")");
}

absl::StatusOr<CpuSource> EmitCpuSource(absl::Span<const Kernel> kernels,
                                        const CpuEmitOptions& options) {
  CpuSource out;
  CodeWriter w;
  w.Line("// Generated by kiln's CPU emitter. Do not edit.");
  w.Line("// extern \"C\" void kiln_kernel_<i>(void* const* buffers, const int64_t* scalars);");
  w.Line("#include <cstdint>  // and nothing else standard: see kernels/cpu/kiln_base.h");
  if (options.include_prelude) w.Raw(kiln::kernels::CpuPrelude());
  out.prelude = w.Take();
  std::string source = out.prelude;
  for (size_t i = 0; i < kernels.size(); ++i) {
    CpuKernelEmitter emitter(kernels[i], static_cast<int>(i), options);
    absl::StatusOr<std::string> fn = emitter.Emit();
    if (!fn.ok()) {
      return absl::Status(fn.status().code(),
                          absl::StrCat("kernel ", i, ": ", fn.status().message()));
    }
    absl::StrAppend(&source, "\n", *fn);
    out.symbols.push_back(CpuKernelSymbol(static_cast<int>(i)));
    out.kernel_sources.push_back(*std::move(fn));
  }
  out.source = std::move(source);
  return out;
}

}  // namespace kiln::codegen
