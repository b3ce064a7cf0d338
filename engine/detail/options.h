// Reading a box's JSON options with every problem reported to Diagnostics
// under its JSON path, and unknown keys refused. Private to engine/.
#pragma once
#if !defined(ENTENTE_IN_ENGINE) && !defined(ENTENTE_TEMPORARY_BROKER_INGEST_READS_ENGINE_OPTIONS)
#error "engine/detail/ is private to engine/ (docs/architecture.md)"
#endif
// TEMPORARY (issue 12): broker/detail/ingest.cpp still reads parse_duration_ms
// from here until that reader moves to base/; broker/CMakeLists.txt defines
// the exemption for that one file. Remove both at that merge.

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "rapidjson/document.h"

namespace entente::engine::detail {

enum class Need : bool { optional = false, required = true };

class OptionReader {
 public:
  // `path` is the JSON path of the options object, e.g. "$.boxes[2].options".
  // A missing options value counts as an empty object.
  OptionReader(const rapidjson::Value* options, std::string path, Diagnostics& diag);

  std::string path_of(std::string_view key) const { return path_ + "." + std::string(key); }
  Diagnostics& diag() const { return diag_; }
  bool has(std::string_view key) const;

  // Each accessor marks `key` as known; a wrong type or a missing required
  // key is reported and yields nullopt.
  const rapidjson::Value* value(std::string_view key, Need need);
  std::optional<std::string> string(std::string_view key, Need need);
  std::optional<int64_t> int64(std::string_view key, Need need, int64_t min = INT64_MIN,
                               int64_t max = INT64_MAX);
  std::optional<double> number(std::string_view key, Need need);
  std::optional<bool> boolean(std::string_view key, Need need);
  std::optional<std::vector<std::string>> strings(std::string_view key, Need need);
  // One of `choices`.
  std::optional<std::string> choice(std::string_view key, Need need,
                                    std::initializer_list<std::string_view> choices);

  // Reports every key that no accessor asked for. Call last.
  void finish();
  bool ok() const { return ok_; }

 private:
  const rapidjson::Value* find(std::string_view key);
  void fail(std::string path, std::string msg) { ok_ = false; diag_.error(std::move(path), std::move(msg)); }

  const rapidjson::Value* options_;
  std::string path_;
  Diagnostics& diag_;
  std::set<std::string, std::less<>> known_;
  bool ok_ = true;
};

// Reads a duration in the grammar of base/units.h, the same as node.json's:
// an integer of milliseconds, or a string with a unit ("250ms", "10s", "5m",
// "5min", "1h", "7d"). Returns nullopt and reports otherwise.
std::optional<int64_t> parse_duration_ms(const rapidjson::Value& v, const std::string& path,
                                         Diagnostics& diag);

}  // namespace entente::engine::detail
