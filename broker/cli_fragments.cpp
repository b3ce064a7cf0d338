// `entente queries move|split|merge` and `entente nodes remove`: what a
// domain of several nodes adds to the admin's tasks (docs/cluster.md),
// with options instead of JSON bodies. See docs/cli.md.
#include <algorithm>
#include <string>
#include <vector>

#include "broker/cli_api_parts.h"
#include "broker/detail/json_out.h"

namespace entente::broker::cli {
namespace {

// Every member of an answer, as `key: value` lines (a nested value as
// compact JSON).
Exit print_members(const Value& d) {
  if (!d.IsObject()) return unexpected("object");
  Fields f;
  for (auto it = d.MemberBegin(); it != d.MemberEnd(); ++it) {
    const std::string key(it->name.GetString(), it->name.GetStringLength());
    f.add(key, it->value.IsObject() || it->value.IsArray() ? compact(it->value) : text_of(&it->value));
  }
  f.print();
  return Exit::ok;
}

// "/v1/queries/Q/fragments/F/ACTION" from the command's two words.
Result<std::string> fragment_target(const CommandLine& c, std::string_view action) {
  auto query = path_name(c.words[0], "a query name");
  if (!query.ok()) return query.error();
  auto fragment = path_name(c.words[1], "a fragment name");
  if (!fragment.ok()) return fragment.error();
  return "/v1/queries/" + *query + "/fragments/" + *fragment + "/" + std::string(action);
}

// The comma-separated words of `list`, none empty.
std::vector<std::string> words_of(const std::string& list) {
  std::vector<std::string> out;
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = list.find(',', at);
    const size_t end = comma == std::string::npos ? list.size() : comma;
    if (end > at) out.push_back(list.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

Exit post_and_print(Api& api, const std::string& target, const std::string& body) {
  const Reply r = api.call("POST", target, body);
  return r.exit == Exit::ok ? emit(api, r, print_members) : r.exit;
}

}  // namespace

Exit queries_move(Api& api, const CommandLine& c) {
  const auto target = fragment_target(c, "move");
  if (!target.ok()) return usage_error(target.error().message);
  const std::string* to = c.value("--to");
  if (to == nullptr || to->empty()) {
    return usage_error("queries move needs --to NODE (of this domain) or --to DOMAIN/NODE (a peer domain, "
                       "under a hosting contract)");
  }
  detail::JsonOut j;
  j.begin_object().key("node").str(*to);
  if (c.switches.count("--cold")) j.key("warm").boolean(false);
  j.end_object();
  return post_and_print(api, *target, j.take());
}

Exit queries_split(Api& api, const CommandLine& c) {
  const auto target = fragment_target(c, "split");
  if (!target.ok()) return usage_error(target.error().message);
  const std::string* nodes = c.value("--nodes");
  const auto parts = nodes == nullptr ? std::vector<std::string>{} : words_of(*nodes);
  if (parts.size() < 2 || parts.size() > 16) {
    return usage_error("queries split needs --nodes N1,N2[,...]: 2 to 16 nodes of this domain, one per part "
                       "(the key groups shared equally, in that order)");
  }
  detail::JsonOut j;
  j.begin_object().key("parts").begin_array();
  for (const auto& n : parts) j.begin_object().key("node").str(n).end_object();
  j.end_array().end_object();
  return post_and_print(api, *target, j.take());
}

Exit queries_merge(Api& api, const CommandLine& c) {
  const auto target = fragment_target(c, "merge");
  if (!target.ok()) return usage_error(target.error().message);
  return post_and_print(api, *target, "");
}

Exit nodes_remove(Api& api, const CommandLine& c) {
  const auto node = path_name(c.words[0], "a node name");
  if (!node.ok()) return usage_error(node.error().message);
  const Reply r = api.call("DELETE", "/v1/nodes/" + *node);
  return r.exit == Exit::ok ? done(api, "removed node " + c.words[0] + " from the domain") : r.exit;
}

}  // namespace entente::broker::cli
