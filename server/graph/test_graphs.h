#ifndef KILN_SERVER_GRAPH_TEST_GRAPHS_H_
#define KILN_SERVER_GRAPH_TEST_GRAPHS_H_

// Test helpers: a small builder for kiln.v1 graphs as the Python client serializes them, and a few
// realistic AOTAutograd graphs (MLP forward/backward, a transformer attention block, a conv+BN
// block, a dynamic-shape graph, a collective graph) with the metadata torch produces.

#include <string>
#include <utility>
#include <vector>

#include "kiln/v1/compiler.pb.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::graph::testing {

namespace v1 = ::kiln::v1;

// Metadata. Empty `strides` means contiguous.
v1::TensorMeta TMeta(v1::DType dtype, std::vector<int64_t> sizes, std::vector<int64_t> strides = {},
                     v1::DeviceKind device = v1::DEVICE_KIND_CUDA, int64_t offset = 0);
v1::ValueMeta T(v1::DType dtype, std::vector<int64_t> sizes, std::vector<int64_t> strides = {},
                v1::DeviceKind device = v1::DEVICE_KIND_CUDA, int64_t offset = 0);
v1::ValueMeta F32(std::vector<int64_t> sizes, std::vector<int64_t> strides = {}, int64_t offset = 0);
v1::ValueMeta Tuple(std::vector<v1::ValueMeta> items);
v1::ValueMeta SymMeta(v1::SymExpr e);
v1::ValueMeta NoneMeta();

// Arguments.
v1::Argument Ref(const std::string& node);
v1::Argument I(int64_t v);
v1::Argument F(double v);
v1::Argument B(bool v);
v1::Argument S(const std::string& v);
v1::Argument Dt(v1::DType d);
v1::Argument Dev(v1::DeviceKind kind, int32_t index);
v1::Argument Mf(v1::MemoryFormat m);
v1::Argument None();
v1::Argument L(std::vector<v1::Argument> items, bool is_tuple = false);
v1::Argument Ints(std::vector<int64_t> v);
v1::Argument SymArg(v1::SymExpr e);

v1::SymExpr SymC(int64_t c);
v1::SymExpr SymS(int32_t index);
v1::SymExpr SymOp(v1::SymExpr::Op op, std::vector<v1::SymExpr> args);

class GraphBuilder {
 public:
  GraphBuilder& Input(const std::string& name, v1::ValueMeta meta);
  GraphBuilder& Call(const std::string& name, const std::string& target, std::vector<v1::Argument> args,
                     v1::ValueMeta meta, std::vector<std::pair<std::string, v1::Argument>> kwargs = {});
  GraphBuilder& Output(std::vector<std::string> names);
  GraphBuilder& Symbol(const std::string& name, int64_t hint, int64_t min_value, int64_t max_value);
  v1::Graph Build() const { return graph_; }

 private:
  v1::Graph graph_;
};

v1::Graph MlpForward();
v1::Graph MlpBackward();
v1::Graph AttentionBlock();
v1::Graph ConvBlock();
v1::Graph DynamicGraph();
v1::Graph CollectiveGraph(const std::string& group_name);
// A training batch norm over x of `sizes` (f32 on the CPU; empty `strides`: contiguous) and its
// backward (train=true, every gradient): outputs out, save_mean, save_invstd, the new running mean
// and var, grad_input, grad_weight, grad_bias. Inputs x, w, bias, rm, rv, go (go laid out as x).
v1::Graph TrainingBatchNorm(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides = {});
std::vector<v1::Graph> AllTestGraphs();

// Imports a graph of placeholders "a0", "a1", ... (with `inputs` metadata) and one call of
// `target`, checks the arguments against the schema and runs inference. Returns the inferred type
// as TypeToString prints it, or "error: <message>".
std::string InferString(const std::string& target, std::vector<v1::ValueMeta> inputs, std::vector<v1::Argument> args,
                        std::vector<std::pair<std::string, v1::Argument>> kwargs = {});

// Symbols that InferString gives its graphs (tests of symbolic inference set them).
google::protobuf::RepeatedPtrField<v1::Symbol>& symbols_for_infer();

v1::CompileRequest Request(v1::Graph graph, const std::string& cuda_arch = "sm_90");

}  // namespace kiln::graph::testing

#endif  // KILN_SERVER_GRAPH_TEST_GRAPHS_H_
