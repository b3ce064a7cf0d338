// What kind of JSON value a RapidJSON value is, as error messages name it:
// base/json_read.h's json_kind. Private to engine/.
#pragma once

#include "base/json_read.h"

namespace entente::engine::detail {

using base::json_kind;

}  // namespace entente::engine::detail
