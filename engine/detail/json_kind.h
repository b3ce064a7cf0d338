// What kind of JSON value a RapidJSON value is, as error messages name it.
// Private to engine/.
#pragma once
#if !defined(ENTENTE_IN_ENGINE)
#error "engine/detail/ is private to engine/ (docs/architecture.md)"
#endif

#include <string_view>

#include "rapidjson/document.h"

namespace entente::engine::detail {

inline std::string_view json_kind(const rapidjson::Value& v) noexcept {
  if (v.IsNull()) return "null";
  if (v.IsBool()) return "boolean";
  if (v.IsNumber()) return "number";
  if (v.IsString()) return "string";
  if (v.IsArray()) return "array";
  return "object";
}

}  // namespace entente::engine::detail
