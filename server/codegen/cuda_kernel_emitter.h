#ifndef KILN_SERVER_CODEGEN_CUDA_KERNEL_EMITTER_H_
#define KILN_SERVER_CODEGEN_CUDA_KERNEL_EMITTER_H_

// Internal to the CUDA emitter, not part of its API (that is cuda_emitter.h): the class that emits
// one kernel as a CUDA function, shared by the files that implement it, one per layout or concern:
//   cuda_kernel_emitter.cc     construction, the function head and its 32-bit instance, the
//                              expression and statement spellings, the helpers below;
//   cuda_emit_vectors.cc       vector plans along one variable (aligned and shifted) and lanes;
//   cuda_emit_pointwise.cc     kPointwise (grid-stride, vectorized) and kTiled (shared tiles);
//   cuda_emit_row_layout.cc    the choice among the row layouts, with cuda_long_rows.h's facts;
//   cuda_emit_rows.cc          the row layouts' loops, accumulators and register row caches;
//   cuda_emit_shared_rows.cc   kSharedRow's row cache in shared memory (cp.async fill) and the
//                              slots of a row cache;
//   cuda_emit_realigned_stores.cc  kSharedRow's store phases over the stores' own alignment;
//   cuda_emit_all_reduce.cc    the all-reduce of each layout and the two-pass statistics' pass B.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/types/optional.h"
#include "server/codegen/cpu_emitter.h"
#include "server/codegen/cuda_emitter.h"
#include "server/codegen/cuda_long_rows.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::codegen::internal {

// Internal namespace: short names for the kernel IR in every file of the emitter.
using kernel::AccKind;
using kernel::Accumulator;
using kernel::Buffer;
using kernel::Expr;
using kernel::ExprKind;
using kernel::ExprNode;
using kernel::Index;
using kernel::IndexTerm;
using kernel::Kernel;
using kernel::ScalarType;
using kernel::Size;
using kernel::Stmt;
using kernel::StmtKind;
using kernel::Var;
using kernel::VarKind;

constexpr int kColumnPoints = 32;    // kColumn: consecutive outer points per block, at most
constexpr int kColumnVector = 4;     // kColumn: outer points per thread, at most (vector columns)
constexpr int kMaxBodyPrefetch = 4;  // kColumn: body loads read before the rows, at most
constexpr int kColumnSmemBytes = 32768;  // kColumn: static shared memory of the all-reduce, at most
constexpr int kRowsBlock = 256;      // kWarpPerRow block size
constexpr int kThreadsPerSm = 2048;

Size Product(const std::vector<Size>& sizes);

// The constant stride of `var` in `index` (0 when absent), or nullopt when it is not constant.
absl::optional<int64_t> ConstStride(const Index& index, const Var& var);

// Whether a value of `stmts` reads `var` itself (a kLoopVar node), not only through indices.
bool ReadsVarValue(const std::vector<Stmt>& stmts, const Var& var);

// Whether `e` is the same for every value of `x`: it reads no memory and no accumulator, and no
// loop variable but through other variables' values.
bool UniformAlong(const Expr& e, const Var& x);

// Whether `e` reads memory or an accumulator (a kLoad or kAccRead node anywhere in it).
bool ReadsMemory(const Expr& e);

// The load nodes of the values of `stmts` outside the subtrees of `skip`, each node once, in
// post-order (masks first).
std::vector<const ExprNode*> LoadsOf(const std::vector<Stmt>& stmts, const std::set<const ExprNode*>& skip = {});

// Whether `index` is contiguous along `x` with a constant offset and constant strides (what
// shifted vector rows and Residues need).
bool ConstantAlong(const Index& index, const Var& x);

// The offset and the constant strides of every variable but `x` of `index` (all constant)
// modulo `width`, the zero strides left out: accesses with equal residues lie equally far past a
// width boundary in every row, given pointers that do.
std::map<std::string, int64_t> Residues(const Index& index, const Var& x, int width);

struct VecAccess {
  Buffer buffer;
  Index index;
  std::string name;
  // A load only masked loads of the access read (PlanVector's masked_loads): their masks, none of
  // which depends on the vector's variable, so that the whole vector is read when one holds (and
  // is zero otherwise). Empty: read unconditionally.
  std::vector<Expr> masks;
};

// The vector accesses of a statement list along `x`: width (1: none) and the accesses that may
// move as one vector, each with its run-time conditions.
struct VecPlan {
  int width = 1;
  std::map<std::string, VecAccess> loads;   // by AccessKey
  std::map<std::string, VecAccess> stores;  // by AccessKey
  std::vector<std::string> checks;          // run-time conditions, ANDed into kiln_vec
  // Rows whose static length is not a multiple of the width (PlanShiftedVector): every access in
  // the plan is as far past a vector boundary as the anchor, `shift` elements at x = 0 (code over
  // the outer variables); a row's vectors start `shift` elements early, its first and last
  // chunks are scalar.
  std::string shift;
};

class CudaKernelEmitter : public CpuKernelEmitter {
 public:
  CudaKernelEmitter(const Kernel& kernel, int index, const CudaEmitOptions& options);

  const CudaLaunch& launch() const { return launch_; }

 protected:
  static CpuEmitOptions CpuOptions();

  bool Allows32BitIndices() const override { return true; }  // cheaper on GPUs

  // Helper spellings: the shared expression code names kiln_cpu:: and std:: functions; the CUDA
  // helpers (kernels/cuda) provide the same names in kiln_cuda::.
  static std::string Retarget(const std::string& code);
  std::string ConstCode(const ExprNode& e) const override;
  std::string UnaryCode(kernel::UnaryOp op, ScalarType t, const std::string& x) const override;
  // approx_exp_nodes_ as kiln_cuda::exp_approx (see PlanApproxExp).
  std::string UnaryNodeCode(const ExprNode& e, const std::string& x) const override;
  std::string BinaryCode(kernel::BinaryOp op, ScalarType t, const std::string& a,
                         const std::string& b) const override;
  bool BoolStoredAsBytes() const override { return false; }  // NVRTC kernels keep `bool`
  std::string CastCode(ScalarType from, ScalarType to, const std::string& x) const override;

  std::string Widen(const Buffer& b, const std::string& raw) const;
  // Lane `lane` of vector `vec` (a Vec of `width` elements of b's type) widened: bf16 lanes of
  // even-width vectors by kiln_cuda::bf16_lane (one instruction), else Widen(vec.v[lane]).
  std::string WidenLane(const Buffer& b, const std::string& vec, int lane, int width) const;
  std::string Narrow(const Buffer& b, const std::string& v) const;

  std::string LoadCode(const Buffer& b, const std::string& index) const override;
  std::string LoadExprCode(const ExprNode& e) override;

  void EmitFunction() override;
  std::string KernelAttributes() const;
  std::string SmemDeclaration() const;

  // What cuda_long_rows.h needs to know about this row kernel of static length `total`.
  ClusterRowFacts LongRowFacts(int64_t total, absl::optional<int64_t> rows, bool* shifted_rows,
                               int* shifted_width);
  ClusterRowLimits LongRowLimits(bool shifted_rows, int shifted_width) const;
  // kSharedRow's shape for a row kernel of static length `total` (cuda_long_rows.h), or nullopt.
  absl::optional<SharedRowChoice> ChooseShared(int64_t total, absl::optional<int64_t> rows);
  // kClusterRow's shape for a row kernel of static length `total` (cuda_long_rows.h), or nullopt;
  // for nullopt, *row_grid = the grid cap of an uncached block per row (UncachedRowGrid; 0: none).
  absl::optional<ClusterRowChoice> ChooseCluster(int64_t total, absl::optional<int64_t> rows,
                                                 int block, int64_t* row_grid);

  // A run-time condition on the scalars under which 32-bit indices are safe: the work and every
  // buffer's size, plus kIndexSlack, fit in int32 (evaluated in double: exact below 2^53, and no
  // overflow). "" when some size is not a polynomial in the scalars the emitter can evaluate.
  std::string Int32Check() const;

 private:
  struct RowLoad {
    int first_phase = 0;
    int phases = 0;                  // phases that read it; > 1: it recurs (the row cache's arrays)
    const ExprNode* node = nullptr;  // the last of its nodes
  };
  struct CacheEntry {
    std::string name;
    int first_phase = 0;
    const ExprNode* load = nullptr;  // the cached load
  };
  // An online-softmax or Welford accumulator whose phase keeps its values in registers: pass A
  // stores each value (or finds it in a row cache) and folds the max / the sum, an all-reduce,
  // pass B folds sum(exp(x - max)) / sum((x - mean)^2) over the registers, an all-reduce.
  struct TwoPass {
    std::string array;          // kiln_a<id>, or the row cache holding the same load
    bool reuses_cache = false;
    int phase = 0;              // the phase folding it
    std::string key;            // reuses_cache: the load's AccessKey
    const ExprNode* value = nullptr;  // the accumulated value
    // Online softmax whose later phases read exp(value - max): pass B overwrites the slots with
    // those exps, which these nodes then read. Over a row cache, only when the later phases read
    // the load nowhere else; in kiln_a<id> (the value's own registers), always.
    std::vector<const ExprNode*> exp_nodes;
  };

  // ---- vector plans (cuda_emit_vectors.cc) ----
  // At most `max_width` lanes (16 bytes of the widest element: at most 8). masked_loads: masked
  // loads whose mask does not depend on `x` (a window or a padding test over other dims) are
  // vector loads too, read when their mask holds. with_loads false: only the stores are planned
  // (and checked), the loads stay scalar.
  VecPlan PlanVector(const std::vector<Stmt>& stmts, const Var& x, int max_width = 8,
                     bool masked_loads = false, bool with_loads = true);
  // Rows of a static length that is not a multiple of the vector width (a 50257 vocabulary): the
  // unmasked accesses contiguous along `x` whose distance to the anchor (the first of them, a load
  // when there is one) is a multiple of the width in every row (constant offset and strides), and
  // whose pointer is as far past a width boundary as the anchor's (run-time check). Each row then
  // moves in aligned vectors from `shift` elements before its start; accesses left out (a layer
  // norm's weight, aligned while the rows are not) stay scalar within the vector lanes.
  VecPlan PlanShiftedVector(const std::vector<Stmt>& stmts, const Var& x);
  // The shift of rows of accesses like (b, index) along `x` (constant offset and strides): how
  // many elements the row's first element lies past a `width` boundary (code over the outer
  // variables).
  std::string ShiftCode(const Buffer& b, const Index& index, const Var& x, int width);
  std::string VecFlag(const VecPlan& plan);
  // Emits `stmts` for `width` consecutive values of `x` from `base` (a declared name): vector
  // loads, one scope per lane, vector stores. `lane_decl` declares the lane's variables given the
  // lane's value expression (e.g. "kiln_base + 2") and its number.
  void EmitVectorLanes(const std::vector<Stmt>& stmts, const VecPlan& full_plan, const Var& x,
                       const std::string& base,
                       absl::FunctionRef<void(const std::string&, int)> lane_decl);
  // Pass A of two-pass softmaxes whose every statement folds the max of a widened f16/bf16 vector
  // load of `plan` (the cached vocabulary row): one kiln_cuda::max_nan_half per vector instead of
  // a widening and a max per lane. False (nothing emitted) otherwise.
  bool EmitPackedMax(const std::vector<Stmt>& stmts, const VecPlan& plan);
  // The statements for vector lane `j` (its loads and stores through the vector plan), in a scope
  // of their own.
  void EmitLane(int j, const std::vector<Stmt>& stmts);
  // A chunk of a shifted row (PlanShiftedVector) from kiln_rb = its first element (-kiln_sh for
  // the row's first chunk): one vector per access when the chunk lies within the row, else a
  // scalar lane per element that does (the row's first and last chunks).
  void EmitShiftedChunk(const std::vector<Stmt>& stmts, const VecPlan& plan, int64_t total);
  // The `else if` after a shifted chunk's vector branch: lane by lane, each lane's element
  // checked against [0, total); `lane(j)` emits lane j's work.
  void EmitShiftedTail(int width, int64_t total, absl::FunctionRef<void(int)> lane);

  void EmitCudaStmt(const Stmt& s);

  // ---- pointwise (cuda_emit_pointwise.cc) ----
  std::string GlobalThread() const;
  void EmitPointwise();
  std::vector<int> UnrolledPointDims() const;
  // Loads contiguous along o{k-2} (y) but strided along the innermost o{k-1} (x), where the
  // stores are contiguous: a block handles a kTile x kTileX tile of (y, x); each such load is
  // staged through a padded shared tile (warps read it coalesced along y), then every thread
  // computes one (y, x) point per step with lanes along x (stores coalesced). Constant y and x
  // extents only; the tail tiles are bounds-checked. False (nothing emitted) when no load needs it.
  bool EmitTiled();

  // ---- rows: layout choice (cuda_emit_row_layout.cc) ----
  bool IsColumnReduction() const;
  // kColumn: bytes of the narrowest load that is coalesced across points (8 if none).
  int NarrowestColumnLoad() const;
  // kColumn: a vector plan along the last outer variable (each thread serves `width` consecutive
  // points: kColumnVector at most, a divisor of that variable's static extent), or width 1 when
  // no load moves along it as a vector.
  VecPlan PlanColumnVector();
  // kColumn: 32-bit words per point that a thread keeps: its accumulators' states plus one per
  // distinct load of the phases (a lane's widened value), for the register budget of a block.
  int ColumnWords() const;
  // kColumn: threads per point (lanes along the rows) for column_points_ points a block row,
  // `points` points in all (nullopt: dynamic), rows of static length total_c, V = vec.
  int ColumnLanes(absl::optional<int64_t> points, absl::optional<int64_t> total_c, int vec,
                  int max_state) const;
  // Column kernels: the body's loads (a batch norm's running statistics and weight), which read
  // no accumulator, into registers before the rows: after the all-reduces' barriers each was one
  // more memory round trip on the kernel's path (0.4-2 us of a 4-8 us batch norm merge, H200).
  void EmitBodyPrefetch(int lanes);
  // kColumn with column_vec_ > 1, in a lane's scope: the last outer variable and a reference to
  // the lane's element of each accumulator array (kiln_acc<id>[lane]) named as the scalar
  // accumulator, so that statements emit as in the scalar layout.
  void DeclareColumnLane(const std::string& value, int lane);
  // A vector column's body (kiln_lane 0 of each point group): its lanes, and its stores along the
  // points as vectors where they line up (one store per vector, else each lane's element).
  void EmitColumnBody(int width);
  // kColumn: a phase's loop over the thread's rows (kiln_r), under kiln_active; vector lanes when
  // plan.width > 1 (its accesses as vectors, the rest scalar per lane).
  void EmitColumnLoop(const std::vector<Stmt>& stmts, const VecPlan& plan, const std::string& total_code,
                      absl::optional<int64_t> total_c);
  // The layout of a row kernel of `rows` outer points (total_c: its static reduction length),
  // and what comes with it: launch_ (but the final max_grid of row layouts, set by EmitRows),
  // group_, smem_bytes_, and the long rows' shape.
  void ChooseRowLayout(const Size& rows, absl::optional<int64_t> total_c);
  // The unmasked loads along the reduction, by AccessKey, with the phases that read them outside
  // the subtrees of `skip`.
  std::map<std::string, RowLoad> RowLoads(const std::set<const ExprNode*>& skip = {}) const;
  // Loads along the reduction that recur in a later phase (the row cache's arrays); with
  // `element_bytes`, the bytes of one element of each of them, summed.
  int RecurringLoads(int64_t* element_bytes = nullptr) const;

  // ---- rows (cuda_emit_rows.cc) ----
  void EmitRows();
  // One row (outer point) with a vector width of plan.width along r0.
  // cache = false: no register cache and no two-pass statistics (loads read in every phase).
  void EmitRow(const VecPlan& plan, bool cache = true);
  // r0..r{m-1} from the flat kiln_r (row-major). The remainder is written as rr - q * e, not
  // rr % e: NVRTC 13.0 (cicc) crashes (SIGSEGV) on `%` here in some warp-per-row kernels (e.g.
  // layer norm backward's weight gradient), and the quotient form costs nothing.
  void EmitReduceDecompose();

  // ---- row caches and kSharedRow (cuda_emit_shared_rows.cc) ----
  // kSharedRow's vector rows: fills the slots of the cached loads first read in this phase before
  // it. A chunk within the row moves by one asynchronous copy (cp.async) per load, straight into
  // its slot; the row's first and last chunks of shifted rows go element by element (lanes outside
  // the row are left as they are: every read of them is skipped). A thread fills only the slots it
  // reads back later (chunk-major, its own), so no barrier: only a wait for its copies.
  // CudaLongRows::kSharedPrefetch (two caches, kiln_buf picks this row's): phase 0 fills this
  // row's cache only at a block's first row, waits for it, then starts the fill of the block's
  // next row into the other cache (the row's outer indices and shift recomputed in a scope of
  // their own) without waiting; the next row's wait is at its own phase 0. Only where every
  // cached load is first read in phase 0 (a later fill's wait would wait for the prefetch too).
  void EmitSharedFill(const VecPlan& plan, int64_t chunks, int64_t total);
  // Declares smem_decls_' cache arrays over kiln_dsmem, each at its offset plus `cache_offset`
  // (code: "" for the one cache, " + kiln_buf * N" for this row's of two...).
  void EmitSmemDecls(const std::string& cache_offset);
  // Two caches on sm_90+ where every load filled is a 16-byte vector of the plan: EmitBulkFill
  // instead. Thread 0 fills a row's cache by bulk copies (the copy engine) counted on that
  // cache's mbarrier, the row's partial edge chunks (shifted rows) by loads into registers that it
  // stores at that row's phase 0; a barrier, then thread 0 starts the next row's fill into the
  // other cache, and every thread waits on this cache's mbarrier. Nothing outside a row is read.
  bool BulkFillable(const std::vector<const CacheEntry*>& fill, const VecPlan& plan) const;
  // The bytes of a cached load's slot when it moves as one vector of the plan (a vector load whose
  // slot keeps the buffer's element size), else 0.
  int64_t VectorSlotBytes(const CacheEntry& e, const VecPlan& plan) const;
  // The scope of the block's next row (kiln_ready set; its outer indices, shift and cache arrays
  // over the other cache, under `if (kiln_ready<also>)`), in which `fill` starts its fill.
  void EmitNextRow(const VecPlan& plan, const std::string& also, absl::FunctionRef<void()> fill);
  void EmitBulkFill(const std::vector<const CacheEntry*>& fill, const VecPlan& plan, int64_t total);
  // The fill loop over `fill`'s slots (no wait).
  void EmitSharedFillLoop(const std::vector<const CacheEntry*>& fill, const VecPlan& plan,
                          int64_t chunks, int64_t total);
  bool SharedForced() const {
    return long_rows_ == CudaLongRows::kShared || long_rows_ == CudaLongRows::kSharedPrefetch;
  }
  // The register of `array` for the current chunk and vector lane (kSharedRow: its shared-memory
  // slot, slot-major over the block's threads).
  std::string Slot(const std::string& array) const;
  // The value in Slot(array): f16/bf16 shared slots widened.
  std::string SlotValue(const std::string& array) const;
  // A shared row cache slot's type and bytes: f16/bf16 as bit patterns.
  std::string SmemType(ScalarType t) const {
    return kernel::IsHalfType(t) ? "uint16_t" : ValueType(t);
  }
  static int64_t SmemBytes(ScalarType t) {
    return kernel::IsHalfType(t) ? 2 : kernel::ScalarTypeBytes(t);
  }

  // ---- kSharedRow's realigned stores (cuda_emit_realigned_stores.cc) ----
  // A phase of shifted vector rows cached in shared memory (smem_vec_) that only stores, where
  // the stores along the row lie differently from the loads (softmax(x[:, 1:]) into a contiguous
  // output: its stores are not in `plan`): the stores' own plan, of plan.width, anchored on the
  // first such store (its buffer's other stores with the same residues join; `shift` theirs),
  // or width 1 (nothing to realign: the phase goes through `plan` as before). Not where a store
  // is in `plan`, a load of `plan` is not cached, or a two-pass value is in registers.
  VecPlan PlanRealignedStores(const std::vector<Stmt>& stmts, const VecPlan& plan);
  // The phase over the stores' own chunks (their shift kiln_so): each cached load read as the
  // window of its two cache chunks that holds the chunk's elements (kiln_cuda::window; the cache
  // is laid out by the loads' shift kiln_sh), one vector store per store of `stores` for a chunk
  // within the row, scalar lanes at the row's ends. The windows are other threads' slots:
  // barriers around the phase where a write of the cache may be unordered with it.
  void EmitRealignedStores(const std::vector<Stmt>& stmts, const VecPlan& stores, int64_t chunks,
                           int64_t total);

  // ---- all-reduces and two-pass statistics (cuda_emit_all_reduce.cc) ----
  // Plans the exp reuse of every online-softmax two-pass accumulator that may have it.
  void PlanExpReuse();
  // The online softmaxes of an expression (not a load) that EmitRow's two-pass plan would keep in
  // registers of their own, with exp nodes in later phases: adds those nodes to `exps` and
  // returns how many softmaxes (each needs one row of registers). EmitRow leaves loads read
  // only inside those nodes uncached.
  int SoftmaxExpsKeptInRegisters(std::set<const ExprNode*>* exps) const;
  // Softmax exps whose results are rounded to f16/bf16 (the kernel's every result is, or the
  // accumulator is marked approx_exp by the lowering: a 16-bit softmax fused with other results,
  // the partials of a split one): pass B's exp(x - max) and the later phases' exp(load - max)
  // nodes (ExpShiftNodes) become kiln_cuda::exp_approx (one ex2.approx: relative error ~2^-22 +
  // |x - max| * 2^-24, against the 2^-9..2^-12 of the rounding that follows), as Triton's exp;
  // other accumulators keep accurate expf.
  void PlanApproxExp();
  // The exp of accumulator `id`'s pass B: exp_approx under PlanApproxExp, else kiln_cuda::exp.
  const char* PassBExp(int id) const {
    return approx_exp_.count(id) ? "kiln_cuda::exp_approx(" : "kiln_cuda::exp(";
  }
  // In a later phase's element scope: the exp(x - max) nodes read the overwritten cache.
  void SeedScope();
  // Whether a softmax's statistics fold once across the cluster (the block's max and sum, then
  // the pairs' merge) rather than in two cluster all-reduces: every kClusterRow kernel.
  bool FoldsSoftmaxInCluster() const { return launch_.layout == CudaLayout::kClusterRow; }
  // Pass B of the two-pass accumulators folded in `stmts`, and the all-reduces of every
  // accumulator the phase folded.
  void EmitAllReduces(const std::vector<Stmt>& stmts, int64_t chunks, int64_t total);

  const CudaEmitOptions cuda_;
  int num_sms_ = 132;
  CudaLongRows long_rows_ = CudaLongRows::kAuto;  // this kernel's (options.kernel_long_rows)
  int64_t row_grid_ = 0;  // kBlockPerRow: the grid cap of uncached long rows (0: none)
  int shared_blocks_per_sm_ = 1;  // kSharedRow: blocks per SM by shared memory (launch bounds)
  int shared_buffers_ = 1;        // kSharedRow: row caches per block (2: prefetch_rows_)
  bool bulk_declared_ = false;    // EmitBulkFill's mbarriers and edge registers are hoisted
  std::set<int> approx_exp_;  // PlanApproxExp: accumulators whose softmax exps are approximate
  std::set<const ExprNode*> approx_exp_nodes_;  // PlanApproxExp: later phases' exp nodes
  std::map<std::string, ScalarType> smem_arrays_;  // kSharedRow: cache arrays in shared memory
  bool smem_vec_ = false;  // kSharedRow's vector rows: Vec slots filled by EmitSharedFill
  bool prefetch_rows_ = false;  // kSharedRow with two caches (shared_buffers_ == 2)
  int64_t smem_cache_bytes_ = 0;  // kSharedRow: bytes of one row cache (the other's offset)
  struct SmemDecl {
    std::string name, type;  // a cache array (Slot's) and its element type
    int64_t offset = 0;      // its bytes' offset in the row cache
  };
  std::vector<SmemDecl> smem_decls_;  // kSharedRow: the cache arrays, in declaration order
  std::string local_vec_array_, local_vec_;  // pass B: a shared array's chunk read into a local
  CudaLaunch launch_;
  int group_ = 1;        // threads per row
  int column_points_ = kColumnPoints;  // kColumn: threads across points per row lane
  int column_vec_ = 1;   // kColumn: consecutive points per thread (the vector width along them)
  VecPlan column_plan_;  // kColumn: PlanColumnVector's plan (width column_vec_)
  int smem_bytes_ = 0;   // static shared memory for the all-reduce
  int pub_offset_ = 0;   // kClusterRow: where the published slots start in kiln_smem
  int width_ = 1;        // vector width of the row path being emitted
  bool shifted_ = false;  // the row path being emitted has shifted vectors (PlanShiftedVector)
  int lane_ = -1;        // the vector lane being emitted, or -1
  // kColumn: the body's loads read into registers before the rows (EmitBodyPrefetch): access key
  // -> array of one element per lane; body_lane_ is the lane whose body is being emitted, or -1.
  std::map<std::string, std::string> prefetched_;
  int body_lane_ = -1;
  int phase_ = -1;       // the phase being emitted, or -1
  const VecPlan* plan_ = nullptr;
  std::map<std::string, CacheEntry> cache_;  // by AccessKey
  std::map<int, TwoPass> two_pass_;          // by accumulator id, in the row being emitted
  std::map<std::string, std::string> tiles_;  // staged loads of a tiled kernel, by AccessKey
  bool tiled_ = false;                        // emitting the compute step of a tiled kernel
  std::set<std::string> filled_;             // cache slots written in the current lane
};

}  // namespace kiln::codegen::internal

#endif  // KILN_SERVER_CODEGEN_CUDA_KERNEL_EMITTER_H_
