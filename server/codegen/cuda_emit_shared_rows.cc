// CudaKernelEmitter (cuda_kernel_emitter.h): kSharedRow's row cache in dynamic shared memory
// (filled by cp.async, or by bulk copies into two caches), and the slots of a row cache, in
// registers or in shared memory.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "server/codegen/cuda_kernel_emitter.h"
#include "server/codegen/cuda_long_rows.h"
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
  if (prefetch_rows_ && phase_ == 0 && all_first && BulkFillable(fill, plan)) {
    EmitBulkFill(fill, plan, total);
    return;
  }
  if (!prefetch_rows_ || phase_ != 0 || !all_first) {
    EmitSharedFillLoop(fill, plan, chunks, total);
    w_.Line("kiln_cuda::cp_async_wait_all();");
    return;
  }
  w_.Open("if (!kiln_ready)");  // the block's first row: nothing was started for it
  EmitSharedFillLoop(fill, plan, chunks, total);
  w_.Close();
  w_.Line("kiln_cuda::cp_async_wait_all();  // this row's cache");
  EmitNextRow(plan, "", [&] {
    EmitSharedFillLoop(fill, plan, chunks, total);
    w_.Line("kiln_cuda::cp_async_commit();");
  });
}

void CudaKernelEmitter::EmitNextRow(const VecPlan& plan, const std::string& also,
                                    absl::FunctionRef<void()> fill) {
  // The block's next row into the other cache, in flight during this row's phases: its outer
  // indices (and shift) in a scope of their own, the cache arrays redeclared over the other half.
  w_.Open("");
  w_.Line("const idx_t kiln_next = kiln_u + gridDim.x;");
  w_.Linef("kiln_ready = kiln_next < ", SizeCode(Product(k_.outer)), ";");
  w_.Open(absl::StrCat("if (kiln_ready", also, ")"));
  w_.Line("const idx_t kiln_u = kiln_next;");
  EmitDecompose("kiln_u", static_cast<int>(k_.outer.size()));
  if (shifted_) w_.Linef("const idx_t kiln_sh = ", plan.shift, ";");
  EmitSmemDecls(absl::StrCat(" + (kiln_buf ^ 1) * ", smem_cache_bytes_));
  fill();
  w_.Close();
  w_.Close();
}

int64_t CudaKernelEmitter::VectorSlotBytes(const CacheEntry& e, const VecPlan& plan) const {
  const int64_t bytes = SmemBytes(e.load->type);
  if (!plan.loads.count(AccessKey(e.load->buffer, e.load->index)) ||
      bytes != kernel::ScalarTypeBytes(e.load->buffer.dtype)) {
    return 0;
  }
  return bytes * plan.width;
}

bool CudaKernelEmitter::BulkFillable(const std::vector<const CacheEntry*>& fill,
                                     const VecPlan& plan) const {
  if (!ArchHasBulkCopies(cuda_.arch)) return false;
  for (const CacheEntry* e : fill) {
    if (VectorSlotBytes(*e, plan) != 16) return false;
  }
  return true;
}

void CudaKernelEmitter::EmitBulkFill(const std::vector<const CacheEntry*>& fill, const VecPlan& plan,
                                     int64_t total) {
  const int width = plan.width;
  // Once per kernel (the top of its body): the two caches' mbarriers after the caches, the phase
  // parity each waits for next, and the edge chunks' registers of the row being filled.
  if (!bulk_declared_) {
    bulk_declared_ = true;
    hoisted_.Linef("uint64_t* const kiln_bars = reinterpret_cast<uint64_t*>(kiln_cuda::dynamic_smem() + ",
                   2 * smem_cache_bytes_, ");");
    hoisted_.Line("unsigned kiln_parity = 0;  // bit b: the parity cache b's next fill completes");
    hoisted_.Open("if (threadIdx.x == 0)");
    hoisted_.Line("kiln_cuda::mbar_init(kiln_bars);");
    hoisted_.Line("kiln_cuda::mbar_init(kiln_bars + 1);");
    hoisted_.Close();
    if (shifted_) {
      for (const CacheEntry* e : fill) {
        const std::string t = absl::StrCat("kiln_cuda::Vec<", SmemType(e->load->type), ", ", width, ">");
        hoisted_.Linef(t, " ", e->name, "_head, ", e->name, "_tail;  // its edge chunks (shifted rows)");
      }
    }
    launch_.shared_bytes = std::max<int>(launch_.shared_bytes,
                                         static_cast<int>(2 * smem_cache_bytes_ + kSharedBulkBytes));
  }
  // Issues the fill of the row in scope (its outer indices, shift and cache arrays) into cache
  // `buf`: the chunks wholly within the row by bulk copies, the partial first and last chunks of
  // a shifted row into registers (stored at that row's phase 0: their loads' latency hides
  // behind this row), so that nothing outside the row is read.
  auto issue = [&](const std::string& buf) {
    const std::string shift = shifted_ ? "kiln_sh" : "0";
    w_.Linef("const idx_t kiln_f0 = ", shifted_ ? "kiln_sh > 0 ? 1 : 0" : "0", ";  // first whole chunk");
    w_.Linef("const idx_t kiln_f1 = (", shift, " + ", total, ") / ", width, ";  // past the last");
    w_.Linef("kiln_cuda::mbar_expect_tx(kiln_bars + ", buf, ", static_cast<uint32_t>((kiln_f1 - kiln_f0) * ",
             16 * static_cast<int64_t>(fill.size()), "));");
    for (const CacheEntry* e : fill) {
      w_.Open("");
      w_.Linef("const idx_t r0 = kiln_f0 * ", width, " - ", shift, ";");
      w_.Linef("kiln_cuda::bulk_copy(&", e->name, "[kiln_f0], b", e->load->buffer.index, " + (",
               IndexCode(e->load->index), "), static_cast<uint32_t>((kiln_f1 - kiln_f0) * 16), kiln_bars + ",
               buf, ");");
      w_.Close();
    }
    if (!shifted_) return;
    for (const CacheEntry* e : fill) {
      for (const char* edge : {"head", "tail"}) {
        const bool head = edge[0] == 'h';
        for (int j = 0; j < width; ++j) {
          w_.Open("");
          w_.Linef("const idx_t r0 = ", head ? "" : absl::StrCat("kiln_f1 * ", width, " + "), j,
                   " - kiln_sh;");
          w_.Open(absl::StrCat("if (r0 >= 0 && r0 < ", total, ")"));
          w_.Linef(e->name, "_", edge, ".v[", j, "] = b", e->load->buffer.index, "[",
                   IndexCode(e->load->index), "];");
          w_.Close();
          w_.Close();
        }
      }
    }
  };
  w_.Line("// This row's cache: filled by bulk copies the row before started (or now, at a block's");
  w_.Line("// first row); its edge chunks from registers; then the next row's fill into the other.");
  w_.Open("if (threadIdx.x == 0)");
  w_.Open("if (!kiln_ready)");
  issue("kiln_buf");
  w_.Close();
  if (shifted_) {
    for (const CacheEntry* e : fill) {
      w_.Linef("if (kiln_sh > 0) ", e->name, "[0] = ", e->name, "_head;");
      w_.Linef("if ((kiln_sh + ", total, ") % ", width, " != 0) ", e->name, "[(kiln_sh + ", total,
               ") / ", width, "] = ", e->name, "_tail;");
    }
  }
  w_.Close();
  w_.Line("__syncthreads();  // the edges are in; every read of the other cache (the row before) is done");
  EmitNextRow(plan, " && threadIdx.x == 0", [&] {
    w_.Line("kiln_cuda::fence_proxy_async();");
    issue("(kiln_buf ^ 1)");
  });
  w_.Line("kiln_cuda::mbar_wait(kiln_bars + kiln_buf, (kiln_parity >> kiln_buf) & 1u);");
  w_.Line("kiln_parity ^= 1u << kiln_buf;");
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
    const int64_t bytes = VectorSlotBytes(*e, plan);
    if (bytes == 4 || bytes == 8 || bytes == 16) {
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
