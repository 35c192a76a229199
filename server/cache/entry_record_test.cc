#include "server/cache/entry_record.h"

#include "gtest/gtest.h"

namespace kiln::cache {
namespace {

EntryRecord Sample() {
  EntryRecord r;
  r.artifact = std::string("\0artifact\xff", 10);
  r.sections.push_back({"source/kernel_0.cu", "__global__ void k() {}"});
  r.sections.push_back({"log", "nvrtc: ok"});
  r.sections.push_back({"source/kernel_1.cu", ""});
  return r;
}

TEST(EntryRecordTest, RoundTripsArtifactAndSections) {
  const Bytes bytes = EncodeEntryRecord(Sample());
  auto decoded = DecodeEntryRecord(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->artifact, Sample().artifact);
  ASSERT_EQ(decoded->sections.size(), 3u);
  EXPECT_EQ(decoded->Find("log")->data, "nvrtc: ok");
  EXPECT_EQ(decoded->Find("key_record"), nullptr);
  auto sources = decoded->FindAll("source/");
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_EQ(sources[0]->name, "source/kernel_0.cu");
  EXPECT_EQ(sources[1]->data, "");
}

TEST(EntryRecordTest, EmptyRecordRoundTrips) {
  auto decoded = DecodeEntryRecord(EncodeEntryRecord(EntryRecord{}));
  ASSERT_TRUE(decoded.ok());
  EXPECT_TRUE(decoded->artifact.empty());
  EXPECT_TRUE(decoded->sections.empty());
}

TEST(EntryRecordTest, EveryTruncationAndTrailingGarbageIsRefused) {
  const Bytes bytes = EncodeEntryRecord(Sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(DecodeEntryRecord(bytes.substr(0, n)).status().code(), absl::StatusCode::kDataLoss)
        << n;
  }
  EXPECT_FALSE(DecodeEntryRecord(bytes + "x").ok());
}

TEST(EntryRecordTest, OtherVersionIsRefused) {
  Bytes bytes = EncodeEntryRecord(Sample());
  bytes[8] = 2;  // the version follows the 8-byte magic
  auto decoded = DecodeEntryRecord(bytes);
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(decoded.status().message().find("version"), absl::string_view::npos);
}

}  // namespace
}  // namespace kiln::cache
