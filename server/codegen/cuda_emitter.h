#ifndef KILN_SERVER_CODEGEN_CUDA_EMITTER_H_
#define KILN_SERVER_CODEGEN_CUDA_EMITTER_H_

// The CUDA C++ emitter: a list of verified Kernels (one graph) -> one self-contained CUDA source
// for NVRTC (server/toolchain/nvrtc.h; no include path, no CUDA headers: the helpers of
// kernels/cuda are embedded at the top), plus a launch configuration per kernel. It subclasses
// the CPU emitter (cpu_emitter.h) and shares its expression emission, common subexpressions,
// hoisted sizes and exact constants; it overrides the signature, the thread mapping, loads and
// stores, and retargets helper names from kiln_cpu:: / std:: to kiln_cuda::.
//
// Parameter convention (kernels[i] -> symbol "kiln_kernel_<i>", or another prefix from
// CudaEmitOptions::symbol_prefix), by value, in this order:
//     extern "C" __global__ void kiln_kernel_<i>(T0* b0, T1* b1, ..., int64_t n0, int64_t n1, ...);
//   b<j>: the element pointer of buffer j (device memory, at the tensor's storage offset;
//   `const T* __restrict__` for read buffers, `T* __restrict__` for write buffers, plain `T*` for
//   read-write ones; f16/bf16 as uint16_t bit patterns, bool as one byte); n<j>: scalar j. So a
//   launch passes cuLaunchKernel's kernelParams = {&b0, ..., &n0, ...}: every parameter is 8 bytes
//   and 8-aligned, no copies to device memory. The runtime (runtime/kiln_cuda.h) builds exactly
//   that array from a step's buffer and scalar tables.
//
// Launch (CudaLaunch): blockDim = (block, 1, 1) EXACTLY (row layouts map warps and lanes to rows
// with the block size as a constant), `shared_bytes` of dynamic shared memory (0 but for
// kSharedRow; cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) above 48 KiB),
// gridDim = (CudaGridSize(launch, scalars), 1, 1) where
//     grid = clamp(ceil(work / work_per_block), 1, max_grid)
// with `work` a Size over the scalars. Every kernel loops grid-stride (persistent), so ANY grid
// >= 1 computes the right result; the rule only picks a fast one (up to 4 waves, by threads, of
// blocks over the SMs: residency also depends on registers, which only ptxas knows).
//
// Index type: idx_t = int32_t when every size is a constant that fits (plus a slack for
// grid-stride and vector overrun), int64_t when some constant does not. Sizes over scalars: the
// body is `template <typename idx_t> KILN_DEV void kiln_kernel_<i>_body(...)` (static shared
// memory stays in the kernel and is passed in), and the kernel calls the int32_t instance when
// the scalars make the work and every buffer size (plus the slack) fit, the int64_t one otherwise.
//
// Loop order: a pointwise kernel whose stores are all contiguous along one outer dim other than
// the innermost (torch gives `a.t() + b` a column-major output) is emitted with that dim moved
// innermost (the points are independent), so the mappings below run along the stores.
//
// Thread mappings (CudaLayout):
//   * kPointwise: the outer space is flattened into rows x chunks of `vector_width` consecutive
//     innermost elements; a thread handles a chunk per grid-stride step. When the innermost index
//     of a load or store is contiguous, the chunk moves through one 16-byte (or narrower)
//     vector access, after a run-time check (pointers aligned, offsets and outer strides
//     multiples of the width; a row's tail chunk is scalar).
//   * kTiled: pointwise kernels with a load contiguous along o{k-2} (y) but strided along the
//     innermost o{k-1} (x), along which stores are contiguous (transposes, transposed broadcast
//     adds), and constant y, x extents >= 32: a block of 256 threads takes 32 x 64 (y, x) tiles
//     grid-stride; each such load is staged in a padded __shared__ [64][33] tile with lanes along
//     y (coalesced), then each thread computes 8 points with lanes along x (coalesced stores,
//     conflict-free tile reads). Tail tiles are bounds-checked; leading dims come from the tile
//     index. CudaEmitOptions::tile = false keeps kPointwise.
//   * kWarpPerRow (static reduction length <= 1024), kBlockPerRow (longer or dynamic): one outer
//     point per warp / block; each phase is a strided loop over the (flattened) reduction space
//     into thread-local accumulators (vectorized like pointwise when r0 is contiguous; rows of a
//     static length or stride that is not a multiple of the width move in vectors shifted to
//     each row's alignment: they start kiln_sh = (misalign(anchor) + row offset) % width elements
//     before the row, the row's first and last chunks go element by element, accesses whose
//     distance to the anchor is not a multiple of the width stay scalar, and pointers lying
//     differently from the anchor's take an uncached scalar path), then a
//     warp-shuffle (+ shared-memory) all-reduce so that every thread holds the row's result for
//     later phases. When the reduction length is static and a load recurs in a later phase, the
//     values are kept in registers (`kiln_c<k>`) and HBM is read once (softmax, layer norm);
//     kBlockPerRow then takes the smallest block (128..1024) leaving <= 32 such values per thread
//     (else 512 threads, or 256..1024 by length). The body runs once per row (lane 0).
//     Two-pass statistics: an online-softmax or Welford accumulator folded by one statement whose
//     values are in registers (the row cache, or `kiln_a<id>` within the register budget) is not
//     updated per element: pass A folds the max (resp. the sum), all-reduce, pass B folds
//     sum(exp(x - max)) (resp. sum((x - mean)^2)) over the registers, all-reduce; count = length.
//     Same (max, sum) / (mean, m2, count) up to rounding; NaN propagates; an all -inf row gives
//     max -inf, sum 0 as the online rule. When later phases read a cached load only inside
//     exp(x - max) of that accumulator (softmax), pass B overwrites the cache with those exps and
//     the later phases read them (one exp per element in all). An f16/bf16 load widened to f32
//     counts as the load for both (the cache holds the widened float). A store of
//     cast<f16/bf16>(x) narrows x once. Division by a row's softmax sum or Welford count is
//     x * (1 / s) with the reciprocal once per row (within 1.5 ulp of x / s; s >= 1, 0 or NaN).
//   * kColumn: reductions whose loads are contiguous across outer points (column sums): a block
//     serves P consecutive points with block/P threads each; partials meet in shared memory (a
//     tree over the threads of a point). P = 32, or down to 32 bytes of the narrowest coalesced
//     load when there are fewer points than blocks for the SMs (2048 bf16 points: P = 16).
//   * kClusterRow (sm_90+, static lengths; cuda_long_rows.h decides): kBlockPerRow with a row
//     spread over the `cluster` blocks of a thread-block cluster (__cluster_dims__(cluster, 1, 1),
//     __launch_bounds__(block, 1024 / block)), lane = rank * block + threadIdx.x of a group of
//     cluster * block threads; all-reduces go through the cluster's distributed shared memory
//     (kiln_cuda_cluster.cuh). For rows too long for one block's registers (read once from HBM,
//     cached in the cluster's registers; with rows enough, kSharedRow takes those whose cache
//     fits a block's shared memory) and for fewer rows than SMs (a split reduction). The
//     grid is a multiple of `cluster` (CudaGridSize rounds it); the kernel ends with a cluster
//     barrier. Shared memory comes from cluster_smem (emulation gives each block its own).
//     Rows too long for one block but with rows enough (>= kClusterRowsPerSm per SM) stay
//     kBlockPerRow, uncached, with a grid capped so that the rows in flight fit the L2
//     (UncachedRowGrid): pass 2 re-reads its row from L2. CudaEmitOptions::long_rows forces
//     either layout.
//   * kSharedRow (sm_80+, static lengths; cuda_long_rows.h ChooseSharedRows decides): kBlockPerRow
//     whose row cache lives in dynamic shared memory (kiln_cuda::dynamic_smem(), launch.shared_bytes)
//     instead of registers, for rows too long for a block's registers with rows enough (>= one
//     per SM): HBM is read once, and several blocks share an SM. Vector rows (width > 1): the
//     cache holds a chunk's Vec<T, width> per slot, chunk e of thread t at [e * block + t]
//     (16 bytes for bf16 x 8 / f32 x 4: consecutive threads, conflict-free), filled before the
//     load's first phase by one asynchronous copy per chunk within the row (cp.async, sm_80+;
//     all of a thread's copies in flight at once) and element by element for the partial chunks
//     at a shifted row's edges (their lanes outside the row are never read), then
//     cp_async_wait_all; every phase reads the slots (a chunk's vector once). Scalar rows: element
//     (slot, thread) at [slot * block + threadIdx.x] with slot = chunk, filled by the first phase
//     as it loads. f16/bf16 loads are kept as their 16-bit patterns and widened at each read (no
//     exp reuse into them), others as their value type. A thread reads back only the slots it
//     wrote, so the cache needs no barrier of its own (a thread's fill of the next row follows
//     its own reads of the row before; the vector-or-scalar choice is uniform over the kernel,
//     so the layout never changes between rows). Two-pass statistics read the cached load; values that
//     are not a cached load keep registers (within the budget) or the online rule. The grid is
//     one wave of blocks over the SMs, as many as fit by shared memory
//     (__launch_bounds__(block, that many)), grid-stride over the rows.
//     Two caches (sm_90+, where every cached load is a 16-byte vector, no other load runs along
//     the row and both fit one block; ChooseSharedRows): one block per SM; thread 0 fills a
//     row's cache by bulk copies (the copy engine, counted on that cache's mbarrier) of the
//     chunks wholly within the row and loads the partial edge chunks into registers; at each
//     row's phase 0 it stores that row's edges, a block barrier follows (every read of the other
//     cache is done), it starts the next row's fill into the other cache, and every thread waits
//     on this cache's mbarrier. The next row's HBM reads overlap this row's phases and stores.
//
// Guarantees: as the CPU emitter (names generated only; no graph strings; constants exact).
// Accumulation is fp32 for f16/bf16 data (the IR's accumulators are f32/f64); NaN propagates.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::codegen {

// Rows too long for one block's registers (cuda_long_rows.h; clusters on sm_90+ only).
enum class CudaLongRows {
  kAuto,         // cuda_long_rows.h decides: rows enough whose cache fits shared memory take
                 // kSharedRow (two caches with bulk fills where they fit on sm_90+, see
                 // kSharedRow below), few rows (and longer ones) clusters
  kBlockPerRow,  // never kClusterRow: one block per row (uncached past its registers; pass 2
                 // re-reads the row, from L2 when the grid keeps few enough rows in flight)
  kCluster,      // kClusterRow wherever a cluster's registers hold the row (rows2's choice)
  kShared,       // kSharedRow with one cache wherever some load recurs along a static row and
                 // its cache fits one block's shared memory (at one block per SM if need be);
                 // elsewhere as kCluster (sm_90+) or one uncached block (fixtures <name>_sm)
  kSharedPrefetch,  // as kShared with two row caches per block, the block's next row filled
                    // into the other while this one reduces and stores: by bulk copies on
                    // sm_90+ with 16-byte vectors (kAuto's choice where it fits), else each
                    // thread's cp.async, not waited for (fixtures <name>_smp)
};

struct CudaEmitOptions {
  std::string arch = "sm_90";  // decides the default SM count, and kClusterRow (sm_90+ only)
  int num_sms = 0;             // 0: 132 for sm_90*, 108 for sm_80, 132 otherwise
  bool include_prelude = true;  // false only in tests that look at kernels alone
  int pointwise_block = 256;
  int pointwise_waves = 4;       // grid cap for pointwise kernels: waves of resident blocks
  int max_cached_values = 64;    // registers per thread that may cache a row's loads (and at
                                 // most half of what the block size leaves a thread)
  bool vectorize = true;
  bool tile = true;  // kTiled for pointwise kernels with transposed loads
  int row_values = 32;       // row kernels: cached values per thread a block size aims at
  int max_row_block = 1024;  // row kernels: the largest block
  int max_cluster = 8;       // kClusterRow: blocks per cluster (< 2: never; sm_8x: never)
  // kClusterRow with blocks two of which fit an SM (512 threads): up to this many blocks, past the
  // portable 8 (sm_90 schedules 16 when the kernel allows non-portable sizes, which the runtime
  // sets for kernels of clusters over 8). <= max_cluster: the portable limit only.
  int max_small_cluster = 16;
  int shared_row_blocks_per_sm = 1;  // kAuto takes kSharedRow where this many blocks fit an SM
                                     // (cuda_long_rows.h; 0: never, 2: up to ~112 KiB a block)
  int shared_row_block = 512;        // kSharedRow: threads per block (at most max_row_block)
  CudaLongRows long_rows = CudaLongRows::kAuto;
  std::vector<CudaLongRows> kernel_long_rows;  // by kernel index, overriding long_rows where
                                               // given (fixtures comparing layouts side by side)
  // Kernel i is named <symbol_prefix><i>. kilnd's compiler makes it "kiln_<8 hex digits of the
  // graph's key>_" so that profiles tell the kernels of different plans apart (a graph's forward
  // and backward both have a kernel 0). Letters, digits and '_' only.
  std::string symbol_prefix = "kiln_kernel_";
};

// The symbol of kernel `index`: options.symbol_prefix followed by the index.
std::string CudaKernelSymbol(const CudaEmitOptions& options, int index);

enum class CudaLayout { kPointwise, kWarpPerRow, kBlockPerRow, kColumn, kTiled, kClusterRow, kSharedRow };
const char* CudaLayoutName(CudaLayout layout);  // "pointwise", "warp_per_row", ...

struct CudaLaunch {
  CudaLayout layout = CudaLayout::kPointwise;
  int block = 256;
  int shared_bytes = 0;  // dynamic shared memory: kSharedRow's row cache, else 0 (static
                         // __shared__ is in the cubin); > 48 KiB needs the opt-in attribute
  kernel::Size work;     // pointwise: elements; rows: outer points
  int64_t work_per_block = 1;
  int64_t max_grid = 1;
  int vector_width = 1;     // elements per vector access (1: none)
  int cached_values = 0;    // registers per thread caching a row (0: none)
  int cluster = 1;          // blocks per thread-block cluster (compile-time __cluster_dims__)
};

// grid = clamp(ceil(work / work_per_block), 1, max_grid) rounded up to a multiple of `cluster`;
// INVALID_ARGUMENT if `work` needs a scalar that is missing or the value overflows.
absl::StatusOr<int64_t> CudaGridSize(const CudaLaunch& launch, const std::vector<int64_t>& scalars);

struct CudaSource {
  std::string source;                       // the whole NVRTC source: prelude + "\n" + each kernel
  std::string prelude;                      // the text before the first kernel (comments, helpers):
                                            // prelude + "\n" + kernel_sources[i] + ... is also a
                                            // complete source, for compiling kernels in parallel
  std::vector<std::string> symbols;         // symbols[i] names kernels[i]
  std::vector<std::string> kernel_sources;  // each kernel's function alone (dumps, golden tests)
  std::vector<CudaLaunch> launches;         // launches[i] for kernels[i]
};

absl::StatusOr<CudaSource> EmitCudaSource(absl::Span<const kernel::Kernel> kernels,
                                          const CudaEmitOptions& options = CudaEmitOptions());

}  // namespace kiln::codegen

#endif  // KILN_SERVER_CODEGEN_CUDA_EMITTER_H_
