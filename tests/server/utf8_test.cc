#include "server/utf8.h"

#include <gtest/gtest.h>

namespace m3::server {
namespace {

TEST(Utf8, AcceptsValidText) {
  EXPECT_FALSE(find_invalid_utf8(""));
  EXPECT_FALSE(find_invalid_utf8("plain ascii"));
  EXPECT_FALSE(find_invalid_utf8("caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80"));
  EXPECT_FALSE(find_invalid_utf8("\xF4\x8F\xBF\xBF"));  // U+10FFFF
}

TEST(Utf8, ReportsTheOffsetOfTheFirstBadByte) {
  EXPECT_EQ(find_invalid_utf8("ab\xFF"
                              "cd"),
            2u);
  EXPECT_EQ(find_invalid_utf8("ok\xC3"), 2u);            // truncated sequence
  EXPECT_EQ(find_invalid_utf8("\xC0\xAF"), 0u);          // overlong '/'
  EXPECT_EQ(find_invalid_utf8("\xE0\x80\xAF"), 0u);      // overlong
  EXPECT_EQ(find_invalid_utf8("x\xED\xA0\x80"), 1u);     // UTF-16 surrogate D800
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("\x80"), 0u);              // lone continuation byte
  EXPECT_EQ(find_invalid_utf8("\xE4\xB8"), 0u);          // truncated 3-byte sequence
}

}  // namespace
}  // namespace m3::server
