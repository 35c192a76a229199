// Softmax computes exp(x - max) twice per element: once while summing, once for the output. A
// row kernel that keeps the row (in registers on CUDA, in a per-thread buffer on CPU) can compute
// the maximum first, then overwrite the kept values with exp(x - max) while summing them, and let
// the output expressions of later phases read those instead of calling exp again.
//
// This file finds where that is legal: the exp(x - max) nodes of the later phases, provided
// nothing there reads x otherwise (the kept x is overwritten); or, where the kernel keeps the
// accumulated value in storage of its own (any expression, e.g. a masked and scaled score), the
// exp(value - max) nodes of the later phases.

#ifndef KILN_SERVER_CODEGEN_EXP_REUSE_H_
#define KILN_SERVER_CODEGEN_EXP_REUSE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/types/optional.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::codegen {

// A name for the element a load reads: loads with equal keys read the same element.
std::string AccessKey(const kernel::Buffer& b, const kernel::Index& index);

// `e` itself if it is an unmasked load, or the load under a widening cast from f16/bf16 to f32
// (the value a row cache keeps); else nullptr.
const kernel::ExprNode* HeldLoad(const kernel::ExprNode* e);

// The nodes exp(load `key` - acc<id>.max) in phases `from`.. of `k` (the load possibly widened,
// as HeldLoad), or nullopt if some expression there reads load `key` outside such a node. Empty
// when there is none.
absl::optional<std::vector<const kernel::ExprNode*>> ExpShiftNodes(const kernel::Kernel& k, size_t from,
                                                                   int id, const std::string& key);

// accumulator id -> how many statements of `k`'s phases fold it (the two-pass softmax and Welford
// plans take accumulators folded by exactly one).
std::map<int, int> FoldCounts(const kernel::Kernel& k);

// Whether `a` and `b` compute the same value in one kernel: the same tree of operations over the
// same loads (buffer and index), constants, scalars, loop variables and accumulator reads.
bool SameExpr(const kernel::ExprNode* a, const kernel::ExprNode* b);

// The nodes exp(`value` - acc<id>.max) in phases `from`.. of `k` and its body (any subtree equal
// to `value`, SameExpr): a kernel that keeps exp(value - max) per element (a row buffer of its own,
// or registers holding only that value) lets them read it instead. The accumulated value may be a
// whole prologue (a softmax of scores * scale, masked), not just a load.
std::vector<const kernel::ExprNode*> ExpShiftNodesOf(const kernel::Kernel& k, size_t from, int id,
                                                     const kernel::ExprNode* value);

}  // namespace kiln::codegen

#endif  // KILN_SERVER_CODEGEN_EXP_REUSE_H_
