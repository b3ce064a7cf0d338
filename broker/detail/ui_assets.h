#pragma once
#if !defined(ENTENTE_IN_BROKER)
#error "broker/detail/ is private to broker/ (docs/architecture.md)"
#endif
// The dashboard's static files (broker/ui/), compiled in at build time by
// scripts/ui_to_cpp.py: the node serves them at /ui/ with nothing read from
// disk and nothing fetched from elsewhere (docs/dashboard.md).

#include <string_view>

namespace entente::broker {

struct UiAsset {
  std::string_view name;          // "app.js"
  std::string_view content_type;  // "text/javascript; charset=utf-8"
  std::string_view etag;          // "\"<sha-256 prefix>\"", a strong validator
  std::string_view body;
};

// The file called `name` (a base name: "index.html"), or null.
const UiAsset* ui_asset(std::string_view name);

}  // namespace entente::broker
