#include "server/compiler/test_executor.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kiln_runtime.h"
#include "server/lower/gemm_step.h"

namespace kiln::compiler::testing {

namespace v1 = ::kiln::v1;

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

int64_t HostTensor::itemsize() const {
  switch (dtype) {
    case v1::DTYPE_FLOAT64: case v1::DTYPE_INT64: return 8;
    case v1::DTYPE_FLOAT32: case v1::DTYPE_INT32: return 4;
    case v1::DTYPE_FLOAT16: case v1::DTYPE_BFLOAT16: return 2;
    default: return 1;
  }
}

namespace {
float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint16_t FloatToBf16(float f) {  // round to nearest even
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}
int64_t ElementOffset(const HostTensor& t, int64_t k) {
  int64_t off = 0;
  for (int d = static_cast<int>(t.sizes.size()) - 1; d >= 0; --d) {
    off += (k % t.sizes[d]) * t.strides[d];
    k /= t.sizes[d];
  }
  return off;
}
}  // namespace

double HostTensor::Get(int64_t k) const {
  const uint8_t* p = data() + ElementOffset(*this, k) * itemsize();
  switch (dtype) {
    case v1::DTYPE_FLOAT32: { float f; std::memcpy(&f, p, 4); return f; }
    case v1::DTYPE_FLOAT64: { double f; std::memcpy(&f, p, 8); return f; }
    case v1::DTYPE_INT64: { int64_t i; std::memcpy(&i, p, 8); return static_cast<double>(i); }
    case v1::DTYPE_INT32: { int32_t i; std::memcpy(&i, p, 4); return i; }
    case v1::DTYPE_BFLOAT16: { uint16_t h; std::memcpy(&h, p, 2); return Bf16ToFloat(h); }
    default: return *p;
  }
}

void HostTensor::Set(int64_t k, double v) {
  uint8_t* p = data() + ElementOffset(*this, k) * itemsize();
  switch (dtype) {
    case v1::DTYPE_FLOAT32: { float f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
    case v1::DTYPE_FLOAT64: std::memcpy(p, &v, 8); break;
    case v1::DTYPE_INT64: { int64_t i = static_cast<int64_t>(v); std::memcpy(p, &i, 8); break; }
    case v1::DTYPE_INT32: { int32_t i = static_cast<int32_t>(v); std::memcpy(p, &i, 4); break; }
    case v1::DTYPE_BFLOAT16: { uint16_t h = FloatToBf16(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
    default: *p = static_cast<uint8_t>(v != 0); break;
  }
}

HostTensor Empty(v1::DType dtype, std::vector<int64_t> sizes, std::vector<int64_t> strides) {
  HostTensor t;
  t.dtype = dtype;
  t.sizes = std::move(sizes);
  if (strides.empty()) {
    strides.assign(t.sizes.size(), 1);
    for (int d = static_cast<int>(t.sizes.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * std::max<int64_t>(t.sizes[d + 1], 1);
  }
  t.strides = std::move(strides);
  int64_t span = 1;
  for (size_t d = 0; d < t.sizes.size(); ++d) span += (t.sizes[d] - 1) * t.strides[d];
  t.storage = std::make_shared<std::vector<uint8_t>>(span * t.itemsize() + 64, 0xCD);
  return t;
}

HostTensor FromMeta(const v1::TensorMeta& meta) {
  std::vector<int64_t> sizes, strides;
  for (const auto& s : meta.sizes()) sizes.push_back(s.constant());
  for (const auto& s : meta.strides()) strides.push_back(s.constant());
  return Empty(meta.dtype(), sizes, strides);
}

std::vector<double> Values(const HostTensor& t) {
  std::vector<double> r;
  for (int64_t k = 0; k < t.numel(); ++k) r.push_back(t.Get(k));
  return r;
}

namespace {

// A LibraryStep "cublasLt.matmul" computed naively (f64 accumulation, one rounding to the dtype).
absl::Status RunGemm(const v1::LibraryStep& step, const std::vector<HostTensor>& values, const std::vector<bool>& ready) {
  namespace l = ::kiln::lower;
  if (absl::Status s = l::CheckGemmStep(step); !s.ok()) return s;
  for (int i = 0; i < 4; ++i) {
    const int32_t a = step.args(i);
    if (a >= static_cast<int32_t>(values.size()) || (a >= 0 && !ready[a])) {
      return absl::InternalError(absl::StrCat("library step arg v", a, " not ready"));
    }
  }
  auto p = [&](int i) { return step.int_params(i); };
  const int64_t batch = p(l::kGemmBatch), m = p(l::kGemmM), n = p(l::kGemmN), k = p(l::kGemmK);
  const auto dtype = static_cast<v1::DType>(p(l::kGemmDType));
  auto view = [&](int arg, std::vector<int64_t> sizes, std::vector<int64_t> strides) {
    HostTensor t = values[step.args(arg)];
    if (t.dtype != dtype) return HostTensor();
    t.sizes = std::move(sizes);
    t.strides = std::move(strides);
    return t;
  };
  const HostTensor a = view(1, {batch, m, k}, {p(l::kGemmABatchStride), p(l::kGemmARowStride), p(l::kGemmAColStride)});
  const HostTensor b = view(2, {batch, k, n}, {p(l::kGemmBBatchStride), p(l::kGemmBRowStride), p(l::kGemmBColStride)});
  HostTensor d = view(0, {batch, m, n}, {p(l::kGemmDBatchStride), p(l::kGemmDRowStride), 1});
  HostTensor c;
  if (p(l::kGemmCKind) == l::kGemmBias) c = view(3, {batch, m, n}, {0, 0, 1});
  if (p(l::kGemmCKind) == l::kGemmMatrix) c = view(3, {batch, m, n}, {p(l::kGemmCBatchStride), p(l::kGemmCRowStride), 1});
  if (!a.storage || !b.storage || !d.storage || (p(l::kGemmCKind) != l::kGemmNoC && !c.storage)) {
    return absl::InternalError("library step operand of another dtype");
  }
  const double alpha = step.float_params(0), beta = step.float_params(1);
  for (int64_t bi = 0; bi < batch; ++bi) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t q = 0; q < k; ++q) acc += a.Get((bi * m + i) * k + q) * b.Get((bi * k + q) * n + j);
        const int64_t e = (bi * m + i) * n + j;
        double out = alpha * acc;
        if (c.storage) out += beta * c.Get(e);
        d.Set(e, out);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

int32_t ArgValue(const v1::Argument& a) {
  if (a.value_case() != v1::Argument::kNode || a.node().size() < 2 || a.node()[0] != 'v') return -1;
  return std::stoi(a.node().substr(1));
}

absl::StatusOr<std::vector<HostTensor>> RunPlan(const v1::Artifact& artifact, const std::vector<HostTensor>& inputs,
                                                const AtenFn& aten) {
  const v1::Plan& plan = artifact.plan();
  std::vector<kiln_module*> modules;
  struct Unload {
    std::vector<kiln_module*>* m;
    ~Unload() { for (auto* x : *m) kiln_module_unload(x); }
  } unload{&modules};
  for (const v1::Binary& b : artifact.binaries()) {
    kiln_module* m = nullptr;
    if (kiln_module_load(b.data().data(), b.data().size(), &m) != KILN_OK) {
      return absl::InternalError(absl::StrCat("load: ", kiln_last_error()));
    }
    modules.push_back(m);
  }
  auto workspace = std::make_shared<std::vector<uint8_t>>(plan.workspace_bytes() + 64, 0xAB);
  std::vector<HostTensor> values(plan.values_size());
  std::vector<bool> ready(plan.values_size(), false);
  auto materialize = [&](int i) -> absl::Status {
    const v1::PlanValue& pv = plan.values(i);
    if (ready[i]) return absl::OkStatus();
    HostTensor t = FromMeta(pv.meta());
    switch (pv.storage()) {
      case v1::PlanValue::STORAGE_INPUT:
        if (pv.index() < 0 || pv.index() >= static_cast<int>(inputs.size())) return absl::InternalError("input index");
        t = inputs[pv.index()];
        break;
      case v1::PlanValue::STORAGE_OUTPUT:
        break;
      case v1::PlanValue::STORAGE_WORKSPACE:
        if (pv.offset() % 64 != 0) return absl::InternalError("unaligned workspace offset");
        t.storage = workspace;
        t.offset = pv.offset() / t.itemsize();
        break;
      case v1::PlanValue::STORAGE_VIEW: {
        if (!ready[pv.index()]) return absl::InternalError(absl::StrCat("view v", i, " before its base"));
        const HostTensor& base = values[pv.index()];
        t.storage = base.storage;
        t.offset = base.offset + pv.offset();
        break;
      }
      case v1::PlanValue::STORAGE_STEP:
        return absl::OkStatus();  // made by its step
      default:
        return absl::UnimplementedError("storage kind in test executor");
    }
    values[i] = t;
    ready[i] = true;
    return absl::OkStatus();
  };
  for (int i = 0; i < plan.values_size(); ++i) {
    if (plan.values(i).storage() != v1::PlanValue::STORAGE_VIEW) {
      if (auto st = materialize(i); !st.ok()) return st;
    }
  }
  auto views = [&]() -> absl::Status {
    for (int i = 0; i < plan.values_size(); ++i) {
      if (plan.values(i).storage() == v1::PlanValue::STORAGE_VIEW && ready[plan.values(i).index()]) {
        if (auto st = materialize(i); !st.ok()) return st;
      }
    }
    return absl::OkStatus();
  };
  if (auto st = views(); !st.ok()) return st;
  for (const v1::PlanStep& step : plan.steps()) {
    if (step.has_kernel()) {
      const v1::KernelStep& k = step.kernel();
      kiln_module* m = modules.at(k.binary());
      int32_t idx = -1;
      if (kiln_module_add_kernel(m, k.symbol().c_str(), &idx) != KILN_OK) return absl::InternalError(kiln_last_error());
      std::vector<void*> bufs;
      for (int32_t a : k.args()) {
        if (!ready[a]) return absl::InternalError(absl::StrCat("kernel arg v", a, " not ready"));
        bufs.push_back(values[a].data());
      }
      if (kiln_run_kernel(m, idx, bufs.data(), nullptr) != KILN_OK) return absl::InternalError(kiln_last_error());
    } else if (step.has_aten()) {
      auto outs = aten(step.aten(), values);
      if (!outs.ok()) return outs.status();
      for (size_t i = 0; i < outs->size() && i < static_cast<size_t>(step.aten().outputs_size()); ++i) {
        const int32_t o = step.aten().outputs(i);
        if (o < 0) continue;
        values[o] = (*outs)[i];
        ready[o] = true;
      }
      if (auto st = views(); !st.ok()) return st;
    } else if (step.has_library()) {
      if (auto st = RunGemm(step.library(), values, ready); !st.ok()) return st;
    } else {
      return absl::UnimplementedError("empty step");
    }
  }
  std::vector<HostTensor> result;
  for (int32_t o : plan.outputs()) {
    if (o < 0) {
      result.push_back(HostTensor());
      continue;
    }
    if (!ready[o]) return absl::InternalError("output not ready");
    result.push_back(values[o]);
  }
  return result;
}

}  // namespace kiln::compiler::testing
