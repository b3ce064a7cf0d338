// The /v1/contracts routes (docs/api.md "Contracts", docs/contracts.md):
// the admin's side of negotiating with another domain. Reading needs a
// reader token; every action that changes a contract needs an admin token
// (the roles are in api_routes(), api.cpp, which checks them).

#include <rapidjson/document.h>
#include <rapidjson/error/en.h>

#include "federation/contracting.h"
#include "broker/detail/json_in.h"
#include "broker/detail/json_out.h"
#include "broker/detail/node_impl.h"
#include "federation/peering.h"
#include "contracts/contract.h"
#include "contracts/terms.h"

namespace entente::broker::detail {
namespace {

using http::Response;

constexpr size_t kMaxReasonBytes = 1024;

// The contract as the API shows it, with whether the last change reached
// the other domain yet.
std::string outcome_json(const Contracting::Outcome& o) {
  std::string body = contracts::contract_to_json(o.contract, wall_clock_ms());
  // contract_to_json is one object: add "delivered" before its closing brace.
  body.pop_back();
  body += o.delivered ? ",\"delivered\":true}" : ",\"delivered\":false}";
  return body;
}

// 409 for a stale version carries the current one, so that a client can
// read it and act again.
Response answer_error(const Error& e, Contracting& c, const std::string& id) {
  if (e.code == Errc::conflict) {
    auto current = c.ledger().get(id);
    if (current.ok()) {
      return Response::problem(409, "Conflict", e.message,
                               "\"current_version\":" +
                                   std::to_string(current->current().number));
    }
  }
  return problem_for(e);
}

Result<rapidjson::Document> parse_body(const http::Request& req) {
  rapidjson::Document doc;
  if (auto p = read_json(req.body, doc)) {
    return make_error(Errc::invalid_argument,
                      p->code == Errc::parse_error ? "the body is not JSON: " + p->why : p->message());
  }
  if (!doc.IsObject()) return make_error(Errc::invalid_argument, "$: the body must be a JSON object");
  return doc;
}

// $.version: the version the admin acted on (required, so that acting on
// something that changed meanwhile is a 409, never a surprise).
Result<uint64_t> version_of(const rapidjson::Document& doc) {
  if (!doc.HasMember("version") || !doc["version"].IsUint64() || doc["version"].GetUint64() == 0) {
    return make_error(Errc::invalid_argument,
                      "$.version: required, the version number this action answers (an integer >= 1)");
  }
  return doc["version"].GetUint64();
}

// $.terms (required) of a propose or counter body.
Result<contracts::Terms> terms_of(const rapidjson::Document& doc) {
  if (!doc.HasMember("terms")) return make_error(Errc::invalid_argument, "$.terms: required");
  return contracts::terms_from_json(doc["terms"]);
}

// 400 with every problem of the terms: the detail lists them, `errors`
// holds each with its JSON path (as for query networks, docs/api.md).
Response terms_problem(const std::string& lead, const std::vector<std::pair<std::string, std::string>>& items) {
  std::string detail = lead;
  JsonOut j;
  j.begin_array();
  for (size_t i = 0; i < items.size(); ++i) {
    detail += (i == 0 ? "" : "; ") + items[i].first + ": " + items[i].second;
    j.begin_object().key("path").str(items[i].first).key("message").str(items[i].second).end_object();
  }
  j.end_array();
  return Response::problem(400, "Bad Request", detail, "\"errors\":" + j.take());
}

// A terms error from contracts::terms_from_json: "path: message" lines.
Response terms_problem(const Error& e) {
  if (e.code != Errc::invalid_argument) return problem_for(e);
  std::vector<std::pair<std::string, std::string>> items;
  size_t start = 0;
  while (start < e.message.size()) {
    size_t end = e.message.find('\n', start);
    if (end == std::string::npos) end = e.message.size();
    const std::string line = e.message.substr(start, end - start);
    start = end + 1;
    const size_t colon = line.find(": ");
    if (line.rfind("$", 0) == 0 && colon != std::string::npos) {
      items.emplace_back(line.substr(0, colon), line.substr(colon + 2));
    } else if (!line.empty()) {
      items.emplace_back("$", line);
    }
  }
  if (items.empty()) return Response::problem(400, "Bad Request", e.message);
  return terms_problem(std::to_string(items.size()) + " problem(s) in the terms: ", items);
}

// The streams array as the body wrote it (terms_from_json sorts it), so
// that problems name the positions the admin wrote.
std::vector<std::string> given_streams(const rapidjson::Document& doc) {
  std::vector<std::string> out;
  if (!doc.HasMember("terms") || !doc["terms"].IsObject()) return out;
  const auto& t = doc["terms"];
  if (!t.HasMember("streams") || !t["streams"].IsArray()) return out;
  for (const auto& v : t["streams"].GetArray()) {
    out.push_back(v.IsString() ? std::string(v.GetString(), v.GetStringLength()) : std::string());
  }
  return out;
}

Result<std::string> reason_of(const rapidjson::Document& doc) {
  if (!doc.HasMember("reason")) return std::string();
  if (!doc["reason"].IsString()) return make_error(Errc::invalid_argument, "$.reason: must be a string");
  if (doc["reason"].GetStringLength() > kMaxReasonBytes) {
    return make_error(Errc::invalid_argument,
                      "$.reason: longer than " + std::to_string(kMaxReasonBytes) + " bytes");
  }
  return std::string(doc["reason"].GetString(), doc["reason"].GetStringLength());
}

Status only_members(const rapidjson::Document& doc, std::initializer_list<std::string_view> allowed) {
  for (auto it = doc.MemberBegin(); it != doc.MemberEnd(); ++it) {
    const std::string_view name(it->name.GetString(), it->name.GetStringLength());
    bool ok = false;
    for (auto a : allowed) ok |= a == name;
    if (!ok) {
      std::string list;
      for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      return make_error(Errc::invalid_argument,
                        "$." + std::string(name.substr(0, 64)) + ": unknown member (allowed: " + list + ")");
    }
  }
  return {};
}

// ?dry_run=true|false (default false).
Result<bool> dry_run_of(const http::Request& req) {
  auto v = req.param("dry_run");
  if (!v || *v == "false") return false;
  if (*v == "true") return true;
  return make_error(Errc::invalid_argument, "dry_run: must be true or false");
}

// The answer to a dry run: what would be recorded.
std::string dry_run_json(const std::string& action, const contracts::Version& v, bool catalog_checked,
                         const std::string& id) {
  JsonOut j;
  j.begin_object().key("dry_run").boolean(true).key("action").str(action);
  if (!id.empty()) j.key("id").str(id);
  j.key("state").str(contracts::state_name(v.state)).key("version").u64(v.number);
  j.key("terms").raw(contracts::canonical_terms(v.terms));
  j.key("catalog_checked").boolean(catalog_checked).end_object();
  return j.take();
}

// Stream terms this domain provides, against its own catalog. The
// consumer's node cannot know the provider's streams: it checks the form
// only, and the provider's node checks the rest when its admin accepts
// (docs/contracts.md, "What each side checks").
bool checks_catalog(const NodeImpl& node, const contracts::Terms& t) {
  return t.kind == contracts::Kind::stream && t.stream.provider == node.config().domain;
}

Diagnostics catalog_problems(const NodeImpl& node, const contracts::Terms& t,
                             const std::vector<std::string>& given) {
  Diagnostics diag;
  if (!checks_catalog(node, t)) return diag;
  contracts::check_stream_catalog(
      t,
      // In a domain of several nodes, any of its streams (docs/cluster.md).
      [&node](const std::string& name) -> engine::SchemaPtr { return node.domain_stream_schema(name); },
      diag, given);
  return diag;
}

}  // namespace

Contracting* NodeImpl::contracting_for(const http::Request& req, const http::Respond& answer) {
  if (req.method != "GET" && !json_body(req, answer)) return nullptr;
  Contracting* c = peering_ ? peering_->contracting() : nullptr;
  if (c == nullptr) {
    answer(Response::problem(404, "Not Found",
                             "this node has no federation section in its configuration, so it "
                             "negotiates no contracts"));
  }
  return c;
}

void NodeImpl::list_contracts(const http::Request& req, const PathParams&, const http::Respond& answer) {
  Contracting* c = contracting_for(req, answer);
  if (c == nullptr) return;
  const int64_t now = wall_clock_ms();
  contracts::ContractFilter f;
  if (auto state = req.param("state")) {
    auto s = contracts::state_from_name(*state);
    if (!s.ok()) {
      answer(Response::problem(400, "Bad Request", "state: " + s.error().message));
      return;
    }
    f.state = *s;
  }
  if (auto peer = req.param("peer")) f.peer = std::string(peer->substr(0, 64));
  if (auto kind = req.param("kind")) {
    if (*kind == "stream") f.kind = contracts::Kind::stream;
    else if (*kind == "hosting") f.kind = contracts::Kind::hosting;
    else {
      answer(Response::problem(400, "Bad Request", "kind: must be stream or hosting"));
      return;
    }
  }
  JsonOut j;
  j.begin_object().key("contracts").begin_array();
  for (const auto& k : c->ledger().list(f, now)) j.raw(contracts::contract_to_json(k, now));
  j.end_array().end_object();
  answer(Response::json(200, j.take()));
}

void NodeImpl::get_contract(const http::Request& req, const PathParams& params, const http::Respond& answer) {
  Contracting* c = contracting_for(req, answer);
  if (c == nullptr) return;
  const std::string& id = params.at(0);
  const int64_t now = wall_clock_ms();
  auto k = c->ledger().get(id);
  if (!k.ok()) {
    answer(problem_for(k.error()));
    return;
  }
  std::string body = contracts::contract_to_json(*k, now);
  // An offer on the table of stream terms this node provides: what its
  // catalog says of them, so that the admin sees before accepting (an
  // offer from the consumer was checked by nobody who knows the catalog).
  const contracts::Version& cur = k->current();
  if ((cur.state == contracts::State::proposed || cur.state == contracts::State::countered) &&
      checks_catalog(*this, cur.terms)) {
    const Diagnostics diag = catalog_problems(*this, cur.terms, {});
    JsonOut j;
    j.begin_array();
    for (const auto& d : diag.items()) {
      j.begin_object().key("path").str(d.path).key("message").str(d.message).end_object();
    }
    j.end_array();
    body.pop_back();  // contract_to_json is one object
    body += ",\"catalog_problems\":" + j.take() + "}";
  }
  answer(Response::json(200, body));
}

void NodeImpl::get_contract_usage(const http::Request& req, const PathParams& params,
                                  const http::Respond& answer) {
  Contracting* c = contracting_for(req, answer);
  if (c == nullptr) return;
  const std::string& id = params.at(0);
  auto k = c->ledger().get(id);
  auto u = c->ledger().usage(id);
  if (!k.ok() || !u.ok()) {
    answer(problem_for(k.ok() ? u.error() : k.error()));
    return;
  }
  const auto& terms = k->current().terms;
  JsonOut j;
  j.begin_object().key("id").str(id).key("kind").str(contracts::kind_name(terms.kind));
  j.key("tuples").u64(u->tuples).key("load_seconds").dbl(u->load_seconds);
  if (terms.kind == contracts::Kind::stream) {
    j.key("price_per_million").u64(terms.stream.price_per_million);
  } else {
    j.key("price_min").u64(terms.hosting.price_min).key("price_max").u64(terms.hosting.price_max);
  }
  j.key("cost_credits").dbl(u->cost_credits).end_object();
  answer(Response::json(200, j.take()));
}

void NodeImpl::propose_contract(const http::Request& req, const PathParams&, const http::Respond& answer) {
  contract_action("/v1/contracts", req, "", answer);
}
void NodeImpl::counter_contract(const http::Request& req, const PathParams& params, const http::Respond& answer) {
  contract_action("/v1/contracts/{id}/counter", req, params.at(0), answer);
}
void NodeImpl::accept_contract(const http::Request& req, const PathParams& params, const http::Respond& answer) {
  contract_action("/v1/contracts/{id}/accept", req, params.at(0), answer);
}
void NodeImpl::reject_contract(const http::Request& req, const PathParams& params, const http::Respond& answer) {
  contract_action("/v1/contracts/{id}/reject", req, params.at(0), answer);
}
void NodeImpl::revoke_contract(const http::Request& req, const PathParams& params, const http::Respond& answer) {
  contract_action("/v1/contracts/{id}/revoke", req, params.at(0), answer);
}

// The actions (POST) that change a contract: `route` says which.
void NodeImpl::contract_action(const std::string& route, const http::Request& req, const std::string& id,
                               const http::Respond& answer) {
  Contracting* c = contracting_for(req, answer);
  if (c == nullptr) return;
  if (!id.empty() && !contracts::valid_contract_id(id)) {
    answer(Response::problem(404, "Not Found", "no contract " + id.substr(0, 64)));
    return;
  }
  // Actions.
  auto doc = parse_body(req);
  if (!doc.ok()) {
    answer(Response::problem(400, "Bad Request", doc.error().message));
    return;
  }
  auto catalog_answer = [&](const Diagnostics& diag) {
    std::vector<std::pair<std::string, std::string>> items;
    for (const auto& d : diag.items()) items.emplace_back(d.path, d.message);
    return terms_problem(std::to_string(items.size()) + " problem(s) with the catalog of " + config().domain + ": ",
                         items);
  };
  // The terms of a proposal or a counter-offer, checked in form and against
  // this node's catalog; nullopt once the refusal has been answered.
  auto proposed_terms = [&](std::initializer_list<std::string_view> members) -> std::optional<contracts::Terms> {
    if (Status s = only_members(*doc, members); !s.ok()) {
      answer(Response::problem(400, "Bad Request", s.error().message));
      return std::nullopt;
    }
    auto terms = terms_of(*doc);
    if (!terms.ok()) {
      answer(terms_problem(terms.error()));
      return std::nullopt;
    }
    if (Diagnostics diag = catalog_problems(*this, *terms, given_streams(*doc)); !diag.ok()) {
      answer(catalog_answer(diag));
      return std::nullopt;
    }
    return std::move(*terms);
  };
  const bool is_proposal = route == "/v1/contracts" || route == "/v1/contracts/{id}/counter";
  auto dry_run = is_proposal ? dry_run_of(req) : Result<bool>(false);
  if (!dry_run.ok()) {
    answer(Response::problem(400, "Bad Request", dry_run.error().message));
    return;
  }
  Result<Contracting::Outcome> out = Error{Errc::invalid_argument, "no action"};
  if (route == "/v1/contracts") {
    auto terms = proposed_terms({"terms"});
    if (!terms) return;
    if (*dry_run) {
      auto v = c->check_propose(*terms);
      if (!v.ok()) {
        answer(problem_for(v.error()));
        return;
      }
      answer(Response::json(200, dry_run_json("propose", *v, checks_catalog(*this, *terms), "")));
      return;
    }
    out = c->propose(*terms);
    if (out.ok()) {
      Response r = Response::json(201, outcome_json(*out));
      r.headers.emplace_back("Location", "/v1/contracts/" + out->contract.id);
      answer(std::move(r));
      return;
    }
    answer(problem_for(out.error()));
    return;
  }
  auto version = version_of(*doc);
  if (!version.ok()) {
    answer(Response::problem(400, "Bad Request", version.error().message));
    return;
  }
  if (route == "/v1/contracts/{id}/counter") {
    auto terms = proposed_terms({"version", "terms"});
    if (!terms) return;
    if (*dry_run) {
      auto v = c->check_counter(id, *version, *terms);
      if (!v.ok()) {
        answer(answer_error(v.error(), *c, id));
        return;
      }
      answer(Response::json(200, dry_run_json("counter", *v, checks_catalog(*this, *terms), id)));
      return;
    }
    out = c->counter(id, *version, *terms);
  } else if (route == "/v1/contracts/{id}/accept") {
    if (Status s = only_members(*doc, {"version"}); !s.ok()) {
      answer(Response::problem(400, "Bad Request", s.error().message));
      return;
    }
    // The provider accepts only terms its catalog can serve (a stale
    // version is left to accept(), which answers the conflict).
    if (auto k = c->ledger().get(id); k.ok() && *version == k->current().number) {
      if (Diagnostics diag = catalog_problems(*this, k->current().terms, {}); !diag.ok()) {
        answer(catalog_answer(diag));
        return;
      }
    }
    out = c->accept(id, *version);
  } else {
    if (Status s = only_members(*doc, {"version", "reason"}); !s.ok()) {
      answer(Response::problem(400, "Bad Request", s.error().message));
      return;
    }
    auto reason = reason_of(*doc);
    if (!reason.ok()) {
      answer(Response::problem(400, "Bad Request", reason.error().message));
      return;
    }
    out = route == "/v1/contracts/{id}/reject" ? c->reject(id, *version, std::move(*reason))
                                               : c->revoke(id, *version, std::move(*reason));
  }
  if (!out.ok()) {
    answer(answer_error(out.error(), *c, id));
    return;
  }
  answer(Response::json(200, outcome_json(*out)));
}

}  // namespace entente::broker::detail
