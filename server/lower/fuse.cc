#include "server/lower/fuse.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

namespace kiln::lower {
namespace {

bool IsStorageKind(ValueKind k) {
  return k == ValueKind::kInput || k == ValueKind::kConstant || k == ValueKind::kStepOutput;
}

std::string Shape(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

struct Hit {
  bool forbidden = false;  // reads a non-affine view of a member: must load it from memory
  bool identity = true;    // every member read is at the reader's own index
  std::set<bool> placements;
  std::vector<int32_t> values;
};

struct Reach {
  std::map<int32_t, Hit> hits;  // group -> how it is read
  int32_t max_dep = -1;         // the latest schedule position of a step read
};

class Fuser {
 public:
  Fuser(const OpGraph& g, const FuseOptions& o) : g_(g), opt_(o) {}

  absl::StatusOr<Schedule> Run() {
    const size_t n = g_.values.size();
    s_.group_of.assign(n, -1);
    s_.stored.assign(n, false);
    realized_.assign(n, false);
    member_stage_.assign(n, 0);
    step_order_.assign(g_.steps.size(), -1);
    DecideRealized();
    // Walk nodes in order: steps, row ops and realized pointwise values.
    std::map<int32_t, std::vector<std::pair<int, int32_t>>> by_node;  // node -> (0 step, 1 row, 2 value)
    for (size_t i = 0; i < g_.steps.size(); ++i) by_node[g_.steps[i].node].push_back({0, static_cast<int32_t>(i)});
    for (size_t i = 0; i < g_.row_ops.size(); ++i) by_node[g_.row_ops[i].node].push_back({1, static_cast<int32_t>(i)});
    for (const LValue& v : g_.values) {
      if (v.kind == ValueKind::kPointwise && realized_[v.id]) by_node[v.node].push_back({2, v.id});
    }
    // copies made for outputs have the node of their view: keep value order within a node.
    for (auto& [node, list] : by_node) {
      for (const auto& [kind, idx] : list) {
        if (kind == 0) {
          step_order_[idx] = static_cast<int32_t>(s_.items.size());
          if (g_.steps[idx].mutates) barrier_ = step_order_[idx];
          s_.items.push_back({true, idx});
        } else if (kind == 1) {
          PlaceRow(idx);
        } else {
          PlacePointwise(idx);
        }
      }
    }
    Prune();
    return std::move(s_);
  }

 private:
  void Log(const std::string& m) {
    spdlog::debug("fuse: {}", m);
    s_.log.push_back(m);
  }

  int Users(int32_t v, bool* composite_reader) const {
    int n = static_cast<int>(g_.row_users[v].size() + g_.step_users[v].size());
    for (int32_t r : g_.row_users[v]) *composite_reader |= g_.row_ops[r].composite;
    for (int32_t u : g_.value_users[v]) n += g_.values[u].kind == ValueKind::kView ? Users(u, composite_reader) : 1;
    return n;
  }

  void Realize(int32_t v, const std::string& why) {
    if (realized_[v]) return;
    realized_[v] = true;
    Log(absl::StrCat("realize v", v, " (", g_.values[v].op, "): ", why));
  }

  // The stored values (inputs, constants, step outputs, realized values) that a kernel reading v
  // loads to recompute it, sorted; nullopt when there are more than kMaxLeaves.
  using Leaves = std::optional<std::vector<int32_t>>;
  static constexpr size_t kMaxLeaves = 16;
  bool Stored(int32_t v) const { return realized_[v] || IsStorageKind(g_.values[v].kind); }
  Leaves LeavesOf(const LValue& v, const std::vector<Leaves>& leaves) const {
    if (Stored(v.id)) return std::vector<int32_t>{v.id};
    if (v.kind == ValueKind::kView) {
      const int32_t r = ViewRoot(g_, v.id);
      return Stored(r) ? std::vector<int32_t>{r} : leaves[r];
    }
    std::set<int32_t> all;
    for (int32_t in : v.inputs) {
      const Leaves l = Stored(in) ? std::vector<int32_t>{in} : leaves[in];
      if (!l) return std::nullopt;
      all.insert(l->begin(), l->end());
    }
    if (all.size() > kMaxLeaves) return std::nullopt;
    return std::vector<int32_t>(all.begin(), all.end());
  }

  // A cheap value with several readers is recomputed in each of them, each loading all its leaves.
  // Storing it costs one pass over the leaves, its write and one read per reader, so it is stored
  // when (users - 1) * leaf bytes > (users + 1) * its bytes. Such values: a residual stream's
  // gradient, summed from its branches and masked by ReLUs, read by three or more backward kernels.
  void RealizeIfFewerBytes(const LValue& v, int users, const std::vector<Leaves>& leaves) {
    const Leaves ls = LeavesOf(v, leaves);
    const int64_t bytes = v.numel() * k::ScalarTypeBytes(v.dtype);
    int64_t leaf_bytes = 0;
    for (int32_t l : ls.value_or(std::vector<int32_t>{})) {
      const LValue& x = g_.values[l];
      leaf_bytes += std::min(x.numel(), v.numel()) * k::ScalarTypeBytes(x.dtype);
    }
    if (!ls) {
      Realize(v.id, absl::StrCat(users, " consumers would each load its more than ", kMaxLeaves, " stored inputs"));
    } else if ((users - 1) * leaf_bytes > (users + 1) * bytes) {
      Realize(v.id, absl::StrCat(users, " consumers would each load its ", ls->size(), " stored inputs (", leaf_bytes,
                                 " bytes) to recompute it (", bytes, " bytes)"));
    }
  }

  void DecideRealized() {
    for (int32_t o : g_.outputs) {
      if (o >= 0 && !IsStorageKind(g_.values[o].kind) && g_.values[o].kind != ValueKind::kView) Realize(o, "graph output");
      if (o >= 0 && g_.values[o].kind == ValueKind::kView) {
        const int32_t r = ViewRoot(g_, o);
        if (!IsStorageKind(g_.values[r].kind)) Realize(r, absl::StrCat("root of output view v", o));
      }
    }
    for (const ExternStep& st : g_.steps) {
      for (int32_t in : st.inputs) {
        const int32_t r = ViewRoot(g_, in);
        if (!IsStorageKind(g_.values[r].kind)) Realize(r, absl::StrCat("read by step ", st.target));
      }
    }
    for (const LValue& v : g_.values) {
      for (int32_t in : v.masked_inputs) {
        const int32_t r = ViewRoot(g_, in);
        if (!IsStorageKind(g_.values[r].kind)) Realize(r, absl::StrCat("read masked by v", v.id, " (", v.op, ")"));
      }
    }
    std::vector<bool> eff_cheap(g_.values.size(), false);
    std::vector<Leaves> leaves(g_.values.size());
    for (const LValue& v : g_.values) {
      if (v.kind == ValueKind::kRowOutput) realized_[v.id] = true;
      if (v.kind == ValueKind::kView) {
        const int32_t r = ViewRoot(g_, v.id);
        if (!IsStorageKind(g_.values[r].kind) && !ViewIsAffine(g_, v.id)) {
          Realize(r, absl::StrCat("view v", v.id, " (", v.op, ") is not an affine window of it"));
        }
      }
      if (v.kind == ValueKind::kPointwise && !realized_[v.id]) {
        if (opt_.disable_fusion) {
          Realize(v.id, "fusion disabled");
        } else {
          bool composite = false;
          const int users = Users(v.id, &composite);
          bool cheap = v.cheap;
          for (int32_t in : v.inputs) cheap = cheap && eff_cheap[in];
          if ((users > 1 || composite) && !cheap) {
            Realize(v.id, users > 1 ? absl::StrCat(users, " consumers and not cheap (computed once)")
                                    : "read twice by a row-fused composite and not cheap");
          } else if (users > 1) {
            RealizeIfFewerBytes(v, users, leaves);
          }
        }
      }
      leaves[v.id] = LeavesOf(v, leaves);
      const int32_t r = ViewRoot(g_, v.id);
      eff_cheap[v.id] = realized_[v.id] || IsStorageKind(v.kind) || (v.kind == ValueKind::kView && eff_cheap[r]) ||
                        (v.kind == ValueKind::kPointwise && v.cheap &&
                         std::all_of(v.inputs.begin(), v.inputs.end(), [&](int32_t i) { return eff_cheap[i]; }));
    }
  }

  void Dep(const LValue& x, Reach& r) {
    if (x.kind == ValueKind::kStepOutput) r.max_dep = std::max(r.max_dep, step_order_[x.step]);
  }

  void Visit(int32_t v, bool identity, Reach& r) {
    const LValue& x = g_.values[v];
    if (s_.group_of[v] >= 0) {
      Hit& h = r.hits[s_.group_of[v]];
      h.identity = h.identity && identity;
      h.placements.insert(member_stage_[v] > 0);
      h.values.push_back(v);
      return;
    }
    if (IsStorageKind(x.kind)) return Dep(x, r);
    if (x.kind == ValueKind::kView) {
      const int32_t root = ViewRoot(g_, v);
      const LValue& rx = g_.values[root];
      if (IsStorageKind(rx.kind)) return Dep(rx, r);
      if (s_.group_of[root] >= 0) {
        Hit& h = r.hits[s_.group_of[root]];
        if (!ViewIsAffine(g_, v)) h.forbidden = true;
        h.identity = h.identity && identity && IsSqueezeView(g_, v);
        h.placements.insert(member_stage_[root] > 0);
        h.values.push_back(root);
        return;
      }
      return Visit(root, identity && IsSqueezeView(g_, v), r);
    }
    for (int32_t in : x.inputs) Visit(in, identity && NonUnit(g_.values[in].sizes) == NonUnit(x.sizes), r);
  }

  bool OrderOk(const Reach& r, int32_t gi) const {
    const int32_t order = s_.groups[gi].order;
    if (r.max_dep > order || barrier_ > order) return false;
    for (const auto& [h, hit] : r.hits) {
      if (h != gi && s_.groups[h].order > order) return false;
    }
    return true;
  }

  int32_t NewGroup(Group::Kind kind, std::vector<int64_t> shape) {
    Group gr;
    gr.kind = kind;
    gr.shape = std::move(shape);
    gr.order = static_cast<int32_t>(s_.items.size());
    s_.items.push_back({false, static_cast<int32_t>(s_.groups.size())});
    s_.groups.push_back(std::move(gr));
    return static_cast<int32_t>(s_.groups.size()) - 1;
  }

  void AddMember(int32_t gi, int32_t v, bool phase, int8_t stage = 1) {
    s_.groups[gi].members.push_back(v);
    s_.groups[gi].stage.push_back(phase ? stage : 0);
    s_.group_of[v] = gi;
    member_stage_[v] = phase ? stage : 0;
  }

  // The phase a pointwise member of row group gi reading `values` (members of gi) is computed
  // in: the latest of theirs; a body member (a row result) of a chained row op needs phase 2.
  int8_t StageAfter(int32_t gi, const std::vector<int32_t>& values) const {
    int8_t stage = 1;
    for (int32_t m : values) {
      stage = std::max<int8_t>(stage, member_stage_[m]);
      if (member_stage_[m] == 0 && g_.values[m].kind == ValueKind::kRowOutput) {
        const Group& gr = s_.groups[gi];
        for (size_t j = 0; j < gr.row_ops.size(); ++j) {
          if (gr.row_ops[j] == g_.values[m].row_op) stage = std::max<int8_t>(stage, gr.row_stage[j] + 1);
        }
      }
    }
    return stage;
  }

  // How a value on a path from a phase-epilogue candidate is indexed relative to the row group:
  // kDomain: at the domain's index (its non-1 dims are the domain's, in order); kRow: at the
  // row's index (the domain's non-reduced non-1 dims, in order); kOther: anything else.
  enum class Along : uint8_t { kDomain, kRow, kOther };

  // Whether the row group `gi` may compute `x` (of the group's domain shape) in a phase after its
  // reductions: every path from x to a member of gi reads phase members at the domain's index
  // and body members (row results) at the row's index, through same-shape elementwise edges,
  // squeeze views, and broadcasts along exactly the reduced dims (x * rsqrt(mean(x^2) + eps)).
  bool ReadsAlongRows(const LValue& x, int32_t gi) const {
    const Group& gr = s_.groups[gi];
    std::vector<int64_t> row_shape = gr.shape;
    for (int d : gr.reduce_dims) row_shape[d] = 1;
    for (int32_t in : x.inputs) {
      if (!AlongRows(in, EdgeAlong(g_.values[in].sizes, x.sizes, Along::kDomain, gr.shape, row_shape), gi)) {
        return false;
      }
    }
    return true;
  }

  // The indexing of an input of sizes `in` read by an elementwise value of sizes `out`.
  static Along EdgeAlong(const std::vector<int64_t>& in, const std::vector<int64_t>& out, Along along,
                         const std::vector<int64_t>& domain, const std::vector<int64_t>& row_shape) {
    if (along == Along::kOther) return along;
    if (NonUnit(in) == NonUnit(out)) return along;  // the same elements in the same order
    if (along != Along::kDomain || out != domain || in.size() > domain.size()) return Along::kOther;
    std::vector<int64_t> padded(domain.size() - in.size(), 1);
    padded.insert(padded.end(), in.begin(), in.end());
    return padded == row_shape ? Along::kRow : Along::kOther;
  }

  bool AlongRows(int32_t v, Along along, int32_t gi) const {
    const LValue& x = g_.values[v];
    if (s_.group_of[v] == gi) {
      return member_stage_[v] > 0 ? along == Along::kDomain : along == Along::kRow;
    }
    if (s_.group_of[v] >= 0 || IsStorageKind(x.kind)) return true;  // loaded from memory
    const Group& gr = s_.groups[gi];
    std::vector<int64_t> row_shape = gr.shape;
    for (int d : gr.reduce_dims) row_shape[d] = 1;
    if (x.kind == ValueKind::kView) {
      const int32_t root = ViewRoot(g_, v);
      return AlongRows(root, IsSqueezeView(g_, v) ? along : Along::kOther, gi);
    }
    if (x.kind != ValueKind::kPointwise) return false;
    for (int32_t in : x.inputs) {
      if (!AlongRows(in, EdgeAlong(g_.values[in].sizes, x.sizes, along, gr.shape, row_shape), gi)) return false;
    }
    return true;
  }

  void PlacePointwise(int32_t v) {
    const LValue& x = g_.values[v];
    Reach r;
    for (int32_t in : x.inputs) Visit(in, NonUnit(g_.values[in].sizes) == NonUnit(x.sizes), r);
    for (int32_t in : x.masked_inputs) {
      const int32_t root = ViewRoot(g_, in);
      if (s_.group_of[root] >= 0) r.hits[s_.group_of[root]].forbidden = true;  // must be loaded, not inlined
    }
    int32_t best = -1;
    bool best_phase = false;
    int8_t best_stage = 1;
    for (const auto& [gi, hit] : r.hits) {
      const Group& gr = s_.groups[gi];
      std::string why;
      bool phase = false;
      if (opt_.disable_fusion) {
        why = "fusion disabled";
      } else if (hit.forbidden) {
        why = "reads a non-affine view of it";
      } else if (!OrderOk(r, gi)) {
        why = "reads a step or kernel scheduled after it";
      } else if (gr.kind == Group::Kind::kPointwise) {
        if (gr.shape != x.sizes) {
          why = absl::StrCat("iteration shape ", Shape(gr.shape), " != ", Shape(x.sizes));
        } else if (!hit.identity &&
                   std::any_of(hit.values.begin(), hit.values.end(), [&](int32_t m) { return !g_.values[m].cheap; })) {
          why = "reads a non-cheap member at another index (would compute it twice)";
        }
      } else if (!hit.identity || hit.placements.size() != 1) {
        if (x.sizes == gr.shape && ReadsAlongRows(x, gi)) {
          phase = true;  // a broadcast of the row's results along the reduced dims (rms norm)
        } else {
          why = "reads the row op's result through a broadcast or view other than along the reduced dims";
        }
      } else {
        phase = *hit.placements.begin();
        const auto& hs = g_.values[hit.values[0]].sizes;
        if (phase ? hs != x.sizes : NonUnit(hs) != NonUnit(x.sizes)) why = "shape differs from the row op's result";
      }
      if (!why.empty()) {
        Log(absl::StrCat("refuse v", v, " (", x.op, ") into group ", gi, ": ", why));
        continue;
      }
      if (best < 0 || gr.order > s_.groups[best].order) {
        best = gi;
        best_phase = phase;
        best_stage = gr.kind == Group::Kind::kRow ? StageAfter(gi, hit.values) : 1;
      }
    }
    if (best >= 0) {
      Log(absl::StrCat("fuse v", v, " (", x.op, ") into group ", best,
                       s_.groups[best].kind == Group::Kind::kRow ? (best_phase ? " as a phase epilogue" : " as an epilogue")
                                                                 : " (vertical)"));
      AddMember(best, v, best_phase, best_stage);
      return;
    }
    if (!opt_.disable_fusion) {  // horizontal: the latest pointwise group of the same shape
      for (int32_t gi = static_cast<int32_t>(s_.groups.size()) - 1; gi >= 0; --gi) {
        const Group& gr = s_.groups[gi];
        if (gr.kind != Group::Kind::kPointwise || gr.shape != x.sizes || r.hits.count(gi) ||
            !OrderOk(r, gi)) {
          continue;
        }
        Log(absl::StrCat("fuse v", v, " (", x.op, ") into group ", gi, " (horizontal: same shape ",
                         Shape(x.sizes), ")"));
        AddMember(gi, v, false);
        return;
      }
    }
    const int32_t gi = NewGroup(Group::Kind::kPointwise, x.sizes);
    Log(absl::StrCat("new pointwise group ", gi, " ", Shape(x.sizes), " for v", v, " (", x.op, ")"));
    AddMember(gi, v, false);
  }

  void PlaceRow(int32_t ri) {
    const RowOp& row = g_.row_ops[ri];
    Reach r;
    for (int32_t in : row.inputs) Visit(in, false, r);
    int32_t best = -1;
    if (!row.composite) {
      for (size_t gi = 0; gi < s_.groups.size(); ++gi) {
        const Group& gr = s_.groups[gi];
        if (gr.kind != Group::Kind::kRow || gr.shape != row.domain || gr.reduce_dims != row.reduce_dims) continue;
        if (g_.row_ops[gr.row_ops[0]].composite) continue;
        std::string why;
        if (opt_.disable_fusion) {
          why = "fusion disabled";
        } else if (r.hits.count(static_cast<int32_t>(gi))) {
          why = "reads its result";
        } else if (!OrderOk(r, static_cast<int32_t>(gi))) {
          why = "reads a step or kernel scheduled after it";
        }
        if (!why.empty()) {
          Log(absl::StrCat("refuse sibling ", row.name, " (row", ri, ") into group ", gi, ": ", why));
          continue;
        }
        if (best < 0 || gr.order > s_.groups[best].order) best = static_cast<int32_t>(gi);
      }
    }
    const int32_t chain = best < 0 ? ChainInto(ri, r) : -1;
    if (chain >= 0) {
      Log(absl::StrCat("chain ", row.name, " (row", ri, ") into group ", chain, " (it reads ",
                       g_.row_ops[s_.groups[chain].row_ops[0]].name, "'s rows where they are computed)"));
      s_.groups[chain].row_ops.push_back(ri);
      s_.groups[chain].row_stage.push_back(1);
      for (const RowOutput& o : row.outputs) AddMember(chain, o.value, o.in_phase, 2);
      return;
    }
    if (best >= 0) {
      Log(absl::StrCat("fuse ", row.name, " (row", ri, ") into group ", best, " (horizontal: same domain ",
                       Shape(row.domain), " and reduce dims)"));
    } else {
      best = NewGroup(Group::Kind::kRow, row.domain);
      s_.groups[best].reduce_dims = row.reduce_dims;
      Log(absl::StrCat("new row group ", best, " for ", row.name, " (row", ri, ") domain ", Shape(row.domain)));
    }
    s_.groups[best].row_ops.push_back(ri);
    s_.groups[best].row_stage.push_back(0);
    for (const RowOutput& o : row.outputs) AddMember(best, o.value, o.in_phase);
  }

  // Rule 3b (chaining): a row op over the same domain and reduce dims as a composite's group
  // (softmax) that reads that composite's phase results at the domain's own index and nothing
  // else of the group (the softmax backward of a softmax recomputed in the backward) folds its
  // accumulators in the composite's phase, and its own phase results come in a third phase: one
  // kernel, the rows read once. The group, or -1.
  int32_t ChainInto(int32_t ri, const Reach& all) {
    const RowOp& row = g_.row_ops[ri];
    if (opt_.disable_fusion) return -1;
    Reach r;  // as `all`, with reads at the domain's index marked (row ops read their inputs there)
    for (int32_t in : row.inputs) Visit(in, NonUnit(g_.values[in].sizes) == NonUnit(row.domain), r);
    if (r.max_dep != all.max_dep) return -1;
    for (const auto& [gi, hit] : r.hits) {
      const Group& gr = s_.groups[gi];
      if (gr.kind != Group::Kind::kRow || gr.shape != row.domain || gr.reduce_dims != row.reduce_dims ||
          gr.row_ops.size() != 1 || !g_.row_ops[gr.row_ops[0]].composite) {
        continue;
      }
      std::string why;
      if (!hit.identity || hit.forbidden || hit.placements != std::set<bool>{true}) {
        why = "reads the group other than at the domain's index, or a row result";
      } else if (std::any_of(hit.values.begin(), hit.values.end(), [&](int32_t m) { return member_stage_[m] != 1; })) {
        why = "reads a value of a later phase";
      } else if (!OrderOk(r, gi)) {
        why = "reads a step or kernel scheduled after it";
      }
      if (!why.empty()) {
        Log(absl::StrCat("refuse chaining ", row.name, " (row", ri, ") into group ", gi, ": ", why));
        continue;
      }
      return gi;
    }
    return -1;
  }

  void NeedRead(int32_t v, int32_t gi, std::vector<bool>& needed) {
    const LValue& x = g_.values[v];
    if (s_.group_of[v] == gi) return;
    if (s_.group_of[v] >= 0) {
      needed[v] = true;
      return;
    }
    if (IsStorageKind(x.kind)) return;
    if (x.kind == ValueKind::kView) {
      const int32_t root = ViewRoot(g_, v);
      if (s_.group_of[root] >= 0) {
        if (s_.group_of[root] != gi || !ViewIsAffine(g_, v)) needed[root] = true;
        return;
      }
      if (IsStorageKind(g_.values[root].kind)) return;
      return NeedRead(root, gi, needed);
    }
    for (int32_t in : x.inputs) NeedRead(in, gi, needed);
  }

  void Prune() {
    std::vector<bool> needed(g_.values.size(), false);
    for (int32_t o : g_.outputs) {
      if (o >= 0) needed[ViewRoot(g_, o)] = true;
    }
    for (const ExternStep& st : g_.steps) {
      for (int32_t in : st.inputs) needed[ViewRoot(g_, in)] = true;
    }
    for (size_t gi = 0; gi < s_.groups.size(); ++gi) {
      for (int32_t m : s_.groups[gi].members) {
        for (int32_t in : g_.values[m].inputs) NeedRead(in, static_cast<int32_t>(gi), needed);
      }
    }
    for (const LValue& v : g_.values) s_.stored[v.id] = IsStorageKind(v.kind);
    for (size_t gi = 0; gi < s_.groups.size(); ++gi) {
      for (int32_t m : s_.groups[gi].members) {
        if (needed[m]) {
          s_.groups[gi].stores.push_back(m);
          s_.stored[m] = true;
        } else {
          Log(absl::StrCat("v", m, " (", g_.values[m].op, ") stays inside group ", gi, " (not stored)"));
        }
      }
    }
  }

  const OpGraph& g_;
  const FuseOptions opt_;
  Schedule s_;
  std::vector<bool> realized_;
  std::vector<int8_t> member_stage_;  // per value: its group's Group::stage entry
  std::vector<int32_t> step_order_;
  int32_t barrier_ = -1;  // the latest in-place step: nothing after it moves before it
};

}  // namespace

absl::StatusOr<Schedule> ScheduleAndFuse(const OpGraph& g, const FuseOptions& options) {
  return Fuser(g, options).Run();
}

std::string PrintSchedule(const OpGraph& g, const Schedule& s) {
  std::string out;
  for (const ScheduleItem& it : s.items) {
    if (it.is_step) {
      absl::StrAppend(&out, "step ", g.steps[it.index].target, g.steps[it.index].fallback ? " (fallback)" : "", "\n");
      continue;
    }
    const Group& gr = s.groups[it.index];
    absl::StrAppend(&out, "group ", it.index, gr.kind == Group::Kind::kRow ? " row " : " pointwise ", Shape(gr.shape),
                    " members [", absl::StrJoin(gr.members, ", "), "] stores [", absl::StrJoin(gr.stores, ", "), "]\n");
  }
  return out;
}

}  // namespace kiln::lower
