#pragma once
// The one UTF-8 validator and the one JSON string escaper of the tree, so a
// REST answer, an encoded row and a contract's canonical form escape a string
// the same way (docs/architecture.md, base/README.md).

#include <cstddef>
#include <string>
#include <string_view>

namespace entente::base {

// Length of the valid UTF-8 sequence starting at s[i] (1 to 4), or 0 when it
// is not one: overlong forms, surrogates, code points above U+10FFFF and
// truncated sequences are invalid. `i` must be < s.size().
size_t utf8_sequence_length(std::string_view s, size_t i);

// Offset of the first byte that does not start a valid UTF-8 sequence, or
// std::string_view::npos when all of `s` is valid UTF-8.
size_t first_invalid_utf8(std::string_view s);

inline bool valid_utf8(std::string_view s) { return first_invalid_utf8(s) == std::string_view::npos; }

// Appends `s` as a JSON string literal, quotes included. '"' and '\\' are
// escaped, control characters below U+0020 as \b \f \n \r \t or \u00XX;
// everything else, DEL and valid UTF-8 included, is copied byte for byte
// (the canonical form of contracts depends on exactly this). A byte that does
// not start a valid UTF-8 sequence becomes U+FFFD, so the output always
// parses; a caller that must refuse such input checks valid_utf8 first.
void append_json_string(std::string& out, std::string_view s);

}  // namespace entente::base
