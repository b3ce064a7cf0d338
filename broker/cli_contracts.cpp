// `entente contracts propose|counter|accept|reject|revoke|usage`: the
// contract actions of docs/contracts.md with the terms as options
// (--streams bids --fields a,b --price 3 --until 30d) instead of JSON
// bodies. A counter-offer starts from the terms on the table and changes
// only what its options name. See docs/cli.md.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "base/json_read.h"
#include "base/units.h"
#include "broker/cli_api_parts.h"
#include "broker/detail/json_out.h"

namespace entente::broker::cli {
namespace {

using rapidjson::Document;

constexpr size_t kMaxListItems = 256;
constexpr size_t kMaxReasonBytes = 1024;
constexpr size_t kMaxPredicateBytes = 4096;

// A term's option: the flag, the member of the terms it sets, and how its
// value is read.
enum class TermType { text, list, count, time };
struct TermOption {
  std::string_view flag;
  std::string_view member;
  TermType type;
  std::string_view kind;  // "stream", "hosting" or "" for both
};

constexpr TermOption kTermOptions[] = {
    {"--provider", "provider", TermType::text, "stream"},
    {"--consumer", "consumer", TermType::text, "stream"},
    {"--streams", "streams", TermType::list, "stream"},
    {"--fields", "fields", TermType::list, "stream"},
    {"--predicate", "predicate", TermType::text, "stream"},
    {"--rate-cap", "rate_cap", TermType::count, "stream"},
    {"--price", "price_per_million", TermType::count, "stream"},
    {"--host", "host", TermType::text, "hosting"},
    {"--owner", "owner", TermType::text, "hosting"},
    {"--box-kinds", "box_kinds", TermType::list, "hosting"},
    {"--max-load", "max_load", TermType::count, "hosting"},
    {"--price-min", "price_min", TermType::count, "hosting"},
    {"--price-max", "price_max", TermType::count, "hosting"},
    {"--notice", "notice_seconds", TermType::count, "hosting"},
    {"--from", "valid_from", TermType::time, ""},
    {"--until", "valid_until", TermType::time, ""},
};

// An error already printed where it happened (the node's refusal, an
// answer without what is needed), whose exit code the function that
// returns it stored in its `failed` argument. Any other error is a usage
// error still to print.
Error already_reported() { return make_error(Errc::unavailable, ""); }
bool reported(const Error& e) { return e.code == Errc::unavailable && e.message.empty(); }

// The exit code for `e`: `failed` when it was printed already, else a
// usage error printed now.
Exit exit_for(const Error& e, Exit failed) { return reported(e) ? failed : usage_error(e.message); }

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A contract time: RFC 3339 as written ("2027-01-01T00:00:00Z"), "now", or
// a duration from now ("30d", "+12h"), as Unix ms in whole seconds.
Result<Value> time_value(const std::string& v, std::string_view flag, Document::AllocatorType& a) {
  if (v.size() >= 5 && all_digits(v.substr(0, 4)) && v[4] == '-') return Value(v.c_str(), a);
  int64_t offset = 0;
  if (v != "now") {
    const auto d = base::parse_duration(v[0] == '+' ? std::string_view(v).substr(1) : std::string_view(v));
    if (!d.ok())
      return make_error(Errc::invalid_argument,
                        std::string(flag) + " '" + printable(v) +
                            "' is not a time: RFC 3339 UTC (2027-01-01T00:00:00Z), now, or a duration from "
                            "now (30d, 12h)");
    offset = d.ms;
  }
  return Value(static_cast<int64_t>((now_ms() + offset) / 1000 * 1000));
}

// "a,b,c" as a JSON array of strings; empty items are refused.
Result<Value> list_value(const std::string& v, std::string_view flag, Document::AllocatorType& a) {
  Value out(rapidjson::kArrayType);
  if (v.empty()) return out;  // "--fields ''": every field
  size_t from = 0;
  for (;;) {
    const size_t comma = v.find(',', from);
    const std::string item = v.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
    if (item.empty() || out.Size() == kMaxListItems)
      return make_error(
          Errc::invalid_argument,
          std::string(flag) + " takes 1 to 256 names separated by commas, not '" + printable(v) + "'");
    out.PushBack(Value(item.c_str(), a), a);
    if (comma == std::string::npos) return out;
    from = comma + 1;
  }
}

Result<Value> term_value(const TermOption& t, const std::string& v, Document::AllocatorType& a) {
  switch (t.type) {
    case TermType::list:
      return list_value(v, t.flag, a);
    case TermType::time:
      return time_value(v, t.flag, a);
    case TermType::count: {
      const auto n = parse_uint(v);
      if (!n || *n > (uint64_t{1} << 53))
        return make_error(Errc::invalid_argument,
                          std::string(t.flag) + " must be a whole number, not '" + printable(v) + "'");
      return Value(*n);
    }
    case TermType::text:
      break;
  }
  if (t.flag == "--predicate" && v.size() > kMaxPredicateBytes)
    return make_error(Errc::invalid_argument, "--predicate is longer than 4096 bytes");
  return Value(v.c_str(), a);
}

// Sets in `terms` (an object of kind `kind`) what the options name.
Status apply_term_options(const CommandLine& c, const std::string& kind, Document& terms) {
  auto& a = terms.GetAllocator();
  for (const auto& t : kTermOptions) {
    const std::string* v = c.value(t.flag);
    if (v == nullptr) continue;
    if (!t.kind.empty() && t.kind != kind)
      return make_error(Errc::invalid_argument, std::string(t.flag) + " is a term of " + std::string(t.kind) +
                                                    " contracts, not of " + kind);
    ENTENTE_ASSIGN_OR_RETURN(Value value, term_value(t, *v, a));
    const Value key(rapidjson::StringRef(t.member.data(), t.member.size()));
    if (terms.HasMember(key))
      terms[key] = value;
    else
      terms.AddMember(Value(t.member.data(), static_cast<rapidjson::SizeType>(t.member.size()), a), value, a);
  }
  return {};
}

// This node's domain, from GET /v1/health; "" (printed, the exit code in
// `failed`) when unknown.
std::string own_domain(Api& api, Exit& failed) {
  const Reply health = api.call("GET", "/v1/health");
  if ((failed = health.exit) != Exit::ok) return "";
  Document h;
  const Value* domain = base::read_json(health.body, h) ? nullptr : get(h, "domain");
  if (domain == nullptr || !domain->IsString()) {
    failed = unexpected("domain in GET /v1/health");
    return "";
  }
  return text_of(domain);
}

// The terms of a proposal: the options, this node's domain as the party the
// options leave out, valid_from now unless --from says.
Result<std::string> proposal_terms(Api& api, const CommandLine& c, Exit& failed) {
  const std::string* kind_opt = c.value("--kind");
  const std::string kind = kind_opt ? *kind_opt : "stream";
  if (kind != "stream" && kind != "hosting")
    return make_error(Errc::invalid_argument,
                      "--kind must be stream or hosting, not '" + printable(kind) + "'");
  if (!c.value("--until"))
    return make_error(Errc::invalid_argument,
                      "contracts propose needs --until TIME (e.g. 30d, or 2027-02-01T00:00:00Z)");
  Document terms(rapidjson::kObjectType);
  terms.AddMember("kind", Value(kind.c_str(), terms.GetAllocator()), terms.GetAllocator());
  ENTENTE_RETURN_IF_ERROR(apply_term_options(c, kind, terms));
  if (!terms.HasMember("valid_from"))
    terms.AddMember("valid_from", Value(now_ms() / 1000 * 1000), terms.GetAllocator());
  const char* a = kind == "stream" ? "provider" : "host";
  const char* b = kind == "stream" ? "consumer" : "owner";
  if (terms.HasMember(a) != terms.HasMember(b)) {
    // The party not named is this node's domain.
    const std::string self = own_domain(api, failed);
    if (self.empty()) return already_reported();
    terms.AddMember(Value(terms.HasMember(a) ? b : a, terms.GetAllocator()),
                    Value(self.c_str(), terms.GetAllocator()), terms.GetAllocator());
  } else if (!terms.HasMember(a)) {
    return make_error(Errc::invalid_argument, std::string("name the other party: --") + b + " DOMAIN (or --" +
                                                  a + " DOMAIN); this node's domain is the party left out");
  }
  return compact(terms);
}

// The contract's current version: --version N, else as the node shows it
// now (read with GET when `contract` is null; its failure's exit code in
// `failed`).
Result<uint64_t> acted_on_version(Api& api, const CommandLine& c, const std::string& path,
                                  const Value* contract, Exit& failed) {
  if (const std::string* v = c.value("--version")) {
    const auto n = parse_uint(*v);
    if (!n || *n == 0)
      return make_error(Errc::invalid_argument,
                        "--version must be a version number, not '" + printable(*v) + "'");
    return *n;
  }
  Document d;
  if (contract == nullptr) {
    const Reply r = api.call("GET", "/v1/contracts/" + path);
    if ((failed = r.exit) != Exit::ok) return already_reported();
    if (base::read_json(r.body, d) || !get(d, "version")) {
      failed = unexpected("contract version");
      return already_reported();
    }
    contract = &d;
  }
  return uint_of(*contract, "version");
}

// Prints a contract action's answer: the contract, and whether the new
// version reached the other domain; a dry run's checks.
Exit print_outcome(const Value& d) {
  if (const Value* dry = get(d, "dry_run"); dry && dry->IsBool()) {
    Fields f;
    f.add("dry_run", "the terms pass every check; nothing was recorded or sent");
    for (const char* key : {"action", "state", "version", "catalog_checked"}) add_member(f, d, key);
    if (const Value* terms = get(d, "terms"); terms && terms->IsObject())
      for (auto it = terms->MemberBegin(); it != terms->MemberEnd(); ++it)
        f.add("terms." + printable(std::string_view(it->name.GetString(), it->name.GetStringLength())),
              text_of(&it->value));
    f.print();
    return Exit::ok;
  }
  const Exit e = print_contract(d);
  if (e == Exit::ok) {
    if (const Value* delivered = get(d, "delivered");
        delivered && delivered->IsBool() && !delivered->GetBool())
      std::printf("\nnot delivered yet: it reaches the other domain when a link to it is up\n");
  }
  return e;
}

// The contract id of the command line, for a path.
Result<std::string> contract_path(const CommandLine& c) { return path_name(c.words[0], "a contract id"); }

Exit post_action(Api& api, const std::string& target, const std::string& body) {
  const Reply r = api.call("POST", target, body);
  return r.exit == Exit::ok ? emit(api, r, print_outcome) : r.exit;
}

// POST /v1/contracts/{id}/{action} with {"version", "reason"?}.
Exit end_action(Api& api, const CommandLine& c, const char* action, bool reason_required) {
  const auto path = contract_path(c);
  if (!path.ok()) return usage_error(path.error().message);
  const std::string* reason = c.value("--reason");
  if (reason_required && (reason == nullptr || reason->empty()))
    return usage_error(std::string("contracts ") + action +
                       " needs --reason TEXT (the other domain sees it)");
  if (reason && reason->size() > kMaxReasonBytes) return usage_error("--reason is longer than 1024 bytes");
  Exit failed = Exit::ok;
  const auto version = acted_on_version(api, c, *path, nullptr, failed);
  if (!version.ok()) return exit_for(version.error(), failed);
  detail::JsonOut j;
  j.begin_object().key("version").u64(*version);
  if (reason) j.key("reason").str(*reason);
  j.end_object();
  return post_action(api, "/v1/contracts/" + *path + "/" + action, j.take());
}

std::string dry_run_query(const CommandLine& c) { return c.has("--dry-run") ? "?dry_run=true" : ""; }

Exit print_usage(const Value& u) {
  if (!u.IsObject() || !get(u, "id")) return unexpected("usage");
  Fields f;
  for (const char* key :
       {"id", "kind", "tuples", "load_seconds", "price_per_million", "price_min", "price_max"})
    add_member(f, u, key);
  // A cost of a few tuples is a millionth of a credit: nine decimals.
  if (const Value* cost = get(u, "cost_credits"); cost && cost->IsNumber()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9f", cost->GetDouble());
    std::string text = buf;
    while (text.back() == '0') text.pop_back();
    if (text.back() == '.') text.pop_back();
    f.add("cost_credits", text);
  }
  f.print();
  return Exit::ok;
}

}  // namespace

const std::vector<OptionSpec>& contract_terms_options() {
  static const std::vector<OptionSpec> kOptions = [] {
    std::vector<OptionSpec> out;
    for (const auto& t : kTermOptions) out.push_back({t.flag, true});
    out.push_back({"--dry-run", false});
    return out;
  }();
  return kOptions;
}

Exit contracts_propose(Api& api, const CommandLine& c) {
  Exit failed = Exit::ok;
  const auto terms = proposal_terms(api, c, failed);
  if (!terms.ok()) return exit_for(terms.error(), failed);
  return post_action(api, "/v1/contracts" + dry_run_query(c), "{\"terms\":" + *terms + "}");
}

Exit contracts_counter(Api& api, const CommandLine& c) {
  const auto path = contract_path(c);
  if (!path.ok()) return usage_error(path.error().message);
  const Reply r = api.call("GET", "/v1/contracts/" + *path);
  if (r.exit != Exit::ok) return r.exit;
  Document contract;
  const Value* current = base::read_json(r.body, contract) ? nullptr : get(contract, "terms");
  if (current == nullptr || !current->IsObject()) return unexpected("terms");
  // The terms on the table, changed where the options say.
  Document terms;
  terms.CopyFrom(*current, terms.GetAllocator());
  const std::string kind = field(terms, "kind");
  if (Status s = apply_term_options(c, kind, terms); !s.ok()) return usage_error(s.error().message);
  Exit failed = Exit::ok;
  const auto version = acted_on_version(api, c, *path, &contract, failed);
  if (!version.ok()) return exit_for(version.error(), failed);
  detail::JsonOut j;
  j.begin_object().key("version").u64(*version).key("terms").raw(compact(terms)).end_object();
  return post_action(api, "/v1/contracts/" + *path + "/counter" + dry_run_query(c), j.take());
}

Exit contracts_accept(Api& api, const CommandLine& c) { return end_action(api, c, "accept", false); }
Exit contracts_reject(Api& api, const CommandLine& c) { return end_action(api, c, "reject", false); }
Exit contracts_revoke(Api& api, const CommandLine& c) { return end_action(api, c, "revoke", true); }

Exit contracts_usage(Api& api, const CommandLine& c) {
  const auto path = contract_path(c);
  if (!path.ok()) return usage_error(path.error().message);
  return get_and_print(api, "/v1/contracts/" + *path + "/usage", print_usage);
}

}  // namespace entente::broker::cli
