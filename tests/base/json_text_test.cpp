#include "base/json_text.h"

#include <gtest/gtest.h>

#include <string>

namespace entente::base {
namespace {

std::string escaped(std::string_view s) {
  std::string out;
  append_json_string(out, s);
  return out;
}

TEST(Utf8, AcceptsWellFormedSequences) {
  EXPECT_TRUE(valid_utf8(""));
  EXPECT_TRUE(valid_utf8("plain ascii"));
  EXPECT_TRUE(valid_utf8("caf\xC3\xA9"));                // U+00E9
  EXPECT_TRUE(valid_utf8("\xE2\x82\xAC"));               // U+20AC
  EXPECT_TRUE(valid_utf8("\xF0\x9F\x98\x80"));           // U+1F600
  EXPECT_TRUE(valid_utf8("\xF4\x8F\xBF\xBF"));           // U+10FFFF
  EXPECT_EQ(utf8_sequence_length("\xF0\x9F\x98\x80", 0), 4u);
}

TEST(Utf8, RefusesOverlongSurrogatesTruncatedAndOutOfRange) {
  EXPECT_EQ(first_invalid_utf8("ab\xC0\xAF"), 2u);       // overlong '/'
  EXPECT_EQ(first_invalid_utf8("\xE0\x80\xAF"), 0u);     // overlong, 3 bytes
  EXPECT_EQ(first_invalid_utf8("x\xED\xA0\x80"), 1u);    // U+D800, a surrogate
  EXPECT_EQ(first_invalid_utf8("\xF4\x90\x80\x80"), 0u); // above U+10FFFF
  EXPECT_EQ(first_invalid_utf8("ok\xE2\x82"), 2u);       // truncated
  EXPECT_EQ(first_invalid_utf8("\x80"), 0u);             // lone continuation
  EXPECT_EQ(first_invalid_utf8("\xFF"), 0u);
  EXPECT_FALSE(valid_utf8("a\xC3"));
}

TEST(JsonText, EscapesQuotesBackslashAndControlCharacters) {
  EXPECT_EQ(escaped("a\"b\\c"), R"("a\"b\\c")");
  EXPECT_EQ(escaped("\b\f\n\r\t"), R"("\b\f\n\r\t")");
  EXPECT_EQ(escaped(std::string("\x00\x01\x1f", 3)), R"("\u0000\u0001\u001f")");
  EXPECT_EQ(escaped(""), R"("")");
}

TEST(JsonText, CopiesValidUtf8AndDelByteForByte) {
  // The canonical form of contracts relies on this: what is signed is the
  // bytes as given, not an escaped form.
  EXPECT_EQ(escaped("caf\xC3\xA9 \xF0\x9F\x98\x80"), "\"caf\xC3\xA9 \xF0\x9F\x98\x80\"");
  EXPECT_EQ(escaped("\x7f"), "\"\x7f\"");
  EXPECT_EQ(escaped("/"), R"("/")");
}

TEST(JsonText, ReplacesEachInvalidByteWithReplacementCharacter) {
  EXPECT_EQ(escaped("a\xFF" "b"), "\"a\xEF\xBF\xBD" "b\"");
  // A truncated sequence: each of its bytes is replaced, the rest survives.
  EXPECT_EQ(escaped("\xE2\x82!"), "\"\xEF\xBF\xBD\xEF\xBF\xBD!\"");
  EXPECT_TRUE(valid_utf8(escaped("\xC0\xAF\xED\xA0\x80")));
}

}  // namespace
}  // namespace entente::base
