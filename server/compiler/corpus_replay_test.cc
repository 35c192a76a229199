// Process replay: every captured AOTAutograd graph of server/graph/testdata goes through
// lower -> fuse -> kernels -> plan -> emit (no C++ compile: cpu_compiler_test covers that). Each
// kernel must verify and each plan must be self-consistent (the checks below restate the plan
// semantics of server/lower/plan_builder.h). The per-graph summary is printed for diffing by hand.

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kiln/v1/compiler.pb.h"
#include "server/codegen/cpu_emitter.h"
#include "server/compiler/test_util.h"
#include "server/graph/graph_path.h"
#include "server/kernel/verifier.h"
#include "server/lower/fuse.h"
#include "server/lower/kernelize.h"
#include "server/lower/lower.h"
#include "server/lower/plan_builder.h"

namespace kiln::lower {
namespace {

namespace v1 = ::kiln::v1;

std::string CheckPlan(const v1::Plan& plan, const KernelSet& ks) {
  std::vector<bool> ready(plan.values_size(), false);
  for (int i = 0; i < plan.values_size(); ++i) {
    const v1::PlanValue& v = plan.values(i);
    switch (v.storage()) {
      case v1::PlanValue::STORAGE_INPUT:
        if (v.index() < 0 || v.index() >= plan.num_inputs()) return absl::StrCat("v", i, ": input index");
        ready[i] = true;
        break;
      case v1::PlanValue::STORAGE_WORKSPACE:
        if (v.offset() % 64 != 0 || v.offset() < 0) return absl::StrCat("v", i, ": workspace offset");
        ready[i] = true;
        break;
      case v1::PlanValue::STORAGE_VIEW:
        if (v.index() < 0 || v.index() >= plan.values_size() ||
            plan.values(v.index()).storage() == v1::PlanValue::STORAGE_VIEW) {
          return absl::StrCat("v", i, ": view base");
        }
        break;
      case v1::PlanValue::STORAGE_STEP:
        break;
      case v1::PlanValue::STORAGE_OUTPUT: case v1::PlanValue::STORAGE_CONSTANT:
        ready[i] = true;
        break;
      default:
        return absl::StrCat("v", i, ": storage unspecified");
    }
  }
  auto is_ready = [&](int i) -> bool {
    if (i < 0 || i >= plan.values_size()) return false;
    const v1::PlanValue& v = plan.values(i);
    return v.storage() == v1::PlanValue::STORAGE_VIEW ? ready[v.index()] : ready[i];
  };
  int kernel = 0;
  for (const v1::PlanStep& s : plan.steps()) {
    if (s.has_kernel()) {
      const auto& buffers = ks.kernels.at(kernel++).kernel.buffers;
      if (s.kernel().args_size() != static_cast<int>(buffers.size())) return "kernel arg count";
      for (int j = 0; j < s.kernel().args_size(); ++j) {
        const int a = s.kernel().args(j);
        if (!is_ready(a)) return absl::StrCat(s.kernel().symbol(), ": arg v", a, " not ready");
        if (plan.values(a).meta().dtype() == v1::DTYPE_UNSPECIFIED) return "arg dtype";
      }
    } else {
      for (const v1::Argument& a : s.aten().args()) {
        if (a.value_case() == v1::Argument::kNode && !is_ready(std::stoi(a.node().substr(1)))) {
          return absl::StrCat(s.aten().target(), ": arg ", a.node(), " not ready");
        }
      }
      for (int32_t o : s.aten().outputs()) {
        if (o >= 0) ready[o] = true;
      }
    }
  }
  for (int32_t o : plan.outputs()) {
    if (o >= 0 && !is_ready(o)) return absl::StrCat("output v", o, " not ready");
  }
  return "";
}

TEST(CorpusReplayTest, EveryCapturedGraphLowersFusesAndPlans) {
  const auto captured = compiler::testing::CapturedRequests();
  ASSERT_GE(captured.size(), 20u);
  int compiled = 0;
  std::string summary;
  for (const auto& [f, captured_request] : captured) {
    v1::CompileRequest req = captured_request;
    req.mutable_target()->Clear();
    req.mutable_target()->set_device(v1::DEVICE_KIND_CPU);
    req.mutable_target()->set_cpu_isa("x86-64");
    auto prepared = graph::PrepareGraph(req, graph::GraphLimits(), graph::CompilerIdentity());
    ASSERT_TRUE(prepared.ok()) << f << ": " << prepared.status();
    auto ops = LowerGraph(prepared->graph, prepared->fallback_nodes);
    if (!ops.ok()) {
      EXPECT_EQ(ops.status().code(), absl::StatusCode::kUnimplemented) << f << ": " << ops.status();
      EXPECT_TRUE(absl::StrContains(ops.status().message(), "dynamic shapes")) << f << ": " << ops.status();
      absl::StrAppend(&summary, f, ": ", ops.status().message(), "\n");
      continue;
    }
    for (bool disable : {false, true}) {
      auto s = ScheduleAndFuse(*ops, FuseOptions{disable});
      ASSERT_TRUE(s.ok()) << f;
      auto ks = BuildKernels(*ops, *s);
      ASSERT_TRUE(ks.ok()) << f << ": " << ks.status();
      std::vector<kernel::Kernel> kernels;
      std::vector<std::string> symbols;
      for (const auto& k : ks->kernels) {
        EXPECT_TRUE(kernel::VerifyKernel(k.kernel).ok()) << f;
        kernels.push_back(k.kernel);
        symbols.push_back(codegen::CpuKernelSymbol(static_cast<int>(symbols.size())));
      }
      PlanStats stats;
      auto plan = AssemblePlan(*ops, *s, *ks, BindToBinary(symbols, 0), &stats);
      ASSERT_TRUE(plan.ok()) << f << ": " << plan.status();
      EXPECT_EQ(CheckPlan(*plan, *ks), "") << f << (disable ? " (fusion disabled)" : "");
      if (!kernels.empty()) {
        auto src = codegen::EmitCpuSource(kernels);
        EXPECT_TRUE(src.ok()) << f << ": " << src.status();
      }
      if (!disable) {
        absl::StrAppend(&summary, f, ": ", stats.kernels, " kernels, ", stats.extern_steps, " extern, ",
                        stats.fallback_steps, " fallback, workspace ", plan->workspace_bytes(), "\n");
      }
    }
    ++compiled;
  }
  EXPECT_GE(compiled, 30);
  std::cout << summary;
}

}  // namespace
}  // namespace kiln::lower
