// CudaKernelEmitter (cuda_kernel_emitter.h): the layout of a row kernel (kColumn, kWarpPerRow,
// kBlockPerRow, kSharedRow, kClusterRow) and the facts about its row that cuda_long_rows.h decides
// the long rows' layouts with.

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/types/optional.h"
#include "server/codegen/cuda_emitter.h"
#include "server/codegen/cuda_kernel_emitter.h"
#include "server/codegen/cuda_long_rows.h"
#include "server/codegen/exp_reuse.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::codegen::internal {

namespace {

constexpr int kWarpRowLimit = 1024;  // static reduction lengths up to this: a warp per row
constexpr int64_t kShortColumnRows = 16;  // column reductions of at most this many rows: a thread per point

// sizeof the accumulator's state in the helpers (kiln_cuda_reduce.cuh).
int StateBytes(const Accumulator& a) {
  const int t = kernel::ScalarTypeBytes(a.dtype);
  switch (a.kind) {
    case AccKind::kArgMax: case AccKind::kArgMin: return 16;
    case AccKind::kWelford: return 3 * t;
    case AccKind::kOnlineSoftmax: return 2 * t;
    default: return t;
  }
}

// Blocks of `threads` threads, each serving `vec` consecutive points, over `points` points.
int64_t BlocksOf(int64_t points, int threads, int vec) {
  return (points + int64_t{threads} * vec - 1) / (int64_t{threads} * vec);
}

}  // namespace

bool CudaKernelEmitter::IsColumnReduction() const {
  if (k_.outer.empty()) return false;
  const Var last_outer{VarKind::kOuter, static_cast<int32_t>(k_.outer.size()) - 1};
  const Var last_reduce{VarKind::kReduce, static_cast<int32_t>(k_.reduce.size()) - 1};
  bool column = false;
  for (const kernel::Phase& p : k_.phases) {
    for (const ExprNode* l : LoadsOf(p.stmts)) {
      if (!l->args.empty()) continue;
      // A load that the last outer var does not move (layer norm's per-row mean and rstd in its
      // weight gradient, also when a split into partials has an outer var pick the rows) reads
      // one element for all of a block's consecutive points: it decides nothing.
      if (ConstStride(l->index, last_outer) == absl::optional<int64_t>(0)) continue;
      if (ConstStride(l->index, last_reduce) == absl::optional<int64_t>(1)) return false;
      if (ConstStride(l->index, last_outer) == absl::optional<int64_t>(1)) column = true;
    }
  }
  return column;
}

int CudaKernelEmitter::NarrowestColumnLoad() const {
  const Var last_outer{VarKind::kOuter, static_cast<int32_t>(k_.outer.size()) - 1};
  int bytes = 8;
  for (const kernel::Phase& p : k_.phases) {
    for (const ExprNode* l : LoadsOf(p.stmts)) {
      if (l->args.empty() && ConstStride(l->index, last_outer) == absl::optional<int64_t>(1)) {
        bytes = std::min(bytes, kernel::ScalarTypeBytes(l->type));
      }
    }
  }
  return bytes;
}

int CudaKernelEmitter::ColumnWords() const {
  int words = 0;
  for (const Accumulator& a : k_.accumulators) words += (StateBytes(a) + 3) / 4;
  std::set<std::string> loads;
  for (const kernel::Phase& p : k_.phases) {
    for (const ExprNode* l : LoadsOf(p.stmts)) loads.insert(AccessKey(l->buffer, l->index));
  }
  return words + static_cast<int>(loads.size());
}

VecPlan CudaKernelEmitter::PlanColumnVector() {
  const absl::optional<int64_t> extent = k_.outer.back().AsConst();
  if (!extent) return VecPlan();
  std::vector<Stmt> all;
  for (const kernel::Phase& p : k_.phases) all.insert(all.end(), p.stmts.begin(), p.stmts.end());
  const Var x{VarKind::kOuter, static_cast<int32_t>(k_.outer.size()) - 1};
  for (int width = kColumnVector; width > 1; width /= 2) {
    VecPlan plan = PlanVector(all, x, width);
    if (plan.width > 1 && !plan.loads.empty() && *extent % plan.width == 0) return plan;
  }
  return VecPlan();
}

int CudaKernelEmitter::ColumnLanes(absl::optional<int64_t> points, absl::optional<int64_t> total_c,
                                   int vec, int max_state) const {
  const int min_group = std::max(8, 32 / column_points_);  // whole warps
  int max_group = 1024 / column_points_;
  if (vec > 1) {
    // Registers: V accumulators and V lanes of each load per thread. A thread of a 1024-thread
    // block has 64; more accumulators and loads (a batch norm's backward partials with its
    // fused producers: 4 sums over 11 loads) take 512-thread blocks (128 each) instead of
    // spilling.
    if (vec * ColumnWords() + 16 > 65536 / 1024) max_group = std::min(max_group, 512 / column_points_);
    // The all-reduce's V states per thread within kColumnSmemBytes, and at least 16 rows per
    // thread where the reduction's length is known (a split batch norm's partials are a few
    // hundred rows: fewer, longer-running threads rather than a tree over many lanes that each
    // load a few rows).
    while (max_group > min_group && column_points_ * max_group * vec * max_state > kColumnSmemBytes) {
      max_group /= 2;
    }
    if (total_c) {
      // Unless that leaves the GPU mostly idle: a forward batch norm's first pass over 32 x 256
      // (n, c) points of 196 rows took 8.3 us for 3.3 MB in 64-thread blocks (4 warps per SM,
      // too few loads in flight); then at least 4 rows per thread.
      auto capped = [&](int64_t min_rows) {
        int group = max_group;
        while (group > min_group && *total_c < int64_t{group} * min_rows) group /= 2;
        return group;
      };
      const int at_16 = capped(16);
      const bool idle = points && BlocksOf(*points, column_points_, vec) * column_points_ * at_16 <
                                      int64_t{num_sms_} * kThreadsPerSm / 2;
      max_group = idle ? capped(4) : at_16;
    }
  }
  if (!points) return std::max(min_group, std::min(32, max_group));
  // Threads per point (min_group up) until the blocks fill every SM's threads.
  const int64_t blocks = BlocksOf(*points, column_points_, vec);
  int group = min_group;
  while (group < max_group && blocks * column_points_ * group < int64_t{num_sms_} * kThreadsPerSm) {
    group *= 2;
  }
  return group;
}

void CudaKernelEmitter::ChooseRowLayout(const Size& rows, absl::optional<int64_t> total_c) {
  launch_.work = rows;
  int max_state = 0;
  for (const Accumulator& a : k_.accumulators) max_state = std::max(max_state, StateBytes(a));
  if (IsColumnReduction()) {
    // Enough threads per point (8..32) that the blocks fill every SM: a column reduction has
    // few points, and each thread's loads are strided.
    launch_.layout = CudaLayout::kColumn;
    column_plan_ = PlanColumnVector();
    const int vec = column_vec_ = column_plan_.width;
    const int narrowest = NarrowestColumnLoad();
    // Vector columns: each row of a block's points is 128 bytes of the narrowest vector load
    // (a bf16 batch norm's partials: 16 threads of 4 channels); scalar ones: 32 points.
    column_points_ = vec == 1 ? kColumnPoints : std::max(1, std::min(kColumnPoints, 128 / (vec * narrowest)));
    const absl::optional<int64_t> points = rows.AsConst();
    auto blocks_of = [&](int threads) { return BlocksOf(*points, threads, vec); };
    if (points) {
      // Fewer points than a block per SM (a batch norm's 32 x 64 (n, c) partials): narrower
      // blocks, down to 32 bytes of the narrowest coalesced load per row (a whole sector), and
      // more threads per point. 2048 bf16 points: 64 blocks of 32 x 32 threads -> 128 of 16 x 64.
      while (column_points_ / 2 * vec * narrowest >= 32 && blocks_of(column_points_) < num_sms_) {
        column_points_ /= 2;
      }
    }
    bool one_per_point = false;
    if (total_c && points && *total_c <= kShortColumnRows) {
      // A few rows per point (grouped-query attention's backward sums the 3 query heads that
      // share a key head: 1M points of 3 rows): lanes along the rows would mostly idle (8 lanes
      // for 3 rows) and meet in shared memory. One thread per point sums its rows instead, every
      // thread of a block along the points, while that leaves two blocks per SM.
      int across = 256;
      while (across > 32 && blocks_of(across) < 2 * num_sms_) across /= 2;
      one_per_point = blocks_of(across) >= num_sms_;
      if (one_per_point) column_points_ = across;
    }
    group_ = one_per_point ? 1 : ColumnLanes(points, total_c, vec, max_state);
    launch_.block = column_points_ * group_;
    launch_.work_per_block = column_points_ * vec;
    launch_.max_grid = int64_t{num_sms_} * (kThreadsPerSm / launch_.block) * 4;
    smem_bytes_ = launch_.block * max_state * vec;
  } else if (total_c && *total_c <= kWarpRowLimit) {
    launch_.layout = CudaLayout::kWarpPerRow;
    launch_.block = kRowsBlock;
    group_ = 32;
    launch_.work_per_block = kRowsBlock / 32;
    launch_.max_grid = int64_t{num_sms_} * (kThreadsPerSm / kRowsBlock);
  } else {
    launch_.layout = CudaLayout::kBlockPerRow;
    // Static lengths: the smallest block (128..1024) that leaves at most kRowValues cached
    // values per thread (in vectors of 4): fewer threads per barrier, and registers enough for
    // several rows per SM. 8192 columns: 256 threads; 32768: 1024.
    int block = 512;
    if (total_c) {
      const int64_t per_thread =
          std::max<int64_t>(4, cuda_.row_values / std::max(1, RecurringLoads()));
      block = std::min(128, cuda_.max_row_block);
      while (block < cuda_.max_row_block && *total_c > int64_t{block} * per_thread) block *= 2;
    }
    launch_.block = block;
    group_ = block;
    launch_.work_per_block = 1;
    launch_.max_grid = int64_t{num_sms_} * (kThreadsPerSm / block);
    smem_bytes_ = 32 * max_state;
    if (total_c) {
      if (const absl::optional<SharedRowChoice> c = ChooseShared(*total_c, rows.AsConst())) {
        // The row cache in dynamic shared memory (EmitRow sets launch_.shared_bytes).
        launch_.layout = CudaLayout::kSharedRow;
        launch_.block = c->block;
        group_ = c->block;
        shared_blocks_per_sm_ = c->blocks_per_sm;
        shared_buffers_ = c->buffers;
      } else if (const absl::optional<ClusterRowChoice> c =
              ChooseCluster(*total_c, rows.AsConst(), block, &row_grid_)) {
        // A row over the blocks of a cluster: slots for the block all-reduce, then the two
        // published slots of 8 words (kiln_cuda_cluster.cuh).
        launch_.layout = CudaLayout::kClusterRow;
        launch_.block = c->block;
        launch_.cluster = c->cluster;
        launch_.work = rows * Size::Const(c->cluster);
        group_ = c->block * c->cluster;
        pub_offset_ = 32 * max_state;
        smem_bytes_ = pub_offset_ + 64;
      }
    }
  }
}

std::map<std::string, CudaKernelEmitter::RowLoad> CudaKernelEmitter::RowLoads(
    const std::set<const ExprNode*>& skip) const {
  std::map<std::string, RowLoad> loads;
  for (size_t p = 0; p < k_.phases.size(); ++p) {
    std::set<std::string> here;
    for (const ExprNode* l : LoadsOf(k_.phases[p].stmts, skip)) {
      if (!l->args.empty()) continue;
      bool uses_r = false;
      for (const IndexTerm& t : l->index.terms) uses_r |= t.var.kind == VarKind::kReduce;
      if (!uses_r) continue;
      const std::string key = AccessKey(l->buffer, l->index);
      if (!here.insert(key).second) continue;
      auto [it, added] = loads.try_emplace(key);
      if (added) it->second.first_phase = static_cast<int>(p);
      ++it->second.phases;
      it->second.node = l;
    }
  }
  return loads;
}

int CudaKernelEmitter::RecurringLoads(int64_t* element_bytes) const {
  int n = 0;
  for (const auto& [key, l] : RowLoads()) {
    if (l.phases < 2) continue;
    ++n;
    if (element_bytes != nullptr) *element_bytes += kernel::ScalarTypeBytes(l.node->buffer.dtype);
  }
  return n;
}

ClusterRowFacts CudaKernelEmitter::LongRowFacts(int64_t total, absl::optional<int64_t> rows,
                                                bool* shifted_rows, int* shifted_width) {
  ClusterRowFacts facts;
  facts.length = total;
  facts.rows = rows;
  int64_t element_bytes = 0;
  facts.recurring_loads = RecurringLoads(&element_bytes);
  facts.other_loads = static_cast<int>(RowLoads().size()) - facts.recurring_loads;
  facts.row_bytes = element_bytes * total;
  facts.element_bytes = element_bytes;
  if (k_.reduce.size() == 1) {
    std::vector<Stmt> all;
    for (const kernel::Phase& p : k_.phases) all.insert(all.end(), p.stmts.begin(), p.stmts.end());
    const int width = PlanVector(all, Var{VarKind::kReduce, 0}).width;
    if (width > 1 && total % width == 0) {
      facts.vector_width = width;
    } else if (const VecPlan shifted = PlanShiftedVector(all, Var{VarKind::kReduce, 0}); shifted.width > 1) {
      // Vectors from up to width - 1 elements before the row's start (PlanShiftedVector).
      facts.vector_width = shifted.width;
      facts.length = total + shifted.width - 1;
      *shifted_rows = true;
      *shifted_width = shifted.width;
      for (const Stmt& s : all) {
        facts.stray_stores |= s.kind == StmtKind::kStore && !shifted.stores.count(AccessKey(s.buffer, s.index)) &&
                              ConstStride(s.index, Var{VarKind::kReduce, 0}) == absl::optional<int64_t>(1);
      }
    }
  }
  return facts;
}

ClusterRowLimits CudaKernelEmitter::LongRowLimits(bool shifted_rows, int shifted_width) const {
  ClusterRowLimits limits;
  limits.num_sms = num_sms_;
  limits.max_cluster = cuda_.max_cluster;
  limits.max_small_cluster = cuda_.max_small_cluster;
  limits.max_row_block = cuda_.max_row_block;
  // Shifted rows hold their shift and scalar edge paths too: a vector and at least a quarter
  // fewer cached values (50257 softmax, ptxas at 64 registers: bf16 with 32 values and f32 with
  // 28 spilled; 24 and 20 do not).
  limits.row_values =
      shifted_rows ? std::max(shifted_width, std::min(cuda_.row_values - shifted_width,
                                                      cuda_.row_values * 3 / 4))
                   : cuda_.row_values;
  limits.max_cached_values = cuda_.max_cached_values;
  if (long_rows_ == CudaLongRows::kBlockPerRow) limits.l2_row_bytes = kL2RowBytes;  // forced: capped grid
  if (!ArchHasClusters(cuda_.arch)) limits.max_cluster = limits.max_small_cluster = 0;
  const SharedMemorySize smem = SharedMemoryOf(cuda_.arch);
  limits.shared_bytes_per_sm = smem.per_sm;
  limits.max_shared_bytes_per_block = smem.per_block;
  limits.static_shared_bytes = smem_bytes_;
  limits.shared_row_blocks_per_sm = cuda_.shared_row_blocks_per_sm;
  limits.shared_row_block = cuda_.shared_row_block;
  limits.shared_row_buffers = long_rows_ == CudaLongRows::kSharedPrefetch ? 2
                              : long_rows_ == CudaLongRows::kAuto        ? 0
                                                                         : 1;
  limits.bulk_copies = ArchHasBulkCopies(cuda_.arch);
  return limits;
}

absl::optional<SharedRowChoice> CudaKernelEmitter::ChooseShared(int64_t total,
                                                                absl::optional<int64_t> rows) {
  if (long_rows_ != CudaLongRows::kAuto && !SharedForced()) return absl::nullopt;
  bool shifted_rows = false;
  int shifted_width = 1;
  const ClusterRowFacts facts = LongRowFacts(total, rows, &shifted_rows, &shifted_width);
  const ClusterRowLimits limits = LongRowLimits(shifted_rows, shifted_width);
  return ChooseSharedRows(facts, limits, SharedForced());
}

absl::optional<ClusterRowChoice> CudaKernelEmitter::ChooseCluster(int64_t total,
                                                                 absl::optional<int64_t> rows,
                                                                 int block, int64_t* row_grid) {
  *row_grid = 0;
  if (!ArchHasClusters(cuda_.arch)) return absl::nullopt;
  bool shifted_rows = false;
  int shifted_width = 1;
  const ClusterRowFacts facts = LongRowFacts(total, rows, &shifted_rows, &shifted_width);
  const ClusterRowLimits limits = LongRowLimits(shifted_rows, shifted_width);
  absl::optional<ClusterRowChoice> choice;
  if (long_rows_ != CudaLongRows::kBlockPerRow) choice = ChooseClusterRows(facts, limits);
  if (!choice && long_rows_ != CudaLongRows::kCluster && !SharedForced()) {
    *row_grid = UncachedRowGrid(facts, limits, block);
  }
  return choice;
}

}  // namespace kiln::codegen::internal
