// The registry of built-in box types: the names query networks use, mapped
// to the factories in engine/boxes/. A fixed table rather than a mutable
// registry, so that the set of types a broker accepts is the set compiled in
// (boxes are declarative; no code is ever loaded from a definition).
#include <algorithm>
#include <array>
#include <utility>

#include "engine/box.h"
#include "engine/boxes/boxes.h"

namespace entente::engine {

namespace {

struct Entry {
  std::string_view name;
  BoxFactory factory;
};

// Sorted by name.
constexpr std::array<Entry, 8> kBoxTypes{{
    {"aggregate", &boxes::make_aggregate},
    {"bsort", &boxes::make_bsort},
    {"filter", &boxes::make_filter},
    {"join", &boxes::make_join},
    {"map", &boxes::make_map},
    {"merge", &boxes::make_merge},
    {"split", &boxes::make_split},
    {"union", &boxes::make_union},
}};

}  // namespace

BoxFactory find_box_factory(std::string_view type) noexcept {
  for (const auto& e : kBoxTypes)
    if (e.name == type) return e.factory;
  return nullptr;
}

std::vector<std::string_view> box_type_names() {
  std::vector<std::string_view> out;
  out.reserve(kBoxTypes.size());
  for (const auto& e : kBoxTypes) out.push_back(e.name);
  return out;
}

}  // namespace entente::engine
