#include "server/codegen/cuda_emitter.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/types/optional.h"
#include "kernels/cuda/embedded_headers.h"
#include "server/codegen/code_writer.h"
#include "server/codegen/cpu_emitter.h"
#include "server/codegen/exp_reuse.h"
#include "server/codegen/cuda_long_rows.h"
#include "server/kernel/printer.h"
#include "server/base/status_macros.h"

namespace kiln::codegen {

using kernel::AccField;
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

namespace {

// Slack added to every size before deciding on 32-bit indices: grid-stride steps and vector
// chunks may run past the last element by less than this.
constexpr int64_t kIndexSlack = int64_t{1} << 22;
constexpr int kWarpRowLimit = 1024;  // static reduction lengths up to this: a warp per row
constexpr int kColumnPoints = 32;    // kColumn: consecutive outer points per block
constexpr int kRowsBlock = 256;      // kWarpPerRow block size
constexpr int kThreadsPerSm = 2048;
constexpr int kRowWaves = 4;    // row kernels: grid cap in waves of blocks that fit by threads
constexpr int kTile = 32;      // kTiled: a tile of kTile (y) x kTileX (x) points per block step
constexpr int kTileX = 64;     // (8 loads in flight per thread)
constexpr int kTileShift = 5;  // log2(kTile)
constexpr int kTileRows = 8;   // kTiled: block = kTile * kTileRows threads

Size Product(const std::vector<Size>& sizes) {
  Size p = Size::Const(1);
  for (const Size& s : sizes) p = p * s;
  return p;
}

// The constant stride of `var` in `index` (0 when absent), or nullopt when it is not constant.
absl::optional<int64_t> ConstStride(const Index& index, const Var& var) {
  for (const IndexTerm& t : index.terms) {
    if (t.var == var) return t.stride.AsConst();
  }
  return int64_t{0};
}

void CollectLoads(const Expr& e, std::set<const ExprNode*>* seen, std::vector<const ExprNode*>* out) {
  if (!seen->insert(e.get()).second) return;
  for (const Expr& a : e->args) CollectLoads(a, seen, out);
  if (e->kind == ExprKind::kLoad) out->push_back(e.get());
}

std::vector<const ExprNode*> LoadsOf(const std::vector<Stmt>& stmts) {
  std::set<const ExprNode*> seen;
  std::vector<const ExprNode*> out;
  for (const Stmt& s : stmts) CollectLoads(s.value, &seen, &out);
  return out;
}

const char* ReduceOp(AccKind k) {
  switch (k) {
    case AccKind::kSum: return "kiln_cuda::SumOp()";
    case AccKind::kProd: return "kiln_cuda::ProdOp()";
    case AccKind::kMax: return "kiln_cuda::MaxOp()";
    case AccKind::kMin: return "kiln_cuda::MinOp()";
    default: return "kiln_cuda::MergeOp()";
  }
}

const char* AccStruct(AccKind k) {
  switch (k) {
    case AccKind::kArgMax: return "ArgMax";
    case AccKind::kArgMin: return "ArgMin";
    case AccKind::kWelford: return "Welford";
    case AccKind::kOnlineSoftmax: return "OnlineSoftmax";
    default: return nullptr;
  }
}

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

struct VecAccess {
  Buffer buffer;
  Index index;
  std::string name;
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

}  // namespace

const char* CudaLayoutName(CudaLayout layout) {
  switch (layout) {
    case CudaLayout::kPointwise: return "pointwise";
    case CudaLayout::kWarpPerRow: return "warp_per_row";
    case CudaLayout::kBlockPerRow: return "block_per_row";
    case CudaLayout::kColumn: return "column";
    case CudaLayout::kTiled: return "tiled";
    case CudaLayout::kClusterRow: return "cluster_row";
    case CudaLayout::kSharedRow: return "shared_row";
  }
  return "?";
}

absl::StatusOr<int64_t> CudaGridSize(const CudaLaunch& launch, const std::vector<int64_t>& scalars) {
  const absl::optional<int64_t> work = launch.work.Evaluate(scalars);
  if (!work) return absl::InvalidArgumentError("cuda launch: work size needs missing scalars");
  if (launch.work_per_block <= 0 || launch.max_grid <= 0 || launch.cluster <= 0) {
    return absl::InvalidArgumentError("cuda launch: bad work_per_block, max_grid or cluster");
  }
  const int64_t blocks = *work <= 0 ? 1 : (*work - 1) / launch.work_per_block + 1;
  const int64_t grid = std::max<int64_t>(1, std::min(blocks, launch.max_grid));
  return (grid + launch.cluster - 1) / launch.cluster * launch.cluster;
}

namespace {

class CudaKernelEmitter : public CpuKernelEmitter {
 public:
  CudaKernelEmitter(const Kernel& kernel, int index, const CudaEmitOptions& options)
      : CpuKernelEmitter(kernel, index, CpuOptions()), cuda_(options) {
    num_sms_ = options.num_sms > 0 ? options.num_sms
                                   : (options.arch.rfind("sm_8", 0) == 0 ? 108 : 132);
    long_rows_ = index >= 0 && static_cast<size_t>(index) < options.kernel_long_rows.size()
                     ? options.kernel_long_rows[index]
                     : options.long_rows;
  }

  const CudaLaunch& launch() const { return launch_; }

 protected:
  static CpuEmitOptions CpuOptions() {
    CpuEmitOptions o;
    o.block = kIndexSlack;  // Emit() decides 32-bit indices with this slack
    o.include_prelude = false;
    return o;
  }

  bool Allows32BitIndices() const override { return true; }  // cheaper on GPUs

  // Helper spellings: the shared expression code names kiln_cpu:: and std:: functions; the CUDA
  // helpers (kernels/cuda) provide the same names in kiln_cuda::.
  static std::string Retarget(const std::string& code) {
    return absl::StrReplaceAll(code, {{"kiln_cpu::", "kiln_cuda::"}, {"std::", "kiln_cuda::"}});
  }
  std::string ConstCode(const ExprNode& e) const override {
    return Retarget(CpuKernelEmitter::ConstCode(e));
  }
  std::string UnaryCode(kernel::UnaryOp op, ScalarType t, const std::string& x) const override {
    return Retarget(CpuKernelEmitter::UnaryCode(op, t, x));
  }
  std::string BinaryCode(kernel::BinaryOp op, ScalarType t, const std::string& a,
                         const std::string& b) const override {
    return Retarget(CpuKernelEmitter::BinaryCode(op, t, a, b));
  }
  bool BoolStoredAsBytes() const override { return false; }  // NVRTC kernels keep `bool`
  std::string CastCode(ScalarType from, ScalarType to, const std::string& x) const override {
    return Retarget(CpuKernelEmitter::CastCode(from, to, x));
  }

  std::string Widen(const Buffer& b, const std::string& raw) const {
    if (b.dtype == ScalarType::kBFloat16) return absl::StrCat("kiln_cuda::bf16_to_f32(", raw, ")");
    if (b.dtype == ScalarType::kFloat16) return absl::StrCat("kiln_cuda::f16_to_f32(", raw, ")");
    return raw;
  }
  std::string Narrow(const Buffer& b, const std::string& v) const {
    if (b.dtype == ScalarType::kBFloat16) return absl::StrCat("kiln_cuda::f32_to_bf16(", v, ")");
    if (b.dtype == ScalarType::kFloat16) return absl::StrCat("kiln_cuda::f32_to_f16(", v, ")");
    return v;
  }

  std::string LoadCode(const Buffer& b, const std::string& index) const override {
    return Widen(b, absl::StrCat("b", b.index, "[", index, "]"));
  }

  std::string LoadExprCode(const ExprNode& e) override {
    if (!e.args.empty()) return CpuKernelEmitter::LoadExprCode(e);  // masked: scalar, uncached
    const std::string key = AccessKey(e.buffer, e.index);
    if (tiled_) {
      auto tile = tiles_.find(key);
      if (tile != tiles_.end()) return absl::StrCat(tile->second, "[kiln_xl][kiln_i]");
    }
    std::string code;
    if (plan_ != nullptr && lane_ >= 0) {
      auto vec = plan_->loads.find(key);
      if (vec != plan_->loads.end()) {
        code = Widen(e.buffer, absl::StrCat(vec->second.name, ".v[", lane_, "]"));
      }
    }
    auto cached = cache_.find(key);
    if (cached == cache_.end()) {
      return code.empty() ? CpuKernelEmitter::LoadExprCode(e) : code;
    }
    if (smem_arrays_.count(cached->second.name)) {
      // kSharedRow: the slot is in shared memory; f16/bf16 as their bit patterns. Vector rows:
      // filled before the load's first phase (EmitSharedFill), `code` the chunk's vector read
      // from shared memory once (EmitVectorLanes).
      if (smem_vec_) return code.empty() ? SlotValue(cached->second.name) : code;
      const std::string slot = Slot(cached->second.name);
      if (phase_ != cached->second.first_phase || !filled_.insert(key).second) return SlotValue(cached->second.name);
      std::string raw = absl::StrCat("b", e.buffer.index, "[", IndexCode(e.index), "]");
      if (plan_ != nullptr && lane_ >= 0) {
        auto vec = plan_->loads.find(key);
        if (vec != plan_->loads.end()) raw = absl::StrCat(vec->second.name, ".v[", lane_, "]");
      }
      const std::string v = absl::StrCat("v", next_value_++);
      w_.Linef("const ", SmemType(e.buffer.dtype), " ", v, " = ", raw, ";");
      w_.Linef(slot, " = ", v, ";");
      return Widen(e.buffer, v);
    }
    const std::string slot =
        width_ == 1 ? absl::StrCat(cached->second.name, "[kiln_e]")
                    : absl::StrCat(cached->second.name, "[kiln_e * ", width_, " + ", lane_, "]");
    if (phase_ == cached->second.first_phase && filled_.insert(key).second) {
      if (code.empty()) code = CpuKernelEmitter::LoadExprCode(e);
      w_.Linef(slot, " = ", code, ";");
    }
    return slot;
  }

  void EmitFunction() override {
    // Sizes over scalars: a 32-bit instance guarded by a run-time check (see below). Loop
    // variables read as values are widened to int64_t in both instances, as with idx32_.
    const std::string fits = idx32_ ? "" : Int32Check();
    if (!fits.empty()) idx32_ = true;
    PushScope();
    if (k_.is_pointwise()) {
      EmitPointwise();
    } else {
      EmitRows();
    }
    PopScope();
    CodeWriter head;
    head.Linef("// ", CpuKernelSymbol(index_), ": ", CudaLayoutName(launch_.layout), ", ",
               k_.outer.size(), " outer dims, ", k_.reduce.size(), " reduction dims, ",
               k_.phases.size(), " phases, vector width ", launch_.vector_width, ", ",
               launch_.cached_values, " cached values per thread",
               launch_.layout == CudaLayout::kSharedRow
                   ? absl::StrCat(", ", launch_.shared_bytes, " bytes of shared row cache per block")
                   : "");
    std::vector<std::string> params;
    for (const Buffer& b : k_.buffers) {
      const std::string t = StorageType(b.dtype);
      switch (b.access) {
        case kernel::Access::kRead:
          params.push_back(absl::StrCat("const ", t, "* __restrict__ b", b.index));
          break;
        case kernel::Access::kWrite:
          params.push_back(absl::StrCat(t, "* __restrict__ b", b.index));
          break;
        case kernel::Access::kReadWrite:
          params.push_back(absl::StrCat(t, "* b", b.index));
          break;
      }
    }
    for (int i = 0; i < k_.num_scalars; ++i) params.push_back(absl::StrCat("int64_t n", i));
    if (fits.empty()) {
      head.Open(absl::StrCat("extern \"C\" __global__ void ", KernelAttributes(),
                             CpuKernelSymbol(index_), "(", absl::StrJoin(params, ", "), ")"));
      head.Linef("using idx_t = ", idx32_ ? "int32_t" : "int64_t", ";");
      if (smem_bytes_ > 0) head.Line(SmemDeclaration());
      result_ = head.Take();
      result_ += hoisted_.str();
      result_ += w_.str();
      result_ += "}\n";
      return;
    }
    // Sizes over scalars: the body is a template on the index type, and the kernel takes the
    // 32-bit instance when the scalars make every size fit (the common case), else 64-bit.
    std::vector<std::string> args;
    for (const Buffer& b : k_.buffers) args.push_back(absl::StrCat("b", b.index));
    for (int i = 0; i < k_.num_scalars; ++i) args.push_back(absl::StrCat("n", i));
    std::vector<std::string> body_params = params;
    if (smem_bytes_ > 0) {
      body_params.push_back("unsigned char* kiln_smem");
      args.push_back("kiln_smem");
    }
    const std::string body = absl::StrCat(CpuKernelSymbol(index_), "_body");
    head.Line("template <typename idx_t>");
    head.Open(absl::StrCat("KILN_DEV void ", body, "(", absl::StrJoin(body_params, ", "), ")"));
    result_ = head.Take();
    result_ += hoisted_.str();
    result_ += w_.str();
    result_ += "}\n";
    CodeWriter kernel;
    kernel.Open(absl::StrCat("extern \"C\" __global__ void ", KernelAttributes(),
                             CpuKernelSymbol(index_), "(", absl::StrJoin(params, ", "), ")"));
    if (smem_bytes_ > 0) kernel.Line(SmemDeclaration());
    kernel.Open(absl::StrCat("if (", fits, ")"));
    kernel.Linef(body, "<int32_t>(", absl::StrJoin(args, ", "), ");");
    kernel.Close();
    kernel.Open("else");
    kernel.Linef(body, "<int64_t>(", absl::StrJoin(args, ", "), ");");
    kernel.Close();
    result_ += kernel.Take();
    result_ += "}\n";
  }

  std::string KernelAttributes() const {
    if (launch_.layout == CudaLayout::kSharedRow) {
      // As many blocks per SM as their shared memory allows (registers: 65536 / that many).
      return absl::StrCat("__launch_bounds__(", launch_.block, ", ", shared_blocks_per_sm_, ") ");
    }
    if (launch_.layout != CudaLayout::kClusterRow) {
      return absl::StrCat("__launch_bounds__(", launch_.block, ") ");
    }
    // <= 64 registers a thread (what 1024 threads have): two blocks of 512 per SM.
    return absl::StrCat("__cluster_dims__(", launch_.cluster, ", 1, 1) __launch_bounds__(",
                        launch_.block, ", ", std::max(1, 1024 / launch_.block), ") ");
  }

  std::string SmemDeclaration() const {
    if (launch_.layout == CudaLayout::kClusterRow) {
      return absl::StrCat("unsigned char* const kiln_smem = kiln_cuda::cluster_smem<", smem_bytes_,
                          ">();");
    }
    return absl::StrCat("alignas(16) __shared__ unsigned char kiln_smem[", smem_bytes_, "];");
  }

  // What cuda_long_rows.h needs to know about this row kernel of static length `total`.
  ClusterRowFacts LongRowFacts(int64_t total, absl::optional<int64_t> rows, bool* shifted_rows,
                               int* shifted_width) {
    ClusterRowFacts facts;
    facts.length = total;
    facts.rows = rows;
    int64_t element_bytes = 0;
    facts.recurring_loads = RecurringLoads(&element_bytes);
    facts.row_bytes = element_bytes * total;
    facts.element_bytes = element_bytes;
    if (k_.reduce.size() == 1) {
      std::vector<Stmt> all;
      for (const kernel::Phase& p : k_.phases) all.insert(all.end(), p.stmts.begin(), p.stmts.end());
      const int width = PlanVector(all, Var{VarKind::kReduce, 0}).width;
      if (width > 1 && total % width == 0) {
        facts.vector_width = width;
      } else if (const int shifted = PlanShiftedVector(all, Var{VarKind::kReduce, 0}).width; shifted > 1) {
        // Vectors from up to width - 1 elements before the row's start (PlanShiftedVector).
        facts.vector_width = shifted;
        facts.length = total + shifted - 1;
        *shifted_rows = true;
        *shifted_width = shifted;
      }
    }
    return facts;
  }

  ClusterRowLimits LongRowLimits(bool shifted_rows, int shifted_width) const {
    ClusterRowLimits limits;
    limits.num_sms = num_sms_;
    limits.max_cluster = cuda_.max_cluster;
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
    if (!ArchHasClusters(cuda_.arch)) limits.max_cluster = 0;
    const SharedMemorySize smem = SharedMemoryOf(cuda_.arch);
    limits.shared_bytes_per_sm = smem.per_sm;
    limits.max_shared_bytes_per_block = smem.per_block;
    limits.static_shared_bytes = smem_bytes_;
    limits.shared_row_blocks_per_sm = cuda_.shared_row_blocks_per_sm;
    limits.shared_row_block = cuda_.shared_row_block;
    return limits;
  }

  // kSharedRow's shape for a row kernel of static length `total` (cuda_long_rows.h), or nullopt.
  absl::optional<SharedRowChoice> ChooseShared(int64_t total, absl::optional<int64_t> rows) {
    if (long_rows_ != CudaLongRows::kAuto && long_rows_ != CudaLongRows::kShared) return absl::nullopt;
    bool shifted_rows = false;
    int shifted_width = 1;
    const ClusterRowFacts facts = LongRowFacts(total, rows, &shifted_rows, &shifted_width);
    const ClusterRowLimits limits = LongRowLimits(shifted_rows, shifted_width);
    return ChooseSharedRows(facts, limits, long_rows_ == CudaLongRows::kShared);
  }

  // kClusterRow's shape for a row kernel of static length `total` (cuda_long_rows.h), or nullopt;
  // for nullopt, *row_grid = the grid cap of an uncached block per row (UncachedRowGrid; 0: none).
  absl::optional<ClusterRowChoice> ChooseCluster(int64_t total, absl::optional<int64_t> rows,
                                                 int block, int64_t* row_grid) {
    *row_grid = 0;
    if (!ArchHasClusters(cuda_.arch)) return absl::nullopt;
    bool shifted_rows = false;
    int shifted_width = 1;
    const ClusterRowFacts facts = LongRowFacts(total, rows, &shifted_rows, &shifted_width);
    const ClusterRowLimits limits = LongRowLimits(shifted_rows, shifted_width);
    absl::optional<ClusterRowChoice> choice;
    if (long_rows_ != CudaLongRows::kBlockPerRow) choice = ChooseClusterRows(facts, limits);
    if (!choice && long_rows_ != CudaLongRows::kCluster && long_rows_ != CudaLongRows::kShared) {
      *row_grid = UncachedRowGrid(facts, limits, block);
    }
    return choice;
  }

  // A run-time condition on the scalars under which 32-bit indices are safe: the work and every
  // buffer's size, plus kIndexSlack, fit in int32 (evaluated in double: exact below 2^53, and no
  // overflow). "" when some size is not a polynomial in the scalars the emitter can evaluate.
  std::string Int32Check() const {
    const Size work = Product(k_.outer) * Product(k_.reduce);
    std::vector<Size> sizes = {work};
    for (const Buffer& b : k_.buffers) sizes.push_back(b.num_elements);
    std::vector<std::string> conds;
    const int64_t limit = std::numeric_limits<int32_t>::max() - kIndexSlack;
    for (const Size& s : sizes) {
      if (const absl::optional<int64_t> c = s.AsConst()) {
        if (*c < 0 || *c > limit) return "";
        continue;
      }
      std::vector<std::string> terms;
      for (const Size::Monomial& m : s.terms()) {
        std::vector<std::string> f;
        f.push_back(absl::StrCat(m.coeff, ".0"));
        for (int32_t p : m.params) f.push_back(absl::StrCat("static_cast<double>(n", p, ")"));
        terms.push_back(absl::StrJoin(f, " * "));
      }
      const std::string cond = absl::StrCat(absl::StrJoin(terms, " + "), " <= ", limit, ".0");
      if (std::find(conds.begin(), conds.end(), cond) == conds.end()) conds.push_back(cond);
    }
    if (conds.empty()) return "";
    return absl::StrJoin(conds, " && ");
  }

 private:
  // ---- vector plans ----
  using Accesses = std::vector<std::pair<Buffer, Index>>;

  // The unmasked loads and the stores of `stmts` whose index `keep` admits, and the vector width
  // of 16 bytes of the widest element among them (at most 8 lanes; 0 when there are none).
  template <typename Keep>
  static int VectorCandidates(const std::vector<Stmt>& stmts, Keep keep, Accesses* loads, Accesses* stores) {
    for (const ExprNode* l : LoadsOf(stmts)) {
      if (l->args.empty() && keep(l->index)) loads->emplace_back(l->buffer, l->index);
    }
    for (const Stmt& s : stmts) {
      if (s.kind == StmtKind::kStore && keep(s.index)) stores->emplace_back(s.buffer, s.index);
    }
    int widest = 0;
    for (const Accesses* list : {loads, stores}) {
      for (const auto& [b, i] : *list) widest = std::max(widest, kernel::ScalarTypeBytes(b.dtype));
    }
    return widest == 0 ? 0 : std::min(8, 16 / widest);
  }

  VecPlan PlanVector(const std::vector<Stmt>& stmts, const Var& x) {
    VecPlan plan;
    if (!cuda_.vectorize) return plan;
    Accesses loads, stores;
    const int width = VectorCandidates(
        stmts, [&](const Index& index) { return ConstStride(index, x) == absl::optional<int64_t>(1); }, &loads,
        &stores);
    if (width <= 1) return plan;
    std::set<std::string> checks;
    auto admit = [&](const Buffer& b, const Index& index, std::map<std::string, VecAccess>* into,
                     const char* prefix) {
      const std::string key = AccessKey(b, index);
      if (into->count(key)) return;
      std::vector<std::string> mine;
      const absl::optional<int64_t> off = index.offset.AsConst();
      if (off) {
        if (*off % width != 0) return;
      } else {
        mine.push_back(absl::StrCat("(", SizeCode(index.offset), ") % ", width, " == 0"));
      }
      for (const IndexTerm& t : index.terms) {
        if (t.var == x) continue;
        const absl::optional<int64_t> st = t.stride.AsConst();
        if (st) {
          if (*st % width != 0) return;
        } else {
          mine.push_back(absl::StrCat(SizeCode(t.stride), " % ", width, " == 0"));
        }
      }
      mine.push_back(absl::StrCat("kiln_cuda::aligned(b", b.index, ", ",
                                  width * kernel::ScalarTypeBytes(b.dtype), ")"));
      for (std::string& c : mine) checks.insert(std::move(c));
      (*into)[key] = VecAccess{b, index, absl::StrCat(prefix, into->size())};
    };
    for (const auto& [b, i] : loads) admit(b, i, &plan.loads, "kiln_lv");
    for (const auto& [b, i] : stores) admit(b, i, &plan.stores, "kiln_sv");
    if (plan.loads.empty() && plan.stores.empty()) return VecPlan();
    plan.width = width;
    plan.checks.assign(checks.begin(), checks.end());
    return plan;
  }

  // Rows of a static length that is not a multiple of the vector width (a 50257 vocabulary): the
  // unmasked accesses contiguous along `x` whose distance to the anchor (the first of them, a load
  // when there is one) is a multiple of the width in every row (constant offset and strides), and
  // whose pointer is as far past a width boundary as the anchor's (run-time check). Each row then
  // moves in aligned vectors from `shift` elements before its start; accesses left out (a layer
  // norm's weight, aligned while the rows are not) stay scalar within the vector lanes.
  VecPlan PlanShiftedVector(const std::vector<Stmt>& stmts, const Var& x) {
    VecPlan plan;
    if (!cuda_.vectorize) return plan;
    Accesses loads, stores;
    auto candidate = [&](const Index& index) {
      if (ConstStride(index, x) != absl::optional<int64_t>(1) || !index.offset.AsConst()) return false;
      for (const IndexTerm& t : index.terms) {
        if (!t.stride.AsConst()) return false;
      }
      return true;
    };
    const int width = VectorCandidates(stmts, candidate, &loads, &stores);
    if (width <= 1) return plan;
    const auto& [anchor_buffer, anchor_index] = loads.empty() ? stores.front() : loads.front();
    // The coefficient of every variable but x, and the offset, modulo the width.
    auto residues = [&](const Index& index) {
      std::map<std::string, int64_t> r;
      r["offset"] = (*index.offset.AsConst() % width + width) % width;
      for (const IndexTerm& t : index.terms) {
        if (t.var == x) continue;
        int64_t& v = r[kernel::VarName(t.var)];
        v = ((v + *t.stride.AsConst()) % width + width) % width;
      }
      for (auto it = r.begin(); it != r.end();) it = it->second == 0 && it->first != "offset" ? r.erase(it) : ++it;
      return r;
    };
    const std::map<std::string, int64_t> anchor_residues = residues(anchor_index);
    std::set<std::string> checks;
    auto admit = [&](const Buffer& b, const Index& index, std::map<std::string, VecAccess>* into,
                     const char* prefix) {
      const std::string key = AccessKey(b, index);
      if (into->count(key) || residues(index) != anchor_residues) return;
      if (b.index != anchor_buffer.index) {
        checks.insert(absl::StrCat("kiln_cuda::misalign(b", b.index, ", ", width,
                                   ") == kiln_cuda::misalign(b", anchor_buffer.index, ", ", width, ")"));
      }
      (*into)[key] = VecAccess{b, index, absl::StrCat(prefix, into->size())};
    };
    for (const auto& [b, i] : loads) admit(b, i, &plan.loads, "kiln_lv");
    for (const auto& [b, i] : stores) admit(b, i, &plan.stores, "kiln_sv");
    std::vector<IndexTerm> rest;
    for (const IndexTerm& t : anchor_index.terms) {
      if (!(t.var == x)) rest.push_back(t);
    }
    plan.width = width;
    plan.checks.assign(checks.begin(), checks.end());
    plan.shift = absl::StrCat("static_cast<idx_t>((kiln_cuda::misalign(b", anchor_buffer.index, ", ",
                              width, ") + (", IndexCode(kernel::MakeIndex(anchor_index.offset, rest)),
                              ") % ", width, ") % ", width, ")");
    return plan;
  }

  // Emits `stmts` for `width` consecutive values of `x` from `base` (a declared name): vector
  // loads, one scope per lane, vector stores. `lane_decl` declares the lane's variables given the
  // lane's value expression (e.g. "kiln_base + 2").
  template <typename LaneDecl>
  void EmitVectorLanes(const std::vector<Stmt>& stmts, const VecPlan& full_plan, const Var& x,
                       const std::string& base, LaneDecl lane_decl) {
    // Only the accesses of these statements; none for loads that come from cached registers.
    VecPlan plan;
    plan.width = full_plan.width;
    for (const ExprNode* l : LoadsOf(stmts)) {
      const std::string key = AccessKey(l->buffer, l->index);
      auto it = full_plan.loads.find(key);
      if (it == full_plan.loads.end()) continue;
      auto cached = cache_.find(key);
      if (cached != cache_.end() && cached->second.first_phase != phase_ && !smem_vec_) continue;
      plan.loads.insert(*it);
    }
    for (const Stmt& s : stmts) {
      if (s.kind != StmtKind::kStore) continue;
      auto it = full_plan.stores.find(AccessKey(s.buffer, s.index));
      if (it != full_plan.stores.end()) plan.stores.insert(*it);
    }
    w_.Open("");
    w_.Linef("const idx_t ", kernel::VarName(x), " = ", base, ";");
    for (const auto& [key, a] : plan.loads) {
      auto cached = cache_.find(key);
      if (smem_vec_ && cached != cache_.end()) {
        // kSharedRow's vector rows: the chunk's slot in shared memory, read once.
        w_.Linef("const kiln_cuda::Vec<", SmemType(a.buffer.dtype), ", ", plan.width, "> ", a.name,
                 " = ", cached->second.name, "[kiln_e * ", group_, " + kiln_lane];");
        continue;
      }
      w_.Linef("const kiln_cuda::Vec<", StorageType(a.buffer.dtype), ", ", plan.width, "> ", a.name,
               " = kiln_cuda::load_vec<", plan.width, ">(b", a.buffer.index, " + (",
               IndexCode(a.index), "));");
    }
    for (const auto& [key, a] : plan.stores) {
      w_.Linef("kiln_cuda::Vec<", StorageType(a.buffer.dtype), ", ", plan.width, "> ", a.name, ";");
    }
    plan_ = &plan;
    for (int j = 0; j < plan.width; ++j) {
      w_.Open("");
      lane_decl(absl::StrCat(base, " + ", j));
      EmitLane(j, stmts);
      w_.Close();
    }
    plan_ = nullptr;
    for (const auto& [key, a] : plan.stores) {
      w_.Linef("kiln_cuda::store_vec<", plan.width, ">(b", a.buffer.index, " + (", IndexCode(a.index),
               "), ", a.name, ");");
    }
    w_.Close();
  }

  // The statements for vector lane `j` (its loads and stores through the vector plan), in a scope
  // of their own.
  void EmitLane(int j, const std::vector<Stmt>& stmts) {
    lane_ = j;
    filled_.clear();
    PushScope();
    SeedScope();
    for (const Stmt& s : stmts) EmitCudaStmt(s);
    PopScope();
    lane_ = -1;
  }

  void EmitCudaStmt(const Stmt& s) {
    // A store of cast<f16/bf16>(x) to a buffer of that type narrows x once: the cast's rounding
    // (round_bf16: to a float) and the store's narrowing give the same bits as narrowing alone.
    const bool narrow_arg = s.kind == StmtKind::kStore && s.value->kind == ExprKind::kCast &&
                            kernel::IsHalfType(s.buffer.dtype) && s.value->type == s.buffer.dtype &&
                            (s.value->args[0]->type == ScalarType::kFloat32 ||
                             s.value->args[0]->type == s.buffer.dtype);
    const std::string v = ExprCode(narrow_arg ? s.value->args[0] : s.value);
    if (s.kind == StmtKind::kStore) {
      const std::string key = AccessKey(s.buffer, s.index);
      if (plan_ != nullptr && lane_ >= 0) {
        auto it = plan_->stores.find(key);
        if (it != plan_->stores.end()) {
          w_.Linef(it->second.name, ".v[", lane_, "] = ", Narrow(s.buffer, v), ";");
          return;
        }
      }
      w_.Linef("b", s.buffer.index, "[", IndexCode(s.index), "] = ", Narrow(s.buffer, v), ";");
      return;
    }
    const int id = s.acc.id;
    auto two = two_pass_.find(id);
    if (two != two_pass_.end()) {
      // Pass A of a two-pass reduction: keep the value, fold the first statistic.
      if (!two->second.reuses_cache) w_.Linef(Slot(two->second.array), " = ", v, ";");
      if (s.acc.kind == AccKind::kOnlineSoftmax) {
        w_.Linef("acc", id, ".max = kiln_cuda::max_nan(acc", id, ".max, ", v, ");");
      } else {
        w_.Linef("acc", id, ".mean += ", v, ";");
      }
      return;
    }
    switch (s.acc.kind) {
      case AccKind::kSum: w_.Linef("acc", id, " += ", v, ";"); break;
      case AccKind::kProd: w_.Linef("acc", id, " *= ", v, ";"); break;
      case AccKind::kMax: w_.Linef("acc", id, " = kiln_cuda::maximum(acc", id, ", ", v, ");"); break;
      case AccKind::kMin: w_.Linef("acc", id, " = kiln_cuda::minimum(acc", id, ", ", v, ");"); break;
      case AccKind::kArgMax: case AccKind::kArgMin:
        w_.Linef("acc", id, ".Update(", v, ", static_cast<int64_t>(kiln_r));");
        break;
      case AccKind::kWelford: case AccKind::kOnlineSoftmax:
        w_.Linef("acc", id, ".Update(", v, ");");
        break;
    }
  }

  std::string VecFlag(const VecPlan& plan) {
    if (plan.width <= 1) return "false";
    return plan.checks.empty() ? "true" : absl::StrJoin(plan.checks, " && ");
  }

  std::string GlobalThread() const {
    return "static_cast<idx_t>(blockIdx.x) * static_cast<idx_t>(blockDim.x) + "
           "static_cast<idx_t>(threadIdx.x)";
  }

  // ---- pointwise ----
  void EmitPointwise() {
    const int k = static_cast<int>(k_.outer.size());
    launch_.layout = CudaLayout::kPointwise;
    launch_.block = cuda_.pointwise_block;
    launch_.work = Product(k_.outer);
    launch_.max_grid =
        int64_t{num_sms_} * std::max(1, kThreadsPerSm / launch_.block) * cuda_.pointwise_waves;
    if (k == 0) {
      launch_.work_per_block = 1;
      launch_.max_grid = 1;
      w_.Open("if (blockIdx.x == 0 && threadIdx.x == 0)");
      for (const Stmt& s : k_.body) EmitCudaStmt(s);
      w_.Close();
      return;
    }
    if (EmitTiled()) return;
    const int last = k - 1;
    const Var x{VarKind::kOuter, last};
    const VecPlan plan = PlanVector(k_.body, x);
    const int width = plan.width;
    launch_.vector_width = width;
    launch_.work_per_block = int64_t{launch_.block} * width;
    const std::string inner = SizeCode(k_.outer[last]);
    const absl::optional<int64_t> inner_c = k_.outer[last].AsConst();
    if (width > 1) w_.Linef("const bool kiln_vec = ", VecFlag(plan), ";");
    std::string chunks = inner;
    if (width > 1) {
      chunks = inner_c ? absl::StrCat((*inner_c + width - 1) / width)
                       : absl::StrCat("(", inner, " + ", width - 1, ") / ", width);
    }
    w_.Linef("const idx_t kiln_chunks = ", chunks, ";");
    Size rows = Size::Const(1);
    for (int i = 0; i < last; ++i) rows = rows * k_.outer[i];
    w_.Linef("const idx_t kiln_units = ",
             rows.is_const(1) ? "kiln_chunks" : absl::StrCat(SizeCode(rows), " * kiln_chunks"), ";");
    w_.Open(absl::StrCat("for (idx_t kiln_u = ", GlobalThread(),
                         "; kiln_u < kiln_units; kiln_u += static_cast<idx_t>(gridDim.x) * "
                         "static_cast<idx_t>(blockDim.x))"));
    if (last > 0) {
      w_.Line("const idx_t kiln_c = kiln_u % kiln_chunks;");
      EmitDecompose("kiln_u / kiln_chunks", last);
    } else {
      w_.Line("const idx_t kiln_c = kiln_u;");
    }
    const std::string xn = kernel::VarName(x);
    if (width == 1) {
      w_.Linef("const idx_t ", xn, " = kiln_c;");
      PushScope();
      for (const Stmt& s : k_.body) EmitCudaStmt(s);
      PopScope();
      w_.Close();
      return;
    }
    w_.Linef("const idx_t kiln_base = kiln_c * ", width, ";");
    w_.Open(absl::StrCat("if (kiln_vec && kiln_base + ", width, " <= ", inner, ")"));
    EmitVectorLanes(k_.body, plan, x, "kiln_base", [&](const std::string& value) {
      w_.Linef("const idx_t ", xn, " = ", value, ";");
    });
    w_.Close();
    w_.Open("else");
    w_.Linef("const idx_t kiln_end = kiln_base + ", width, " < ", inner, " ? kiln_base + ", width,
             " : ", inner, ";");
    w_.Open(absl::StrCat("for (idx_t ", xn, " = kiln_base; ", xn, " < kiln_end; ++", xn, ")"));
    PushScope();
    for (const Stmt& s : k_.body) EmitCudaStmt(s);
    PopScope();
    w_.Close();
    w_.Close();
    w_.Close();
  }

  // ---- tiled pointwise ----
  // Loads contiguous along o{k-2} (y) but strided along the innermost o{k-1} (x), where the
  // stores are contiguous: a block handles a kTile x kTileX tile of (y, x); each such load is
  // staged through a padded shared tile (warps read it coalesced along y), then every thread
  // computes one (y, x) point per step with lanes along x (stores coalesced). Constant y and x
  // extents only; the tail tiles are bounds-checked. False (nothing emitted) when no load needs it.
  bool EmitTiled() {
    const int k = static_cast<int>(k_.outer.size());
    if (k < 2 || !cuda_.tile) return false;
    const Var x{VarKind::kOuter, k - 1}, y{VarKind::kOuter, k - 2};
    const absl::optional<int64_t> xs = k_.outer[k - 1].AsConst(), ys = k_.outer[k - 2].AsConst();
    if (!xs || !ys || *xs < kTile || *ys < kTile) return false;
    tiles_.clear();
    std::vector<const ExprNode*> staged;
    for (const ExprNode* l : LoadsOf(k_.body)) {
      if (!l->args.empty()) continue;
      const absl::optional<int64_t> sx = ConstStride(l->index, x), sy = ConstStride(l->index, y);
      if (sy != absl::optional<int64_t>(1) || !sx || *sx == 0 || *sx == 1) continue;
      const std::string key = AccessKey(l->buffer, l->index);
      if (tiles_.count(key)) continue;
      tiles_[key] = absl::StrCat("kiln_t", tiles_.size());
      staged.push_back(l);
    }
    if (staged.empty()) return false;
    launch_.layout = CudaLayout::kTiled;
    launch_.block = kTile * kTileRows;
    const int64_t tx = (*xs + kTileX - 1) / kTileX, ty = (*ys + kTile - 1) / kTile;
    Size rest = Size::Const(1);
    for (int i = 0; i < k - 2; ++i) rest = rest * k_.outer[i];
    launch_.work = rest * Size::Const(tx * ty);
    launch_.work_per_block = 1;
    launch_.max_grid =
        int64_t{num_sms_} * std::max(1, kThreadsPerSm / launch_.block) * cuda_.pointwise_waves;
    const std::string xn = kernel::VarName(x), yn = kernel::VarName(y);
    for (const ExprNode* l : staged) {
      w_.Linef("__shared__ ", ValueType(l->type), " ", tiles_[AccessKey(l->buffer, l->index)], "[",
               kTileX, "][", kTile + 1, "];");
    }
    w_.Linef("const int kiln_lane = threadIdx.x & ", kTile - 1, ";");
    w_.Linef("const int kiln_row = threadIdx.x >> ", kTileShift, ";");
    w_.Linef("const idx_t kiln_units = ",
             rest.is_const(1) ? absl::StrCat(tx * ty) : absl::StrCat(SizeCode(rest), " * ", tx * ty),
             ";");
    w_.Open("for (idx_t kiln_u = blockIdx.x; kiln_u < kiln_units; kiln_u += gridDim.x)");
    w_.Linef("const idx_t kiln_x0 = kiln_u % ", tx, " * ", kTileX, ";");
    w_.Linef("const idx_t kiln_y0 = kiln_u / ", tx, " % ", ty, " * ", kTile, ";");
    if (k > 2) {
      w_.Linef("const idx_t kiln_rest_u = kiln_u / ", tx * ty, ";");
      EmitDecompose("kiln_rest_u", k - 2);
    }
    const bool x_tail = *xs % kTileX != 0, y_tail = *ys % kTile != 0;
    auto bounds = [&]() {
      std::vector<std::string> c;
      if (y_tail) c.push_back(absl::StrCat(yn, " < ", *ys));
      if (x_tail) c.push_back(absl::StrCat(xn, " < ", *xs));
      return absl::StrJoin(c, " && ");
    };
    // Stage: lanes along y (coalesced reads), rows of the block along x.
    w_.Raw("#pragma unroll");
    w_.Open(absl::StrCat("for (int kiln_j = 0; kiln_j < ", kTileX / kTileRows, "; ++kiln_j)"));
    w_.Linef("const int kiln_i = kiln_row + kiln_j * ", kTileRows, ";");
    w_.Linef("const idx_t ", yn, " = kiln_y0 + kiln_lane;");
    w_.Linef("const idx_t ", xn, " = kiln_x0 + kiln_i;");
    std::string cond = bounds();
    if (!cond.empty()) w_.Open(absl::StrCat("if (", cond, ")"));
    for (const ExprNode* l : staged) {
      w_.Linef(tiles_[AccessKey(l->buffer, l->index)], "[kiln_i][kiln_lane] = ",
               LoadCode(l->buffer, IndexCode(l->index)), ";");
    }
    if (!cond.empty()) w_.Close();
    w_.Close();
    w_.Line("__syncthreads();");
    // Compute: lanes along x, rows of the block along y.
    w_.Raw("#pragma unroll");
    w_.Open(absl::StrCat("for (int kiln_j = 0; kiln_j < ", kTile / kTileRows * (kTileX / kTile),
                         "; ++kiln_j)"));
    w_.Linef("const int kiln_i = kiln_row + kiln_j % ", kTile / kTileRows, " * ", kTileRows, ";");
    w_.Linef("const int kiln_xl = kiln_lane + kiln_j / ", kTile / kTileRows, " * ", kTile, ";");
    w_.Linef("const idx_t ", yn, " = kiln_y0 + kiln_i;");
    w_.Linef("const idx_t ", xn, " = kiln_x0 + kiln_xl;");
    if (!cond.empty()) w_.Open(absl::StrCat("if (", cond, ")"));
    tiled_ = true;
    PushScope();
    for (const Stmt& st : k_.body) EmitCudaStmt(st);
    PopScope();
    tiled_ = false;
    if (!cond.empty()) w_.Close();
    w_.Close();
    w_.Line("__syncthreads();  // the tiles are refilled next step");
    w_.Close();
    return true;
  }

  // ---- rows ----
  bool IsColumnReduction() const {
    if (k_.outer.empty()) return false;
    const Var last_outer{VarKind::kOuter, static_cast<int32_t>(k_.outer.size()) - 1};
    const Var last_reduce{VarKind::kReduce, static_cast<int32_t>(k_.reduce.size()) - 1};
    bool column = false;
    for (const kernel::Phase& p : k_.phases) {
      for (const ExprNode* l : LoadsOf(p.stmts)) {
        if (!l->args.empty()) continue;
        if (ConstStride(l->index, last_reduce) == absl::optional<int64_t>(1)) return false;
        if (ConstStride(l->index, last_outer) == absl::optional<int64_t>(1)) column = true;
      }
    }
    return column;
  }

  void EmitRows() {
    const int k = static_cast<int>(k_.outer.size());
    const int m = static_cast<int>(k_.reduce.size());
    const Size rows = Product(k_.outer);
    const Size total = Product(k_.reduce);
    const absl::optional<int64_t> total_c = total.AsConst();
    launch_.work = rows;
    int max_state = 0;
    for (const Accumulator& a : k_.accumulators) max_state = std::max(max_state, StateBytes(a));
    if (IsColumnReduction()) {
      // Enough threads per point (8..32) that the blocks fill every SM: a column reduction has
      // few points, and each thread's loads are strided.
      launch_.layout = CudaLayout::kColumn;
      group_ = 32;
      if (const absl::optional<int64_t> points = rows.AsConst()) {
        const int64_t blocks = (*points + kColumnPoints - 1) / kColumnPoints;
        group_ = 8;
        while (group_ < 32 && blocks * kColumnPoints * group_ < int64_t{num_sms_} * kThreadsPerSm) {
          group_ *= 2;
        }
      }
      launch_.block = kColumnPoints * group_;
      launch_.work_per_block = kColumnPoints;
      launch_.max_grid = int64_t{num_sms_} * (kThreadsPerSm / launch_.block) * 4;
      smem_bytes_ = launch_.block * max_state;
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
      default:
        w_.Linef("const int kiln_lane = threadIdx.x / ", kColumnPoints, ";");
        w_.Open(absl::StrCat("for (idx_t kiln_p = static_cast<idx_t>(blockIdx.x) * ", kColumnPoints,
                             "; kiln_p < ", rows_code, "; kiln_p += static_cast<idx_t>(gridDim.x) * ",
                             kColumnPoints, ")"));
        w_.Linef("const idx_t kiln_u = kiln_p + threadIdx.x % ", kColumnPoints, ";");
        w_.Linef("const bool kiln_active = kiln_u < ", rows_code, ";");
        break;
    }
    if (k > 0) EmitDecompose("kiln_u", k);
    // A vector path along r0 when the reduction space is one-dimensional.
    VecPlan plan;
    if (launch_.layout != CudaLayout::kColumn && m == 1) {
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
    if (plan.width > 1) {
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
    w_.Close();
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

  struct RowLoad {
    int first_phase = 0;
    int phases = 0;                  // phases that read it; > 1: it recurs (the row cache's arrays)
    const ExprNode* node = nullptr;  // the last of its nodes
  };

  // The unmasked loads along the reduction, by AccessKey.
  std::map<std::string, RowLoad> RowLoads() const {
    std::map<std::string, RowLoad> loads;
    for (size_t p = 0; p < k_.phases.size(); ++p) {
      std::set<std::string> here;
      for (const ExprNode* l : LoadsOf(k_.phases[p].stmts)) {
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

  // Loads along the reduction that recur in a later phase (the row cache's arrays); with
  // `element_bytes`, the bytes of one element of each of them, summed.
  int RecurringLoads(int64_t* element_bytes = nullptr) const {
    int n = 0;
    for (const auto& [key, l] : RowLoads()) {
      if (l.phases < 2) continue;
      ++n;
      if (element_bytes != nullptr) *element_bytes += kernel::ScalarTypeBytes(l.node->buffer.dtype);
    }
    return n;
  }

  // One row (outer point) with a vector width of plan.width along r0.
  // cache = false: no register cache and no two-pass statistics (loads read in every phase).
  void EmitRow(const VecPlan& plan, bool cache = true) {
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
    for (const Accumulator& a : k_.accumulators) {
      const std::string t = ValueType(a.dtype);
      if (const char* st = AccStruct(a.kind)) {
        w_.Linef("kiln_cuda::", st, "<", t, "> acc", a.id, ";");
      } else if (a.kind == AccKind::kSum) {
        w_.Linef(t, " acc", a.id, " = 0;");
      } else if (a.kind == AccKind::kProd) {
        w_.Linef(t, " acc", a.id, " = 1;");
      } else {
        w_.Linef(t, " acc", a.id, " = kiln_cuda::", a.kind == AccKind::kMax ? "lowest" : "highest",
                 "<", t, ">();");
      }
    }
    // Registers caching loads that recur in later phases (static lengths only).
    cache_.clear();
    int64_t chunks = 0;
    if (total_c && !column) {
      // Shifted rows: chunks over [-kiln_sh, total), up to width - 1 elements more.
      chunks = (*total_c + (shifted_ ? width - 1 : 0) + int64_t{group_} * width - 1) /
               (int64_t{group_} * width);
      const std::map<std::string, RowLoad> loads = RowLoads();
      int64_t values = 0;
      for (const auto& [key, l] : loads) values += l.phases > 1 && !shared ? chunks * width : 0;
      // At most half of the registers a thread of this block size may have.
      const int64_t limit = std::min<int64_t>(cuda_.max_cached_values, 65536 / launch_.block / 2);
      if (values > limit || !cache) values = 0;
      if (shared && cache) {
        // kSharedRow: each recurring load's slots in dynamic shared memory, one after another
        // (each a multiple of 32 bytes: the block is a multiple of 32 threads). Vector rows: slots
        // of a chunk's Vec<T, width>, chunk-major ([kiln_e * block + thread]), filled by
        // asynchronous copies before the load's first phase (EmitSharedFill).
        smem_vec_ = width > 1;
        int64_t offset = 0;
        for (const auto& [key, l] : loads) {
          if (l.phases < 2) continue;
          const ScalarType type = l.node->type;
          CacheEntry e{absl::StrCat("kiln_c", cache_.size()), l.first_phase, l.node};
          const std::string t = smem_vec_ ? absl::StrCat("kiln_cuda::Vec<", SmemType(type), ", ", width, ">")
                                          : SmemType(type);
          w_.Linef(t, "* const ", e.name, " = reinterpret_cast<", t, "*>(kiln_dsmem + ", offset, ");");
          smem_arrays_[e.name] = type;
          cache_[key] = e;
          offset += SmemBytes(type) * chunks * width * group_;
        }
        launch_.shared_bytes = std::max<int>(launch_.shared_bytes, static_cast<int>(offset));
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
      std::map<int, int> folds;
      for (const kernel::Phase& p : k_.phases) {
        for (const Stmt& s : p.stmts) folds[s.acc.id] += s.kind == StmtKind::kAccumulate;
      }
      for (size_t pi = 0; pi < k_.phases.size(); ++pi) {
        for (const Stmt& s : k_.phases[pi].stmts) {
          if (s.kind != StmtKind::kAccumulate || folds[s.acc.id] != 1) continue;
          if (s.acc.kind != AccKind::kOnlineSoftmax && s.acc.kind != AccKind::kWelford) continue;
          if (!kernel::IsFloatType(s.acc.dtype)) continue;
          if (!cache) continue;
          TwoPass tp;
          tp.phase = static_cast<int>(pi);
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
      launch_.cached_values = std::max<int>(launch_.cached_values, static_cast<int>(values));
    }
    std::string total_code = SizeCode(total);
    for (size_t p = 0; p < k_.phases.size(); ++p) {
      phase_ = static_cast<int>(p);
      const std::vector<Stmt>& stmts = k_.phases[p].stmts;
      w_.Linef("// phase ", p);
      if (smem_vec_) EmitSharedFill(plan, chunks, *total_c);
      int opened = 0;
      if (column) {
        w_.Open("if (kiln_active)");
        w_.Raw("#pragma unroll 8");
        w_.Open(absl::StrCat("for (idx_t kiln_r = kiln_lane; kiln_r < ", total_code, "; kiln_r += ",
                             group_, ")"));
        opened = 2;
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
      if (shifted_) {
        // EmitShiftedChunk did the chunk.
      } else if (width > 1) {
        EmitVectorLanes(stmts, plan, Var{VarKind::kReduce, 0}, "kiln_rb",
                        [&](const std::string& value) {
                          w_.Linef("const idx_t kiln_r = ", value, ";");
                          w_.Line("const idx_t r0 = kiln_r;");
                        });
      } else {
        if (!column) w_.Line("const idx_t kiln_r = kiln_rb;");
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
    smem_vec_ = false;
    if (!k_.body.empty()) {
      w_.Open(column ? "if (kiln_active && kiln_lane == 0)" : "if (kiln_lane == 0)");
      PushScope();
      for (const Stmt& s : k_.body) EmitCudaStmt(s);
      PopScope();
      w_.Close();
    }
    PopScope();
  }

  // kSharedRow's vector rows: fills the slots of the cached loads first read in this phase before
  // it. A chunk within the row moves by one asynchronous copy (cp.async) per load, straight into
  // its slot; the row's first and last chunks of shifted rows go element by element (lanes outside
  // the row are left as they are: every read of them is skipped). A thread fills only the slots it
  // reads back later (chunk-major, its own), so no barrier: only a wait for its copies.
  void EmitSharedFill(const VecPlan& plan, int64_t chunks, int64_t total) {
    std::vector<const CacheEntry*> fill;
    for (const auto& [key, e] : cache_) {
      if (e.first_phase == phase_ && smem_arrays_.count(e.name)) fill.push_back(&e);
    }
    if (fill.empty()) return;
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
      w_.Open(absl::StrCat("else if (kiln_rb < ", total, ")"));
      for (int j = 0; j < width; ++j) {
        w_.Open("");
        w_.Linef("const idx_t kiln_r = kiln_rb + ", j, ";");
        w_.Open(absl::StrCat("if (kiln_r >= 0 && kiln_r < ", total, ")"));
        w_.Line("const idx_t r0 = kiln_r;");
        for (const CacheEntry* e : fill) scalar(*e, j);
        w_.Close();
        w_.Close();
      }
      w_.Close();
    }
    w_.Close();
    w_.Line("kiln_cuda::cp_async_wait_all();");
  }

  // A chunk of a shifted row (PlanShiftedVector) from kiln_rb = its first element (-kiln_sh for
  // the row's first chunk): one vector per access when the chunk lies within the row, else a
  // scalar lane per element that does (the row's first and last chunks).
  void EmitShiftedChunk(const std::vector<Stmt>& stmts, const VecPlan& plan, int64_t total) {
    const int width = plan.width;
    w_.Open(absl::StrCat("if (kiln_rb >= 0 && kiln_rb + ", width, " <= ", total, ")"));
    EmitVectorLanes(stmts, plan, Var{VarKind::kReduce, 0}, "kiln_rb", [&](const std::string& value) {
      w_.Linef("const idx_t kiln_r = ", value, ";");
      w_.Line("const idx_t r0 = kiln_r;");
    });
    w_.Close();
    w_.Open(absl::StrCat("else if (kiln_rb < ", total, ")"));
    for (int j = 0; j < width; ++j) {
      w_.Open("");
      w_.Linef("const idx_t kiln_r = kiln_rb + ", j, ";");
      w_.Open(absl::StrCat("if (kiln_r >= 0 && kiln_r < ", total, ")"));
      w_.Line("const idx_t r0 = kiln_r;");
      EmitLane(j, stmts);
      w_.Close();
      w_.Close();
    }
    w_.Close();
  }

  // r0..r{m-1} from the flat kiln_r (row-major). The remainder is written as rr - q * e, not
  // rr % e: NVRTC 13.0 (cicc) crashes (SIGSEGV) on `%` here in some warp-per-row kernels (e.g.
  // layer norm backward's weight gradient), and the quotient form costs nothing.
  void EmitReduceDecompose() {
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
    // Online softmax over a row cache whose later phases read the load only inside
    // exp(x - max): pass B overwrites the cache with those exps, which these nodes then read.
    std::vector<const ExprNode*> exp_nodes;
  };

  // The unmasked load whose register value `e` is exactly: `e` itself, or an f16/bf16 load
  // widened to f32 (both are held as the same float, so a row cache of the load serves the cast);
  // nullptr otherwise.
  // Plans the exp reuse of every online-softmax two-pass accumulator that may have it.
  void PlanExpReuse() {
    for (auto& [id, tp] : two_pass_) {
      if (!tp.reuses_cache) continue;
      auto smem = smem_arrays_.find(tp.array);
      if (smem != smem_arrays_.end() && kernel::IsHalfType(smem->second)) continue;  // 16-bit slots
      bool alone = true;
      for (const auto& [other, o] : two_pass_) alone &= other == id || o.array != tp.array;
      if (!alone) continue;
      bool softmax = false;
      for (const Accumulator& a : k_.accumulators) {
        softmax |= a.id == id && a.kind == AccKind::kOnlineSoftmax;
      }
      if (!softmax) continue;
      absl::optional<std::vector<const ExprNode*>> nodes = ExpShiftNodes(k_, tp.phase + 1, id, tp.key);
      if (nodes && !nodes->empty()) tp.exp_nodes = std::move(*nodes);
    }
  }

  // In a later phase's element scope: the exp(x - max) nodes read the overwritten cache.
  void SeedScope() {
    for (const auto& [id, tp] : two_pass_) {
      if (phase_ <= tp.phase) continue;
      std::string slot = Slot(tp.array);
      if (smem_vec_ && plan_ != nullptr && lane_ >= 0) {
        // kSharedRow's vector rows: the chunk's vector, already read from shared memory.
        auto vec = plan_->loads.find(tp.key);
        if (vec != plan_->loads.end()) slot = absl::StrCat(vec->second.name, ".v[", lane_, "]");
      }
      for (const ExprNode* e : tp.exp_nodes) scopes_.back()[e] = slot;
    }
  }

  // The register of `array` for the current chunk and vector lane (kSharedRow: its shared-memory
  // slot, slot-major over the block's threads).
  std::string Slot(const std::string& array) const {
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

  // The value in Slot(array): f16/bf16 shared slots widened.
  std::string SlotValue(const std::string& array) const {
    auto smem = smem_arrays_.find(array);
    if (smem == smem_arrays_.end() || !kernel::IsHalfType(smem->second)) return Slot(array);
    Buffer b;
    b.dtype = smem->second;
    return Widen(b, Slot(array));
  }
  // A shared row cache slot's type and bytes: f16/bf16 as bit patterns.
  std::string SmemType(ScalarType t) const { return kernel::IsHalfType(t) ? "uint16_t" : ValueType(t); }
  static int64_t SmemBytes(ScalarType t) { return kernel::IsHalfType(t) ? 2 : kernel::ScalarTypeBytes(t); }

  // Pass B of the two-pass accumulators folded in `stmts`, and the all-reduces of every
  // accumulator the phase folded.
  void EmitAllReduces(const std::vector<Stmt>& stmts, int64_t chunks, int64_t total) {
    auto allreduce = [&](const std::string& value, const char* op) {
      switch (launch_.layout) {
        case CudaLayout::kWarpPerRow:
          w_.Linef(value, " = kiln_cuda::warp_allreduce(", value, ", ", op, ");");
          break;
        case CudaLayout::kBlockPerRow:
        case CudaLayout::kSharedRow:
          w_.Linef(value, " = kiln_cuda::block_allreduce<", launch_.block / 32, ">(", value, ", ", op,
                   ", kiln_smem);");
          break;
        case CudaLayout::kClusterRow:
          w_.Linef(value, " = kiln_cuda::cluster_allreduce<", launch_.block / 32, ", ",
                   launch_.cluster, ">(", value, ", ", op, ", kiln_smem, kiln_pub, &kiln_parity);");
          break;
        default:
          w_.Linef(value, " = kiln_cuda::column_allreduce(", value, ", ", op, ", kiln_smem, ",
                   kColumnPoints, ");");
          break;
      }
    };
    std::set<int> done;
    for (const Stmt& s : stmts) {
      if (s.kind != StmtKind::kAccumulate || !done.insert(s.acc.id).second) continue;
      const std::string acc = absl::StrCat("acc", s.acc.id);
      auto two = two_pass_.find(s.acc.id);
      if (two == two_pass_.end()) {
        allreduce(acc, ReduceOp(s.acc.kind));
        continue;
      }
      const std::string t = ValueType(s.acc.dtype);
      const bool softmax = s.acc.kind == AccKind::kOnlineSoftmax;
      if (softmax) {
        allreduce(acc + ".max", "kiln_cuda::MaxOp()");
      } else {
        allreduce(acc + ".mean", "kiln_cuda::SumOp()");
        w_.Linef(acc, ".mean = ", acc, ".mean / static_cast<", t, ">(", total, ");");
      }
      w_.Open("");
      if (softmax && two->second.exp_nodes.empty()) {
        // An all -inf row: max -inf, every exp(-inf - 0) = 0, so sum 0 as the online rule.
        w_.Linef("const ", t, " kiln_m = ", acc, ".max == -kiln_cuda::inf<", t, ">() ? ", t,
                 "(0) : ", acc, ".max;");
      }
      // Shared slots need no constant index: a loop, not chunks x lanes of straight code.
      w_.Raw(smem_arrays_.count(two->second.array) ? "#pragma unroll 4" : "#pragma unroll");
      w_.Open(absl::StrCat("for (int kiln_e = 0; kiln_e < ", chunks, "; ++kiln_e)"));
      const bool guard = !shifted_ && total % (int64_t{group_} * width_) != 0;
      if (guard) {
        w_.Open(absl::StrCat("if ((static_cast<idx_t>(kiln_e) * ", group_, " + kiln_lane)",
                             width_ == 1 ? "" : absl::StrCat(" * ", width_), " < ", total, ")"));
      }
      auto smem = smem_arrays_.find(two->second.array);
      const bool local = smem_vec_ && smem != smem_arrays_.end();
      if (local) {
        // The chunk's vector read once (and written back once with the exps).
        const std::string slot = absl::StrCat(smem->first, "[kiln_e * ", group_, " + kiln_lane]");
        w_.Linef(two->second.exp_nodes.empty() ? "const " : "", "kiln_cuda::Vec<",
                 SmemType(smem->second), ", ", width_, "> kiln_x = ", slot, ";");
        local_vec_array_ = smem->first;
        local_vec_ = "kiln_x";
      }
      for (int j = 0; j < width_; ++j) {
        lane_ = width_ == 1 ? -1 : j;
        if (shifted_) {
          // Only the lanes within the row (its first and last chunks have others).
          w_.Open("");
          w_.Linef("const idx_t kiln_r = (static_cast<idx_t>(kiln_e) * ", group_, " + kiln_lane) * ",
                   width_, " + ", j, " - kiln_sh;");
          w_.Open(absl::StrCat("if (kiln_r >= 0 && kiln_r < ", total, ")"));
        }
        const std::string x = SlotValue(two->second.array);
        if (softmax && !two->second.exp_nodes.empty()) {
          w_.Linef(x, " = kiln_cuda::exp(", x, " - ", acc, ".max);");  // not 16-bit (PlanExpReuse)
          w_.Linef(acc, ".sum += ", x, ";");
        } else if (softmax) {
          w_.Linef(acc, ".sum += kiln_cuda::exp(", x, " - kiln_m);");
        } else {
          w_.Linef("const ", t, " kiln_d", j, " = ", x, " - ", acc, ".mean;");
          w_.Linef(acc, ".m2 += kiln_d", j, " * kiln_d", j, ";");
        }
        if (shifted_) {
          w_.Close();
          w_.Close();
        }
      }
      lane_ = -1;
      if (local) {
        if (!two->second.exp_nodes.empty()) {
          w_.Linef(smem->first, "[kiln_e * ", group_, " + kiln_lane] = kiln_x;");
        }
        local_vec_array_.clear();
        local_vec_.clear();
      }
      if (guard) w_.Close();
      w_.Close();
      w_.Close();
      if (softmax) {
        allreduce(acc + ".sum", "kiln_cuda::SumOp()");
        if (!two->second.exp_nodes.empty()) {
          // The exps are exp(x - max) exactly as later phases compute them (NaN for an all -inf
          // row); the online rule's sum of that row is 0.
          w_.Linef("if (", acc, ".max == -kiln_cuda::inf<", t, ">()) ", acc, ".sum = ", t, "(0);");
        }
      } else {
        allreduce(acc + ".m2", "kiln_cuda::SumOp()");
        w_.Linef(acc, ".count = static_cast<", t, ">(", total, ");");
      }
    }
  }

  const CudaEmitOptions cuda_;
  int num_sms_ = 132;
  CudaLongRows long_rows_ = CudaLongRows::kAuto;  // this kernel's (options.kernel_long_rows)
  int64_t row_grid_ = 0;  // kBlockPerRow: the grid cap of uncached long rows (0: none)
  int shared_blocks_per_sm_ = 1;  // kSharedRow: blocks per SM by shared memory (launch bounds)
  std::map<std::string, ScalarType> smem_arrays_;  // kSharedRow: cache arrays in shared memory
  bool smem_vec_ = false;  // kSharedRow's vector rows: Vec slots filled by EmitSharedFill
  std::string local_vec_array_, local_vec_;  // pass B: a shared array's chunk read into a local
  CudaLaunch launch_;
  int group_ = 1;        // threads per row
  int smem_bytes_ = 0;   // static shared memory for the all-reduce
  int pub_offset_ = 0;   // kClusterRow: where the published slots start in kiln_smem
  int width_ = 1;        // vector width of the row path being emitted
  bool shifted_ = false;  // the row path being emitted has shifted vectors (PlanShiftedVector)
  int lane_ = -1;        // the vector lane being emitted, or -1
  int phase_ = -1;       // the phase being emitted, or -1
  const VecPlan* plan_ = nullptr;
  std::map<std::string, CacheEntry> cache_;  // by AccessKey
  std::map<int, TwoPass> two_pass_;          // by accumulator id, in the row being emitted
  std::map<std::string, std::string> tiles_;  // staged loads of a tiled kernel, by AccessKey
  bool tiled_ = false;                        // emitting the compute step of a tiled kernel
  std::set<std::string> filled_;             // cache slots written in the current lane
};

// Pointwise kernels whose stores are all contiguous along an outer dim other than the innermost
// (a torch output that follows a transposed input's layout: `a.t() + b` is column-major): the
// same kernel with that dim moved innermost, so that threads (and vectors, and the y/x tiles of
// kTiled) run along the stores. Every point of a pointwise kernel is independent, so the order
// of the outer loops is free; the permuted kernel is only emitted, never printed or keyed.
class OuterPermuter {
 public:
  // new_of_old[i]: the position of old outer dim i.
  explicit OuterPermuter(std::vector<int32_t> new_of_old) : new_of_old_(std::move(new_of_old)) {}

  Index Map(const Index& index) const {
    std::vector<IndexTerm> terms;
    for (const IndexTerm& t : index.terms) terms.push_back(IndexTerm{MapVar(t.var), t.stride});
    return kernel::MakeIndex(index.offset, std::move(terms));
  }

  Expr Map(const Expr& e) {
    auto it = memo_.find(e.get());
    if (it != memo_.end()) return it->second;
    auto n = std::make_shared<ExprNode>(*e);
    if (n->kind == ExprKind::kLoad) n->index = Map(n->index);
    if (n->kind == ExprKind::kLoopVar) n->var = MapVar(n->var);
    for (Expr& a : n->args) a = Map(a);
    Expr out = n;
    memo_[e.get()] = out;
    return out;
  }

 private:
  Var MapVar(const Var& v) const {
    return v.kind == VarKind::kOuter ? Var{VarKind::kOuter, new_of_old_[v.index]} : v;
  }
  std::vector<int32_t> new_of_old_;
  std::map<const ExprNode*, Expr> memo_;  // keeps shared subexpressions shared (emitter CSE)
};

absl::optional<Kernel> StoreOrderedPointwise(const Kernel& k) {
  const int n = static_cast<int>(k.outer.size());
  if (!k.is_pointwise() || n < 2) return absl::nullopt;
  int dim = -1;
  for (const Stmt& s : k.body) {
    if (s.kind != StmtKind::kStore) continue;
    int d = -1;
    for (const IndexTerm& t : s.index.terms) {
      if (t.var.kind == VarKind::kOuter && t.stride.AsConst() == absl::optional<int64_t>(1) &&
          !k.outer[t.var.index].is_const(1)) {
        d = t.var.index;
      }
    }
    if (d < 0 || (dim >= 0 && d != dim)) return absl::nullopt;
    dim = d;
  }
  if (dim < 0 || dim == n - 1) return absl::nullopt;
  std::vector<int32_t> new_of_old(n);
  for (int i = 0, next = 0; i < n; ++i) new_of_old[i] = i == dim ? n - 1 : next++;
  OuterPermuter perm(new_of_old);
  Kernel out = k;
  for (int i = 0; i < n; ++i) out.outer[new_of_old[i]] = k.outer[i];
  for (Stmt& s : out.body) {
    s.index = perm.Map(s.index);
    s.value = perm.Map(s.value);
  }
  return out;
}

}  // namespace

absl::StatusOr<CudaSource> EmitCudaSource(absl::Span<const Kernel> kernels,
                                          const CudaEmitOptions& options) {
  if (options.pointwise_block <= 0 || options.pointwise_block % 32 != 0 ||
      options.pointwise_block > 1024 || options.pointwise_waves <= 0) {
    return absl::InvalidArgumentError("cuda emitter: bad options");
  }
  CudaSource out;
  CodeWriter w;
  w.Line("// Generated by kiln's CUDA emitter. Do not edit.");
  w.Line("// extern \"C\" __global__ void kiln_kernel_<i>(b0, b1, ..., int64_t n0, ...);");
  if (options.include_prelude) w.Raw(kiln::kernels::CudaPrelude());
  std::string source = w.Take();
  out.prelude = source;
  for (size_t i = 0; i < kernels.size(); ++i) {
    const absl::optional<Kernel> permuted = StoreOrderedPointwise(kernels[i]);
    CudaKernelEmitter emitter(permuted ? *permuted : kernels[i], static_cast<int>(i), options);
    absl::StatusOr<std::string> fn = emitter.Emit();
    if (!fn.ok()) {
      return absl::Status(fn.status().code(),
                          absl::StrCat("kernel ", i, ": ", fn.status().message()));
    }
    absl::StrAppend(&source, "\n", *fn);
    out.symbols.push_back(CpuKernelSymbol(static_cast<int>(i)));
    out.kernel_sources.push_back(*std::move(fn));
    out.launches.push_back(emitter.launch());
  }
  out.source = std::move(source);
  return out;
}

}  // namespace kiln::codegen
