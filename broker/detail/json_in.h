#pragma once
#if !defined(ENTENTE_IN_BROKER)
#error "broker/detail/ is private to broker/ (docs/architecture.md)"
#endif
// The reader of JSON request bodies is the tree's one JSON reader,
// base/json_read.h (duplicate keys refused at any depth, nesting bounded,
// UTF-8 validated). This header keeps its names in broker::detail for the
// broker's files that include it.

#include "base/json_read.h"

namespace entente::broker::detail {

using base::check_json;
using base::JsonProblem;
using base::kMaxJsonDepth;
using base::read_json;
using base::read_json_body;
using base::read_json_insitu;

}  // namespace entente::broker::detail
