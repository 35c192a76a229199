#ifndef KILN_SERVER_LOWER_OP_GRAPH_H_
#define KILN_SERVER_LOWER_OP_GRAPH_H_

// The op-level representation between the graph IR and the kernel IR: what LowerGraph produces,
// what ScheduleAndFuse groups into kernels, and what BuildKernels turns into kernel IR.
//
// Semantics.
//   * Every tensor a graph node produces (each item of a tuple result too) is one LValue, created
//     in graph order; so a value only reads values with smaller ids. Shapes are static (int64).
//   * A value is computed elementwise at a multi-index (one Affine per dimension, over the loop
//     variables of the kernel being built) through a LoadContext, which decides per read whether a
//     value is loaded from memory (it has storage) or computed inline (fused):
//       kInput / kConstant / kStepOutput   always have storage (graph inputs, Graph.constants,
//                                          the results of extern/fallback aten steps);
//       kPointwise                          `elem` computes the element from its inputs (broadcasting,
//                                          type promotion and views already folded in);
//       kView                               a view of `base` (no data of its own): sizes/strides/
//                                          storage_offset describe the same storage as the base's;
//       kRowOutput                          an output of RowOp `row_op` (a reduction or a row-fused
//                                          composite); computable only inside that row op's kernel.
//   * A RowOp iterates over `domain`: the dims not in `reduce_dims` are the outer (parallel) space,
//     the reduce dims the reduction space. Its accumulators all fold in phase 0; each output is
//     computed either in the body (at the output's own index, from the accumulators) or in phase 1
//     (at the full domain index: softmax, layer norm). Reductions have one phase, composites two.
//   * Extern steps are aten ops run by torch on the client (mm, convolution, fallbacks): they read
//     values that must have storage and produce kStepOutput values.
//   * Element values are always of the value's dtype; f16/bf16 arithmetic happens in f32 and is
//     rounded at each op's output, so results equal eager torch's op by op.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/v1/graph.pb.h"
#include "server/graph/ir.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::lower {

namespace k = ::kiln::kernel;

// offset + sum(coeff * var): one dimension of an element index.
struct Affine {
  int64_t offset = 0;
  std::vector<std::pair<k::Var, int64_t>> terms;  // sorted by var, no zero coefficients
};
Affine AffConst(int64_t c);
Affine AffVar(k::Var v);
Affine AffAdd(const Affine& a, const Affine& b);
Affine AffScale(const Affine& a, int64_t c);
bool AffEqual(const Affine& a, const Affine& b);
// A kernel Index for `index` into a tensor with these strides.
k::Index ToKernelIndex(const std::vector<Affine>& index, const std::vector<int64_t>& strides);
std::string IndexKey(const std::vector<Affine>& index);

class LoadContext {
 public:
  virtual ~LoadContext() = default;
  // The element of `value` at `index`, of the value's dtype.
  virtual k::ExprOr Load(int32_t value, const std::vector<Affine>& index) = 0;
  // The element where `mask` (b8) holds, 0 elsewhere; `index` may be out of range where it does
  // not. Only for values listed in the reader's `masked_inputs` (the scheduler stores them).
  virtual k::ExprOr LoadMasked(int32_t value, const std::vector<Affine>& index, const k::ExprOr& mask) = 0;
};

// The i64 expression of an index dimension (for ops whose value depends on the position).
k::ExprOr AffineExpr(const Affine& a);
using ElemFn = std::function<k::ExprOr(LoadContext&, const std::vector<Affine>&)>;

enum class ValueKind : uint8_t { kInput, kConstant, kPointwise, kRowOutput, kView, kStepOutput };
const char* ValueKindName(ValueKind kind);

struct LValue {
  int32_t id = -1;
  ValueKind kind = ValueKind::kPointwise;
  int32_t node = -1;  // the graph node (for messages and ordering)
  int32_t item = -1;  // tuple item of the node's result, or -1
  std::string op;     // short op name for logs ("add", "exp", "sum", "view")
  k::ScalarType dtype = k::ScalarType::kFloat32;
  std::vector<int64_t> sizes, strides;
  int64_t storage_offset = 0;
  ::kiln::v1::TensorMeta meta;  // as the plan states it
  std::vector<int32_t> inputs;  // values read
  ElemFn elem;                  // kPointwise
  std::vector<int32_t> masked_inputs;  // kPointwise: inputs read through LoadMasked (cat, pads)
  bool cheap = false;           // kPointwise: one simple op (recomputing it is free)
  int32_t input_index = -1;     // kInput
  int32_t constant_index = -1;  // kConstant
  int32_t base = -1;            // kView: the value viewed
  int32_t row_op = -1;          // kRowOutput
  int32_t step = -1;            // kStepOutput
  bool kernel_dtype = true;     // false: a dtype kernels cannot touch (only steps may read it)

  int64_t numel() const;
};

using AccReader = std::function<k::ExprOr(int acc, k::AccField field)>;

struct RowAcc {
  k::AccKind kind = k::AccKind::kSum;
  k::ScalarType dtype = k::ScalarType::kFloat32;
  ElemFn value;  // the value folded in at a domain index (of `dtype`)
  bool approx_exp = false;  // kOnlineSoftmax: its exps may be approximate (k::Accumulator's)
};

struct RowOutput {
  int32_t value = -1;
  bool in_phase = false;  // false: body, at the output's own index; true: phase 1, domain index
  std::function<k::ExprOr(LoadContext&, const AccReader&, const std::vector<Affine>&)> fn;
};

struct RowOp {
  int32_t node = -1;
  std::string name;
  std::vector<int64_t> domain;
  std::vector<int> reduce_dims;  // sorted, distinct
  std::vector<RowAcc> accs;
  std::vector<RowOutput> outputs;
  std::vector<int32_t> inputs;   // values read
  bool composite = false;        // has a phase-1 output (softmax, layer norm)
};

struct ExternStep {
  int32_t node = -1;
  std::string target;
  bool fallback = false;
  std::string reason;            // why a lowerable op became a fallback ("" for extern ops)
  std::vector<int32_t> inputs;   // tensor values read
  std::vector<int32_t> outputs;  // one per result item, -1 for a non-tensor item
  bool mutates = false;          // an in-place op ("aten.copy_.default"): an ordering barrier
  bool may_alias = false;        // its results may alias its inputs (view ops, unknown ops)
};

struct OpGraph {
  const graph::Graph* graph = nullptr;
  std::vector<LValue> values;
  std::vector<RowOp> row_ops;
  std::vector<ExternStep> steps;
  std::vector<int32_t> outputs;  // graph outputs in order; -1 for None
  std::vector<int32_t> node_value;  // graph node -> its tensor value, or -1
  int32_t num_inputs = 0;

  // Consumers of each value (values, row ops and steps that read it), filled by LowerGraph.
  std::vector<std::vector<int32_t>> value_users;  // value ids
  std::vector<std::vector<int32_t>> row_users;    // row op ids
  std::vector<std::vector<int32_t>> step_users;   // step ids
};

// The value at the bottom of a chain of views.
int32_t ViewRoot(const OpGraph& g, int32_t value);
// The dims of `value`'s index that address its root's storage: maps an index of the view to an
// index of its root, or fails (NOT_FOUND) when the view is not a simple affine window of a
// root laid out as the root's own strides say (e.g. a reshape merging permuted dims).
absl::StatusOr<std::vector<Affine>> MapViewIndex(const OpGraph& g, int32_t view,
                                                 const std::vector<Affine>& index);
bool ViewIsAffine(const OpGraph& g, int32_t view);
// True when the view only inserts or removes size-1 dims of its root (element k of the view, in
// row-major order over its non-1 dims, is element k of the root): index-preserving for epilogues.
bool IsSqueezeView(const OpGraph& g, int32_t view);
// `sizes` without its 1s.
std::vector<int64_t> NonUnit(const std::vector<int64_t>& sizes);

// Readable one-line-per-value dump (the "lower" stage dump).
std::string PrintOpGraph(const OpGraph& g);

}  // namespace kiln::lower

#endif  // KILN_SERVER_LOWER_OP_GRAPH_H_
