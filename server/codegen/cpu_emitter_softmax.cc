// CpuKernelEmitter: online softmax phases run in two passes over a per-thread row buffer, so
// that softmax computes exp once per element (see cpu_emitter.h and exp_reuse.h).

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "server/codegen/cpu_emitter.h"
#include "server/codegen/exp_reuse.h"

namespace kiln::codegen {

using kernel::AccKind;
using kernel::ExprNode;
using kernel::Stmt;
using kernel::StmtKind;

namespace {

// The row buffer's size limit: a few of them per thread stay in L1/L2 next to the row itself.
constexpr int64_t kRowBufferBytes = 64 * 1024;

}  // namespace

void CpuKernelEmitter::PlanSoftmaxTwoPass() {
  two_pass_.clear();
  if (k_.reduce.size() != 1) return;  // softmax reduces one dim
  int64_t length = 1;
  for (const kernel::Size& s : k_.reduce) {
    const absl::optional<int64_t> c = s.AsConst();
    if (!c) return;  // dynamic lengths keep the online rule
    length *= *c;
  }
  if (length <= 0) return;
  std::map<int, int> folds = FoldCounts(k_);
  for (size_t p = 0; p < k_.phases.size(); ++p) {
    const std::vector<Stmt>& stmts = k_.phases[p].stmts;
    if (stmts.size() != 1) continue;
    const Stmt& s = stmts[0];
    if (s.kind != StmtKind::kAccumulate || s.acc.kind != AccKind::kOnlineSoftmax || folds[s.acc.id] != 1) {
      continue;
    }
    if (s.acc.dtype != kernel::ScalarType::kFloat32 && s.acc.dtype != kernel::ScalarType::kFloat64) continue;
    if (s.value->type != s.acc.dtype) continue;
    const int64_t bytes = length * (s.acc.dtype == kernel::ScalarType::kFloat64 ? 8 : 4);
    if (bytes > kRowBufferBytes) continue;
    // The row buffer is the kernel's own: every later exp(value - max) may read it, whatever the
    // value (a load, or a prologue of several ops) and whatever else reads its inputs.
    std::vector<const ExprNode*> nodes = ExpShiftNodesOf(k_, p + 1, s.acc.id, s.value.get());
    if (nodes.empty()) continue;
    SoftmaxTwoPass tp;
    tp.phase = p;
    tp.stmt = &s;
    tp.array = absl::StrCat("kiln_row", s.acc.id);
    tp.length = length;
    tp.exp_nodes = std::move(nodes);
    two_pass_.push_back(std::move(tp));
  }
}

void CpuKernelEmitter::SeedExpReuse(size_t p) {
  for (const SoftmaxTwoPass& tp : two_pass_) {
    if (p <= tp.phase) continue;
    const std::string slot = absl::StrCat(tp.array, "[r0]");
    for (const ExprNode* e : tp.exp_nodes) scopes_.back()[e] = slot;
  }
}

void CpuKernelEmitter::EmitSoftmaxTwoPass(const SoftmaxTwoPass& tp) {
  const Stmt& s = *tp.stmt;
  const std::string t = ValueType(s.acc.dtype);
  const std::string acc = absl::StrCat("acc", s.acc.id);
  const std::string extent = SizeCode(k_.reduce[0]);
  w_.Linef("// phase ", tp.phase, ": softmax statistics in two passes, exp(x - max) kept in ", tp.array,
           " for the phases below");
  w_.Open("");
  PushScope();
  HoistInvariants(k_.phases[tp.phase].stmts);
  // Pass 1: the maximum, as an omp simd max reduction (vectorized; kiln_cpu::maximum's NaN rule
  // in lanes does not vectorize) plus an or-reduction that notes NaN, which then wins.
  w_.Linef(t, " kiln_max = kiln_cpu::lowest<", t, ">();");
  w_.Line("int kiln_nan = 0;");
  w_.Raw("#pragma omp simd reduction(max:kiln_max) reduction(|:kiln_nan)");
  w_.Open(absl::StrCat("for (idx_t r0 = 0; r0 < ", extent, "; ++r0)"));
  PushScope();
  const std::string v = ExprCode(s.value);
  w_.Linef("kiln_max = ", v, " > kiln_max ? ", v, " : kiln_max;");
  w_.Linef("kiln_nan |= ", v, " != ", v, ";");
  PopScope();
  w_.Close();
  w_.Linef("if (kiln_nan) kiln_max = kiln_cpu::nan<", t, ">();");
  // Pass 2 (the row is in cache now): exp(x - max) into the buffer, and its sum. A NaN anywhere
  // made the maximum NaN, so every exp and the sum are NaN (torch's result); a row of -inf gives
  // exp(-inf - -inf) = NaN as in torch.
  w_.Linef(t, " kiln_sum = 0;");
  w_.Raw("#pragma omp simd reduction(+:kiln_sum)");
  w_.Open(absl::StrCat("for (idx_t r0 = 0; r0 < ", extent, "; ++r0)"));
  PushScope();
  w_.Linef("const ", t, " kiln_x = kiln_cpu::exp(", ExprCode(s.value), " - kiln_max);");
  PopScope();
  w_.Linef(tp.array, "[r0] = kiln_x;");
  w_.Line("kiln_sum += kiln_x;");
  w_.Close();
  w_.Linef(acc, ".max = kiln_max;");
  w_.Linef(acc, ".sum = kiln_sum;");
  PopScope();
  w_.Close();
}

}  // namespace kiln::codegen
