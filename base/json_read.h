#pragma once
// The one JSON reader of the tree (RapidJSON), in three layers:
//
// * Documents: `read_json` parses a REST body (or any untrusted text) with
//   full-precision numbers and UTF-8 validation, iteratively (deep nesting
//   cannot overflow the stack), nesting bounded, and an object with the same
//   key twice refused at any depth: a second "name" silently overriding the
//   first ({"name":"a","name":"b"} creating stream b) is how a request says
//   something other than what its author reads in it.
// * Values: `read_duration_ms` and `read_size_bytes` read a JSON value in
//   the grammars of base/units.h, the same for `node.json`, REST bodies and
//   box options; `json_kind` names a value's type in messages.
// * Objects: `JsonObjectReader` reads one object's members, reporting to
//   Diagnostics, under its JSON path, every missing, bad or unknown key, so a
//   user sees all of them at once.

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "rapidjson/document.h"

namespace entente::base {

// ---- documents

// Deeper nesting is refused: no document of this tree comes near it.
inline constexpr size_t kMaxJsonDepth = 64;

// What is wrong with a document.
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

// ---- values

// "null", "boolean", "number", "string", "array" or "object".
std::string_view json_kind(const rapidjson::Value& v) noexcept;

// A duration (base/units.h): an integer of milliseconds, or a string with a
// unit ("250ms", "10s", "5m", "5min", "1h", "7d"). nullopt, with the problem
// reported at `path`, otherwise (a negative integer included).
std::optional<int64_t> read_duration_ms(const rapidjson::Value& v, const std::string& path, Diagnostics& diag);

// A size (base/units.h): an integer of bytes, or a string with a binary unit
// ("512KiB", "64MiB", "1GiB") or none ("4096"). nullopt, with the problem
// reported at `path`, otherwise ("1GB" as ambiguous).
std::optional<uint64_t> read_size_bytes(const rapidjson::Value& v, const std::string& path, Diagnostics& diag);

// ---- objects

enum class Need : bool { optional = false, required = true };

// How a reader names the members of its object in messages.
struct MemberWords {
  std::string_view member = "key";  // "missing required key 'x'", "unknown key 'x'; known keys: ..."
  std::string_view whole = "the value";  // "the value must be an object, not array"
};
// A box's options: "unknown option 'x'; known options: ...".
inline constexpr MemberWords kOptionWords{"option", "options"};
// A document's fields (query networks, contracts): "unknown field 'x'; ...".
inline constexpr MemberWords kFieldWords{"field", "the value"};

// For readers that look their keys up themselves: reports, in member order,
// every key of object `obj` that is not in `known` ("unknown field 'x';
// known fields: a b c", in the order of `known`) and every key given twice
// ("duplicate field 'x'"), each under its path. Keys are shown cut at 64
// bytes. REQUIRES: obj.IsObject().
void check_members(const rapidjson::Value& obj, const std::string& path, const std::vector<std::string_view>& known,
                   Diagnostics& diag, MemberWords words = {});

// Reads the members of one JSON object. Each accessor marks its key as
// known and reports a wrong type, a value out of range or a missing
// required key under the key's path; finish() then reports every key no
// accessor asked for. Nothing stops at the first problem. Holds pointers
// into the document, which must outlive it.
class JsonObjectReader {
 public:
  // `path` is the JSON path of the object, e.g. "$.boxes[2].options". A
  // missing value (nullptr) counts as an empty object.
  JsonObjectReader(const rapidjson::Value* object, std::string path, Diagnostics& diag,
                   MemberWords words = {});

  std::string path_of(std::string_view key) const { return path_ + "." + std::string(key); }
  Diagnostics& diag() const { return diag_; }
  bool has(std::string_view key) const;

  const rapidjson::Value* value(std::string_view key, Need need);
  std::optional<std::string> string(std::string_view key, Need need);
  std::optional<int64_t> int64(std::string_view key, Need need, int64_t min = INT64_MIN, int64_t max = INT64_MAX);
  std::optional<double> number(std::string_view key, Need need);
  std::optional<bool> boolean(std::string_view key, Need need);
  std::optional<std::vector<std::string>> strings(std::string_view key, Need need);
  // One of `choices`.
  std::optional<std::string> choice(std::string_view key, Need need, std::initializer_list<std::string_view> choices);
  // read_duration_ms and read_size_bytes of the key's value.
  std::optional<int64_t> duration_ms(std::string_view key, Need need);
  std::optional<uint64_t> size_bytes(std::string_view key, Need need);

  // Reports every key that no accessor asked for. Call last.
  void finish();
  // No problem reported by this reader so far.
  bool ok() const { return ok_; }

 private:
  const rapidjson::Value* find(std::string_view key);
  void fail(std::string path, std::string msg) {
    ok_ = false;
    diag_.error(std::move(path), std::move(msg));
  }

  const rapidjson::Value* object_;
  std::string path_;
  Diagnostics& diag_;
  MemberWords words_;
  std::set<std::string, std::less<>> known_;
  bool ok_ = true;
};

}  // namespace entente::base
