// Softmax computes exp(x - max) twice per element: once while summing, once for the output. A
// row kernel that keeps the row (in registers on CUDA, in a per-thread buffer on CPU) can compute
// the maximum first, then overwrite the kept values with exp(x - max) while summing them, and let
// the output expressions of later phases read those instead of calling exp again.
//
// This file finds where that is legal: the exp(x - max) nodes of the later phases, provided
// nothing there reads x otherwise (the kept x is overwritten).

#ifndef KILN_SERVER_CODEGEN_EXP_REUSE_H_
#define KILN_SERVER_CODEGEN_EXP_REUSE_H_

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

}  // namespace kiln::codegen

#endif  // KILN_SERVER_CODEGEN_EXP_REUSE_H_
