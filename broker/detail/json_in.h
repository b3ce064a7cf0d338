#pragma once
#if !defined(ENTENTE_IN_BROKER)
#error "broker/detail/ is private to broker/ (docs/architecture.md)"
#endif
// The one reader of JSON request bodies (streams, queries, imports,
// contracts, rows): RapidJSON with full-precision numbers and UTF-8
// validation, iterative (so deep nesting cannot overflow the stack), nesting
// bounded, and an object with the same key twice refused at any depth. The
// engine's readers of query networks and contracts' readers of terms refuse
// duplicates only among the keys they know; a second "name" silently
// overriding the first ({"name":"a","name":"b"} creating stream b) is how a
// request says something other than what its author reads in it, so every
// body is checked whole before any route looks at it.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "base/result.h"
#include "rapidjson/document.h"

namespace entente::broker::detail {

// Deeper nesting is refused: no body of this API comes near it.
inline constexpr size_t kMaxJsonDepth = 64;

// What is wrong with a body.
struct JsonProblem {
  Errc code = Errc::parse_error;  // parse_error (not JSON) or invalid_argument
  // JSON path of the problem ("$.retention.max_age", "$[3].price"); "$" for
  // a syntax error.
  std::string path = "$";
  // When the document is an array: the element the problem is in (the row
  // of a batch of tuples).
  std::optional<size_t> element;
  // The key given twice ("" for other problems).
  std::string key;
  std::string why;  // "duplicate key 'max_age'", "invalid JSON at offset 8: Invalid value."

  // "PATH: WHY", or WHY alone for a syntax error.
  std::string message() const;
  Error error() const { return make_error(code, message()); }
};

// Parses `text` into `doc`. nullopt when it is one JSON value with no
// duplicate key and at most kMaxJsonDepth levels of nesting.
std::optional<JsonProblem> read_json(std::string_view text, rapidjson::Document& doc);

// The same, parsing in place up to the first '\0': `text` is modified and
// must outlive `doc` (its strings point into it).
std::optional<JsonProblem> read_json_insitu(char* text, rapidjson::Document& doc);

// read_json as a Status whose message is JsonProblem::message().
Status read_json_body(std::string_view text, rapidjson::Document& doc);

// Checks an already parsed value for duplicate keys and depth, naming paths
// from `root`.
std::optional<JsonProblem> check_json(const rapidjson::Value& v, std::string_view root = "$");

}  // namespace entente::broker::detail
