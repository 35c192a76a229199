#include "server/lower/conv_layout.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "spdlog/spdlog.h"

namespace kiln::lower {
namespace {

constexpr char kConvolution[] = "aten.convolution.default";

bool IsFloat4d(const LValue& v) {
  return v.sizes.size() == 4 && (v.dtype == k::ScalarType::kFloat32 || v.dtype == k::ScalarType::kFloat16 ||
                                 v.dtype == k::ScalarType::kBFloat16);
}

// Reads of `v` allow any layout: kernels read through strides; steps only as a convolution input;
// no views (their strides were derived from the base's recorded ones).
bool ReadersAllowChannelsLast(const OpGraph& g, int32_t v, bool* read_by_conv, std::string* why) {
  *read_by_conv = false;
  for (int32_t u : g.value_users[v]) {
    if (g.values[u].kind == ValueKind::kView) {
      *why = "a view reads it";
      return false;
    }
  }
  for (int32_t s : g.step_users[v]) {
    const ExternStep& st = g.steps[s];
    if (st.target != kConvolution || st.inputs.empty() || st.inputs[0] != v ||
        std::count(st.inputs.begin(), st.inputs.end(), v) != 1) {
      *why = "step " + st.target + " reads it";
      return false;
    }
    *read_by_conv = true;
  }
  return true;
}

void SetChannelsLast(LValue* v) {
  const int64_t c = std::max<int64_t>(v->sizes[1], 1), h = std::max<int64_t>(v->sizes[2], 1),
                w = std::max<int64_t>(v->sizes[3], 1);
  v->strides = {h * w * c, 1, w * c, c};
  v->meta.clear_strides();
  for (int64_t s : v->strides) v->meta.add_strides()->set_constant(s);
}

}  // namespace

int ChooseConvLayouts(OpGraph* g) {
  bool any_conv = false;
  for (const ExternStep& st : g->steps) any_conv |= st.target == kConvolution;
  if (!any_conv) return 0;
  const std::set<int32_t> outputs(g->outputs.begin(), g->outputs.end());
  std::vector<bool> nhwc(g->values.size(), false);
  int changed = 0;
  // Values only read values with smaller ids: one pass in id order sees a convolution's input
  // decided before its output.
  for (LValue& v : g->values) {
    if (v.kind != ValueKind::kPointwise && v.kind != ValueKind::kRowOutput && v.kind != ValueKind::kStepOutput) continue;
    if (!IsFloat4d(v) || outputs.count(v.id)) continue;
    if (v.storage_offset != 0) continue;
    bool by_conv = false;
    std::string why;
    if (v.kind == ValueKind::kStepOutput) {
      const ExternStep& producer = g->steps[v.step];
      if (producer.target != kConvolution || producer.inputs.empty() || !nhwc[producer.inputs[0]] ||
          producer.outputs.size() != 1) {
        continue;
      }
      if (!ReadersAllowChannelsLast(*g, v.id, &by_conv, &why)) {
        spdlog::debug("layout: v{} ({}) stays as recorded although its input is channels-last: {}", v.id, v.op, why);
        continue;
      }
    } else if (!ReadersAllowChannelsLast(*g, v.id, &by_conv, &why) || !by_conv) {
      if (!why.empty()) spdlog::debug("layout: v{} ({}) stays as recorded: {}", v.id, v.op, why);
      continue;
    }
    SetChannelsLast(&v);
    nhwc[v.id] = true;
    ++changed;
    spdlog::debug("layout: v{} ({}) channels-last", v.id, v.op);
  }
  return changed;
}

}  // namespace kiln::lower
