#ifndef KILN_SERVER_KERNEL_KERNEL_IR_H_
#define KILN_SERVER_KERNEL_KERNEL_IR_H_

// The kernel IR: a loop-level IR shared by every backend (the CPU C++ emitter now, a CUDA emitter
// later). The graph path lowers fused groups of graph nodes to Kernels; emitters turn Kernels into
// source. Nodes are immutable and built only through the validating Make functions below (they
// return StatusOr and accept StatusOr arguments, so an error anywhere in a nested expression comes
// out at the top); VerifyKernel (verifier.h) checks what needs the whole kernel.
//
// Semantics.
//   * A Kernel has typed buffer parameters b<i> (flat element pointers; dtype; read, write or
//     read-write; a number of elements used for bounds checks), int64 scalar parameters n<i>
//     (run-time sizes), an outer *parallel* iteration space o0..o{k-1} (row-major, extents are
//     Sizes over the scalars), an optional *reduction* space r0..r{m-1}, accumulators a<i>,
//     phases and a body.
//   * For each outer point, in any order and possibly concurrently with other points:
//       - the accumulators start at their identity;
//       - each phase runs in order; a phase loops over the whole reduction space in row-major
//         order (r0 outermost) and runs its statements in order at each point;
//       - the body runs once.
//     A pointwise kernel has no reduction space and no phases: only the body.
//     So softmax is one kernel per row: phase 0 folds the row into an online-softmax accumulator,
//     phase 1 loads again and stores exp(x - max) / sum. A CUDA emitter maps an outer point to a
//     thread (pointwise) or to a warp/block (rows); phases to block-strided loops plus a block
//     reduction of the accumulators between phases.
//   * Visibility: reduction variables appear only in phase statements. An accumulator is updated
//     in exactly one phase and read (AccRead) only in later phases or the body.
//   * Different outer points never write the same element, and a phase never stores to an
//     element that the same kernel loads (the lowering guarantees it; the emitter may reorder and
//     vectorize on that basis). Buffers of one call do not overlap unless they are the same
//     pointer with identical load/store indices (in-place pointwise).
//   * Index: an affine expression offset + sum(stride_k * var_k) in elements; strides may be any
//     non-negative Size (0 = broadcast); permutes, slices and expands are just strides/offsets.
//   * A masked load (LoadMasked) reads only where its bool mask holds and gives 0 (false)
//     elsewhere; its index may be out of range (even negative) where the mask is false, so the
//     verifier does not range-check it (constant_pad_nd, cat, boundary handling).
//   * Types: b8, i8, u8, i32, i64, f16, bf16, f32, f64. Expressions are typed exactly; there are
//     no implicit conversions (the lowering inserts Casts after torch's type promotion).
//     f16/bf16 values are data only: Load, Store, Const, Cast and Select accept them, arithmetic
//     does not (cast to f32 first). A Cast to f16/bf16 rounds to nearest even; a Store requires the
//     value's type to be the buffer's dtype.
//   * Floats are IEEE with NaN and -0.0 kept; no fast-math (one exception, the CUDA emitter's:
//     softmax exps of kernels whose every result is f16/bf16, or of accumulators marked
//     approx_exp, may be approximate, ~2^-22 relative, below those types' rounding; see
//     CudaKernelEmitter::PlanApproxExp). rsqrt on CUDA is CUDA's rsqrtf (2 ulp), as torch's own
//     CUDA rsqrt and batch norms compute it; on the CPU, 1 / sqrt(x).
//     maximum/minimum and the max/min accumulators propagate NaN. argmax/argmin treat NaN as the
//     extreme and return the first index of the extreme (torch's rule); the index is the
//     row-major position in the reduction space. Welford uses the sequential (mean, M2, count)
//     update; online softmax keeps (max, sum of exp(x - max)). Reductions over an empty space give
//     the identity (sum 0, prod 1, max -inf or the type's lowest value, argmax index -1... never
//     read by torch-valid graphs).
//   * Integers: add/sub/mul/neg/abs wrap (two's complement); trunc_div rounds toward zero,
//     floor_div and remainder follow Python (remainder has the divisor's sign), fmod the
//     dividend's; division or remainder by zero gives 0 instead of trapping, INT_MIN / -1 wraps.
//     Shifts by >= the bit width give 0 (or -1 for a negative right shift). Casts float -> int
//     behave as torch on x86-64: to types of <= 32 bits through int32, to int64 directly (NaN
//     and out-of-range give INT32_MIN / INT64_MIN), then wrap; -> bool is x != 0 (NaN is true).
//   * Float ops: true_div; trunc_div = trunc(a / b); floor_div and remainder as torch
//     (remainder = fmod with the divisor's sign). round is half-to-even. sign(NaN) = 0 as torch.
//     relu(NaN) = NaN. gelu is the erf form, gelu_tanh the tanh approximation.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/kernel/size_expr.h"

namespace kiln::kernel {

enum class ScalarType : uint8_t { kBool, kInt8, kUInt8, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64 };
const char* ScalarTypeName(ScalarType t);  // "b8", "i8", "u8", "i32", "i64", "f16", "bf16", "f32", "f64"
int ScalarTypeBytes(ScalarType t);
bool IsFloatType(ScalarType t);    // f16, bf16, f32, f64
bool IsHalfType(ScalarType t);     // f16, bf16
bool IsIntType(ScalarType t);      // i8, u8, i32, i64 (not bool)
bool IsSignedIntType(ScalarType t);

enum class UnaryOp : uint8_t {
  kNeg, kAbs, kExp, kExp2, kExpm1, kLog, kLog1p, kLog2, kSqrt, kRsqrt, kReciprocal, kSin, kCos,
  kTanh, kSigmoid, kErf, kRelu, kGelu, kGeluTanh, kSilu, kFloor, kCeil, kRound, kTrunc, kSign,
  kIsNan, kIsInf, kLogicalNot, kBitwiseNot,
};
const char* UnaryOpName(UnaryOp op);

enum class BinaryOp : uint8_t {
  kAdd, kSub, kMul, kTrueDiv, kTruncDiv, kFloorDiv, kRemainder, kFmod, kPow, kMaximum, kMinimum,
  kEq, kNe, kLt, kLe, kGt, kGe, kLogicalAnd, kLogicalOr, kLogicalXor, kBitwiseAnd, kBitwiseOr,
  kBitwiseXor, kShiftLeft, kShiftRight,
};
const char* BinaryOpName(BinaryOp op);

enum class Access : uint8_t { kRead, kWrite, kReadWrite };
const char* AccessName(Access a);

// A kernel parameter: element pointer b<index>.
struct Buffer {
  int32_t index = -1;
  ScalarType dtype = ScalarType::kFloat32;
  Access access = Access::kRead;
  Size num_elements;  // the elements the kernel may touch: [0, num_elements)
};

enum class VarKind : uint8_t { kOuter, kReduce };
struct Var {
  VarKind kind = VarKind::kOuter;
  int32_t index = 0;
  bool operator==(const Var& o) const { return kind == o.kind && index == o.index; }
  bool operator<(const Var& o) const {
    return kind != o.kind ? kind < o.kind : index < o.index;
  }
};
std::string VarName(const Var& v);  // "o0", "r1"

struct IndexTerm {
  Var var;
  Size stride;
};
// offset + sum(stride * var), terms sorted by var, one per var, zero strides dropped.
struct Index {
  Size offset;
  std::vector<IndexTerm> terms;
};
Index MakeIndex(Size offset, std::vector<IndexTerm> terms);
// The contiguous (row-major) index of `vars` in a tensor of `sizes`: strides are suffix products.
Index ContiguousIndex(const std::vector<Var>& vars, const std::vector<Size>& sizes);

enum class AccKind : uint8_t { kSum, kProd, kMax, kMin, kArgMax, kArgMin, kWelford, kOnlineSoftmax };
const char* AccKindName(AccKind k);
enum class AccField : uint8_t { kValue, kIndex, kMean, kM2, kCount, kMax, kSum };
const char* AccFieldName(AccField f);

struct Accumulator {
  int32_t id = -1;
  AccKind kind = AccKind::kSum;
  ScalarType dtype = ScalarType::kFloat32;  // the type of the values folded in (and of kValue)
  // kOnlineSoftmax whose results reach the graph only rounded to f16/bf16 (a 16-bit softmax, or
  // the partials of a split one): its exps may be approximate (see "Semantics" above).
  bool approx_exp = false;
};

enum class ExprKind : uint8_t { kConst, kLoad, kScalar, kLoopVar, kUnary, kBinary, kSelect, kCast, kAccRead };

struct ExprNode;
using Expr = std::shared_ptr<const ExprNode>;
using ExprOr = absl::StatusOr<Expr>;

struct ExprNode {
  ExprKind kind;
  ScalarType type;
  // kConst: bool and integers in `int_value`, floats in `float_value` (exact in `type`).
  int64_t int_value = 0;
  double float_value = 0;
  Buffer buffer;         // kLoad
  Index index;           // kLoad
  int32_t scalar = -1;   // kScalar: n<scalar>
  Var var;               // kLoopVar
  UnaryOp unary_op = UnaryOp::kNeg;
  BinaryOp binary_op = BinaryOp::kAdd;
  std::vector<Expr> args;  // kUnary: 1, kBinary: 2, kSelect: (cond, a, b), kCast: 1,
                           // kLoad: none, or the mask of a masked load
  Accumulator acc;         // kAccRead
  AccField field = AccField::kValue;
};

// Makers. Type errors come back as INVALID_ARGUMENT.
ExprOr ConstInt(ScalarType type, int64_t value);      // integer or bool types; value must fit
ExprOr ConstFloat(ScalarType type, double value);     // float types; value must be exact in type
ExprOr ConstBool(bool value);
ExprOr Load(const Buffer& buffer, Index index);       // of type buffer.dtype
ExprOr LoadMasked(const Buffer& buffer, Index index, const ExprOr& mask);  // mask: b8
ExprOr ScalarParam(int32_t index);                     // i64
ExprOr LoopVar(Var var);                               // i64
ExprOr Unary(UnaryOp op, const ExprOr& x);
ExprOr Binary(BinaryOp op, const ExprOr& a, const ExprOr& b);
ExprOr Select(const ExprOr& cond, const ExprOr& a, const ExprOr& b);
ExprOr Cast(ScalarType to, const ExprOr& x);           // a no-op cast returns x
ExprOr AccRead(const Accumulator& acc, AccField field);
// The type AccRead(acc, field) has, or INVALID_ARGUMENT if the field does not belong to the kind.
absl::StatusOr<ScalarType> AccFieldType(const Accumulator& acc, AccField field);

// Shorthands.
inline ExprOr Add(const ExprOr& a, const ExprOr& b) { return Binary(BinaryOp::kAdd, a, b); }
inline ExprOr Sub(const ExprOr& a, const ExprOr& b) { return Binary(BinaryOp::kSub, a, b); }
inline ExprOr Mul(const ExprOr& a, const ExprOr& b) { return Binary(BinaryOp::kMul, a, b); }
inline ExprOr Div(const ExprOr& a, const ExprOr& b) { return Binary(BinaryOp::kTrueDiv, a, b); }
inline ExprOr Max(const ExprOr& a, const ExprOr& b) { return Binary(BinaryOp::kMaximum, a, b); }
inline ExprOr Min(const ExprOr& a, const ExprOr& b) { return Binary(BinaryOp::kMinimum, a, b); }
inline ExprOr Exp(const ExprOr& x) { return Unary(UnaryOp::kExp, x); }
inline ExprOr Log(const ExprOr& x) { return Unary(UnaryOp::kLog, x); }

enum class StmtKind : uint8_t { kStore, kAccumulate };
struct Stmt {
  StmtKind kind = StmtKind::kStore;
  Buffer buffer;  // kStore
  Index index;    // kStore
  Expr value;
  Accumulator acc;  // kAccumulate
};
using StmtOr = absl::StatusOr<Stmt>;
StmtOr Store(const Buffer& buffer, Index index, const ExprOr& value);  // value.type == dtype
StmtOr Accumulate(const Accumulator& acc, const ExprOr& value);        // value.type == acc.dtype

struct Phase {
  std::vector<Stmt> stmts;
};

struct Kernel {
  std::string debug_name;  // printed by PrintKernel only; never part of generated source
  std::vector<Buffer> buffers;  // buffers[i].index == i
  int32_t num_scalars = 0;
  std::vector<Size> outer;   // extents of o0..
  std::vector<Size> reduce;  // extents of r0..
  std::vector<Accumulator> accumulators;  // accumulators[i].id == i
  std::vector<Phase> phases;
  std::vector<Stmt> body;

  bool is_pointwise() const { return reduce.empty() && phases.empty(); }
};

// Builds a Kernel by appending parameters and statements; remembers the first error (so calls can
// be chained without checks) and returns it from Finish, which also runs VerifyKernel.
class KernelBuilder {
 public:
  explicit KernelBuilder(std::string debug_name);
  Size AddScalar();  // returns the Size n<i>
  Buffer AddBuffer(ScalarType dtype, Access access, Size num_elements);
  Var AddOuter(Size extent);
  Var AddReduce(Size extent);
  Accumulator AddAccumulator(AccKind kind, ScalarType dtype, bool approx_exp = false);
  void BeginPhase();  // later statements go into a new phase
  void BeginBody();   // later statements go into the body (the default before any phase)
  void Add(const StmtOr& stmt);
  absl::StatusOr<Kernel> Finish();

 private:
  Kernel kernel_;
  bool in_body_ = true;
  absl::Status status_;
};

}  // namespace kiln::kernel

#endif  // KILN_SERVER_KERNEL_KERNEL_IR_H_
