#include "server/cache_entry.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "server/cache/encoding.h"
#include "server/graph/ir.h"
#include "server/packages.h"

namespace kiln {
std::string TargetName(const kiln::v1::Target& target) {
  switch (target.device()) {
    case kiln::v1::DEVICE_KIND_CPU: return absl::StrCat("cpu:", target.cpu_isa());
    case kiln::v1::DEVICE_KIND_CUDA: return absl::StrCat("cuda:", target.cuda_arch());
    default: return "unknown";
  }
}

kiln::v1::Target ParseTargetName(const std::string& name) {
  kiln::v1::Target target;
  absl::string_view rest = name;
  if (absl::ConsumePrefix(&rest, "cpu:")) {
    target.set_device(kiln::v1::DEVICE_KIND_CPU);
    target.set_cpu_isa(std::string(rest));
  } else if (absl::ConsumePrefix(&rest, "cuda:")) {
    target.set_device(kiln::v1::DEVICE_KIND_CUDA);
    target.set_cuda_arch(std::string(rest));
  }
  return target;
}

std::string ArtifactChecksum(const kiln::v1::Artifact& artifact) {
  kiln::v1::Artifact copy = artifact;
  copy.clear_checksum();
  std::string bytes;
  // Deterministic serialization: the checksum must not depend on map ordering.
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    copy.SerializeToCodedStream(&coded);
  }
  return cache::Sha256Hex(bytes);
}

cache::EntryRecord MakeEntryRecord(const graph::PreparedGraph& prepared,
                                   const kiln::v1::CompileRequest& request, CompileResult result) {
  result.artifact.set_format_version(kArtifactFormatVersion);
  *result.artifact.mutable_target() = request.target();
  result.artifact.set_checksum(ArtifactChecksum(result.artifact));

  cache::EntryRecord record;
  record.artifact = result.artifact.SerializeAsString();
  kiln::v1::CompileRequest stored = request;
  stored.clear_client();
  record.sections.push_back({"request", stored.SerializeAsString()});
  record.sections.push_back({"graph", graph::PrintGraph(prepared.graph)});
  // Key record and timings as a serialized kiln.v1.Entry holding only those fields: values may
  // contain any byte.
  kiln::v1::Entry key_record;
  for (const graph::KeyField& f : prepared.key.record) {
    kiln::v1::KeyField* field = key_record.add_key_record();
    field->set_path(f.path);
    field->set_value(f.value);
  }
  record.sections.push_back({"key_record", key_record.SerializeAsString()});
  kiln::v1::Entry timings;
  for (const auto& list : {prepared.timings_us, result.timings_us}) {
    for (const auto& [phase, us] : list) {
      kiln::v1::PhaseTiming* t = timings.add_timings();
      t->set_phase(phase);
      t->set_micros(us);
    }
  }
  record.sections.push_back({"timings", timings.SerializeAsString()});
  record.sections.push_back({"summary", result.summary});
  if (!result.log.empty()) record.sections.push_back({"log", std::move(result.log)});
  for (auto& [name, text] : result.sources) {
    record.sections.push_back({absl::StrCat("source/", name), std::move(text)});
  }
  return record;
}

absl::StatusOr<kiln::v1::Artifact> ReadArtifact(const cache::EntryRecord& record) {
  kiln::v1::Artifact artifact;
  if (!artifact.ParseFromString(record.artifact)) {
    return absl::DataLossError("the stored artifact does not parse as kiln.v1.Artifact");
  }
  if (artifact.format_version() != kArtifactFormatVersion) {
    return absl::DataLossError(absl::StrCat("the stored artifact has format version ",
                                            artifact.format_version(), "; this kilnd reads ",
                                            kArtifactFormatVersion));
  }
  if (ArtifactChecksum(artifact) != artifact.checksum()) {
    return absl::DataLossError("the stored artifact's checksum does not match its contents");
  }
  return artifact;
}

void FillSummary(const cache::EntryMeta& meta, kiln::v1::EntrySummary* summary) {
  summary->set_key(meta.key);
  summary->set_size_bytes(meta.size_bytes);
  summary->set_created_unix_ms(meta.created_unix_ms);
  summary->set_last_hit_unix_ms(meta.last_hit_unix_ms);
  summary->set_hits(meta.hits);
  *summary->mutable_target() = ParseTargetName(meta.target);
  summary->set_graph_summary(meta.graph_summary);
  summary->set_debug_name(meta.debug_name);
}

void FillEntry(const cache::EntryMeta& meta, const cache::EntryRecord& record,
               const kiln::v1::GetEntryRequest& request, kiln::v1::Entry* entry) {
  FillSummary(meta, entry->mutable_summary());
  if (IsPackageRecord(record)) {  // opaque data: no graph, plan, sources, log or key record
    entry->set_package_bytes(static_cast<int64_t>(record.Find(kPackageSection)->data.size()));
    return;
  }
  if (request.include_graph()) {
    if (const cache::EntrySection* s = record.Find("graph")) entry->set_graph_text(s->data);
  }
  if (request.include_source()) {
    for (const cache::EntrySection* s : record.FindAll("source/")) {
      kiln::v1::SourceFile* file = entry->add_sources();
      file->set_name(s->name.substr(7));
      file->set_text(s->data);
    }
  }
  if (request.include_plan()) {
    kiln::v1::Artifact artifact;
    if (artifact.ParseFromString(record.artifact)) *entry->mutable_plan() = artifact.plan();
  }
  if (request.include_log()) {
    if (const cache::EntrySection* s = record.Find("log")) entry->set_compile_log(s->data);
  }
  if (request.include_timings()) {
    kiln::v1::Entry timings;
    if (const cache::EntrySection* s = record.Find("timings"); s && timings.ParseFromString(s->data)) {
      *entry->mutable_timings() = timings.timings();
    }
  }
  if (request.include_key_record()) {
    kiln::v1::Entry key_record;
    if (const cache::EntrySection* s = record.Find("key_record");
        s && key_record.ParseFromString(s->data)) {
      *entry->mutable_key_record() = key_record.key_record();
    }
  }
}

}  // namespace kiln
