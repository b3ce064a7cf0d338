#include "engine/boxes/detail_stateless_common.h"

#include <set>

namespace entente::engine::boxes {

bool check_input_count(const BoxBuildContext& ctx, std::string_view type, size_t min, size_t max) {
  const size_t n = ctx.inputs.size();
  if (n >= min && n <= max) return true;
  std::string want;
  if (min == max)
    want = std::to_string(min);
  else if (max == std::numeric_limits<size_t>::max())
    want = "at least " + std::to_string(min);
  else
    want = std::to_string(min) + " to " + std::to_string(max);
  ctx.diag->error(ctx.path, std::string(type) + " box needs " + want + " input" +
                                (min == 1 && max == 1 ? "" : "s") + ", got " + std::to_string(n));
  return false;
}

bool check_same_schemas(const BoxBuildContext& ctx, std::string_view type) {
  bool good = true;
  for (size_t i = 1; i < ctx.inputs.size(); ++i) {
    if (*ctx.inputs[i] == *ctx.inputs[0]) continue;
    ctx.diag->error(ctx.path, std::string(type) + " box: input " + std::to_string(i) + " has schema (" +
                                  ctx.inputs[i]->to_string() + ") but input 0 has (" +
                                  ctx.inputs[0]->to_string() + "); every input needs the same schema");
    good = false;
  }
  return good;
}

std::optional<std::vector<Expr>> read_predicates(detail::OptionReader& r, std::string_view key,
                                                 const Schema& input) {
  auto texts = r.strings(key, detail::Need::required);
  if (!texts) return std::nullopt;
  if (texts->empty() || texts->size() > kMaxPredicates) {
    r.diag().error(r.path_of(key), "expected 1 to " + std::to_string(kMaxPredicates) +
                                       " predicates, got " + std::to_string(texts->size()));
    return std::nullopt;
  }
  std::vector<Expr> out;
  bool good = true;
  for (size_t i = 0; i < texts->size(); ++i) {
    const std::string path = r.path_of(key) + "[" + std::to_string(i) + "]";
    auto e = Expr::compile((*texts)[i], input);
    if (!e.ok()) {
      r.diag().error(path, e.error().message);
      good = false;
      continue;
    }
    if (e->type() != Type::Bool) {
      r.diag().error(path, "a predicate must be bool, but '" + (*texts)[i] + "' is " +
                               std::string(type_name(e->type())));
      good = false;
      continue;
    }
    out.push_back(std::move(e).value());
  }
  if (!good) return std::nullopt;
  return out;
}

std::optional<std::vector<size_t>> read_field_list(detail::OptionReader& r, std::string_view key,
                                                   detail::Need need, const Schema& input,
                                                   size_t min_count) {
  auto names = r.strings(key, need);
  if (!names) return std::nullopt;
  if (names->size() < min_count) {
    r.diag().error(r.path_of(key), "expected at least " + std::to_string(min_count) + " field name" +
                                       (min_count == 1 ? "" : "s"));
    return std::nullopt;
  }
  std::vector<size_t> out;
  std::set<std::string_view> seen;
  bool good = true;
  for (size_t i = 0; i < names->size(); ++i) {
    const std::string path = r.path_of(key) + "[" + std::to_string(i) + "]";
    const std::string& name = (*names)[i];
    auto idx = input.index_of(name);
    if (!idx) {
      r.diag().error(path, "unknown field '" + name + "'; input has (" + input.to_string() + ")");
      good = false;
      continue;
    }
    if (!seen.insert(name).second) {
      r.diag().error(path, "field '" + name + "' is listed twice");
      good = false;
      continue;
    }
    out.push_back(*idx);
  }
  if (!good) return std::nullopt;
  return out;
}

}  // namespace entente::engine::boxes
