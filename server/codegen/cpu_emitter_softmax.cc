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
using kernel::Var;
using kernel::VarKind;

namespace {

// The row buffer's size limit: a few of them per thread stay in L1/L2 next to the row itself.
constexpr int64_t kRowBufferBytes = 64 * 1024;

}  // namespace

std::string CpuKernelEmitter::RowFlatIndex() {
  std::vector<Var> vars;
  for (size_t i = 0; i < k_.reduce.size(); ++i) vars.push_back(Var{VarKind::kReduce, static_cast<int32_t>(i)});
  return IndexCode(kernel::ContiguousIndex(vars, k_.reduce));
}

void CpuKernelEmitter::PlanSoftmaxTwoPass() {
  two_pass_.clear();
  if (k_.reduce.empty()) return;
  int64_t length = 1;
  for (const kernel::Size& s : k_.reduce) {
    const absl::optional<int64_t> c = s.AsConst();
    if (!c) return;  // dynamic lengths keep the online rule
    length *= *c;
  }
  if (length <= 0) return;
  std::map<int, int> folds;
  for (const kernel::Phase& ph : k_.phases) {
    for (const Stmt& s : ph.stmts) folds[s.acc.id] += s.kind == StmtKind::kAccumulate;
  }
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
    const ExprNode* load = HeldLoad(s.value.get());
    if (load == nullptr) continue;
    absl::optional<std::vector<const ExprNode*>> nodes =
        ExpShiftNodes(k_, p + 1, s.acc.id, AccessKey(load->buffer, load->index));
    if (!nodes || nodes->empty()) continue;
    SoftmaxTwoPass tp;
    tp.phase = p;
    tp.stmt = &s;
    tp.array = absl::StrCat("kiln_row", s.acc.id);
    tp.length = length;
    tp.exp_nodes = std::move(*nodes);
    two_pass_.push_back(std::move(tp));
  }
}

void CpuKernelEmitter::SeedExpReuse(size_t p) {
  for (const SoftmaxTwoPass& tp : two_pass_) {
    if (p <= tp.phase) continue;
    const std::string slot = absl::StrCat(tp.array, "[", RowFlatIndex(), "]");
    for (const ExprNode* e : tp.exp_nodes) scopes_.back()[e] = slot;
  }
}

void CpuKernelEmitter::EmitSoftmaxTwoPass(const SoftmaxTwoPass& tp) {
  const Stmt& s = *tp.stmt;
  const std::string t = ValueType(s.acc.dtype);
  const std::string acc = absl::StrCat("acc", s.acc.id);
  const int lanes = std::max(1, options_.reduction_lanes);
  const int m = static_cast<int>(k_.reduce.size());
  w_.Linef("// phase ", tp.phase, ": softmax statistics in two passes over ", tp.array,
           " (the row, then exp(x - max), read again below)");
  w_.Open("");
  PushScope();
  HoistInvariants(k_.phases[tp.phase].stmts);
  w_.Linef("kiln_cpu::MaxLanes<", t, ", ", lanes, "> kiln_max_l;");
  for (int i = 0; i < m - 1; ++i) {
    w_.Open(absl::StrCat("for (idx_t r", i, " = 0; r", i, " < ", SizeCode(k_.reduce[i]), "; ++r", i, ")"));
  }
  const std::string last = absl::StrCat("r", m - 1);
  const std::string extent = SizeCode(k_.reduce[m - 1]);
  auto element = [&](const std::string& lane) {
    PushScope();
    const std::string v = ExprCode(s.value);
    w_.Linef(tp.array, "[", RowFlatIndex(), "] = ", v, ";");
    w_.Linef("kiln_max_l.Update(", lane, ", ", v, ");");
    PopScope();
  };
  w_.Linef("const idx_t kiln_full = ", extent, " - ", extent, " % ", lanes, ";");
  w_.Open(absl::StrCat("for (idx_t kiln_base = 0; kiln_base < kiln_full; kiln_base += ", lanes, ")"));
  w_.Open(absl::StrCat("for (int kiln_lane = 0; kiln_lane < ", lanes, "; ++kiln_lane)"));
  w_.Linef("const idx_t ", last, " = kiln_base + kiln_lane;");
  element("kiln_lane");
  w_.Close();
  w_.Close();
  w_.Open(absl::StrCat("for (idx_t ", last, " = kiln_full; ", last, " < ", extent, "; ++", last, ")"));
  element("0");
  w_.Close();
  for (int i = 0; i < m - 1; ++i) w_.Close();
  // A NaN anywhere makes the maximum NaN and then every exp and the sum NaN (torch's result); a
  // row of -inf gives exp(-inf - -inf) = NaN too, as torch does.
  w_.Linef(t, " kiln_max = kiln_cpu::lowest<", t, ">();");
  w_.Line("kiln_max_l.CombineInto(kiln_max);");
  w_.Linef(t, " kiln_sum = 0;");
  w_.Raw("#pragma omp simd reduction(+:kiln_sum)");
  w_.Open(absl::StrCat("for (idx_t kiln_e = 0; kiln_e < ", tp.length, "; ++kiln_e)"));
  w_.Linef("const ", t, " kiln_x = kiln_cpu::exp(", tp.array, "[kiln_e] - kiln_max);");
  w_.Linef(tp.array, "[kiln_e] = kiln_x;");
  w_.Line("kiln_sum += kiln_x;");
  w_.Close();
  w_.Linef(acc, ".max = kiln_max;");
  w_.Linef(acc, ".sum = kiln_sum;");
  PopScope();
  w_.Close();
}

}  // namespace kiln::codegen
