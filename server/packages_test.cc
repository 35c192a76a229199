#include "server/packages.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/cache/encoding.h"
#include "server/cache/entry_record.h"

namespace kiln {
namespace {

const std::string kClientKey(64, 'a');

TEST(PackageStoreKeyTest, IsStableAndDiffersFromTheClientKey) {
  absl::StatusOr<std::string> key = PackageStoreKey(kClientKey);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_TRUE(cache::IsValidKey(*key));
  EXPECT_NE(*key, kClientKey);
  EXPECT_EQ(*key, *PackageStoreKey(kClientKey));
  // The documented derivation: SHA-256 of "kiln.package.v1" '\0' client key.
  EXPECT_EQ(*key, cache::Sha256Hex(std::string("kiln.package.v1\0", 16) + kClientKey));
  EXPECT_NE(*key, *PackageStoreKey(std::string(64, 'b')));
}

TEST(PackageStoreKeyTest, BadKeysNameTheProblem) {
  absl::StatusOr<std::string> short_key = PackageStoreKey("abc");
  ASSERT_EQ(short_key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(short_key.status().message(), "package key"));
  EXPECT_TRUE(absl::StrContains(short_key.status().message(), "64 lowercase hex"));
  EXPECT_TRUE(absl::StrContains(short_key.status().message(), "got 3 characters"));

  std::string upper(64, 'A');
  EXPECT_EQ(PackageStoreKey(upper).status().code(), absl::StatusCode::kInvalidArgument);
  std::string with_nul = kClientKey;
  with_nul[10] = '\0';
  absl::Status nul = PackageStoreKey(with_nul).status();
  EXPECT_EQ(nul.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(absl::StrContains(nul.message(), absl::string_view("\0", 1)));  // escaped
}

TEST(PackageLimitsTest, SizeAndSwitch) {
  EXPECT_TRUE(CheckPackagesEnabled(1).ok());
  absl::Status off = CheckPackagesEnabled(0);
  EXPECT_EQ(off.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(off.message(), "--max_package_bytes")) << off;

  EXPECT_TRUE(CheckPackageSize(100, 100).ok());
  absl::Status over = CheckPackageSize(101, 100);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(over.message(), "101 bytes")) << over;
  EXPECT_TRUE(absl::StrContains(over.message(), "100 bytes")) << over;
  EXPECT_TRUE(absl::StrContains(over.message(), "--max_package_bytes")) << over;

  EXPECT_EQ(CheckPackageSize(0, 100).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckPackageSize(1, 0).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(PackageRecordTest, RoundTripsAnyBytes) {
  std::string data("\0\x01pickle\xff\n", 10);
  std::string record = EncodePackageRecord(data);
  absl::StatusOr<std::string> back = DecodePackageRecord(record);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, data);

  absl::StatusOr<cache::EntryRecord> decoded = cache::DecodeEntryRecord(record);
  ASSERT_TRUE(decoded.ok());
  EXPECT_TRUE(decoded->artifact.empty());
  ASSERT_EQ(decoded->sections.size(), 1u);
  EXPECT_EQ(decoded->sections[0].name, "package");
  EXPECT_TRUE(IsPackageRecord(*decoded));
}

TEST(PackageRecordTest, RefusesWhatIsNotAPackage) {
  cache::EntryRecord graph;
  graph.artifact = "serialized artifact";
  graph.sections.push_back({"package", "x"});
  EXPECT_FALSE(IsPackageRecord(graph));
  EXPECT_EQ(DecodePackageRecord(cache::EncodeEntryRecord(graph)).status().code(),
            absl::StatusCode::kDataLoss);

  cache::EntryRecord no_section;
  no_section.sections.push_back({"log", "x"});
  EXPECT_EQ(DecodePackageRecord(cache::EncodeEntryRecord(no_section)).status().code(),
            absl::StatusCode::kDataLoss);

  std::string truncated = EncodePackageRecord("data");
  truncated.pop_back();
  EXPECT_FALSE(DecodePackageRecord(truncated).ok());
  EXPECT_FALSE(DecodePackageRecord("").ok());
}

TEST(PackageMetaTest, SummaryIsOneBoundedLine) {
  EXPECT_EQ(PackageSummaryLine("", 42), "package, 42 bytes");
  EXPECT_EQ(PackageSummaryLine(" \n ", 42), "package, 42 bytes");
  EXPECT_EQ(PackageSummaryLine("Block.forward\ntwo graphs\r\n", 42),
            "package: Block.forward two graphs  ");
  std::string long_summary(1000, 'x');
  EXPECT_EQ(PackageSummaryLine(long_summary, 1), "package: " + std::string(200, 'x'));

  cache::EntryMeta meta = PackageMeta("cuda:sm_90", "Block.forward", "3 graphs", 7);
  EXPECT_EQ(meta.target, "cuda:sm_90");
  EXPECT_EQ(meta.debug_name, "Block.forward");
  EXPECT_EQ(meta.graph_summary, "package: 3 graphs");
}

TEST(PackageMetaTest, CutsNeverSplitUtf8) {
  // "é" is two bytes (C3 A9): a cut after 3 bytes of "aéé" keeps "aé", one after 2 keeps "a".
  EXPECT_EQ(OneLine("a\xC3\xA9\xC3\xA9", 3), "a\xC3\xA9");
  EXPECT_EQ(OneLine("a\xC3\xA9\xC3\xA9", 2), "a");
  EXPECT_EQ(OneLine("tab\there", 100), "tab here");
}

}  // namespace
}  // namespace kiln
