#include "contracts/contract.h"

#include <openssl/rand.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "contracts/canonical.h"
#include "contracts/detail/json.h"
#include "rapidjson/document.h"
#include "rapidjson/error/en.h"

namespace entente::contracts {

namespace {

using detail::Alloc;
using detail::string_value;

constexpr size_t kMaxVersionTextBytes = 1 << 20;
constexpr size_t kMaxSignatures = 2;

Error conflict(std::string m) { return make_error(Errc::conflict, std::move(m)); }
Error denied(std::string m) { return make_error(Errc::permission_denied, std::move(m)); }
Error invalid(std::string m) { return make_error(Errc::invalid_argument, std::move(m)); }

std::string state_list(std::initializer_list<State> states) {
  std::string out;
  for (State s : states) out += (out.empty() ? "" : " or ") + std::string(state_name(s));
  return out;
}

// The other party of the terms.
std::string other_party(const Terms& t, std::string_view self) {
  auto [a, b] = parties(t);
  return self == a ? b : a;
}

bool is_party(const Terms& t, std::string_view domain) {
  auto [a, b] = parties(t);
  return domain == a || domain == b;
}

// What every version must satisfy, whatever its state: the next number,
// the bounds, made by the domain it comes from.
Status check_envelope(const Contract& c, const Version& v, std::string_view from) {
  if (!valid_contract_id(c.id)) return invalid("contract id '" + c.id.substr(0, 40) + "' is not c- and 16 hex digits");
  const std::string& id = c.id;
  const uint64_t current = c.history.size();
  if (v.number != current + 1) {
    if (current == 0) return conflict("contract " + id + " does not exist yet; version " + std::to_string(v.number) + " cannot start it");
    return conflict("contract " + id + " is at version " + std::to_string(current) + "; version " +
                    std::to_string(v.number) + " is not the next one");
  }
  if (v.number > kMaxVersions) {
    return make_error(Errc::limit_exceeded, "contract " + id + " has reached " + std::to_string(kMaxVersions) + " versions");
  }
  if (v.by != from) {
    return denied("version " + std::to_string(v.number) + " of contract " + id + " is made by '" +
                  v.by.substr(0, 64) + "' but comes from " + std::string(from));
  }
  if (v.at_ms < 0) return invalid("version " + std::to_string(v.number) + " of contract " + id + " has a negative time");
  if (v.reason.size() > kMaxReasonBytes) {
    return invalid("reason is longer than " + std::to_string(kMaxReasonBytes) + " bytes");
  }
  if (v.signatures.size() > kMaxSignatures) return invalid("more than 2 signatures");
  return Status::Ok();
}

// Version 1: a proposal, by one of the parties it names.
Status check_first(const Contract& c, const Version& v, std::string_view from) {
  if (v.state != State::proposed) {
    return invalid("contract " + c.id + " must start with a proposal, not " + std::string(state_name(v.state)));
  }
  ENTENTE_RETURN_IF_ERROR(validate_terms(v.terms));
  if (!is_party(v.terms, from)) {
    auto [a, b] = parties(v.terms);
    return denied(std::string(from) + " may not propose a contract between " + a + " and " + b);
  }
  if (v.offer != 1 || !v.signatures.empty() || !v.reason.empty()) {
    return invalid("a proposal is its own offer (1) and carries no signature or reason");
  }
  return Status::Ok();
}

// A version after the first: an answer to the current one (counter,
// accept, countersign, reject) or a revocation, by a party, in the states
// that allow it.
Status check_answer(const Contract& c, const Version& v, std::string_view from) {
  const std::string& id = c.id;
  const Version& cur = c.current();
  const auto [first, second] = parties(cur.terms);
  if (!is_party(cur.terms, from)) {
    return denied(std::string(from) + " is not a party of contract " + id + " (" + first + ", " + second + ")");
  }
  const std::string cur_state(state_name(cur.state));
  const std::string at = "contract " + id + " is " + cur_state;
  auto need_state = [&](std::initializer_list<State> ok, std::string_view action) -> Status {
    for (State s : ok)
      if (cur.state == s) return Status::Ok();
    const std::string states = state_list(ok);
    // "an accepted or active contract", "a proposed or countered contract".
    const char* article = std::string_view("aeiou").find(states.front()) != std::string_view::npos ? "an " : "a ";
    return conflict(at + "; only " + article + states + " contract can be " + std::string(action));
  };
  // Offers are answered by the party that did not make them.
  auto need_other = [&](std::string_view action) -> Status {
    if (from == cur.by) {
      return denied(cur.by + " made version " + std::to_string(cur.number) + " of contract " + id + "; only " +
                    other_party(cur.terms, cur.by) + " may " + std::string(action) + " it");
    }
    return Status::Ok();
  };
  auto same_terms = [&]() -> Status {
    if (!(v.terms == cur.terms)) {
      return invalid("version " + std::to_string(v.number) + " of contract " + id +
                     " changes the terms; only a counter-offer may");
    }
    return Status::Ok();
  };
  auto no_signatures = [&]() -> Status {
    if (!v.signatures.empty()) return invalid("a " + std::string(state_name(v.state)) + " version carries no signature");
    return Status::Ok();
  };

  switch (v.state) {
    case State::proposed:
      return conflict("contract " + id + " exists already; a proposal starts a new contract");
    case State::countered: {
      ENTENTE_RETURN_IF_ERROR(need_state({State::proposed, State::countered}, "countered"));
      ENTENTE_RETURN_IF_ERROR(need_other("counter"));
      ENTENTE_RETURN_IF_ERROR(validate_terms(v.terms));
      if (v.terms.kind != cur.terms.kind) {
        return invalid("a counter-offer keeps the kind (" + std::string(kind_name(cur.terms.kind)) + ")");
      }
      if (parties(v.terms) != parties(cur.terms)) {
        return invalid("a counter-offer keeps the parties (" + first + ", " + second + ")");
      }
      if (v.offer != v.number) return invalid("a counter-offer is its own offer");
      if (!v.reason.empty()) return invalid("a counter-offer carries no reason");
      return no_signatures();
    }
    case State::accepted: {
      ENTENTE_RETURN_IF_ERROR(need_state({State::proposed, State::countered}, "accepted"));
      ENTENTE_RETURN_IF_ERROR(need_other("accept"));
      if (v.offer != cur.number) {
        return invalid("an acceptance is about the current offer " + std::to_string(cur.number) + ", not " +
                       std::to_string(v.offer));
      }
      ENTENTE_RETURN_IF_ERROR(same_terms());
      if (v.signatures.size() != 1 || v.signatures[0].domain != from) {
        return denied("an acceptance by " + std::string(from) + " carries exactly one signature, by " +
                      std::string(from));
      }
      return Status::Ok();
    }
    case State::active: {
      ENTENTE_RETURN_IF_ERROR(need_state({State::accepted}, "countersigned"));
      ENTENTE_RETURN_IF_ERROR(need_other("countersign"));
      if (v.offer != cur.offer) {
        return invalid("a countersignature is about the accepted offer " + std::to_string(cur.offer));
      }
      ENTENTE_RETURN_IF_ERROR(same_terms());
      if (v.signatures.size() != 2 || cur.signatures.empty() || !(v.signatures[0] == cur.signatures[0]) ||
          v.signatures[1].domain != from) {
        return denied("an active version carries the acceptor's signature of version " +
                      std::to_string(cur.number) + ", then one by " + std::string(from));
      }
      return Status::Ok();
    }
    case State::rejected: {
      ENTENTE_RETURN_IF_ERROR(need_state({State::proposed, State::countered}, "rejected"));
      ENTENTE_RETURN_IF_ERROR(need_other("reject"));
      if (v.offer != cur.number) return invalid("a rejection is about the current offer " + std::to_string(cur.number));
      ENTENTE_RETURN_IF_ERROR(same_terms());
      return no_signatures();
    }
    case State::revoked: {
      ENTENTE_RETURN_IF_ERROR(need_state({State::accepted, State::active}, "revoked"));
      if (v.offer != cur.offer) return invalid("a revocation is about the offer in force " + std::to_string(cur.offer));
      ENTENTE_RETURN_IF_ERROR(same_terms());
      if (v.reason.empty()) return invalid("a revocation needs a reason");
      return no_signatures();
    }
    case State::expired:
      return invalid("expired is derived from valid_until and never recorded");
  }
  return invalid("unknown state");
}

}  // namespace

// The transition rules, without signature verification: shared by the pure
// transition functions, check_next and the Ledger.
Status check_transition(const Contract& c, const Version& v, std::string_view from) {
  ENTENTE_RETURN_IF_ERROR(check_envelope(c, v, from));
  return c.history.empty() ? check_first(c, v, from) : check_answer(c, v, from);
}

namespace {

Result<Version> next_version(const Contract& c, std::string_view self, uint64_t on_version, State state,
                             int64_t now_ms) {
  if (c.history.empty()) return make_error(Errc::not_found, "contract " + c.id + " has no versions");
  if (on_version != c.current().number) {
    return conflict("contract " + c.id + " is at version " + std::to_string(c.current().number) + ", not " +
                    std::to_string(on_version));
  }
  Version v;
  v.number = c.current().number + 1;
  v.state = state;
  v.by = std::string(self);
  v.at_ms = now_ms;
  v.terms = c.current().terms;
  v.offer = c.current().offer;
  return v;
}

rapidjson::Value signature_value(const certs::Signature& s, Alloc& a) {
  rapidjson::Value o(rapidjson::kObjectType);
  o.AddMember("algorithm", string_value(s.algorithm, a), a);
  o.AddMember("certificate", string_value(s.certificate, a), a);
  o.AddMember("domain", string_value(s.domain, a), a);
  o.AddMember("node", string_value(s.node, a), a);
  o.AddMember("value", string_value(s.value, a), a);
  return o;
}

rapidjson::Value version_value(const Version& v, Alloc& a) {
  rapidjson::Value o(rapidjson::kObjectType);
  o.AddMember("number", rapidjson::Value(v.number), a);
  o.AddMember("state", string_value(state_name(v.state), a), a);
  o.AddMember("by", string_value(v.by, a), a);
  o.AddMember("at_ms", rapidjson::Value(v.at_ms), a);
  o.AddMember("terms", detail::terms_value(v.terms, a), a);
  o.AddMember("offer", rapidjson::Value(v.offer), a);
  rapidjson::Value sigs(rapidjson::kArrayType);
  for (const auto& s : v.signatures) sigs.PushBack(signature_value(s, a), a);
  o.AddMember("signatures", sigs, a);
  o.AddMember("reason", string_value(v.reason, a), a);
  return o;
}

const std::vector<std::string_view> kVersionMembers = {"number", "state",  "by",         "at_ms",
                                                       "terms",  "offer", "signatures", "reason"};
const std::vector<std::string_view> kSignatureMembers = {"algorithm", "certificate", "domain", "node", "value"};

std::optional<certs::Signature> signature_from_json(const rapidjson::Value& v, const std::string& p,
                                                    Diagnostics& diag) {
  if (!v.IsObject()) {
    diag.error(p, "must be an object");
    return std::nullopt;
  }
  detail::check_members(v, p, kSignatureMembers, diag);
  certs::Signature s;
  bool ok = true;
  auto field = [&](const char* name, size_t max, std::string& out) {
    const auto it = v.FindMember(name);
    if (it == v.MemberEnd()) {
      diag.error(p + "." + name, "missing");
      ok = false;
      return;
    }
    if (auto str = detail::read_string(it->value, p + "." + name, max, diag)) {
      out = std::move(*str);
    } else {
      ok = false;
    }
  };
  field("algorithm", 64, s.algorithm);
  field("certificate", certs::kMaxSignatureCertBytes, s.certificate);
  field("domain", 63, s.domain);
  field("node", 63, s.node);
  field("value", certs::kMaxSignatureValueBytes, s.value);
  if (!ok) return std::nullopt;
  return s;
}

}  // namespace

std::string_view state_name(State s) {
  switch (s) {
    case State::proposed: return "proposed";
    case State::countered: return "countered";
    case State::accepted: return "accepted";
    case State::active: return "active";
    case State::rejected: return "rejected";
    case State::revoked: return "revoked";
    case State::expired: return "expired";
  }
  return "unknown";
}

Result<State> state_from_name(std::string_view name) {
  for (State s : {State::proposed, State::countered, State::accepted, State::active, State::rejected,
                  State::revoked, State::expired}) {
    if (state_name(s) == name) return s;
  }
  return invalid("unknown contract state '" + std::string(name.substr(0, 40)) +
                 "' (proposed, countered, accepted, active, rejected, revoked, expired)");
}

State Contract::state_at(int64_t now_ms) const {
  const Version& cur = current();
  if ((cur.state == State::accepted || cur.state == State::active) && now_ms >= cur.terms.valid_until_ms) {
    return State::expired;
  }
  return cur.state;
}

bool Contract::in_force(int64_t now_ms) const {
  if (history.empty()) return false;
  const Version& cur = current();
  return cur.state == State::active && cur.signatures.size() == 2 && cur.terms.valid_from_ms <= now_ms &&
         now_ms < cur.terms.valid_until_ms;
}

int64_t Contract::notice_until_ms() const {
  if (history.size() < 2) return 0;
  const Version& cur = current();
  const Version& before = history[history.size() - 2];
  if (cur.state != State::revoked || cur.terms.kind != Kind::hosting || cur.terms.hosting.notice_seconds == 0)
    return 0;
  // Revoked while in force: a contract never in force has nothing to end.
  if (before.state != State::active || before.signatures.size() != 2 || cur.at_ms < before.terms.valid_from_ms ||
      cur.at_ms >= before.terms.valid_until_ms)
    return 0;
  const auto notice_ms = static_cast<int64_t>(std::min<uint64_t>(cur.terms.hosting.notice_seconds, kMaxNoticeSeconds) * 1000);
  return before.terms.valid_until_ms - cur.at_ms <= notice_ms ? before.terms.valid_until_ms : cur.at_ms + notice_ms;
}

std::string new_contract_id() {
  unsigned char bytes[8];
  if (RAND_bytes(bytes, sizeof bytes) != 1) {
    // The id only has to be unique between two domains' contracts; a seeded
    // engine is enough when OpenSSL's generator is unavailable.
    std::random_device rd;
    std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
    const uint64_t r = gen();
    for (size_t i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(r >> (8 * i));
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "c-";
  for (unsigned char b : bytes) {
    id += kHex[b >> 4];
    id += kHex[b & 15];
  }
  return id;
}

bool valid_contract_id(std::string_view id) {
  if (id.size() != 18 || id.substr(0, 2) != "c-") return false;
  for (char c : id.substr(2)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string signing_message(const std::string& id, uint64_t offer_version, const Terms& terms) {
  rapidjson::Document doc(rapidjson::kObjectType);
  Alloc& a = doc.GetAllocator();
  doc.AddMember("id", string_value(id, a), a);
  doc.AddMember("kind", string_value(kind_name(terms.kind), a), a);
  doc.AddMember("terms", detail::terms_value(terms, a), a);
  doc.AddMember("version", rapidjson::Value(offer_version), a);
  return detail::canonical_of(doc);
}

Result<Version> propose(std::string_view self, const Terms& terms, int64_t now_ms) {
  ENTENTE_RETURN_IF_ERROR(validate_terms(terms));
  Version v;
  v.number = 1;
  v.state = State::proposed;
  v.by = std::string(self);
  v.at_ms = now_ms;
  v.terms = terms;
  v.offer = 1;
  // An empty contract, to check the first transition; the caller gives the
  // real id when it records the version (the rules do not read the id).
  Contract fresh{"c-0000000000000000", {}};
  ENTENTE_RETURN_IF_ERROR(check_transition(fresh, v, self));
  return v;
}

Result<Version> counter(const Contract& c, std::string_view self, uint64_t on_version, const Terms& terms,
                        int64_t now_ms) {
  ENTENTE_ASSIGN_OR_RETURN(Version v, next_version(c, self, on_version, State::countered, now_ms));
  v.terms = terms;
  v.offer = v.number;
  ENTENTE_RETURN_IF_ERROR(check_transition(c, v, self));
  return v;
}

Result<Version> accept(const Contract& c, const certs::Signer& signer, uint64_t on_version, int64_t now_ms) {
  const std::string& self = signer.identity().domain;
  ENTENTE_ASSIGN_OR_RETURN(Version v, next_version(c, self, on_version, State::accepted, now_ms));
  v.offer = on_version;
  // Check before signing: nothing is signed that could not be recorded.
  v.signatures.push_back(certs::Signature{self, {}, {}, {}, {}});
  ENTENTE_RETURN_IF_ERROR(check_transition(c, v, self));
  ENTENTE_ASSIGN_OR_RETURN(v.signatures[0], signer.sign(signing_message(c.id, v.offer, v.terms)));
  return v;
}

Result<Version> countersign(const Contract& c, const certs::Signer& signer, uint64_t on_version,
                            int64_t now_ms) {
  const std::string& self = signer.identity().domain;
  ENTENTE_ASSIGN_OR_RETURN(Version v, next_version(c, self, on_version, State::active, now_ms));
  // The acceptor's signature, then ours.
  if (!c.current().signatures.empty()) v.signatures.push_back(c.current().signatures.front());
  v.signatures.push_back(certs::Signature{self, {}, {}, {}, {}});
  ENTENTE_RETURN_IF_ERROR(check_transition(c, v, self));
  ENTENTE_ASSIGN_OR_RETURN(v.signatures[1], signer.sign(signing_message(c.id, v.offer, v.terms)));
  return v;
}

Result<Version> reject(const Contract& c, std::string_view self, uint64_t on_version, std::string reason,
                       int64_t now_ms) {
  ENTENTE_ASSIGN_OR_RETURN(Version v, next_version(c, self, on_version, State::rejected, now_ms));
  v.offer = on_version;
  v.reason = std::move(reason);
  ENTENTE_RETURN_IF_ERROR(check_transition(c, v, self));
  return v;
}

Result<Version> revoke(const Contract& c, std::string_view self, uint64_t on_version, std::string reason,
                       int64_t now_ms) {
  ENTENTE_ASSIGN_OR_RETURN(Version v, next_version(c, self, on_version, State::revoked, now_ms));
  v.reason = std::move(reason);
  ENTENTE_RETURN_IF_ERROR(check_transition(c, v, self));
  return v;
}

Status check_next(const Contract& c, const Version& v, std::string_view from, const certs::TrustStore& trust,
                  certs::Clock::time_point now) {
  ENTENTE_RETURN_IF_ERROR(check_transition(c, v, from));
  if (v.signatures.empty()) return Status::Ok();
  const std::string message = signing_message(c.id, v.offer, v.terms);
  for (const auto& sig : v.signatures) {
    Status s = certs::verify_signature(trust, sig, message, now);
    if (!s.ok()) {
      return make_error(s.error().code, "version " + std::to_string(v.number) + " of contract " + c.id + ": " +
                                            s.error().message);
    }
  }
  return Status::Ok();
}

Status apply(Contract& c, Version v, std::string_view from, const certs::TrustStore& trust,
             certs::Clock::time_point now) {
  ENTENTE_RETURN_IF_ERROR(check_next(c, v, from, trust, now));
  c.history.push_back(std::move(v));
  return Status::Ok();
}

std::string version_to_json(const Version& v) {
  rapidjson::Document doc;
  return detail::canonical_of(version_value(v, doc.GetAllocator()));
}

Result<Version> version_from_json(const rapidjson::Value& v, std::string_view path) {
  const std::string p(path);
  Diagnostics diag;
  if (!v.IsObject()) {
    diag.error(p, "must be an object");
    return detail::diagnostics_error(diag);
  }
  detail::check_members(v, p, kVersionMembers, diag);
  Version out;
  auto member = [&](const char* name) -> const rapidjson::Value* {
    const auto it = v.FindMember(name);
    if (it == v.MemberEnd()) {
      diag.error(p + "." + name, "missing");
      return nullptr;
    }
    return &it->value;
  };
  if (const auto* m = member("number")) {
    if (auto n = detail::read_uint(*m, p + ".number", diag)) {
      if (*n < 1 || *n > kMaxVersions) {
        diag.error(p + ".number", "must be 1.." + std::to_string(kMaxVersions));
      }
      out.number = *n;
    }
  }
  if (const auto* m = member("state")) {
    if (auto s = detail::read_string(*m, p + ".state", 16, diag)) {
      auto st = state_from_name(*s);
      if (!st.ok() || *st == State::expired) {
        diag.error(p + ".state", "must be proposed, countered, accepted, active, rejected or revoked");
      } else {
        out.state = *st;
      }
    }
  }
  if (const auto* m = member("by")) {
    if (auto s = detail::read_string(*m, p + ".by", 63, diag)) {
      if (!certs::valid_name(*s)) diag.error(p + ".by", "invalid domain name '" + *s + "'");
      out.by = std::move(*s);
    }
  }
  if (const auto* m = member("at_ms")) {
    if (auto n = detail::read_int(*m, p + ".at_ms", diag)) {
      if (*n < 0) diag.error(p + ".at_ms", "must not be negative");
      out.at_ms = *n;
    }
  }
  if (const auto* m = member("terms")) {
    auto t = terms_from_json(*m, p + ".terms");
    if (t.ok()) {
      out.terms = std::move(*t);
    } else {
      // terms_from_json already names its paths: keep each "path: message".
      std::string_view lines = t.error().message;
      while (!lines.empty()) {
        const size_t nl = lines.find('\n');
        const std::string_view line = lines.substr(0, nl);
        const size_t colon = line.find(": ");
        if (colon == std::string_view::npos) {
          diag.error(p + ".terms", std::string(line));
        } else {
          diag.error(std::string(line.substr(0, colon)), std::string(line.substr(colon + 2)));
        }
        lines = nl == std::string_view::npos ? std::string_view() : lines.substr(nl + 1);
      }
    }
  }
  if (const auto* m = member("offer")) {
    if (auto n = detail::read_uint(*m, p + ".offer", diag)) {
      if (*n < 1 || *n > kMaxVersions) diag.error(p + ".offer", "must be 1.." + std::to_string(kMaxVersions));
      out.offer = *n;
    }
  }
  if (const auto* m = member("signatures")) {
    if (!m->IsArray()) {
      diag.error(p + ".signatures", "must be an array");
    } else if (m->Size() > kMaxSignatures) {
      diag.error(p + ".signatures", "has more than " + std::to_string(kMaxSignatures) + " signatures");
    } else {
      for (rapidjson::SizeType i = 0; i < m->Size(); ++i) {
        if (auto s = signature_from_json((*m)[i], p + ".signatures[" + std::to_string(i) + "]", diag)) {
          out.signatures.push_back(std::move(*s));
        }
      }
    }
  }
  if (const auto* m = member("reason")) {
    if (auto s = detail::read_string(*m, p + ".reason", kMaxReasonBytes, diag)) out.reason = std::move(*s);
  }
  if (!diag.ok()) return detail::diagnostics_error(diag);
  return out;
}

Result<Version> version_from_text(std::string_view text) {
  if (text.size() > kMaxVersionTextBytes) {
    return make_error(Errc::limit_exceeded, "a contract version is at most " +
                                                std::to_string(kMaxVersionTextBytes) + " bytes of JSON");
  }
  rapidjson::Document doc;
  doc.Parse<rapidjson::kParseValidateEncodingFlag | rapidjson::kParseIterativeFlag>(text.data(), text.size());
  if (doc.HasParseError()) {
    return make_error(Errc::parse_error, "contract version JSON at offset " + std::to_string(doc.GetErrorOffset()) +
                                             ": " + rapidjson::GetParseError_En(doc.GetParseError()));
  }
  return version_from_json(doc);
}

std::string contract_to_json(const Contract& c, int64_t now_ms) {
  rapidjson::Document doc(rapidjson::kObjectType);
  Alloc& a = doc.GetAllocator();
  const Version& cur = c.current();
  doc.AddMember("id", string_value(c.id, a), a);
  doc.AddMember("kind", string_value(kind_name(cur.terms.kind), a), a);
  auto [first, second] = parties(cur.terms);
  rapidjson::Value ps(rapidjson::kArrayType);
  ps.PushBack(string_value(first, a), a);
  ps.PushBack(string_value(second, a), a);
  doc.AddMember("parties", ps, a);
  doc.AddMember("state", string_value(state_name(c.state_at(now_ms)), a), a);
  doc.AddMember("in_force", rapidjson::Value(c.in_force(now_ms)), a);
  // A revocation under notice: the hosted runs end then (contracts.md).
  if (const int64_t until = c.notice_until_ms(); until != 0)
    doc.AddMember("notice_until", string_value(format_time(until), a), a);
  doc.AddMember("version", rapidjson::Value(cur.number), a);
  doc.AddMember("terms", detail::terms_value(cur.terms, a), a);
  rapidjson::Value history(rapidjson::kArrayType);
  for (const auto& v : c.history) history.PushBack(version_value(v, a), a);
  doc.AddMember("history", history, a);
  return detail::canonical_of(doc);
}

}  // namespace entente::contracts
