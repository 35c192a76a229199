#include "client/kilnctl/args.h"

#include "client/kilnctl/format.h"
#include "gtest/gtest.h"

namespace kiln::kilnctl {
namespace {

const std::set<std::string> kGlobal = {"server", "json", "timeout"};
const std::set<std::string> kValued = {"server", "timeout", "sort", "older_than"};

TEST(ParseArgsTest, SplitsGlobalOptionsCommandOptionsAndPositionals) {
  auto args = ParseArgs({"--server", "unix:/s", "--json", "ls", "--sort=size", "--asc", "x"},
                        kGlobal, kValued);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->global.at("server"), "unix:/s");
  EXPECT_TRUE(args->global.count("json"));
  EXPECT_EQ(args->command, "ls");
  EXPECT_EQ(args->options.at("sort"), "size");
  EXPECT_TRUE(args->options.count("asc"));
  ASSERT_EQ(args->positional.size(), 1u);
  EXPECT_EQ(args->positional[0], "x");
}

TEST(ParseArgsTest, ReportsMistakes) {
  EXPECT_FALSE(ParseArgs({"--bogus", "ls"}, kGlobal, kValued).ok());
  EXPECT_FALSE(ParseArgs({"ls", "--sort"}, kGlobal, kValued).ok());
  EXPECT_FALSE(ParseArgs({"ls", "--asc=1"}, kGlobal, kValued).ok());
}

TEST(ParseArgsTest, DoubleDashEndsOptions) {
  auto args = ParseArgs({"show", "--", "--not-an-option"}, kGlobal, kValued);
  ASSERT_TRUE(args.ok());
  ASSERT_EQ(args->positional.size(), 1u);
  EXPECT_EQ(args->positional[0], "--not-an-option");
}

TEST(FormatTest, HumanUnitsAndAges) {
  EXPECT_EQ(HumanBytes(512), "512 B");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanMicros(850), "850 us");
  EXPECT_EQ(HumanMicros(12300), "12.3 ms");
  EXPECT_EQ(*ParseAge("7d"), absl::Hours(168));
  EXPECT_EQ(*ParseAge("90m"), absl::Minutes(90));
  EXPECT_FALSE(ParseAge("soon").ok());
  EXPECT_FALSE(ParseAge("-5m").ok());
  Table t({"A", "BB"});
  t.AddRow({"long value", "x"});
  EXPECT_EQ(t.Render(), "A           BB\nlong value  x\n");
}

}  // namespace
}  // namespace kiln::kilnctl
