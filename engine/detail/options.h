// Reading a box's JSON options with every problem reported to Diagnostics
// under its JSON path, and unknown keys refused: the tree's one object
// reader (base/json_read.h), naming members "options". Private to engine/.
#pragma once
#if !defined(ENTENTE_IN_ENGINE)
#error "engine/detail/ is private to engine/ (docs/architecture.md)"
#endif

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "base/json_read.h"
#include "base/result.h"
#include "rapidjson/document.h"

namespace entente::engine::detail {

using base::Need;

class OptionReader : public base::JsonObjectReader {
 public:
  // `path` is the JSON path of the options object, e.g. "$.boxes[2].options".
  // A missing options value counts as an empty object.
  OptionReader(const rapidjson::Value* options, std::string path, Diagnostics& diag)
      : JsonObjectReader(options, std::move(path), diag, base::kOptionWords) {}
};

// A duration in the grammar of base/units.h, the same as node.json's and a
// REST body's: base::read_duration_ms.
inline std::optional<int64_t> parse_duration_ms(const rapidjson::Value& v, const std::string& path,
                                                Diagnostics& diag) {
  return base::read_duration_ms(v, path, diag);
}

}  // namespace entente::engine::detail
