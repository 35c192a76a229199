// CudaKernelEmitter (cuda_kernel_emitter.h): kSharedRow's row cache in dynamic shared memory
// (filled by cp.async), and the slots of a row cache, in registers or in shared memory.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/codegen/cuda_kernel_emitter.h"
#include "server/codegen/exp_reuse.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::codegen::internal {

void CudaKernelEmitter::EmitSharedFill(const VecPlan& plan, int64_t chunks, int64_t total) {
  std::vector<const CacheEntry*> fill;
  bool all_first = true;  // every cached load is first read in phase 0
  for (const auto& [key, e] : cache_) {
    if (!smem_arrays_.count(e.name)) continue;
    if (e.first_phase == phase_) fill.push_back(&e);
    all_first &= e.first_phase == 0;
  }
  if (fill.empty()) return;
  if (!prefetch_rows_ || phase_ != 0 || !all_first) {
    EmitSharedFillLoop(fill, plan, chunks, total);
    w_.Line("kiln_cuda::cp_async_wait_all();");
    return;
  }
  w_.Open("if (!kiln_ready)");  // the block's first row: nothing was started for it
  EmitSharedFillLoop(fill, plan, chunks, total);
  w_.Close();
  w_.Line("kiln_cuda::cp_async_wait_all();  // this row's cache");
  // The block's next row into the other cache, in flight during this row's phases: its outer
  // indices (and shift) in a scope of their own, the cache arrays redeclared over the other half.
  w_.Open("");
  w_.Line("const idx_t kiln_next = kiln_u + gridDim.x;");
  w_.Linef("kiln_ready = kiln_next < ", SizeCode(Product(k_.outer)), ";");
  w_.Open("if (kiln_ready)");
  w_.Line("const idx_t kiln_u = kiln_next;");
  EmitDecompose("kiln_u", static_cast<int>(k_.outer.size()));
  if (shifted_) w_.Linef("const idx_t kiln_sh = ", plan.shift, ";");
  EmitSmemDecls(absl::StrCat(" + (kiln_buf ^ 1) * ", smem_cache_bytes_));
  EmitSharedFillLoop(fill, plan, chunks, total);
  w_.Line("kiln_cuda::cp_async_commit();");
  w_.Close();
  w_.Close();
}

void CudaKernelEmitter::EmitSharedFillLoop(const std::vector<const CacheEntry*>& fill,
                                           const VecPlan& plan, int64_t chunks, int64_t total) {
  const int width = plan.width;
  auto slot = [&](const CacheEntry& e) {
    return absl::StrCat(e.name, "[kiln_e * ", group_, " + kiln_lane]");
  };
  auto scalar = [&](const CacheEntry& e, int j) {
    w_.Linef(slot(e), ".v[", j, "] = b", e.load->buffer.index, "[", IndexCode(e.load->index), "];");
  };
  w_.Raw(chunks <= 16 ? "#pragma unroll" : "#pragma unroll 4");
  w_.Open(absl::StrCat("for (int kiln_e = 0; kiln_e < ", chunks, "; ++kiln_e)"));
  w_.Linef("const idx_t kiln_rb = (static_cast<idx_t>(kiln_e) * ", group_, " + kiln_lane) * ", width,
           shifted_ ? " - kiln_sh" : "", ";");
  if (shifted_) {
    w_.Open(absl::StrCat("if (kiln_rb >= 0 && kiln_rb + ", width, " <= ", total, ")"));
  } else {
    w_.Open(total % (int64_t{group_} * width) != 0 ? absl::StrCat("if (kiln_rb < ", total, ")") : "");
  }
  w_.Line("const idx_t r0 = kiln_rb;");
  for (const CacheEntry* e : fill) {
    const std::string key = AccessKey(e->load->buffer, e->load->index);
    const int64_t bytes = SmemBytes(e->load->type) * width;
    if (plan.loads.count(key) &&
        SmemBytes(e->load->type) == kernel::ScalarTypeBytes(e->load->buffer.dtype) &&
        (bytes == 4 || bytes == 8 || bytes == 16)) {
      w_.Linef("kiln_cuda::cp_async<", bytes, ">(&", slot(*e), ", b", e->load->buffer.index, " + (",
               IndexCode(e->load->index), "));");
      continue;
    }
    // Not a vector access of the plan: element by element.
    for (int j = 0; j < width; ++j) {
      w_.Open("");
      w_.Linef("const idx_t r0 = kiln_rb + ", j, ";");
      scalar(*e, j);
      w_.Close();
    }
  }
  w_.Close();
  if (shifted_) {
    EmitShiftedTail(width, total, [&](int j) {
      for (const CacheEntry* e : fill) scalar(*e, j);
    });
  }
  w_.Close();
}

void CudaKernelEmitter::EmitSmemDecls(const std::string& cache_offset) {
  for (const SmemDecl& d : smem_decls_) {
    w_.Linef(d.type, "* const ", d.name, " = reinterpret_cast<", d.type, "*>(kiln_dsmem + ", d.offset,
             cache_offset, ");");
  }
}

std::string CudaKernelEmitter::Slot(const std::string& array) const {
  if (smem_arrays_.count(array)) {
    if (smem_vec_) {
      const std::string chunk = array == local_vec_array_
                                    ? local_vec_
                                    : absl::StrCat(array, "[kiln_e * ", group_, " + kiln_lane]");
      return absl::StrCat(chunk, ".v[", (lane_ < 0 ? 0 : lane_), "]");
    }
    const std::string slot =
        width_ == 1 ? "kiln_e" : absl::StrCat("(kiln_e * ", width_, " + ", (lane_ < 0 ? 0 : lane_), ")");
    return absl::StrCat(array, "[", slot, " * ", group_, " + kiln_lane]");
  }
  return width_ == 1 ? absl::StrCat(array, "[kiln_e]")
                     : absl::StrCat(array, "[kiln_e * ", width_, " + ", (lane_ < 0 ? 0 : lane_), "]");
}

std::string CudaKernelEmitter::SlotValue(const std::string& array) const {
  auto smem = smem_arrays_.find(array);
  if (smem == smem_arrays_.end() || !kernel::IsHalfType(smem->second)) return Slot(array);
  Buffer b;
  b.dtype = smem->second;
  // Pass B's chunk vector, read once into a local: its lanes widen in one instruction each.
  if (smem_vec_ && array == local_vec_array_ && lane_ >= 0) return WidenLane(b, local_vec_, lane_, width_);
  return Widen(b, Slot(array));
}

}  // namespace kiln::codegen::internal
