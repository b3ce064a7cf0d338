// What kind of JSON value a RapidJSON value is, as error messages name it:
// base/json_read.h's json_kind. Private to engine/.
#pragma once
#if !defined(ENTENTE_IN_ENGINE)
#error "engine/detail/ is private to engine/ (docs/architecture.md)"
#endif

#include "base/json_read.h"

namespace entente::engine::detail {

using base::json_kind;

}  // namespace entente::engine::detail
