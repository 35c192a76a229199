// prepare_graph: runs the graph path on serialized kiln.v1.CompileRequest files (as the Python
// client writes them) and reports, for each: OK with the key and fallback ops, or the error.
//   bazel run //server/graph:prepare_graph -- [--print] [--record] FILE...
// --print shows the IR (PrintGraph); --record shows every hashed field (FormatKeyRecord);
// --schemas lists the op registry.

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "kiln/v1/compiler.pb.h"
#include "server/graph/graph_path.h"
#include "server/graph/op_registry.h"

int main(int argc, char** argv) {
  bool print = false, record = false;
  int failures = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--print") {
      print = true;
      continue;
    }
    if (arg == "--record") {
      record = true;
      continue;
    }
    if (arg == "--schemas") {  // the registry: target, class, schema
      for (const kiln::graph::OpDef* op : kiln::graph::AllOps()) {
        std::cout << op->target << "\t" << kiln::graph::OpClassName(op->op_class) << "\t" << op->schema.ToString()
                  << "\n";
      }
      continue;
    }
    std::ifstream in(arg, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    kiln::v1::CompileRequest request;
    if (!in || !request.ParseFromString(bytes.str())) {
      std::cout << arg << ": not a serialized kiln.v1.CompileRequest\n";
      ++failures;
      continue;
    }
    kiln::graph::CompilerIdentity compiler{{{"tool", "prepare_graph"}}};
    auto prepared = kiln::graph::PrepareGraph(request, kiln::graph::GraphLimits(), compiler);
    if (!prepared.ok()) {
      std::cout << arg << ": " << prepared.status() << "\n";
      ++failures;
      continue;
    }
    std::cout << arg << ": OK " << prepared->graph.nodes.size() << " nodes, key " << prepared->key.hex << " (";
    for (const auto& [phase, us] : prepared->timings_us) std::cout << phase << " " << us << "us ";
    std::cout << ")";
    for (int32_t f : prepared->fallback_nodes) std::cout << " [fallback " << prepared->graph.nodes[f].target << "]";
    std::cout << "\n";
    if (print) std::cout << kiln::graph::PrintGraph(prepared->graph);
    if (record) std::cout << kiln::graph::FormatKeyRecord(prepared->key.record);
  }
  return failures == 0 ? 0 : 1;
}
