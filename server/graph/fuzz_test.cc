// Robustness: valid serialized graphs truncated at every length and randomly mutated, fed to
// ParseFromString + PrepareGraph. Nothing may crash or hang; every result is OK or an error.

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <random>

#include <google/protobuf/stubs/logging.h>

#include "server/graph/graph_path.h"
#include "server/graph/test_graphs.h"

namespace kiln::graph {
namespace {

using namespace ::kiln::graph::testing;  // NOLINT

#if defined(__SANITIZE_ADDRESS__)
constexpr int kScale = 8;  // sanitizers are ~10x slower
#else
constexpr int kScale = 1;
#endif

CompilerIdentity Compiler() { return CompilerIdentity{{{"nvrtc", "13.0"}}}; }

// Mutated strings are often invalid UTF-8; protobuf logs each one. Keep the test log readable.
const bool kQuietProtobuf = [] {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();

int Feed(const std::string& bytes, int* ok_count) {
  v1::CompileRequest r;
  if (!r.ParseFromString(bytes)) return 0;
  auto p = PrepareGraph(r, GraphLimits(), Compiler());
  if (p.ok()) ++*ok_count;
  return 1;
}

// Real client-serialized graphs from the corpus (see corpus_test), as extra seeds.
std::vector<std::string> CorpusSeeds() {
  std::vector<std::string> out;
  for (const char* name : {"block_dyn_bwd", "conv_cl_cuda_bwd", "zoo3_fwd", "emb_cuda_fwd"}) {
    std::ifstream in(std::string("server/graph/testdata/") + name + ".binpb", std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    EXPECT_FALSE(s.str().empty()) << name;
    out.push_back(s.str());
  }
  return out;
}

std::vector<std::string> Seeds() {
  std::vector<std::string> out;
  for (const v1::Graph& g : AllTestGraphs()) out.push_back(Request(g).SerializeAsString());
  for (std::string& s : CorpusSeeds()) out.push_back(std::move(s));
  return out;
}

TEST(FuzzTest, EveryTruncation) {
  int ok = 0, parsed = 0;
  for (const std::string& s : Seeds()) {
    const size_t step = kScale * (s.size() > 8192 ? 7 : 1);
    for (size_t len = 0; len <= s.size(); len += step) parsed += Feed(s.substr(0, len), &ok);
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(ok, 0);  // at least the full-length seeds
}

TEST(FuzzTest, RandomByteMutations) {
  std::mt19937_64 rng(0x6b696c6e);  // deterministic
  const std::vector<std::string> seeds = Seeds();
  int ok = 0, parsed = 0;
  const int iterations = 60000 / kScale;
  for (int i = 0; i < iterations; ++i) {
    std::string s = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t pos = rng() % s.size();
      switch (rng() % 5) {
        case 0: s[pos] = static_cast<char>(rng()); break;                       // overwrite
        case 1: s[pos] = static_cast<char>(s[pos] ^ (1u << (rng() % 8))); break;  // bit flip
        case 2: s.erase(pos, 1 + rng() % 4); break;                              // delete
        case 3: s.insert(pos, 1, static_cast<char>(rng())); break;               // insert
        default: {  // splice a chunk from elsewhere
          const std::string& other = seeds[rng() % seeds.size()];
          const size_t from = rng() % other.size();
          s.insert(pos, other.substr(from, 1 + rng() % 32));
        }
      }
    }
    parsed += Feed(s, &ok);
  }
  EXPECT_GT(parsed, 0);
}

// Structured mutations: valid protos with hostile field values.
TEST(FuzzTest, RandomFieldMutations) {
  std::mt19937_64 rng(42);
  std::vector<v1::Graph> graphs = AllTestGraphs();
  for (const std::string& s : CorpusSeeds()) {
    v1::CompileRequest r;
    ASSERT_TRUE(r.ParseFromString(s));
    graphs.push_back(r.graph());
  }
  const int64_t hostile[] = {0, -1, 1, 2, 63, 64, int64_t{1} << 31, int64_t{1} << 62, INT64_MAX, INT64_MIN, -7};
  int ok = 0;
  const int iterations = 60000 / kScale;
  for (int i = 0; i < iterations; ++i) {
    v1::CompileRequest r = Request(graphs[rng() % graphs.size()]);
    v1::Graph* g = r.mutable_graph();
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      v1::Node* n = g->mutable_nodes(static_cast<int>(rng() % g->nodes_size()));
      const int64_t v = hostile[rng() % (sizeof(hostile) / sizeof(hostile[0]))];
      if (rng() % 16 == 0 && g->symbols_size() > 0) {
        v1::Symbol* sym = g->mutable_symbols(0);
        if (rng() % 2) sym->set_hint(v); else sym->set_max_value(v);
        continue;
      }
      switch (rng() % 10) {
        case 0:
          if (n->meta().has_tensor() && n->meta().tensor().sizes_size() > 0) {
            auto* t = n->mutable_meta()->mutable_tensor();
            t->mutable_sizes(static_cast<int>(rng() % t->sizes_size()))->set_constant(v);
          }
          break;
        case 1:
          if (n->meta().has_tensor() && n->meta().tensor().strides_size() > 0) {
            auto* t = n->mutable_meta()->mutable_tensor();
            t->mutable_strides(static_cast<int>(rng() % t->strides_size()))->set_constant(v);
          }
          break;
        case 2:
          if (n->args_size() > 0) *n->mutable_args(static_cast<int>(rng() % n->args_size())) = I(v);
          break;
        case 3:
          if (n->args_size() > 0) {
            *n->mutable_args(static_cast<int>(rng() % n->args_size())) =
                Ref(g->nodes(static_cast<int>(rng() % g->nodes_size())).name());
          }
          break;
        case 4:
          n->set_target(g->nodes(static_cast<int>(rng() % g->nodes_size())).target());
          break;
        case 5:
          if (n->meta().has_tensor()) n->mutable_meta()->mutable_tensor()->set_dtype(static_cast<v1::DType>(v & 31));
          break;
        case 6:
          if (n->args_size() > 0) n->mutable_args()->RemoveLast();
          break;
        case 7: {
          v1::Argument* a = n->add_args();
          *a = L({Ints({v, v}), SymArg(SymOp(v1::SymExpr::OP_FLOOR_DIV, {SymC(v), SymC(0)}))});
          break;
        }
        case 8:
          if (n->meta().has_tensor()) {
            *n->mutable_meta()->mutable_tensor()->add_sizes()->mutable_expr() =
                SymOp(v1::SymExpr::OP_MUL, {SymC(v), SymS(static_cast<int32_t>(rng() % 3))});
            n->mutable_meta()->mutable_tensor()->add_strides()->set_constant(v);
          }
          break;
        default:
          g->mutable_nodes()->SwapElements(static_cast<int>(rng() % g->nodes_size()),
                                           static_cast<int>(rng() % g->nodes_size()));
      }
    }
    auto p = PrepareGraph(r, GraphLimits(), Compiler());
    if (p.ok()) ++ok;
  }
  std::cout << ok << " of " << iterations << " field-mutated graphs still valid\n";
  EXPECT_GT(ok, 0);
}

TEST(FuzzTest, DeepAndWideInputsAreBounded) {
  // A SymExpr nested as deep as protobuf allows, and a very long list: refused, not recursed into.
  v1::SymExpr e = SymS(0);
  for (int i = 0; i < 90; ++i) e = SymOp(v1::SymExpr::OP_NEG, {e});
  v1::Graph g = DynamicGraph();
  *g.mutable_nodes(0)->mutable_meta()->mutable_tensor()->mutable_sizes(0)->mutable_expr() = e;
  auto p = PrepareGraph(Request(g), GraphLimits(), Compiler());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
  GraphBuilder b;
  b.Input("x", F32({4}));
  std::vector<v1::Argument> many(100000, I(1));
  b.Call("f", "aten.foo.default", {L(many)}, F32({4})).Output({"f"});
  p = PrepareGraph(Request(b.Build()), GraphLimits(), Compiler());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
}

}  // namespace
}  // namespace kiln::graph
