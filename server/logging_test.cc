#include "server/logging.h"

#include "gtest/gtest.h"

namespace kiln {
namespace {

TEST(LoggingTest, JsonEscapeQuotesControlCharacters) {
  EXPECT_EQ(JsonEscape("plain"), "plain");
  EXPECT_EQ(JsonEscape("a\"b\\c\nd\te"), "a\\\"b\\\\c\\nd\\te");
  EXPECT_EQ(JsonEscape(std::string("\x01", 1)), "\\u0001");
}

TEST(LoggingTest, RejectsUnknownFormatAndLevel) {
  EXPECT_TRUE(ConfigureLogging("text", "info").ok());
  EXPECT_TRUE(ConfigureLogging("json", "debug").ok());
  EXPECT_EQ(ConfigureLogging("xml", "info").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConfigureLogging("text", "loud").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln
