#include "server/lower/plan_builder.h"

#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/base/status_macros.h"
#include "server/graph/op_registry.h"
#include "server/lower/gemm_step.h"
#include "spdlog/spdlog.h"

namespace kiln::lower {
namespace {

namespace v1 = ::kiln::v1;
using graph::Arg;

int64_t SpanBytes(const LValue& v) {
  int64_t n = 1;
  for (size_t d = 0; d < v.sizes.size(); ++d) {
    if (v.sizes[d] == 0) return 0;
    n += (v.sizes[d] - 1) * v.strides[d];
  }
  return n * k::ScalarTypeBytes(v.dtype);
}

class Assembler {
 public:
  Assembler(const OpGraph& g, const Schedule& s, const PlanOptions& options)
      : g_(g), s_(s), options_(options), index_(g.values.size(), -1) {
    for (int32_t o : g.outputs) {
      if (o < 0) continue;
      outputs_.insert(o);
      // A graph output that is a view (e.g. t() of a GEMM's result, as AOTAutograd returns weight
      // gradients) keeps its root alive past the plan: the root cannot live in the workspace,
      // which later steps (and the next call) reuse.
      if (g.values[o].kind == ValueKind::kView) outputs_.insert(ViewRoot(g, o));
    }
  }

  absl::StatusOr<int32_t> Ensure(int32_t v) {
    if (index_[v] >= 0) return index_[v];
    const LValue& x = g_.values[v];
    v1::PlanValue pv;
    *pv.mutable_meta() = x.meta;
    switch (x.kind) {
      case ValueKind::kInput:
        pv.set_storage(v1::PlanValue::STORAGE_INPUT);
        pv.set_index(x.input_index);
        break;
      case ValueKind::kConstant:
        pv.set_storage(v1::PlanValue::STORAGE_CONSTANT);
        pv.set_index(x.constant_index);
        break;
      case ValueKind::kStepOutput:
        if (!library_outputs_.count(v)) {
          pv.set_storage(v1::PlanValue::STORAGE_STEP);
          pv.set_index(-1);
          break;
        }
        [[fallthrough]];  // a library step writes into storage the plan allocates, as a kernel does
      case ValueKind::kPointwise:
      case ValueKind::kRowOutput:
        if (!s_.stored[v]) return absl::InternalError(absl::StrCat("v", v, " is used but never stored"));
        pv.mutable_meta()->mutable_storage_offset()->set_constant(0);
        if (outputs_.count(v) || pinned_.count(v)) {
          pv.set_storage(v1::PlanValue::STORAGE_OUTPUT);
        } else {
          pv.set_storage(v1::PlanValue::STORAGE_WORKSPACE);
          workspace_.push_back(v);
        }
        break;
      case ValueKind::kView: {
        const int32_t root = ViewRoot(g_, v);
        KILN_ASSIGN_OR_RETURN(int32_t base, Ensure(root));
        pv.set_storage(v1::PlanValue::STORAGE_VIEW);
        pv.set_index(base);
        pv.set_offset(x.storage_offset - g_.values[root].storage_offset);
        break;
      }
    }
    index_[v] = plan_.values_size();
    *plan_.add_values() = std::move(pv);
    return index_[v];
  }

  absl::Status ConvertArg(const Arg& a, v1::Argument* out) {
    switch (a.kind) {
      case Arg::Kind::kNone: out->mutable_none(); break;
      case Arg::Kind::kValue: {
        const int32_t v = a.value >= 0 && a.value < static_cast<int32_t>(g_.node_value.size()) ? g_.node_value[a.value] : -1;
        if (v < 0) return absl::UnimplementedError("a step argument is not a tensor value");
        KILN_ASSIGN_OR_RETURN(int32_t pi, Ensure(v));
        out->set_node(absl::StrCat("v", pi));
        break;
      }
      case Arg::Kind::kInt: out->set_int_value(a.i); break;
      case Arg::Kind::kFloat: out->set_float_value(a.f); break;
      case Arg::Kind::kBool: out->set_bool_value(a.b); break;
      case Arg::Kind::kString: out->set_string_value(a.s); break;
      case Arg::Kind::kDType: out->set_dtype(a.dtype); break;
      case Arg::Kind::kDevice:
        out->mutable_device()->set_kind(a.device);
        out->mutable_device()->set_index(a.device_index);
        break;
      case Arg::Kind::kLayout: out->set_layout(a.layout); break;
      case Arg::Kind::kMemoryFormat: out->set_memory_format(a.memory_format); break;
      case Arg::Kind::kList: {
        auto* list = out->mutable_list();
        for (const Arg& x : a.list) KILN_RETURN_IF_ERROR(ConvertArg(x, list->add_items()));
        break;
      }
      case Arg::Kind::kSym: return absl::UnimplementedError("symbolic step argument");
    }
    return absl::OkStatus();
  }

  absl::Status AddStep(const ExternStep& st, int32_t pos) {
    const graph::Node& node = g_.graph->nodes[st.node];
    v1::AtenStep* a = plan_.add_steps()->mutable_aten();
    a->set_target(st.target);
    a->set_fallback(st.fallback);
    a->set_node(node.name);
    if (node.op != nullptr) {
      const auto& schema = node.op->schema;
      for (size_t i = 0; i < node.args.size(); ++i) {
        if (i < schema.args.size() && schema.args[i].kwarg_only) {
          v1::NamedArgument* kw = a->add_kwargs();
          kw->set_name(schema.args[i].name);
          KILN_RETURN_IF_ERROR(ConvertArg(node.args[i], kw->mutable_value()));
        } else {
          KILN_RETURN_IF_ERROR(ConvertArg(node.args[i], a->add_args()));
        }
      }
    } else {
      for (const Arg& x : node.args) KILN_RETURN_IF_ERROR(ConvertArg(x, a->add_args()));
      for (const auto& [name, x] : node.kwargs) {
        v1::NamedArgument* kw = a->add_kwargs();
        kw->set_name(name);
        KILN_RETURN_IF_ERROR(ConvertArg(x, kw->mutable_value()));
      }
    }
    for (int32_t in : st.inputs) Read(in, pos);
    for (int32_t o : st.outputs) {
      if (o < 0) {
        a->add_outputs(-1);
        continue;
      }
      KILN_ASSIGN_OR_RETURN(int32_t pi, Ensure(o));
      a->add_outputs(pi);
    }
    return absl::OkStatus();
  }

  // A GEMM as a cuBLASLt call: its operands, its result (allocated by the plan) and its scratch.
  absl::Status AddLibraryStep(const ExternStep& st, const GemmCall& call, int32_t pos) {
    v1::LibraryStep* lib = plan_.add_steps()->mutable_library();
    lib->set_function(kGemmFunction);
    for (int32_t v : {call.d, call.a, call.b, call.c}) {
      if (v < 0) {
        lib->add_args(-1);
        continue;
      }
      KILN_ASSIGN_OR_RETURN(int32_t pi, Ensure(v));
      lib->add_args(pi);
    }
    const int64_t scratch = call.params[kGemmWorkspaceBytesParam];
    if (scratch > 0) {
      v1::PlanValue pv;
      v1::TensorMeta* meta = pv.mutable_meta();
      *meta = g_.values[call.d].meta;
      meta->set_dtype(v1::DTYPE_UINT8);
      meta->clear_sizes();
      meta->clear_strides();
      meta->add_sizes()->set_constant(scratch);
      meta->add_strides()->set_constant(1);
      meta->mutable_storage_offset()->set_constant(0);
      pv.set_storage(v1::PlanValue::STORAGE_WORKSPACE);
      scratch_.push_back({plan_.values_size(), scratch, pos});
      lib->add_args(plan_.values_size());
      *plan_.add_values() = std::move(pv);
    } else {
      lib->add_args(-1);
    }
    for (int64_t p : call.params) lib->add_int_params(p);
    lib->add_float_params(call.alpha);
    lib->add_float_params(call.beta);
    if (absl::Status s = CheckGemmStep(*lib); !s.ok()) {
      return absl::InternalError(absl::StrCat("node ", g_.graph->nodes[st.node].name, ": ", s.message()));
    }
    for (int32_t v : {call.a, call.b, call.c}) {
      if (v >= 0) Read(v, pos);
    }
    Write(call.d, pos);
    return absl::OkStatus();
  }

  void Read(int32_t v, int32_t pos) {
    const int32_t r = ViewRoot(g_, v);
    auto& lr = live_[r];
    lr.second = std::max(lr.second, pos);
  }
  void Write(int32_t v, int32_t pos) {
    auto it = live_.find(v);
    if (it == live_.end()) {
      live_[v] = {pos, pos};
    } else {
      it->second.first = std::min(it->second.first, pos);
    }
  }

  absl::StatusOr<v1::Plan> Run(const KernelSet& ks, const std::vector<KernelBinding>& bindings,
                               PlanStats* stats) {
    // A step whose results may alias its inputs (a view op run by torch, an unknown op) could
    // hand out workspace memory beyond its lifetime: such inputs get their own allocation.
    for (const ExternStep& st : g_.steps) {
      if (!st.may_alias) continue;
      for (int32_t in : st.inputs) pinned_.insert(ViewRoot(g_, in));
    }
    std::map<int32_t, GemmCall> gemms;  // step -> its cuBLASLt call
    if (options_.library_gemms) {
      for (size_t i = 0; i < g_.steps.size(); ++i) {
        const ExternStep& st = g_.steps[i];
        if (st.fallback) continue;
        absl::StatusOr<GemmCall> call = MatchGemm(g_, st);
        if (!call.ok()) {
          if (st.target.find("mm.default") != std::string::npos) {
            spdlog::debug("plan: {}", std::string(call.status().message()));
          }
          continue;
        }
        library_outputs_.insert(call->d);
        gemms.emplace(static_cast<int32_t>(i), *call);
      }
    }
    for (const LValue& v : g_.values) {
      if (v.kind == ValueKind::kInput) (void)Ensure(v.id);
    }
    plan_.set_num_inputs(g_.num_inputs);
    int32_t pos = 0;
    for (const ScheduleItem& it : s_.items) {
      if (it.is_step) {
        const ExternStep& st = g_.steps[it.index];
        if (auto gemm = gemms.find(it.index); gemm != gemms.end()) {
          KILN_RETURN_IF_ERROR(AddLibraryStep(st, gemm->second, pos));
          ++stats->library_steps;
          ++pos;
          continue;
        }
        KILN_RETURN_IF_ERROR(AddStep(st, pos));
        if (st.fallback) {
          ++stats->fallback_steps;
          stats->fallback_nodes.push_back(st.node);
          stats->fallback_reasons.push_back(st.reason);
        } else {
          ++stats->extern_steps;
        }
        ++pos;
        continue;
      }
      const int32_t ki = ks.kernel_of_group[it.index];
      if (ki < 0) continue;
      const GraphKernel& gk = ks.kernels[ki];
      if (ki >= static_cast<int32_t>(bindings.size())) return absl::InternalError("missing kernel binding");
      const KernelBinding& bind = bindings[ki];
      v1::KernelStep* kst = plan_.add_steps()->mutable_kernel();
      kst->set_binary(bind.binary);
      kst->set_symbol(bind.symbol);
      if (bind.grid > 0) {
        kst->add_grid(bind.grid);
        kst->add_block(bind.block);
        kst->set_shared_bytes(bind.shared_bytes);
      }
      for (size_t b = 0; b < gk.args.size(); ++b) {
        KILN_ASSIGN_OR_RETURN(int32_t pi, Ensure(gk.args[b]));
        kst->add_args(pi);
        if (gk.kernel.buffers[b].access == k::Access::kRead) {
          Read(gk.args[b], pos);
        } else {
          Write(gk.args[b], pos);
        }
      }
      ++stats->kernels;
      ++pos;
    }
    for (int32_t o : g_.outputs) {
      if (o < 0) {
        plan_.add_outputs(-1);
        continue;
      }
      KILN_ASSIGN_OR_RETURN(int32_t pi, Ensure(o));
      plan_.add_outputs(pi);
    }
    // Workspace.
    std::vector<BufferRequest> req;
    for (int32_t v : workspace_) {
      auto it = live_.find(v);
      BufferRequest r;
      r.bytes = SpanBytes(g_.values[v]);
      if (it != live_.end()) {
        r.first = it->second.first;
        r.last = std::max(it->second.first, it->second.second);
      }
      req.push_back(r);
    }
    for (const Scratch& sc : scratch_) {
      BufferRequest r;
      r.bytes = sc.bytes;
      r.first = r.last = sc.pos;
      req.push_back(r);
    }
    // 256-byte offsets: cublasLtMatmul requires its workspace (library steps' scratch) 256-byte
    // aligned, and the client's workspace buffer comes from torch's allocator (512-aligned).
    KILN_ASSIGN_OR_RETURN(MemoryPlan mp, PlanMemory(req, 256));
    for (size_t i = 0; i < workspace_.size(); ++i) plan_.mutable_values(index_[workspace_[i]])->set_offset(mp.offsets[i]);
    for (size_t i = 0; i < scratch_.size(); ++i) {
      plan_.mutable_values(scratch_[i].value)->set_offset(mp.offsets[workspace_.size() + i]);
    }
    plan_.set_workspace_bytes(mp.workspace_bytes);
    stats->memory_dump = PrintMemoryPlan(req, mp);
    return std::move(plan_);
  }

 private:
  struct Scratch {
    int32_t value;  // plan value
    int64_t bytes;
    int32_t pos;    // the step using it
  };

  const OpGraph& g_;
  const Schedule& s_;
  const PlanOptions& options_;
  std::vector<int32_t> index_;
  std::set<int32_t> outputs_;
  std::set<int32_t> pinned_;  // computed values allocated as OUTPUT storage (never reused)
  std::vector<int32_t> workspace_;
  std::set<int32_t> library_outputs_;  // results of library steps (allocated by the plan)
  std::vector<Scratch> scratch_;       // library steps' workspace values
  std::map<int32_t, std::pair<int32_t, int32_t>> live_;  // root value -> [first write, last read]
  v1::Plan plan_;
};

}  // namespace

std::vector<KernelBinding> BindToBinary(const std::vector<std::string>& symbols, int32_t binary) {
  std::vector<KernelBinding> out;
  for (const std::string& symbol : symbols) out.push_back({binary, symbol});
  return out;
}

absl::StatusOr<v1::Plan> AssemblePlan(const OpGraph& g, const Schedule& s, const KernelSet& kernels,
                                      const std::vector<KernelBinding>& bindings, PlanStats* stats,
                                      const PlanOptions& options) {
  return Assembler(g, s, options).Run(kernels, bindings, stats);
}

}  // namespace kiln::lower
