#ifndef KILN_SERVER_CODEGEN_CUDA_LONG_ROWS_H_
#define KILN_SERVER_CODEGEN_CUDA_LONG_ROWS_H_

// Long rows: the kClusterRow layout (sm_90+) and the kSharedRow layout (sm_80+, see below) of the
// CUDA emitter (cuda_emitter.h). kClusterRow: one row
// (outer point) is spread over the blocks of a thread-block cluster (`cluster` blocks of `block`
// threads, __cluster_dims__(cluster, 1, 1)), which split it as one group of cluster * block
// threads: thread t of the block of rank c is lane c * block + t of the row. Each phase's
// all-reduce is a block all-reduce and then an exchange of the blocks' states through
// distributed shared memory (kernels/cuda/kiln_cuda_cluster.cuh), so that
//   * a row too long for one block's registers is still read once from HBM and kept in the
//     registers of the cluster (softmax, log_softmax, layer norm over 50257..262144 columns);
//   * a few long rows (fewer rows than SMs: sums with few outputs, a full reduction) occupy
//     `cluster` times as many SMs (a split reduction with no workspace and no second kernel).
// ChooseClusterRows takes the facts the emitter knows about a row kernel and says whether to use
// the layout and with which shape; it never chooses it for sm_8x (no clusters), dynamic lengths,
// or when one block already does the job (a block caches the row, or there are rows enough).
//
// Rows too long for one block's registers but with rows enough (>= cluster_rows_per_sm rows per
// SM, or an unknown count) whose rows in flight fit the L2 (one per SM: num_sms * row_bytes <=
// l2_row_bytes) stay one block per row, uncached: pass 1 reads the row from HBM, pass 2 reads it
// again from L2 (UncachedRowGrid caps the grid, so the rows in flight, to what the L2 holds).
// THE DECISION between the two is kClusterRowsPerSm (and kL2RowBytes) below: rows >=
// kClusterRowsPerSm * SMs -> one uncached block per row; fewer -> a cluster caching the row.
// kClusterRowsPerSm = 0 gives the uncached block to every count of rows that fits the L2 test,
// a huge value (or l2_row_bytes = 0) restores clusters wherever their registers hold the row.
//
// Shared rows (sm_80+, the emitter's kSharedRow layout): one block per row whose recurring loads
// are cached in the block's dynamic shared memory instead of registers (f16/bf16 as their 16-bit
// bit patterns, so a 50257-column bf16 row takes ~104 KB). ChooseSharedRows takes them for static
// rows too long for one block's registers whose cache fits at least `shared_row_blocks_per_sm`
// blocks per SM (1 by default: up to ~226 KiB a block on sm_90, ~162 KiB on sm_80; two blocks
// share an SM where they fit) and rows enough (>= one per SM, or an unknown count; on archs
// without clusters any count); fewer rows keep clusters. The grid is one wave of the blocks that
// fit an SM by shared memory (persistent over the rows). Measured on the H200 with the rows
// filled by cp.async (fixtures, 2026-11-21): bf16 4096 x 50257 softmax 54.3% of copy at two
// blocks per SM (41.8% at one, 32.7% as a cluster); at one block per SM f32 4096 x 50257 70.9%
// (cluster 48.8%), bf16 65536 columns 59.3% (cluster 54.4%). Within a block the phases run one
// after another (fill, reduce, store), so HBM idles while a row reduces; CudaLongRows::
// kSharedPrefetch (fixtures <name>_smp, not chosen automatically until measured) gives a block two
// caches and starts the fill of its next row before the current row's phases.
// Rows of one load (a softmax; no other load along the row) that registers hold only with more
// than kWideRowValues values a thread at shared_row_block threads (kBlockPerRow's 1024-thread
// blocks) take kSharedRow too: 16-bit rows always, f32 rows unless they are whole chunks of a
// 1024-thread block (no ragged last chunk). Measured on the H200 (fixtures, 2026-11-22, % of copy,
// registers against kSharedRow): bf16 4096 x 32000 33.2% vs 86.7% (two caches), 32001 47.2% vs
// 81.7%; f32 4096 x 32000 81.8% vs 88.9%, 8192 x 20000 76.5% vs 89.5%, 4096 x 24001 56.0% vs
// 84.1% (two caches); but f32 2048 x 32768 87.8% vs 84.2% (log_softmax 82.5% vs 84.5%); at 512
// threads registers win (bf16 8192 x 16384 87.6% vs 83.8%, f32 8192 x 16384 93.7% vs 89.7%).
// Rows that one block's registers would hold take kSharedRow too when their stores are stray
// (ClusterRowFacts::stray_stores) and every thread has a vector of the row: registers hold each
// value at its load's alignment, so such stores would go element by element (bf16 softmax of
// x[:, 1:], 4096 x 32001 on the H200: 698 us in registers, against Inductor's 364 us).

#include <cstdint>
#include <string>

#include "absl/types/optional.h"

namespace kiln::codegen {

struct ClusterRowFacts {
  int64_t length = 0;                 // the (static) reduction length of a row
  absl::optional<int64_t> rows;       // the number of rows, when static
  int recurring_loads = 0;            // loads along the row that later phases read again
  int other_loads = 0;                // loads along the row read in one phase only (not cached:
                                      // a layer norm's weight and bias)
  int vector_width = 1;               // elements per vector access along the row (1: scalar)
  int64_t row_bytes = 0;              // bytes of the recurring loads of one row (what pass 2
                                      // of an uncached row reads again)
  int64_t element_bytes = 0;          // bytes of one element of each recurring load, summed (the
                                      // shared row cache: 2 for f16/bf16, 4 for f32...)
  bool stray_stores = false;          // shifted rows whose stores along the row lie differently
                                      // from the loads (softmax of x[:, 1:] into a contiguous
                                      // output): only kSharedRow stores those in vectors
};

// Rows per SM from which a row too long for one block is read twice by one block (pass 2 from
// L2) rather than cached in a cluster's registers. From the H200 fixtures: clusters win with a
// few long rows (64 x 262144), lose with thousands (4096 x 50257: 0.94x Inductor).
inline constexpr int kClusterRowsPerSm = 2;
// The bytes of rows in flight pass 2 may expect to find in L2 (H100/H200: 50 MB, of which the
// writes of pass 2 and the other partition's copies take a share).
inline constexpr int64_t kL2RowBytes = int64_t{32} << 20;

struct ClusterRowLimits {
  int num_sms = 132;
  int max_cluster = 8;       // blocks per cluster (8: the portable limit); < 2: never
  // Blocks per cluster of blocks that two fit an SM (<= 512 threads), where a row needs more than
  // max_cluster of them in registers: clusters of 16 x 512 span 8 SMs as 8 x 1024 do, but two
  // blocks of an SM overlap one's loads with the other's reductions. Measured on the H200
  // (fixtures, tests/gpu/cuda_kernels_check.py, 2026-11-22; emit_cuda_fixtures
  // --portable_clusters for 8 x 1024): softmax f32 64 x 262144 58.0-59.1 us against 65.4-67.2,
  // log_softmax 56.8-57.0 against 65.2-65.9, softmax bf16 44 against 48. 0: max_cluster only.
  int max_small_cluster = 16;
  int max_row_block = 1024;  // threads per block
  int row_values = 32;       // cached values per thread a block aims at
  int max_cached_values = 64;  // the emitter's register budget (also <= 65536 / block / 2)
  int cluster_rows_per_sm = kClusterRowsPerSm;  // see above
  // 0 (the default): no uncached long rows, clusters wherever their registers hold the row.
  // Measured on the H200 (fixtures <name>_l2 vs <name>_cl, 2026-11-21): the uncached block with
  // pass 2 from L2 lost on every shape but f32 4096 x 50257 at two blocks per SM (51.7% vs 48.6%
  // of copy): bf16 65536 33.8% vs 55.3%, log_softmax 131072 47.6% vs 74.4%, bf16 50257 32.2% vs
  // 32.6%. kL2RowBytes turns it on for experiments.
  int64_t l2_row_bytes = 0;
  // Shared rows (ChooseSharedRows). The arch's shared memory (SharedMemoryOf; 0: never).
  int64_t shared_bytes_per_sm = 228 * 1024;
  int64_t max_shared_bytes_per_block = 227 * 1024;
  int64_t reserved_shared_bytes = 1024;  // per block, taken by the system (sm_80+)
  int64_t static_shared_bytes = 0;       // the kernel's static __shared__ (the all-reduce slots)
  // kAuto takes shared rows whose cache lets at least this many blocks share an SM (1: up to
  // ~226 KiB at one block per SM on sm_90; 2: ~112 KiB; 0: never automatically).
  int shared_row_blocks_per_sm = 1;
  int shared_row_block = 512;  // threads per block (at most max_row_block)
  // Row caches per block: 1, 2 (CudaLongRows::kSharedPrefetch), or 0: two where the arch has bulk
  // copies (bulk_copies), every recurring load is a 16-byte vector, no other load runs along the
  // row and two caches fit one block, else one (CudaLongRows::kAuto; see kSharedBulkBytes below).
  int shared_row_buffers = 1;
  bool bulk_copies = false;  // the arch has cp.async.bulk (sm_90+: ArchHasBulkCopies)
};

// Two row caches with bulk fills (cuda_kernel_emitter.h, EmitSharedFill): the block's next row is
// copied into the other cache by the copy engine while this row reduces and stores. Measured on
// the H200 (scratch kernel beside the kSharedRow fixture, 2026-11-22): softmax bf16 4096 x 50257
// at 85.6-86.8% of copy against 80-81% with one cache and two blocks per SM, 69% with the next
// row filled by each thread's cp.async instead. Not where a later phase also loads along the row
// from global memory: layer norm bf16 4096 x 50257 (weight and bias) ran at 39.3% with two caches
// in one block per SM against 43.8% with one cache and two blocks (those loads' latency wants
// the second block's warps). The dynamic shared memory's two mbarriers follow the caches:
// kSharedBulkBytes more per block.
inline constexpr int64_t kSharedBulkBytes = 16;

// Shared memory of an arch: per SM and the most one block may have (opt-in), in bytes; zeros for
// archs before sm_80 or unknown ones (no shared rows).
struct SharedMemorySize {
  int64_t per_sm = 0;
  int64_t per_block = 0;
};
SharedMemorySize SharedMemoryOf(const std::string& arch);

inline constexpr int kWideRowValues = 32;  // see above

struct SharedRowChoice {
  int block = 1;             // threads per block
  int64_t bytes = 0;         // dynamic shared memory per block: the row caches
  int blocks_per_sm = 1;     // blocks that fit an SM by shared memory and threads (the grid cap)
  int buffers = 1;           // row caches per block (2: the next row's fill in flight)
};

// The shared-row layout for a row kernel of static length, or nullopt (see above). `forced`
// (CudaLongRows::kShared): whenever some load recurs and the cache fits one block, whatever the
// row count or register fit.
absl::optional<SharedRowChoice> ChooseSharedRows(const ClusterRowFacts& facts,
                                                 const ClusterRowLimits& limits, bool forced);

// Bytes of shared memory caching a row's recurring loads with blocks of `block` threads: slot
// (chunk * width + lane, thread), chunks = ceil(length / (block * width)).
int64_t SharedRowBytes(const ClusterRowFacts& facts, int block);

struct ClusterRowChoice {
  int cluster = 1;  // blocks per cluster, 2..max_cluster
  int block = 1;    // threads per block
};

// Whether `arch` ("sm_90", "sm_90a", "sm_100"...) has thread-block clusters (sm_90 and later).
bool ArchHasClusters(const std::string& arch);
// Whether `arch` has bulk copies into shared memory (cp.async.bulk: sm_90 and later).
inline bool ArchHasBulkCopies(const std::string& arch) { return ArchHasClusters(arch); }

// The blocks per row: enough that every recurring load of the row fits in the registers the
// emitter caches (<= row_values per thread per load, rounded to vectors), and, for fewer rows
// than SMs, enough for about two blocks per SM (with >= 8 values per thread). Blocks of
// min(512, max_row_block) threads (two per SM at <= 64 registers), else max_row_block. nullopt:
// one block per row (the kBlockPerRow layout).
absl::optional<ClusterRowChoice> ChooseClusterRows(const ClusterRowFacts& facts,
                                                   const ClusterRowLimits& limits);

// The longest row of one recurring load that ChooseClusterRows keeps in a cluster's registers:
// the largest cluster of blocks times row_values (16 x 512 x 32 = 262144 by default); 0 where
// there are no clusters (max_cluster < 2).
int64_t LongestClusterRow(const ClusterRowLimits& limits);

// Whether a row too long for one block's registers is better read twice by one block (rows
// enough, and a row per SM fits the L2) than cached in a cluster: the rule above.
bool PreferUncachedRows(const ClusterRowFacts& facts, const ClusterRowLimits& limits);

// The grid of one uncached block per row of blocks of `block` threads, when rows are too long for
// one block's registers and recur (pass 2 re-reads them): whole blocks per SM, as many as fit by
// threads but no more rows in flight than l2_row_bytes / row_bytes (at least one per SM), so that
// pass 2 finds its row in L2. 0: no cap (the row is cached, nothing recurs, or no L2 budget).
int64_t UncachedRowGrid(const ClusterRowFacts& facts, const ClusterRowLimits& limits, int block);

}  // namespace kiln::codegen

#endif  // KILN_SERVER_CODEGEN_CUDA_LONG_ROWS_H_
