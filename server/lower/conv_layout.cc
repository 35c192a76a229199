#include "server/lower/conv_layout.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "spdlog/spdlog.h"

namespace kiln::lower {
namespace {

constexpr char kConvolution[] = "aten.convolution.default";

// Steps that read a channels-last input (argument 0) as well as an NCHW one and return their
// 4-D results channels-last for it: torch's CUDA convolution and pooling kernels follow the
// input's suggested memory format.
bool FollowsInputLayout(const std::string& target) {
  return target == kConvolution || target == "aten.max_pool2d_with_indices.default" ||
         target == "aten.avg_pool2d.default" || target == "aten._adaptive_avg_pool2d.default";
}

bool IsFloat4d(const LValue& v) {
  return v.sizes.size() == 4 && (v.dtype == k::ScalarType::kFloat32 || v.dtype == k::ScalarType::kFloat16 ||
                                 v.dtype == k::ScalarType::kBFloat16);
}

class LayoutRules {
 public:
  explicit LayoutRules(const OpGraph& g)
      : g_(g), outputs_(FixedOutputs(g)), returned_(g.outputs.begin(), g.outputs.end()),
        step_ok_(g.steps.size(), kUnknown) {}

  // Whether `v` is a graph output whose strides the graph states (not one of
  // Graph.free_layout_outputs only).
  bool IsGraphOutput(int32_t v) const { return outputs_.count(v) > 0; }
  // Whether `v` is returned at all (free position or not).
  bool IsReturned(int32_t v) const { return returned_.count(v) > 0; }
  // Whether `v` is returned, only at free positions, and nothing in the graph reads it.
  bool SavedOnly(int32_t v) const {
    return IsReturned(v) && !IsGraphOutput(v) && g_.value_users[v].empty() && g_.step_users[v].empty() &&
           g_.row_users[v].empty();
  }

  // Reads of `v` allow any layout: kernels read through strides; steps only as the input of a
  // convolution or pooling whose results may follow (StepResultsMayFollow); no views (their
  // strides were derived from the base's recorded ones). *by_step: a step reads it.
  bool ReadersAllow(int32_t v, bool* by_step, std::string* why) {
    *by_step = false;
    for (int32_t u : g_.value_users[v]) {
      if (g_.values[u].kind == ValueKind::kView) {
        *why = "a view reads it";
        return false;
      }
    }
    for (int32_t s : g_.step_users[v]) {
      const ExternStep& st = g_.steps[s];
      if (!FollowsInputLayout(st.target) || st.inputs.empty() || st.inputs[0] != v ||
          std::count(st.inputs.begin(), st.inputs.end(), v) != 1) {
        *why = "step " + st.target + " reads it";
        return false;
      }
      if (!StepResultsMayFollow(s)) {
        *why = "step " + st.target + " reads it and its result must keep the recorded strides";
        return false;
      }
      *by_step = true;
    }
    return true;
  }

  // Whether every 4-D result of step `s` may become channels-last, as torch will return it for a
  // channels-last input: none is a graph output and their readers allow it. A channels-last input
  // is only chosen when this holds, so the plan states the strides torch returns (a view of a
  // result with other strides than the plan's would read the wrong elements).
  bool StepResultsMayFollow(int32_t s) {
    if (step_ok_[s] != kUnknown) return step_ok_[s] == kYes;
    step_ok_[s] = kNo;  // values only read values with larger ids: no cycles; this is the default
    bool ok = true;
    for (int32_t o : g_.steps[s].outputs) {
      if (o < 0 || g_.values[o].sizes.size() != 4) continue;
      bool by_step = false;
      std::string why;
      if (IsGraphOutput(o) || g_.values[o].storage_offset != 0 || !ReadersAllow(o, &by_step, &why)) {
        ok = false;
        break;
      }
    }
    step_ok_[s] = ok ? kYes : kNo;
    return ok;
  }

 private:
  enum State : int8_t { kUnknown, kYes, kNo };

  // The values at output positions other than Graph.free_layout_outputs' (a value returned at a
  // free position and at a fixed one keeps its strides).
  static std::set<int32_t> FixedOutputs(const OpGraph& g) {
    std::set<int32_t> free;
    if (g.graph != nullptr) free.insert(g.graph->free_layout_outputs.begin(), g.graph->free_layout_outputs.end());
    std::set<int32_t> fixed;
    for (size_t i = 0; i < g.outputs.size(); ++i) {
      if (free.count(static_cast<int32_t>(i)) == 0) fixed.insert(g.outputs[i]);
    }
    return fixed;
  }

  const OpGraph& g_;
  const std::set<int32_t> outputs_;
  const std::set<int32_t> returned_;
  std::vector<State> step_ok_;
};

void SetChannelsLast(LValue* v) {
  const int64_t c = std::max<int64_t>(v->sizes[1], 1), h = std::max<int64_t>(v->sizes[2], 1),
                w = std::max<int64_t>(v->sizes[3], 1);
  v->strides = {h * w * c, 1, w * c, c};
  v->meta.clear_strides();
  for (int64_t s : v->strides) v->meta.add_strides()->set_constant(s);
}

}  // namespace

int ChooseConvLayouts(OpGraph* g) {
  bool any_conv = false;  // pooling alone is not worth a layout change
  for (const ExternStep& st : g->steps) any_conv |= st.target == kConvolution;
  if (!any_conv) return 0;
  LayoutRules rules(*g);
  std::vector<bool> nhwc(g->values.size(), false);
  int changed = 0;
  // Values only read values with smaller ids: one pass in id order sees a step's input decided
  // before its results.
  for (LValue& v : g->values) {
    if (v.kind != ValueKind::kPointwise && v.kind != ValueKind::kRowOutput && v.kind != ValueKind::kStepOutput) continue;
    if (v.sizes.size() != 4 || rules.IsGraphOutput(v.id) || v.storage_offset != 0) continue;
    if (v.kind == ValueKind::kStepOutput) {
      // Every 4-D result of a channels-last input comes back channels-last (max_pool2d's indices
      // too); choosing that input checked that the results may (StepResultsMayFollow).
      const ExternStep& producer = g->steps[v.step];
      if (!FollowsInputLayout(producer.target) || producer.inputs.empty() || !nhwc[producer.inputs[0]]) continue;
    } else {
      bool by_step = false;
      std::string why;
      if (!IsFloat4d(v) || !rules.ReadersAllow(v.id, &by_step, &why)) {
        if (!why.empty()) spdlog::debug("layout: v{} ({}) stays as recorded: {}", v.id, v.op, why);
        continue;
      }
      // Read by kernels only (stored for a windowed read such as max_pool2d's, or for several
      // readers): it follows a channels-last input of its shape instead of transposing.
      bool follows_input = false;
      if (!by_step && v.kind == ValueKind::kPointwise) {
        for (int32_t in : v.inputs) follows_input |= nhwc[in] && g->values[in].sizes == v.sizes;
      }
      if (!by_step && !follows_input) continue;
    }
    SetChannelsLast(&v);
    nhwc[v.id] = true;
    ++changed;
    spdlog::debug("layout: v{} ({}) channels-last", v.id, v.op);
  }
  // Values kernels compute for kernels only, whose readers are all channels-last kernel values or
  // unused (max_pool2d's windows over a batch norm's output, and its unused indices, at a ResNet's
  // stem in inference, where the convolution read the NCHW image): they follow their readers, so
  // the pointwise kernel transposes through its tiled loads instead of the windowed reads
  // gathering along channels (ResNet-18 fp32 on an H200: such a pooling kernel took 121 us per
  // step). Reverse id order: readers are decided first.
  for (auto it = g->values.rbegin(); it != g->values.rend(); ++it) {
    LValue& v = *it;
    if (v.kind != ValueKind::kPointwise || nhwc[v.id] || !IsFloat4d(v) || rules.IsGraphOutput(v.id) ||
        v.storage_offset != 0 || !g->step_users[v.id].empty() || g->value_users[v.id].empty()) {
      continue;
    }
    bool readers_nhwc = true, any_live = false;
    for (int32_t u : g->value_users[v.id]) {
      const LValue& r = g->values[u];
      if (r.kind == ValueKind::kView) {  // its strides derive from v's recorded ones
        readers_nhwc = false;
        break;
      }
      if (g->value_users[u].empty() && g->step_users[u].empty() && !rules.IsReturned(u)) continue;  // unused
      if (rules.SavedOnly(u) && r.kind == ValueKind::kPointwise) continue;  // follows its inputs below
      any_live = true;
      readers_nhwc &= (r.kind == ValueKind::kPointwise || r.kind == ValueKind::kRowOutput) && nhwc[u];
    }
    if (!readers_nhwc || !any_live) continue;
    SetChannelsLast(&v);
    nhwc[v.id] = true;
    ++changed;
    spdlog::debug("layout: v{} ({}) channels-last (its readers are)", v.id, v.op);
  }
  // Values kernels compute that are only returned, at free positions (a training forward's saved
  // max_pool2d indices, of any dtype), follow a channels-last input: the kernel's stores then go
  // along channels as its other results' do (on the H200, ResNet-50 bf16 training: with NCHW
  // indices the stem's pooling kernel was among the top kernels, with 0.64 ms per step under its
  // name, shared with two small backward kernels; with channels-last ones, under 0.18 ms).
  for (LValue& v : g->values) {
    if (v.kind != ValueKind::kPointwise || nhwc[v.id] || v.sizes.size() != 4 || v.storage_offset != 0 ||
        !rules.SavedOnly(v.id)) {
      continue;
    }
    bool follows_input = false;
    for (int32_t in : v.inputs) follows_input |= nhwc[in];
    if (!follows_input) continue;
    SetChannelsLast(&v);
    nhwc[v.id] = true;
    ++changed;
    spdlog::debug("layout: v{} ({}) channels-last (saved for the backward, follows its input)", v.id, v.op);
  }
  // Weights (argument 1) written by kernels (autocast's casts of the parameters) follow their
  // convolutions' channels-last inputs: torch would otherwise copy them to channels-last per call.
  for (LValue& v : g->values) {
    if (v.kind != ValueKind::kPointwise && v.kind != ValueKind::kRowOutput) continue;
    if (nhwc[v.id] || !IsFloat4d(v) || rules.IsGraphOutput(v.id) || v.storage_offset != 0) continue;
    if (g->step_users[v.id].empty()) continue;
    bool weight_of_nhwc_convs = true;
    for (int32_t u : g->value_users[v.id]) weight_of_nhwc_convs &= g->values[u].kind != ValueKind::kView;
    for (int32_t s : g->step_users[v.id]) {
      const ExternStep& st = g->steps[s];
      weight_of_nhwc_convs &= st.target == kConvolution && st.inputs.size() >= 2 && st.inputs[1] == v.id &&
                              st.inputs[0] != v.id && nhwc[st.inputs[0]] &&
                              std::count(st.inputs.begin(), st.inputs.end(), v.id) == 1;
    }
    if (!weight_of_nhwc_convs) continue;
    SetChannelsLast(&v);
    nhwc[v.id] = true;
    ++changed;
    spdlog::debug("layout: v{} ({}) channels-last (weight of channels-last convolutions)", v.id, v.op);
  }
  return changed;
}

}  // namespace kiln::lower
