#pragma once
#if !defined(ENTENTE_IN_CONTRACTS)
#error "contracts/detail/ is private to contracts/ (docs/architecture.md)"
#endif
// Private helpers of contracts/: building rapidjson values of the model and
// reading typed fields with path-named errors. Only contracts/*.cpp include it.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "contracts/terms.h"
#include "base/result.h"
#include "rapidjson/document.h"

namespace entente::contracts::detail {

using Alloc = rapidjson::MemoryPoolAllocator<>;

rapidjson::Value string_value(std::string_view s, Alloc& a);
rapidjson::Value terms_value(const Terms& t, Alloc& a);

// The canonical form of a value this module built (no floats, valid UTF-8
// strings by construction). REQUIRES: canonical_json(v) succeeds.
std::string canonical_of(const rapidjson::Value& v);

// Typed reads: each reports a problem at `path` to `diag` and returns
// nullopt. Strings longer than `max_bytes` are refused.
std::optional<std::string> read_string(const rapidjson::Value& v, const std::string& path, size_t max_bytes,
                                       Diagnostics& diag);
std::optional<uint64_t> read_uint(const rapidjson::Value& v, const std::string& path, Diagnostics& diag);
std::optional<int64_t> read_int(const rapidjson::Value& v, const std::string& path, Diagnostics& diag);
std::optional<bool> read_bool(const rapidjson::Value& v, const std::string& path, Diagnostics& diag);
std::optional<std::vector<std::string>> read_strings(const rapidjson::Value& v, const std::string& path,
                                                     size_t max_items, size_t max_bytes, Diagnostics& diag);
// An RFC 3339 UTC string or integer Unix milliseconds (whole seconds).
std::optional<int64_t> read_time(const rapidjson::Value& v, const std::string& path, Diagnostics& diag);

// Refuses members not in `known` and duplicate members: base::check_members
// ("unknown field 'x'; known fields: ...", "duplicate field 'x'").
void check_members(const rapidjson::Value& obj, const std::string& path,
                   const std::vector<std::string_view>& known, Diagnostics& diag);

// A Diagnostics as one invalid_argument error.
Error diagnostics_error(const Diagnostics& diag);

}  // namespace entente::contracts::detail
