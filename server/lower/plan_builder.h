#ifndef KILN_SERVER_LOWER_PLAN_BUILDER_H_
#define KILN_SERVER_LOWER_PLAN_BUILDER_H_

// AssemblePlan: schedule + kernels + memory plan -> a kiln.v1.Plan.
//
// Takes the OpGraph, its Schedule, its KernelSet and, per kernel, where the compiled kernel lives
// (KernelBinding: binary index, symbol, and for CUDA its launch). Runs PlanMemory over the workspace values and returns the Plan. Errors: INTERNAL
// for inconsistencies; UNIMPLEMENTED for a step argument the plan cannot express.
//
// ===== Run-time semantics of a Plan (what the client's executor implements) =====
// Values. plan.values[i] is a tensor while the plan runs; its meta gives dtype, sizes and strides
// (static integers; graphs with symbolic sizes are not compiled). Values 0..num_inputs-1 are the
// graph inputs in placeholder order. By storage:
//   INPUT      the graph input at position `index` among the placeholders (the caller's tensor).
//   CONSTANT   Graph.constants[`index`], held by the client.
//   OUTPUT     allocated by the client before the first step, torch.empty_strided(meta.sizes,
//              meta.strides, dtype=meta.dtype) on the target device; returned when plan.outputs
//              lists it (an intermediate read by an aten step that may alias its inputs, e.g. a
//              view op run by torch, is OUTPUT too, so that no alias points into the workspace).
//   WORKSPACE  the bytes [offset, offset + span) of the ONE workspace buffer of `workspace_bytes`
//              bytes (allocated by the client per run, 64-byte aligned base, contents undefined),
//              viewed with meta.sizes/strides (storage offset 0 at `offset`). Offsets are multiples
//              of 64; values whose lifetimes overlap never share bytes.
//   VIEW       a view of value `index` (never itself a view): torch.as_strided(values[index],
//              meta.sizes, meta.strides, values[index].storage_offset() + offset), i.e. `offset` is
//              the element offset RELATIVE to the base's own storage offset (meta.storage_offset
//              is the graph's, informational). Created when its base exists.
//   STEP       produced by the AtenStep that lists it in `outputs`; the tensor torch returned.
// Steps run in order.
//   KernelStep: call `symbol` of binaries[`binary`] (CPU: the runtime's kiln_run_steps; CUDA:
//     kiln_cuda_run_launches on the caller's current stream with gridDim = (grid[0], 1, 1),
//     blockDim = (block[0], 1, 1) and `shared_bytes` of dynamic shared memory; CPU steps have no
//     grid/block) with buffers[j] = data pointer of values[args[j]] at its storage offset
//     (tensor.data_ptr()), and no scalars (scalar_args is empty: static shapes). Consecutive
//     kernel steps of one binary may be handed to the runtime in one call.
//   LibraryStep (CUDA plans, PlanOptions::library_gemms): a call into a vendor library made by the
//     client's runtime on the caller's current stream; function "cublasLt.matmul" is a GEMM whose
//     encoding server/lower/gemm_step.h documents. Its result value (args[0]) has storage OUTPUT
//     or WORKSPACE like a kernel's; its workspace value (args[4]) is u8 scratch live only during
//     the step. A client without the library runs it with torch (same semantics).
//   AtenStep: call torch.ops.<target> (target "aten.mm.default" -> torch.ops.aten.mm.default) with
//     `args` and `kwargs` converted as graph.proto says, where an Argument whose `node` is
//     "v<i>" is values[i]; lists convert item by item. For registry ops the arguments are in
//     schema order with defaults filled in, keyword-only parameters in `kwargs` by schema name;
//     for ops outside the registry they are exactly as the client serialized them. A device
//     argument is the graph's (the client maps it to the device it runs on). The result's tensors
//     become the values in `outputs`: a single tensor result -> outputs[0]; a tuple/list result ->
//     outputs[k] is item k (-1: item not used as a value). Kernels read a STEP value with its
//     meta's strides: a result whose sizes/strides differ from its meta must be copied into that
//     layout (torch.empty_strided(meta) + copy_) before later steps use it. `fallback` = true
//     marks an op kiln could not compile (counted as an op fallback); `node` names the graph node.
// Values whose sizes contain a 0 may have no producing step (there is nothing to compute); the
// client still allocates them from their storage kind.
// Outputs. plan.outputs[k] is the value returned as graph output k; -1 means the graph returns None
// there (AOTAutograd backward graphs do). The same value may appear twice; an output may be an
// INPUT or a VIEW of one (aliasing as in the graph).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/v1/compiler.pb.h"
#include "server/lower/fuse.h"
#include "server/lower/kernelize.h"
#include "server/lower/memory_plan.h"
#include "server/lower/op_graph.h"

namespace kiln::lower {

struct PlanStats {
  int32_t kernels = 0;
  int32_t extern_steps = 0;   // aten steps that are not fallbacks
  int32_t library_steps = 0;  // extern GEMMs emitted as LibrarySteps
  int32_t fallback_steps = 0;
  std::vector<int32_t> fallback_nodes;  // graph nodes
  std::vector<std::string> fallback_reasons;
  std::string memory_dump;
};

// Where kernels.kernels[i] lives once compiled, and (CUDA) how it is launched.
struct KernelBinding {
  int32_t binary = 0;  // index into Artifact.binaries
  std::string symbol;
  int64_t grid = 0;    // CUDA gridDim.x; 0: no launch configuration (CPU)
  int32_t block = 0;   // CUDA blockDim.x
  int32_t shared_bytes = 0;
};

struct PlanOptions {
  // Extern mm/bmm/addmm/baddbmm steps that cuBLASLt can run become LibrarySteps (gemm_step.h);
  // the rest stay AtenSteps (the reason is logged at debug level). The CUDA compiler sets it.
  bool library_gemms = false;
};

// Bindings for kernels that all live in binary `binary` under `symbols` (CPU).
std::vector<KernelBinding> BindToBinary(const std::vector<std::string>& symbols, int32_t binary);

absl::StatusOr<::kiln::v1::Plan> AssemblePlan(const OpGraph& g, const Schedule& s, const KernelSet& kernels,
                                              const std::vector<KernelBinding>& bindings, PlanStats* stats,
                                              const PlanOptions& options = PlanOptions());

}  // namespace kiln::lower

#endif  // KILN_SERVER_LOWER_PLAN_BUILDER_H_
