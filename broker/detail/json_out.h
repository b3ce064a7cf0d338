#pragma once
#if !defined(ENTENTE_IN_BROKER)
#error "broker/detail/ is private to broker/ (docs/architecture.md)"
#endif
// A small JSON writer over RapidJSON for API responses: keys and strings are
// escaped by RapidJSON, numbers written exactly.

#include <string>
#include <string_view>

#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace entente::broker::detail {

// A parsed value (a catalog entry, a part of one) as compact JSON text.
inline std::string json_text(const rapidjson::Value& v) {
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  v.Accept(w);
  return {sb.GetString(), sb.GetSize()};
}

class JsonOut {
 public:
  JsonOut() : w_(sb_) {}
  JsonOut& key(std::string_view k) {
    w_.Key(k.data(), static_cast<rapidjson::SizeType>(k.size()));
    return *this;
  }
  JsonOut& str(std::string_view s) {
    w_.String(s.data(), static_cast<rapidjson::SizeType>(s.size()));
    return *this;
  }
  JsonOut& u64(uint64_t v) { w_.Uint64(v); return *this; }
  JsonOut& i64(int64_t v) { w_.Int64(v); return *this; }
  JsonOut& dbl(double v) { w_.Double(v); return *this; }
  JsonOut& boolean(bool v) { w_.Bool(v); return *this; }
  JsonOut& null() { w_.Null(); return *this; }
  // Inserts already-valid JSON text as one value.
  JsonOut& raw(std::string_view json) {
    w_.RawValue(json.data(), json.size(), rapidjson::kObjectType);
    return *this;
  }
  JsonOut& begin_object() { w_.StartObject(); return *this; }
  JsonOut& end_object() { w_.EndObject(); return *this; }
  JsonOut& begin_array() { w_.StartArray(); return *this; }
  JsonOut& end_array() { w_.EndArray(); return *this; }
  std::string take() { return std::string(sb_.GetString(), sb_.GetSize()); }

 private:
  rapidjson::StringBuffer sb_;
  rapidjson::Writer<rapidjson::StringBuffer> w_;
};

}  // namespace entente::broker::detail
