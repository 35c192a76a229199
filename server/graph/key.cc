#include "server/graph/key.h"

#include <openssl/evp.h>

#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/graph/op_registry.h"

namespace kiln::graph {

namespace {

namespace v1 = ::kiln::v1;

constexpr char kGroupToken[] = "<group>";

bool IsCollective(const std::string& target) {
  return absl::StartsWith(target, "_c10d_functional.") || absl::StartsWith(target, "c10d_functional.");
}

bool IsRankSpecificName(const std::string& name) {
  return name == "group_name" || name == "tag" || name == "ranks" || name == "group";
}

// Strings that collectives use for reduce ops: these change code and stay hashed.
bool IsReduceOpString(const std::string& s) {
  static const char* const kOps[] = {"sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum"};
  for (const char* op : kOps) {
    if (s == op) return true;
  }
  return false;
}

std::string Hex(const unsigned char* data, size_t n) {
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(data), n));
}

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr);
  return Hex(digest, len);
}

class KeyBuilder {
 public:
  void Add(std::string path, std::string value) { record_.push_back({std::move(path), std::move(value)}); }
  std::vector<KeyField>& record() { return record_; }

 private:
  std::vector<KeyField> record_;
};

// A fallback collective's positional string that is not a reduce op is rank-specific.
std::string CanonicalArg(const Arg& a, bool rank_specific) {
  if (rank_specific) return kGroupToken;
  return ArgToString(a);
}

}  // namespace

absl::Status ValidateTarget(const v1::Target& target) {
  switch (target.device()) {
    case v1::DEVICE_KIND_CUDA: {
      const std::string& arch = target.cuda_arch();
      bool ok = absl::StartsWith(arch, "sm_") && arch.size() >= 5 && arch.size() <= 7;
      size_t digits = 0;
      for (size_t i = 3; ok && i < arch.size(); ++i) {
        if (arch[i] >= '0' && arch[i] <= '9' && digits == i - 3) {
          ++digits;
        } else if (arch[i] == 'a' && i + 1 == arch.size() && digits >= 2) {
        } else {
          ok = false;
        }
      }
      ok = ok && digits >= 2 && digits <= 3;
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat("target.cuda_arch '", absl::CEscape(arch.substr(0, 64)),
                                                       "' is not a real CUDA architecture like sm_80, sm_90 or sm_90a"));
      }
      if (!target.cpu_isa().empty()) return absl::InvalidArgumentError("target.cpu_isa must be empty for a CUDA target");
      return absl::OkStatus();
    }
    case v1::DEVICE_KIND_CPU: {
      const std::string& isa = target.cpu_isa();
      if (isa == "native") {
        return absl::InvalidArgumentError(
            "target.cpu_isa 'native' is refused: it means 'whatever machine compiles this', so the same key would "
            "name different code on different machines; send an explicit -march value such as x86-64-v3");
      }
      bool ok = !isa.empty() && isa.size() <= 64 && isa[0] >= 'a' && isa[0] <= 'z';
      for (char c : isa) {
        ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '+' || c == '_');
      }
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat("target.cpu_isa '", absl::CEscape(isa.substr(0, 64)),
                                                       "' is not a -march value such as x86-64-v3 or armv8.2-a"));
      }
      if (!target.cuda_arch().empty()) return absl::InvalidArgumentError("target.cuda_arch must be empty for a CPU target");
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError("target.device must be CPU or CUDA");
  }
}

absl::StatusOr<CacheKey> ComputeKey(const Graph& graph, const v1::Target& target, const v1::CompileOptions& options,
                                    const CompilerIdentity& compiler) {
  if (auto st = ValidateTarget(target); !st.ok()) return st;
  KeyBuilder k;
  // --- Every field that changes generated code, in one place. ---
  k.Add("format", kKeyFormatVersion);
  k.Add("target.device", DeviceKindName(target.device()));
  if (target.device() == v1::DEVICE_KIND_CUDA) {
    k.Add("target.cuda_arch", target.cuda_arch());
  } else {
    k.Add("target.cpu_isa", target.cpu_isa());
  }
  for (const auto& [name, value] : compiler.components) k.Add(absl::StrCat("compiler.", name), value);
  k.Add("options.cuda_emit_ptx", options.cuda_emit_ptx() ? "true" : "false");
  k.Add("options.disable_fusion", options.disable_fusion() ? "true" : "false");
  k.Add("options.deterministic", options.deterministic() ? "true" : "false");
  // Not hashed: options.keep_source, options.compile_timeout_ms.
  for (size_t i = 0; i < graph.symbols.size(); ++i) {
    k.Add(absl::StrCat("symbol[", i, "].range"),
          absl::StrCat("[", graph.symbols[i].min_value, ", ", graph.symbols[i].max_value, "]"));
  }
  for (size_t i = 0; i < graph.constants.size(); ++i) {
    const Constant& c = graph.constants[i];
    k.Add(absl::StrCat("constant[", i, "].meta"), TensorTypeToString(c.type));
    k.Add(absl::StrCat("constant[", i, "].data"), absl::StrCat("sha256:", Sha256Hex(c.data), " (", c.data.size(), " bytes)"));
  }
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& n = graph.nodes[i];
    const std::string node = absl::StrCat("node[", i, "]");
    switch (n.kind) {
      case NodeKind::kInput:
        k.Add(absl::StrCat(node, ".op"), absl::StrCat("input ", n.input_index));
        k.Add(absl::StrCat("input[", n.input_index, "].meta"), TypeToString(n.type));
        continue;
      case NodeKind::kConstant:
        k.Add(absl::StrCat(node, ".op"), absl::StrCat("constant ", n.constant_index));
        break;
      case NodeKind::kOutput:
        k.Add(absl::StrCat(node, ".op"), "output");
        break;
      case NodeKind::kCall:
        k.Add(absl::StrCat(node, ".op"), n.is_fallback() ? "call fallback" : "call");
        k.Add(absl::StrCat(node, ".target"), n.target);
        break;
    }
    const bool collective = n.kind == NodeKind::kCall && IsCollective(n.target);
    for (size_t a = 0; a < n.args.size(); ++a) {
      bool rank_specific = false;
      if (collective) {
        if (n.op != nullptr) {
          rank_specific = a < n.op->schema.args.size() && IsRankSpecificName(n.op->schema.args[a].name);
        } else {
          rank_specific = n.args[a].kind == Arg::Kind::kString && !IsReduceOpString(n.args[a].s);
        }
      }
      k.Add(absl::StrCat(node, ".arg[", a, "]"), CanonicalArg(n.args[a], rank_specific));
    }
    for (const auto& [name, value] : n.kwargs) {
      const bool rank_specific = collective && (IsRankSpecificName(name) ||
                                                (value.kind == Arg::Kind::kString && !IsReduceOpString(value.s)));
      k.Add(absl::StrCat(node, ".kwarg.", name), CanonicalArg(value, rank_specific));
    }
    if (n.kind != NodeKind::kOutput) k.Add(absl::StrCat(node, ".meta"), TypeToString(n.type));
  }
  if (!graph.free_layout_outputs.empty()) {  // absent from the record otherwise: earlier keys hold
    k.Add("free_layout_outputs", absl::StrJoin(graph.free_layout_outputs, ","));
  }
  // --- Encoding and digest. ---
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return absl::InternalError("EVP SHA-256 initialization failed");
  }
  auto update = [&](absl::string_view s) {
    unsigned char len[4] = {static_cast<unsigned char>(s.size() >> 24), static_cast<unsigned char>(s.size() >> 16),
                            static_cast<unsigned char>(s.size() >> 8), static_cast<unsigned char>(s.size())};
    EVP_DigestUpdate(ctx.get(), len, sizeof(len));
    EVP_DigestUpdate(ctx.get(), s.data(), s.size());
  };
  for (const KeyField& f : k.record()) {
    update(f.path);
    update(f.value);
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx.get(), digest, &len) != 1) return absl::InternalError("EVP SHA-256 failed");
  CacheKey key;
  key.hex = Hex(digest, len);
  key.record = std::move(k.record());
  return key;
}

std::string FormatKeyRecord(const std::vector<KeyField>& record) {
  std::string out;
  for (const KeyField& f : record) absl::StrAppend(&out, f.path, " = ", f.value, "\n");
  return out;
}

std::vector<std::string> DiffKeyRecords(const std::vector<KeyField>& a, const std::vector<KeyField>& b) {
  std::map<std::string, std::string> ma, mb;
  for (const KeyField& f : a) ma[f.path] = f.value;
  for (const KeyField& f : b) mb[f.path] = f.value;
  std::vector<std::string> out;
  for (const KeyField& f : a) {
    auto it = mb.find(f.path);
    if (it == mb.end()) {
      out.push_back(absl::StrCat("- ", f.path, " = ", f.value));
    } else if (it->second != f.value) {
      out.push_back(absl::StrCat(f.path, ": ", f.value, " -> ", it->second));
    }
  }
  for (const KeyField& f : b) {
    if (!ma.count(f.path)) out.push_back(absl::StrCat("+ ", f.path, " = ", f.value));
  }
  return out;
}

}  // namespace kiln::graph
