// A fragment moved to a node of another domain (docs/cluster.md, "Moving a
// fragment to another domain"): POST /v1/queries/{query}/fragments/
// {fragment}/move with {"domain": D, "node": N} (or {"node": "D/N"}), D a
// peer domain. The move is admitted only under a hosting contract in force
// between D (host) and this domain (owner) that permits every box kind of
// the fragment and whose maximum load covers the fragment's measured load
// plus what D already runs for this domain (contracts::may_host_fragment,
// docs/contracts.md, "The hosting check"); otherwise 403 naming the term
// that fails, and nothing moves.
//
// Once admitted here, the fragment is offered to the host node over the
// federation link (federation/hosting.h): its declarative definition (the
// fragment's query network, never code) and its load. The host checks the
// offer against its own ledger, with the box kinds its own engine reads
// from the definition, and replies; its refusal answers 403 as well.
//
// An offer the host admits is then run there (cluster_hosted.cpp): the
// fragment's state sent, the host reading the owner's streams and writing
// results the owner reads back into the fragment's own streams.

#include <algorithm>
#include <chrono>
#include <optional>
#include <cmath>
#include <set>

#include "broker/detail/node_impl.h"
#include "certs/certs.h"
#include "contracts/hosting.h"
#include "contracts/ledger.h"
#include "contracts/terms.h"
#include "engine/fragments.h"
#include "federation/contracting.h"
#include "federation/hosting.h"
#include "federation/peering.h"
#include "rapidjson/document.h"

namespace entente::broker::detail {
namespace {

int64_t now_unix_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

// The node of another domain a move names, or nothing when it names a
// node of this domain (or does not parse: the move route answers that).
struct HostTarget {
  std::string domain;
  std::string node;
};

std::optional<HostTarget> host_target(const rapidjson::Document& d, const std::string& own_domain) {
  if (!d.IsObject() || !d.HasMember("node") || !d["node"].IsString()) return std::nullopt;
  std::string node = d["node"].GetString();
  std::string domain;
  if (d.HasMember("domain") && d["domain"].IsString()) {
    domain = d["domain"].GetString();
  } else if (const size_t slash = node.find('/'); slash != std::string::npos) {
    domain = node.substr(0, slash);
    node = node.substr(slash + 1);
  }
  if (domain.empty() || domain == own_domain) return std::nullopt;
  return HostTarget{std::move(domain), std::move(node)};
}

// The fragment's box kinds, sorted, without repeats.
std::vector<std::string> box_kinds(const QueryInfo& info) {
  std::set<std::string> kinds;
  for (const auto& b : info.boxes) kinds.insert(b.type);
  return {kinds.begin(), kinds.end()};
}

// The load may_host is asked with: the measured CPU ms per second, rounded
// up, at least 1 (an idle fragment still takes a slot of the host's
// budget), at most the terms' bound.
uint64_t asked_load(double cpu_ms_per_s) {
  const double up = std::ceil(cpu_ms_per_s);
  if (!(up >= 1)) return 1;
  if (up >= static_cast<double>(contracts::kMaxLoad)) return contracts::kMaxLoad;
  return static_cast<uint64_t>(up);
}

// The target's names, and whether it is a node of a peer domain this node
// has a link to (in any state: GET /v1/peers): the refusal, or nothing.
std::optional<http::Response> check_host_target(const HostTarget& target, const federation::PeersReport& peers,
                                                const std::string& own_domain) {
  if (!certs::valid_name(target.domain)) {
    return http::Response::problem(400, "Bad Request", "$.domain: '" + target.domain.substr(0, 64) +
                                                           "' is not a domain name ([a-z][a-z0-9-]*, at most 63 "
                                                           "characters)");
  }
  if (!certs::valid_name(target.node)) {
    return http::Response::problem(400, "Bad Request", "$.node: '" + target.node.substr(0, 64) +
                                                           "' is not a node name ([a-z][a-z0-9-]*, at most 63 "
                                                           "characters)");
  }
  std::vector<std::string> nodes;
  for (const auto& p : peers.peers)
    if (p.link.identity.domain == target.domain) nodes.push_back(p.link.identity.node);
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  if (nodes.empty()) {
    return http::Response::problem(400, "Bad Request", "$.domain: " + target.domain + " is not a peer domain of " +
                                                           own_domain + " (no link to any of its nodes); nothing "
                                                           "moved");
  }
  if (!std::binary_search(nodes.begin(), nodes.end(), target.node)) {
    std::string known;
    for (const auto& n : nodes) known += (known.empty() ? "" : ", ") + n;
    return http::Response::problem(400, "Bad Request", "$.node: " + target.node + " is not a node of domain " +
                                                           target.domain + " known to " + own_domain +
                                                           " (its nodes: " + known + "); nothing moved");
  }
  return std::nullopt;
}

}  // namespace

bool NodeImpl::host_fragment_route(const http::Request& req, const PathParams& params,
                                   const http::Respond& answer) {
  rapidjson::Document d;
  d.Parse(req.body.data(), req.body.size());
  if (d.HasParseError()) return false;
  const auto target = host_target(d, config_.domain);
  if (!target) return false;
  const std::string& query = params.at(0);
  const std::string& fragment = params.at(1);
  const std::string where = target->domain + "/" + target->node;
  if (d.HasMember("warm") && !d["warm"].IsBool()) {
    answer(http::Response::problem(400, "Bad Request", "$.warm: a boolean (default true: the state goes to " + where +
                                                       " before the pause, not in it)"));
    return true;
  }
  const bool warm = !d.HasMember("warm") || d["warm"].GetBool();
  if (auto refused = check_host_target(*target, peering_->peers_report(), config_.domain)) {
    answer(std::move(*refused));
    return true;
  }
  auto entry = cut_entry(query, true);
  if (!entry) {
    answer(http::Response::problem(404, "Not Found", "no query '" + query.substr(0, 100) + "' cut into fragments in "
                                                     "domain " + config_.domain));
    return true;
  }
  std::string from;
  for (const auto& [f, n] : entry->fragments)
    if (f == fragment) from = n;
  if (from.empty()) {
    answer(http::Response::problem(404, "Not Found", "query '" + query + "' has no fragment '" +
                                                     fragment.substr(0, 64) + "'"));
    return true;
  }
  if (auto refused = refuse_if_held(*entry, "moving fragment " + fragment + " to another domain")) {
    answer(std::move(*refused));
    return true;
  }
  // The load is measured where the fragment runs: the check runs there.
  if (from != config_.node) {
    forward(req, from, answer);
    return true;
  }
  auto q = find_query(engine::fragment_network_name(query, fragment));
  if (!q) {
    answer(http::Response::problem(409, "Conflict", "fragment " + fragment + " of query '" + query +
                                                    "' is placed on " + from + " but does not run there now; "
                                                    "nothing moved"));
    return true;
  }
  const contracts::Ledger* ledger =
      peering_->contracting() != nullptr ? &peering_->contracting()->ledger() : nullptr;
  if (ledger == nullptr) {
    answer(http::Response::problem(503, "Service Unavailable", "the contracts ledger is not open; nothing moved"));
    return true;
  }
  const QueryInfo info = q->info();
  const std::vector<std::string> kinds = box_kinds(info);
  const uint64_t load = asked_load(info.cpu_ms_per_s);
  // What the host already runs for this domain (from this node), at the
  // loads its runs were admitted with.
  const uint64_t hosted_load = hosted_load_on(target->domain);
  const std::string what = "fragment " + fragment + " of query '" + query + "'";
  auto grant = contracts::may_host_fragment(
      *ledger, contracts::FragmentHostingRequest{config_.domain, target->domain, kinds, load, hosted_load},
      now_unix_ms());
  if (!grant.ok()) {
    const unsigned status = grant.error().code == Errc::invalid_argument ? 400 : 403;
    answer(http::Response::problem(status, status == 400 ? "Bad Request" : "Forbidden",
                                   what + " may not move to " + where + ": " + grant.error().message +
                                       "; nothing moved"));
    return true;
  }
  // The host checks the offer itself (federation/hosting.h): its own
  // ledger, the box kinds of the definition as its engine reads it.
  federation::Hosting* hosting = peering_->hosting();
  if (hosting == nullptr) {
    answer(http::Response::problem(503, "Service Unavailable", "the federation is not started; nothing moved"));
    return true;
  }
  std::string kind_list;
  for (const auto& k : kinds) kind_list += (kind_list.empty() ? "" : ", ") + k;
  const std::string terms = "(box kinds " + kind_list + "; load " + std::to_string(load) + " + " +
                            std::to_string(hosted_load) + " hosted of at most " + std::to_string(grant->max_load) +
                            " CPU ms/s)";
  const std::string permitted = "contract " + grant->contract_id + " permits hosting " + what + " " + terms +
                                " on " + where;
  hosting->offer(
      certs::Identity{target->domain, target->node},
      federation::Hosting::Offer{query, fragment, q->meta().network_json, load},
      [this, answer, what, where, permitted, query, fragment, target = *target, price = grant->price_min,
       load, warm](Result<federation::Hosting::Reply> reply) {
        if (!reply.ok()) {
          answer(http::Response::problem(503, "Service Unavailable", permitted + ", but the offer to " + where +
                                                                         " got no reply: " + reply.error().message +
                                                                         "; nothing moved"));
        } else if (!reply->admitted) {
          answer(http::Response::problem(403, "Forbidden", what + " may not move to " + where + ": " + where +
                                                               " refuses it: " + reply->reason + "; nothing moved"));
        } else {
          start_hosted_move(query, fragment, target.domain, target.node, reply->contract, price, load, warm, answer);
        }
      });
  return true;
}

}  // namespace entente::broker::detail
