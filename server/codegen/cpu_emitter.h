#ifndef KILN_SERVER_CODEGEN_CPU_EMITTER_H_
#define KILN_SERVER_CODEGEN_CPU_EMITTER_H_

// The CPU C++ emitter: a list of verified Kernels (one graph) -> one self-contained C++17
// translation unit, compiled by server/toolchain with g++/clang++ -O3 -fopenmp -fwrapv.
//
// Calling convention of every generated kernel (kernels[i] -> symbol "kiln_kernel_<i>"):
//     extern "C" void kiln_kernel_<i>(void* const* buffers, const int64_t* scalars);
//   buffers[j] is the element pointer of the kernel's buffer b<j> (already offset by the tensor's
//   storage offset; f16/bf16 as 16-bit patterns, bool as one byte 0/1); scalars[j] is n<j>. A kernel
//   with no buffers or scalars may be given null for that array. Kernels return nothing and cannot
//   fail; they may use OpenMP threads internally and return when all their work is done.
//
// Guarantees: the source depends only on the kernels' structure and the options, never on
// Kernel::debug_name or any other string from the graph (all names are generated: b<j>, n<j>,
// o<k>, r<k>, acc<k>, v<k>, z<k>); constants are exact (hex floats, inf/nan via helpers); the
// helper headers of kernels/cpu are embedded at the top. Fails with the verifier's error for a
// kernel that does not verify.
//
// Loop structure (see EmitKernel): pointwise kernels flatten all outer dims but the innermost,
// split the innermost into blocks of `block` elements, and run the (row, block) units under
// `#pragma omp parallel for` when the total work reaches `parallel_threshold`; the innermost loop
// has unit stride whenever the IR's strides allow, so g++ -O3 vectorizes it. Row kernels run one
// outer point per unit with the phases as loops inside: sum/prod phases under `omp simd
// reduction`, Welford/online-softmax/max/min phases in `reduction_lanes` lanes (kiln_reduce.h)
// plus a scalar tail. Column kernels (one phase of sum/prod/max/min accumulators whose loads are
// contiguous across the last outer dim and not along the innermost reduction dim, e.g. the column
// sums of a backward pass) instead run a block of `column_block` consecutive outer points per
// unit: the reduction loops outside, the block's points inside (vectorized), one accumulator
// array per block; so memory is read row by row instead of one strided column at a time.
// A phase that only folds an online softmax of a row short enough for a per-thread buffer
// (kRowBufferBytes), whose output phases read x only as exp(x - max), runs in two passes instead:
// the row's maximum (an omp simd max reduction), then exp(x - max) into the buffer while it is
// summed, and the output reads the buffer: one exp per element instead of two (exp_reuse.h), and
// no per-element online rescaling.
// Indices are 64-bit: the code is compiled with -fwrapv, under which a 32-bit
// index may wrap, so g++ could not prove addresses affine and would not vectorize the loops.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/codegen/code_writer.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::codegen {

struct CpuEmitOptions {
  int64_t parallel_threshold = 32768;  // elements of work below which a kernel stays on one thread
  int64_t block = 4096;                // innermost block of the flattened pointwise loop
  bool include_prelude = true;         // false only in tests that look at kernels alone
  // Phases that fold only Welford / online-softmax / max / min accumulators run the contiguous
  // part of their innermost loop in this many independent lanes (vectorized), then combine; 0 or
  // 1 disables.
  int reduction_lanes = 16;
  // Outer points per unit of a column kernel (see above); 0 or 1 disables the column layout.
  int column_block = 64;
};

struct CpuSource {
  std::string source;                        // the whole translation unit
  std::vector<std::string> symbols;          // symbols[i] names kernels[i]
  std::vector<std::string> kernel_sources;   // each kernel's function alone (dumps, golden tests)
  std::string prelude;  // what precedes the kernels: prelude + any kernels form a translation unit
};

std::string CpuKernelSymbol(int index);  // "kiln_kernel_<index>"

absl::StatusOr<CpuSource> EmitCpuSource(absl::Span<const kernel::Kernel> kernels,
                                        const CpuEmitOptions& options = CpuEmitOptions());

// Emits one kernel as a C++ function. A CUDA emitter is meant to subclass this: it overrides the
// signature and loop structure (EmitFunction) and the type/math spellings, and shares expression
// emission, common-subexpression scopes and constants.
class CpuKernelEmitter {
 public:
  CpuKernelEmitter(const kernel::Kernel& kernel, int index, const CpuEmitOptions& options);
  virtual ~CpuKernelEmitter() = default;

  absl::StatusOr<std::string> Emit();

 protected:
  virtual void EmitFunction();
  // Whether Emit() may choose 32-bit indices (idx32_) when every size is a constant that fits.
  // No on CPUs (see the loop structure above); the CUDA emitter says yes.
  virtual bool Allows32BitIndices() const { return false; }
  virtual std::string ValueType(kernel::ScalarType t) const;
  virtual std::string StorageType(kernel::ScalarType t) const;
  // Bool buffers as uint8_t (loads `!= 0`, stores 0/1): g++ does not vectorize a loop that
  // loads or stores `bool` next to floats ("no vectype"), e.g. a relu mask saved for backward.
  virtual bool BoolStoredAsBytes() const { return true; }
  virtual std::string ConstCode(const kernel::ExprNode& e) const;
  virtual std::string UnaryCode(kernel::UnaryOp op, kernel::ScalarType t, const std::string& x) const;
  // The code of unary node `e` over its argument's code `x`: UnaryCode, unless an emitter picks
  // another form for that node (the CUDA emitter's approximate softmax exps).
  virtual std::string UnaryNodeCode(const kernel::ExprNode& e, const std::string& x) const {
    return UnaryCode(e.unary_op, e.args[0]->type, x);
  }
  virtual std::string BinaryCode(kernel::BinaryOp op, kernel::ScalarType t, const std::string& a,
                                 const std::string& b) const;
  // Whether `b` (an expression's code) is a row accumulator's softmax sum or Welford count:
  // divisions by it become multiplications by its reciprocal.
  static bool IsRowDivisor(const std::string& b);
  virtual std::string CastCode(kernel::ScalarType from, kernel::ScalarType to,
                               const std::string& x) const;

  // Expressions: a C++ expression for `e`, usually the name of a `const T v<k>` emitted into the
  // current scope (shared subexpressions are emitted once per scope).
  std::string ExprCode(const kernel::Expr& e);
  std::string IndexCode(const kernel::Index& index);
  std::string SizeCode(const kernel::Size& s);  // a literal or a hoisted z<k>
  // A load node's code without its mask (ExprCode adds that). The CUDA emitter overrides it to
  // read vector lanes and registers that cache a row.
  virtual std::string LoadExprCode(const kernel::ExprNode& e);
  virtual std::string LoadCode(const kernel::Buffer& b, const std::string& index) const;
  void EmitStmt(const kernel::Stmt& s);
  void EmitLanePhase(size_t p);
  // Emits, in the current scope, the largest subexpressions of `stmts` that do not depend on a
  // reduction variable (loads indexed by outer variables only, accumulators of earlier phases),
  // so that a phase's loops reload nothing per iteration. Legal because a kernel never stores to
  // an element it loads (kernel_ir.h).
  void HoistInvariants(const std::vector<kernel::Stmt>& stmts);
  void HoistInvariantExpr(const kernel::Expr& e);
  void PushScope() { scopes_.emplace_back(); }
  void PopScope() { scopes_.pop_back(); }

  void EmitPointwiseLoops();
  void EmitRowLoops();
  bool UseColumnLayout() const;
  void EmitColumnLoops();
  void EmitPhase(size_t p);
  // Softmax phases that run in two passes over a row buffer (see the top of this file).
  struct SoftmaxTwoPass {
    size_t phase = 0;
    const kernel::Stmt* stmt = nullptr;
    std::string array;  // the row buffer: x, then exp(x - max)
    int64_t length = 0;
    std::vector<const kernel::ExprNode*> exp_nodes;  // later phases' exp(x - max)
  };
  void PlanSoftmaxTwoPass();
  void EmitSoftmaxTwoPass(const SoftmaxTwoPass& tp);
  // In an element scope of phase `p`: earlier two-pass phases' exp(x - max) read their buffer.
  void SeedExpReuse(size_t p);
  // const idx_t o<i> for the outer dims i < num_dims but those in `skip`, from the flat index
  // `unit` over them (the last varies fastest).
  void EmitDecompose(const std::string& unit, int num_dims, const std::vector<int>& skip = {});
  std::string ParallelPragma(const kernel::Size& work);

  const kernel::Kernel& k_;
  const int index_;
  const CpuEmitOptions options_;
  bool idx32_ = false;
  CodeWriter hoisted_{1};  // z<k> declarations at the top of the function
  CodeWriter w_{1};        // the function body after the declarations
  std::string result_;     // the whole function, set by EmitFunction
  bool lane_mode_ = false;  // Accumulate statements update the lanes (acc<k>_l)
  bool column_mode_ = false;  // Accumulate statements update acc<k>_c[kiln_j]
  int next_size_ = 0;
  int next_value_ = 0;
  std::map<std::string, std::string> sizes_;  // Size text -> hoisted name
  std::vector<std::map<const kernel::ExprNode*, std::string>> scopes_;
  std::vector<SoftmaxTwoPass> two_pass_;
};

}  // namespace kiln::codegen

#endif  // KILN_SERVER_CODEGEN_CPU_EMITTER_H_
