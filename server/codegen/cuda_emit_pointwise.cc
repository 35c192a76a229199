// CudaKernelEmitter (cuda_kernel_emitter.h): pointwise kernels. kPointwise: a grid-stride loop
// over the points, vectorized along the innermost dim; kTiled: loads strided along the innermost
// dim staged through shared tiles.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/optional.h"
#include "server/codegen/cuda_emitter.h"
#include "server/codegen/cuda_kernel_emitter.h"
#include "server/codegen/exp_reuse.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::codegen::internal {

namespace {

constexpr int kTile = 32;      // kTiled: a tile of kTile (y) x kTileX (x) points per block step
constexpr int kTileX = 64;     // (8 loads in flight per thread)
constexpr int kTileShift = 5;  // log2(kTile)
constexpr int kTileRows = 8;   // kTiled: block = kTile * kTileRows threads
constexpr int64_t kMaxUnrolledPoints = 4;  // kPointwise: points a thread computes per unit (UnrolledPointDims)

}  // namespace

std::string CudaKernelEmitter::GlobalThread() const {
  return "static_cast<idx_t>(blockIdx.x) * static_cast<idx_t>(blockDim.x) + "
         "static_cast<idx_t>(threadIdx.x)";
}

void CudaKernelEmitter::EmitPointwise() {
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
  const VecPlan plan = PlanVector(k_.body, x, 8, /*masked_loads=*/true);
  const int width = plan.width;
  const std::vector<int> unrolled = UnrolledPointDims();
  int64_t points_per_unit = 1;
  for (int d : unrolled) points_per_unit *= *k_.outer[d].AsConst();
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
  for (int i = 0; i < last; ++i) {
    if (std::find(unrolled.begin(), unrolled.end(), i) == unrolled.end()) rows = rows * k_.outer[i];
  }
  launch_.work = rows * k_.outer[last];
  w_.Linef("const idx_t kiln_units = ",
           rows.is_const(1) ? "kiln_chunks" : absl::StrCat(SizeCode(rows), " * kiln_chunks"), ";");
  w_.Open(absl::StrCat("for (idx_t kiln_u = ", GlobalThread(),
                       "; kiln_u < kiln_units; kiln_u += static_cast<idx_t>(gridDim.x) * "
                       "static_cast<idx_t>(blockDim.x))"));
  if (last > 0) {
    w_.Line("const idx_t kiln_c = kiln_u % kiln_chunks;");
    EmitDecompose("kiln_u / kiln_chunks", last, unrolled);
  } else {
    w_.Line("const idx_t kiln_c = kiln_u;");
  }
  // The body once per point of the unrolled dims, each in its own scope with their indices as
  // constants.
  auto each_point = [&](absl::FunctionRef<void()> body) {
    for (int64_t p = 0; p < points_per_unit; ++p) {
      if (!unrolled.empty()) {
        w_.Open("");
        PushScope();
        int64_t rest = p;
        for (size_t j = unrolled.size(); j-- > 0;) {
          const int64_t e = *k_.outer[unrolled[j]].AsConst();
          w_.Linef("const idx_t o", unrolled[j], " = ", rest % e, ";");
          rest /= e;
        }
      }
      body();
      if (!unrolled.empty()) {
        PopScope();
        w_.Close();
      }
    }
  };
  const std::string xn = kernel::VarName(x);
  if (width == 1) {
    w_.Linef("const idx_t ", xn, " = kiln_c;");
    each_point([&] {
      PushScope();
      for (const Stmt& s : k_.body) EmitCudaStmt(s);
      PopScope();
    });
    w_.Close();
    return;
  }
  w_.Linef("const idx_t kiln_base = kiln_c * ", width, ";");
  w_.Open(absl::StrCat("if (kiln_vec && kiln_base + ", width, " <= ", inner, ")"));
  each_point([&] {
    EmitVectorLanes(k_.body, plan, x, "kiln_base", [&](const std::string& value, int) {
      w_.Linef("const idx_t ", xn, " = ", value, ";");
    });
  });
  w_.Close();
  w_.Open("else");
  w_.Linef("const idx_t kiln_end = kiln_base + ", width, " < ", inner, " ? kiln_base + ", width,
           " : ", inner, ";");
  w_.Open(absl::StrCat("for (idx_t ", xn, " = kiln_base; ", xn, " < kiln_end; ++", xn, ")"));
  each_point([&] {
    PushScope();
    for (const Stmt& s : k_.body) EmitCudaStmt(s);
    PopScope();
  });
  w_.Close();
  w_.Close();
  w_.Close();
}

std::vector<int> CudaKernelEmitter::UnrolledPointDims() const {
  // Outer dims but the innermost, of static extent 2 to 4 (together at most kMaxUnrolledPoints),
  // whose index the body reads as a value: a stride split's phase (max_pool2d's backward tests
  // which windows an input element lies in, with [n, h / 2, h % 2, w / 2, w % 2, c] as its
  // outer dims). A thread computes all their points, each with those indices constants, so the
  // compiler drops the tests that fail (a 3 x 3 window of stride 2: 9 candidates a point -> 9 for
  // all 4) and loads what the points share once.
  std::vector<int> dims;
  int64_t points = 1;
  for (int i = 0; i + 1 < static_cast<int>(k_.outer.size()); ++i) {
    const absl::optional<int64_t> e = k_.outer[i].AsConst();
    if (!e || *e < 2 || *e > 4 || points * *e > kMaxUnrolledPoints) continue;
    if (!ReadsVarValue(k_.body, Var{VarKind::kOuter, i})) continue;
    dims.push_back(i);
    points *= *e;
  }
  return dims;
}

bool CudaKernelEmitter::EmitTiled() {
  const int k = static_cast<int>(k_.outer.size());
  if (k < 2 || !cuda_.tile) return false;
  const Var x{VarKind::kOuter, k - 1}, y{VarKind::kOuter, k - 2};
  const absl::optional<int64_t> xs = k_.outer[k - 1].AsConst(), ys = k_.outer[k - 2].AsConst();
  if (!xs || !ys || *xs < kTile || *ys < kTile) return false;
  tiles_.clear();
  // Loads strided along x and unit-stride along y, staged once per access. A masked one (a cat's
  // operand, a padded window) is staged under its mask when the mask reads no memory and every
  // load of that access has that same mask (or none has one): the tile then holds what each of
  // them reads, zero where the mask fails.
  std::map<std::string, std::vector<const ExprNode*>> by_access;
  std::vector<std::string> order;
  for (const ExprNode* l : LoadsOf(k_.body)) {
    const std::string key = AccessKey(l->buffer, l->index);
    if (by_access[key].empty()) order.push_back(key);
    by_access[key].push_back(l);
  }
  std::vector<const ExprNode*> staged;
  for (const std::string& key : order) {
    const std::vector<const ExprNode*>& loads = by_access[key];
    const ExprNode* l = loads.front();
    const absl::optional<int64_t> sx = ConstStride(l->index, x), sy = ConstStride(l->index, y);
    if (sy != absl::optional<int64_t>(1) || !sx || *sx == 0 || *sx == 1) continue;
    const kernel::Expr mask = l->args.empty() ? nullptr : l->args[0];
    const bool same_mask = std::all_of(loads.begin(), loads.end(), [&](const ExprNode* o) {
      return (o->args.empty() ? nullptr : o->args[0]) == mask;
    });
    if (!same_mask || (mask != nullptr && ReadsMemory(mask))) continue;
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
  PushScope();  // the masks' values here are the staged point's, not the computed one's
  for (const ExprNode* l : staged) {
    std::string value = LoadCode(l->buffer, IndexCode(l->index));
    if (!l->args.empty()) {
      value = absl::StrCat(ExprCode(l->args[0]), " ? ", value, " : ", ValueType(l->type), "(0)");
    }
    w_.Linef(tiles_[AccessKey(l->buffer, l->index)], "[kiln_i][kiln_lane] = ", value, ";");
  }
  PopScope();
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

}  // namespace kiln::codegen::internal
