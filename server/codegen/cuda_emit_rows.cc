// CudaKernelEmitter (cuda_kernel_emitter.h): row kernels, a group of threads per row (outer
// point): the loop over the rows of each layout, and each row's accumulators, register row
// caches, two-pass statistics and phases.

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/optional.h"
#include "server/codegen/cuda_emitter.h"
#include "server/codegen/cuda_kernel_emitter.h"
#include "server/codegen/exp_reuse.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::codegen::internal {

namespace {

constexpr int kRowWaves = 4;    // row kernels: grid cap in waves of blocks that fit by threads

const char* AccStruct(AccKind k) {
  switch (k) {
    case AccKind::kArgMax: return "ArgMax";
    case AccKind::kArgMin: return "ArgMin";
    case AccKind::kWelford: return "Welford";
    case AccKind::kOnlineSoftmax: return "OnlineSoftmax";
    default: return nullptr;
  }
}

}  // namespace

void CudaKernelEmitter::EmitRows() {
  const int k = static_cast<int>(k_.outer.size());
  const int m = static_cast<int>(k_.reduce.size());
  const Size rows = Product(k_.outer);
  const Size total = Product(k_.reduce);
  const absl::optional<int64_t> total_c = total.AsConst();
  ChooseRowLayout(rows, total_c);
  const std::string rows_code = SizeCode(rows);
  switch (launch_.layout) {
    case CudaLayout::kWarpPerRow:
      w_.Line("const int kiln_lane = threadIdx.x & 31;");
      w_.Open(absl::StrCat("for (idx_t kiln_u = static_cast<idx_t>(blockIdx.x) * ",
                           kRowsBlock / 32, " + (threadIdx.x >> 5); kiln_u < ", rows_code,
                           "; kiln_u += static_cast<idx_t>(gridDim.x) * ", kRowsBlock / 32, ")"));
      break;
    case CudaLayout::kBlockPerRow:
    case CudaLayout::kSharedRow:
      w_.Line("const int kiln_lane = threadIdx.x;");
      if (launch_.layout == CudaLayout::kSharedRow) {
        w_.Line("unsigned char* const kiln_dsmem = kiln_cuda::dynamic_smem();");
        prefetch_rows_ = shared_buffers_ == 2;
        if (prefetch_rows_) {
          w_.Line("int kiln_buf = 0;  // this row's cache (of two)");
          w_.Line("bool kiln_ready = false;  // its fill was started by the row before");
        }
      }
      w_.Open(absl::StrCat("for (idx_t kiln_u = blockIdx.x; kiln_u < ", rows_code,
                           "; kiln_u += gridDim.x)"));
      break;
    case CudaLayout::kClusterRow:
      // Every block of a cluster runs the same rows (the barriers inside the all-reduces).
      w_.Linef("const int kiln_lane = static_cast<int>(blockIdx.x % ", launch_.cluster, "u) * ",
               launch_.block, " + static_cast<int>(threadIdx.x);");
      w_.Linef("uint32_t* const kiln_pub = reinterpret_cast<uint32_t*>(kiln_smem + ", pub_offset_,
               ");");
      w_.Line("unsigned kiln_parity = 0;");
      w_.Open(absl::StrCat("for (idx_t kiln_u = blockIdx.x / ", launch_.cluster, "u; kiln_u < ",
                           rows_code, "; kiln_u += gridDim.x / ", launch_.cluster, "u)"));
      break;
    default: {
      // Vector columns: thread t serves points kiln_u .. kiln_u + V - 1 (one vector of each load
      // along the last outer variable, whose extent V divides: no vector straddles two rows).
      const int points = column_points_ * column_vec_;
      w_.Linef("const int kiln_lane = threadIdx.x / ", column_points_, ";");
      w_.Open(absl::StrCat("for (idx_t kiln_p = static_cast<idx_t>(blockIdx.x) * ", points,
                           "; kiln_p < ", rows_code, "; kiln_p += static_cast<idx_t>(gridDim.x) * ",
                           points, ")"));
      w_.Linef("const idx_t kiln_u = kiln_p + threadIdx.x % ", column_points_,
               column_vec_ > 1 ? absl::StrCat(" * ", column_vec_) : "", ";");
      w_.Linef("const bool kiln_active = kiln_u < ", rows_code, ";");
      break;
    }
  }
  if (k > 0) EmitDecompose("kiln_u", k);
  // A vector path along r0 when the reduction space is one-dimensional; vector columns along
  // the last outer variable.
  VecPlan plan;
  if (launch_.layout == CudaLayout::kColumn) {
    plan = column_plan_;
    if (plan.width > 1) w_.Linef("const idx_t kiln_ob = o", k - 1, ";");
  } else if (m == 1) {
    std::vector<Stmt> all;
    for (const kernel::Phase& p : k_.phases) all.insert(all.end(), p.stmts.begin(), p.stmts.end());
    plan = PlanVector(all, Var{VarKind::kReduce, 0});
    if (total_c && (plan.width <= 1 || *total_c % plan.width != 0)) {
      // Rows of an odd length or stride: vectors shifted to each row's alignment.
      plan = PlanShiftedVector(all, Var{VarKind::kReduce, 0});
    } else if (plan.width > 1 && !total_c) {
      plan.checks.push_back(absl::StrCat(SizeCode(total), " % ", plan.width, " == 0"));
    }
  }
  launch_.vector_width = plan.width;
  if (plan.width > 1 && launch_.layout == CudaLayout::kColumn) {
    // Vector columns: one body, in which only each phase's loop over the rows branches on the
    // alignment check (EmitRow). Two copies of the whole body, vector and scalar, doubled the
    // code of kernels that run for a few microseconds, where the time follows the code's size
    // (on the H200, a 32 x 256 batch-norm merge: 7.3 us at 103 KB of code, 4.2 us at 16 KB). A
    // check per load instead left the loop's loads waiting on each other (large column kernels
    // 1.5-3x slower).
    hoisted_.Linef("const bool kiln_vec = ", VecFlag(plan), ";");
    EmitRow(plan);
  } else if (plan.width > 1) {
    // kiln_vec is uniform over the kernel: every thread of a row takes the same path.
    hoisted_.Linef("const bool kiln_vec = ", VecFlag(plan), ";");
    w_.Open("if (kiln_vec)");
    EmitRow(plan);
    w_.Close();
    w_.Open("else");
    // Shifted rows whose buffers lie differently from each other (rare): scalar and read
    // twice, not cached (a cached scalar row next to the vector one spills at 64 registers).
    EmitRow(VecPlan(), /*cache=*/plan.shift.empty());
    w_.Close();
  } else {
    EmitRow(plan);
  }
  if (prefetch_rows_) w_.Line("kiln_buf ^= 1;");
  w_.Close();
  prefetch_rows_ = false;
  if (launch_.layout == CudaLayout::kClusterRow) {
    w_.Line("kiln_cuda::cluster_sync();  // no block leaves while others may read its slots");
  }
  if (launch_.layout != CudaLayout::kColumn) {
    // Several waves of blocks (as many as there are rows, up to kRowWaves times what fits by
    // threads): how many blocks are resident depends on registers that only ptxas knows, and
    // a persistent grid sized by a wrong guess leaves a partial last wave as long as the rest.
    launch_.max_grid = int64_t{num_sms_} * (kThreadsPerSm / launch_.block) * kRowWaves /
                       launch_.cluster * launch_.cluster;
    // Uncached rows too long for a block: no more rows in flight than the L2 holds (pass 2).
    if (row_grid_ > 0) launch_.max_grid = std::min(launch_.max_grid, row_grid_);
    // Shared rows: one wave of the blocks that fit by shared memory, grid-stride over the rows.
    if (launch_.layout == CudaLayout::kSharedRow) {
      launch_.max_grid = int64_t{num_sms_} * shared_blocks_per_sm_;
    }
  }
}

void CudaKernelEmitter::EmitRow(const VecPlan& plan, bool cache) {
  const int width = plan.width;
  width_ = width;
  const Size total = Product(k_.reduce);
  const absl::optional<int64_t> total_c = total.AsConst();
  const bool column = launch_.layout == CudaLayout::kColumn;
  shifted_ = !plan.shift.empty();
  const bool shared = launch_.layout == CudaLayout::kSharedRow;
  smem_arrays_.clear();
  smem_vec_ = false;
  PushScope();
  if (shifted_) w_.Linef("const idx_t kiln_sh = ", plan.shift, ";");
  const bool lanes = column && width > 1;  // vector columns: an accumulator per point (lane)
  // Vector columns: kiln_acc<id>[V], each lane's named acc<id> in its scope (DeclareColumnLane).
  for (const Accumulator& a : k_.accumulators) {
    const std::string t = ValueType(a.dtype);
    const std::string name = lanes ? absl::StrCat("kiln_acc", a.id, "[", width, "]") : absl::StrCat("acc", a.id);
    if (const char* st = AccStruct(a.kind)) {
      w_.Linef("kiln_cuda::", st, "<", t, "> ", name, ";");
      continue;
    }
    const std::string init = a.kind == AccKind::kSum    ? "0"
                             : a.kind == AccKind::kProd ? "1"
                             : absl::StrCat("kiln_cuda::", a.kind == AccKind::kMax ? "lowest" : "highest", "<", t, ">()");
    if (lanes) {
      w_.Linef(t, " ", name, " = {", absl::StrJoin(std::vector<std::string>(width, init), ", "), "};");
    } else {
      w_.Linef(t, " ", name, " = ", init, ";");
    }
  }
  // Registers caching loads that recur in later phases (static lengths only).
  cache_.clear();
  int64_t chunks = 0;
  if (total_c && !column) {
    // Shifted rows: chunks over [-kiln_sh, total), up to width - 1 elements more.
    chunks = (*total_c + (shifted_ ? width - 1 : 0) + int64_t{group_} * width - 1) /
             (int64_t{group_} * width);
    std::map<std::string, RowLoad> loads = RowLoads();
    int64_t values = 0;
    for (const auto& [key, l] : loads) values += l.phases > 1 && !shared ? chunks * width : 0;
    // At most half of the registers a thread of this block size may have.
    const int64_t limit = std::min<int64_t>(cuda_.max_cached_values, 65536 / launch_.block / 2);
    if (!shared && cache) {
      // Softmaxes of an expression keep exp(v - max) in registers of their own for the later
      // phases (PlanExpReuse): loads that those phases read only inside such exps need no cache.
      // Planned so when the trimmed caches and the softmaxes' registers fit together.
      std::set<const ExprNode*> reused;
      const int64_t own = SoftmaxExpsKeptInRegisters(&reused) * chunks * width;
      if (!reused.empty()) {
        std::map<std::string, RowLoad> trimmed = RowLoads(reused);
        int64_t trimmed_values = 0;
        for (const auto& [key, l] : trimmed) trimmed_values += l.phases > 1 ? chunks * width : 0;
        if (trimmed_values + own <= limit && trimmed_values < values) {
          loads = std::move(trimmed);
          values = trimmed_values;
        }
      }
    }
    if (values > limit || !cache) values = 0;
    if (shared && cache) {
      // kSharedRow: each recurring load's slots in dynamic shared memory, one after another
      // (each a multiple of 32 bytes: the block is a multiple of 32 threads). Vector rows: slots
      // of a chunk's Vec<T, width>, chunk-major ([kiln_e * block + thread]), filled by
      // asynchronous copies before the load's first phase (EmitSharedFill).
      smem_vec_ = width > 1;
      smem_decls_.clear();
      int64_t offset = 0;
      for (const auto& [key, l] : loads) {
        if (l.phases < 2) continue;
        const ScalarType type = l.node->type;
        CacheEntry e{absl::StrCat("kiln_c", cache_.size()), l.first_phase, l.node};
        const std::string t = smem_vec_ ? absl::StrCat("kiln_cuda::Vec<", SmemType(type), ", ", width, ">")
                                        : SmemType(type);
        smem_decls_.push_back({e.name, t, offset});
        smem_arrays_[e.name] = type;
        cache_[key] = e;
        offset += SmemBytes(type) * chunks * width * group_;
      }
      // kSharedPrefetch: two caches, this row's at kiln_buf.
      smem_cache_bytes_ = offset;
      EmitSmemDecls(prefetch_rows_ ? absl::StrCat(" + kiln_buf * ", offset) : "");
      launch_.shared_bytes =
          std::max<int>(launch_.shared_bytes, static_cast<int>(offset * (prefetch_rows_ ? 2 : 1)));
    } else if (values > 0) {
      for (const auto& [key, l] : loads) {
        if (l.phases < 2) continue;
        CacheEntry e{absl::StrCat("kiln_c", cache_.size()), l.first_phase};
        w_.Linef(ValueType(l.node->type), " ", e.name, "[", chunks * width, "];");
        cache_[key] = e;
      }
    }
    // Online softmax and Welford over register-resident values: two cheap passes instead of
    // the per-element online rule (a max or sum, then exp(x - max) or (x - mean)^2). Not for
    // an accumulator folded by more than one statement.
    std::map<int, int> folds = FoldCounts(k_);
    for (size_t pi = 0; pi < k_.phases.size(); ++pi) {
      for (const Stmt& s : k_.phases[pi].stmts) {
        if (s.kind != StmtKind::kAccumulate || folds[s.acc.id] != 1) continue;
        if (s.acc.kind != AccKind::kOnlineSoftmax && s.acc.kind != AccKind::kWelford) continue;
        if (!kernel::IsFloatType(s.acc.dtype)) continue;
        if (!cache) continue;
        TwoPass tp;
        tp.phase = static_cast<int>(pi);
        tp.value = s.value.get();
        if (const ExprNode* load = HeldLoad(s.value.get())) {
          auto cached = cache_.find(AccessKey(load->buffer, load->index));
          if (cached != cache_.end() && s.value->type == s.acc.dtype) {
            tp.array = cached->second.name;
            tp.reuses_cache = true;
            tp.key = cached->first;
          }
        }
        if (!tp.reuses_cache) {
          if (values + chunks * width > limit) continue;
          values += chunks * width;
          tp.array = absl::StrCat("kiln_a", s.acc.id);
          w_.Linef(ValueType(s.acc.dtype), " ", tp.array, "[", chunks * width, "];");
        }
        two_pass_[s.acc.id] = tp;
      }
    }
    PlanExpReuse();
    PlanApproxExp();
    launch_.cached_values = std::max<int>(launch_.cached_values, static_cast<int>(values));
  }
  if (column) EmitBodyPrefetch(lanes ? width : 1);
  std::string total_code = SizeCode(total);
  for (size_t p = 0; p < k_.phases.size(); ++p) {
    phase_ = static_cast<int>(p);
    const std::vector<Stmt>& stmts = k_.phases[p].stmts;
    w_.Linef("// phase ", p);
    if (smem_vec_) {
      EmitSharedFill(plan, chunks, *total_c);
      // Stores that lie differently from the cached loads: over their own chunks.
      const VecPlan stores = PlanRealignedStores(stmts, plan);
      if (stores.width > 1) {
        EmitRealignedStores(stmts, stores, chunks, *total_c);
        continue;
      }
    }
    if (lanes) {
      // Vector columns: the loop twice, vector loads under kiln_vec, else the same lanes' scalar
      // loads (a plan of the same width with no vector accesses); accumulators, all-reduces and
      // the body once.
      VecPlan scalar;
      scalar.width = plan.width;
      w_.Open("if (kiln_vec)");
      EmitColumnLoop(stmts, plan, total_code, total_c);
      w_.Close();
      w_.Open("else");
      EmitColumnLoop(stmts, scalar, total_code, total_c);
      w_.Close();
      EmitAllReduces(stmts, 0, 0);
      continue;
    }
    int opened = 0;
    if (column) {
      EmitColumnLoop(stmts, plan, total_code, total_c);
    } else if (total_c) {
      // Uncached shifted rows: 4 chunks at a time (each has a vector and a scalar path; fully
      // unrolled, the 13 chunks of a 50257 f32 row spill at 64 registers; 4 take 32, no spill).
      // Shared rows: only registers need constant indices (two-pass arrays of their own).
      bool registers = !cache_.empty();
      if (shared) {
        registers = false;
        for (const auto& [id, tp] : two_pass_) registers |= !tp.reuses_cache;
      }
      const bool unroll_all = registers || (chunks <= 16 && !(shifted_ && chunks > 4));
      w_.Raw(unroll_all ? "#pragma unroll" : "#pragma unroll 4");
      w_.Open(absl::StrCat("for (int kiln_e = 0; kiln_e < ", chunks, "; ++kiln_e)"));
      if (width == 1) {
        w_.Linef("const idx_t kiln_rb = static_cast<idx_t>(kiln_e) * ", group_, " + kiln_lane;");
      } else {
        w_.Linef("const idx_t kiln_rb = (static_cast<idx_t>(kiln_e) * ", group_,
                 " + kiln_lane) * ", width, shifted_ ? " - kiln_sh" : "", ";");
      }
      opened = 1;
      if (shifted_) {
        EmitShiftedChunk(stmts, plan, *total_c);
      } else if (*total_c % (int64_t{group_} * width) != 0) {
        w_.Open(absl::StrCat("if (kiln_rb < ", total_code, ")"));
        opened = 2;
      }
    } else {
      w_.Raw("#pragma unroll 4");
      w_.Open(absl::StrCat("for (idx_t kiln_rb = static_cast<idx_t>(kiln_lane)",
                           width == 1 ? "" : absl::StrCat(" * ", width), "; kiln_rb < ",
                           total_code, "; kiln_rb += ", int64_t{group_} * width, ")"));
      opened = 1;
    }
    if (shifted_ || column) {
      // EmitShiftedChunk did the chunk; EmitColumnLoop the loop.
    } else if (width > 1) {
      EmitVectorLanes(stmts, plan, Var{VarKind::kReduce, 0}, "kiln_rb",
                      [&](const std::string& value, int) {
                        w_.Linef("const idx_t kiln_r = ", value, ";");
                        w_.Line("const idx_t r0 = kiln_r;");
                      });
    } else {
      w_.Line("const idx_t kiln_r = kiln_rb;");
      EmitReduceDecompose();
      filled_.clear();
      PushScope();
      SeedScope();
      for (const Stmt& s : stmts) EmitCudaStmt(s);
      PopScope();
    }
    for (int i = 0; i < opened; ++i) w_.Close();
    if (total_c && !column) {
      EmitAllReduces(stmts, chunks, *total_c);
    } else {
      EmitAllReduces(stmts, 0, 0);
    }
  }
  phase_ = -1;
  cache_.clear();
  two_pass_.clear();
  approx_exp_.clear();
  approx_exp_nodes_.clear();
  smem_vec_ = false;
  if (!k_.body.empty()) {
    w_.Open(column ? "if (kiln_active && kiln_lane == 0)" : "if (kiln_lane == 0)");
    if (lanes) {
      EmitColumnBody(width);
    } else {
      body_lane_ = 0;
      PushScope();
      for (const Stmt& s : k_.body) EmitCudaStmt(s);
      PopScope();
      body_lane_ = -1;
    }
    w_.Close();
  }
  prefetched_.clear();
  PopScope();
}

void CudaKernelEmitter::EmitColumnBody(int width) {
  // The stores along the points (the last outer variable) in vectors of the column's width: each
  // lane computes into its slot, then one vector store where the pointers line up (checked once,
  // kiln_vec_out), else a store per lane from the same registers. One body either way. (A short
  // column's 1M points of grouped-query attention's backward stored two f32 and a bf16 output
  // element by element: 4 store instructions where one would do.)
  const Var x{VarKind::kOuter, static_cast<int32_t>(k_.outer.size()) - 1};
  VecPlan stores = PlanVector(k_.body, x, width, /*masked_loads=*/false, /*with_loads=*/false);
  if (stores.width != width) stores = VecPlan();
  std::set<int> stored;
  for (const auto& [key, a] : stores.stores) stored.insert(a.buffer.index);
  for (const ExprNode* l : LoadsOf(k_.body)) {  // a lane would read an earlier lane's store
    if (stored.count(l->buffer.index)) stores = VecPlan();
  }
  if (!stores.stores.empty()) {
    hoisted_.Linef("const bool kiln_vec_out = ", VecFlag(stores), ";");
    for (const auto& [key, a] : stores.stores) {
      w_.Linef("kiln_cuda::Vec<", StorageType(a.buffer.dtype), ", ", width, "> ", a.name, ";");
    }
  }
  plan_ = stores.stores.empty() ? nullptr : &stores;
  for (int j = 0; j < width; ++j) {
    w_.Open("");
    DeclareColumnLane(absl::StrCat("kiln_ob + ", j), j);
    body_lane_ = j;
    lane_ = plan_ != nullptr ? j : -1;
    PushScope();
    for (const Stmt& s : k_.body) EmitCudaStmt(s);
    PopScope();
    lane_ = -1;
    body_lane_ = -1;
    w_.Close();
  }
  plan_ = nullptr;
  if (stores.stores.empty()) return;
  w_.Open("if (kiln_vec_out)");
  w_.Linef("const idx_t ", kernel::VarName(x), " = kiln_ob;");
  for (const auto& [key, a] : stores.stores) {
    w_.Linef("kiln_cuda::store_vec<", width, ">(b", a.buffer.index, " + (", IndexCode(a.index), "), ", a.name,
             ");");
  }
  w_.Close();
  w_.Open("else");
  for (int j = 0; j < width; ++j) {
    w_.Open("");
    w_.Linef("const idx_t ", kernel::VarName(x), " = kiln_ob + ", j, ";");
    for (const auto& [key, a] : stores.stores) {
      w_.Linef("b", a.buffer.index, "[", IndexCode(a.index), "] = ", a.name, ".v[", j, "];");
    }
    w_.Close();
  }
  w_.Close();
}

void CudaKernelEmitter::EmitColumnLoop(const std::vector<Stmt>& stmts, const VecPlan& plan,
                                       const std::string& total_code, absl::optional<int64_t> total_c) {
  w_.Open("if (kiln_active)");
  // Up to 8 rows in flight per thread (4 in blocks of 1024 threads, which ptxas gives 32
  // registers a thread for two blocks an SM: 8 vector rows spilled there, and a GPT bias
  // gradient's column sum of 4096 x 3072 f32 took 14.0 us warm against 12.7 with 4; H200,
  // session 29; in session 30 the training steps' generated kernels took the same time or less:
  // ResNet-50 3,455 us either way, ResNet-18 1,072 -> 1,065, GPT 309 -> 307), but no more copies
  // than a thread has rows: unrolled code that never runs still has to be fetched (see EmitRows).
  const int64_t most = launch_.block >= 1024 ? 4 : 8;
  int64_t unroll = most;
  if (total_c) unroll = std::clamp<int64_t>((*total_c + group_ - 1) / group_, 1, most);
  w_.Raw(absl::StrCat("#pragma unroll ", unroll));
  w_.Open(absl::StrCat("for (idx_t kiln_r = kiln_lane; kiln_r < ", total_code, "; kiln_r += ", group_,
                       ")"));
  EmitReduceDecompose();
  if (plan.width > 1) {
    EmitVectorLanes(stmts, plan, Var{VarKind::kOuter, static_cast<int32_t>(k_.outer.size()) - 1},
                    "kiln_ob", [&](const std::string& value, int j) { DeclareColumnLane(value, j); });
  } else {
    filled_.clear();
    PushScope();
    SeedScope();
    for (const Stmt& s : stmts) EmitCudaStmt(s);
    PopScope();
  }
  w_.Close();
  w_.Close();
}

void CudaKernelEmitter::EmitBodyPrefetch(int lanes) {
  prefetched_.clear();
  std::vector<std::pair<const ExprNode*, std::string>> loads;  // (load, its array)
  for (const ExprNode* l : LoadsOf(k_.body)) {
    if (!l->args.empty()) continue;  // masked: where it reads depends on the mask
    if (l->buffer.access != kernel::Access::kRead) continue;  // the kernel writes it too
    const std::string key = AccessKey(l->buffer, l->index);
    if (prefetched_.count(key) > 0 || prefetched_.size() >= kMaxBodyPrefetch) continue;
    const std::string& name = prefetched_[key] = absl::StrCat("kiln_pf", prefetched_.size());
    loads.emplace_back(l, name);
  }
  if (loads.empty()) return;
  for (const auto& [l, name] : loads) w_.Linef(StorageType(l->buffer.dtype), " ", name, "[", lanes, "];");
  w_.Open("if (kiln_active && kiln_lane == 0)");
  for (int j = 0; j < lanes; ++j) {
    w_.Open("");
    if (lanes > 1) w_.Linef("const idx_t o", k_.outer.size() - 1, " = kiln_ob + ", j, ";");
    for (const auto& [l, name] : loads) {
      w_.Linef(name, "[", j, "] = b", l->buffer.index, "[", IndexCode(l->index), "];");
    }
    w_.Close();
  }
  w_.Close();
}

void CudaKernelEmitter::DeclareColumnLane(const std::string& value, int lane) {
  w_.Linef("const idx_t o", k_.outer.size() - 1, " = ", value, ";");
  for (const Accumulator& a : k_.accumulators) {
    const char* st = AccStruct(a.kind);
    const std::string t = st != nullptr ? absl::StrCat("kiln_cuda::", st, "<", ValueType(a.dtype), ">")
                                        : ValueType(a.dtype);
    w_.Linef(t, "& acc", a.id, " = kiln_acc", a.id, "[", lane, "];");
  }
}

void CudaKernelEmitter::EmitReduceDecompose() {
  const int m = static_cast<int>(k_.reduce.size());
  if (m == 1) {
    w_.Line("const idx_t r0 = kiln_r;");
    return;
  }
  w_.Line("idx_t kiln_rr = kiln_r;");
  for (int i = m - 1; i >= 1; --i) {
    const std::string e = SizeCode(k_.reduce[i]);
    w_.Linef("const idx_t kiln_q", i, " = kiln_rr / ", e, ";");
    w_.Linef("const idx_t r", i, " = kiln_rr - kiln_q", i, " * ", e, ";");
    w_.Linef("kiln_rr = kiln_q", i, ";");
  }
  w_.Line("const idx_t r0 = kiln_rr;");
}

}  // namespace kiln::codegen::internal
