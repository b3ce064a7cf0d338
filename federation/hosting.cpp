#include "federation/hosting.h"

#include <algorithm>
#include <vector>

#include "contracts/hosting.h"
#include "contracts/terms.h"
#include "engine/network.h"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace entente::federation {
namespace {

constexpr size_t kMaxName = 64;
constexpr size_t kMaxReason = 4096;

int64_t system_now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

std::string json_of(const rapidjson::Value& v) {
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  v.Accept(w);
  return {sb.GetString(), sb.GetSize()};
}

// A string member of at most `max` bytes (1.. when `required_non_empty`).
Result<std::string> string_member(const rapidjson::Value& o, const char* key, size_t max, bool non_empty) {
  auto it = o.FindMember(key);
  if (it == o.MemberEnd() || !it->value.IsString() || it->value.GetStringLength() > max ||
      (non_empty && it->value.GetStringLength() == 0)) {
    return make_error(Errc::invalid_argument, std::string("'") + key + "' must be a string of " +
                                                  (non_empty ? "1" : "0") + " to " + std::to_string(max) +
                                                  " bytes");
  }
  return std::string(it->value.GetString(), it->value.GetStringLength());
}

// The box kinds of a network that parsed: its boxes' "type"s.
std::vector<std::string> box_kinds_of(const rapidjson::Value& network) {
  std::vector<std::string> kinds;
  auto boxes = network.FindMember("boxes");
  if (boxes == network.MemberEnd() || !boxes->value.IsArray()) return kinds;
  for (const auto& b : boxes->value.GetArray()) {
    auto t = b.IsObject() ? b.FindMember("type") : b.MemberEnd();
    if (b.IsObject() && t != b.MemberEnd() && t->value.IsString()) kinds.emplace_back(t->value.GetString());
  }
  return kinds;
}

}  // namespace

std::string encode_offer(uint64_t id, const Hosting::Offer& offer) {
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  w.StartObject();
  w.Key("type");
  w.String("hosting.offer");
  w.Key("id");
  w.Uint64(id);
  w.Key("query");
  w.String(offer.query.c_str(), static_cast<rapidjson::SizeType>(offer.query.size()));
  w.Key("fragment");
  w.String(offer.fragment.c_str(), static_cast<rapidjson::SizeType>(offer.fragment.size()));
  w.Key("network");
  w.RawValue(offer.network_json.c_str(), offer.network_json.size(), rapidjson::kObjectType);
  w.Key("load");
  w.Uint64(offer.load);
  w.EndObject();
  return {sb.GetString(), sb.GetSize()};
}

Result<Hosting::Offer> decode_offer(std::string_view message, uint64_t& id) {
  if (message.size() > kMaxOfferNetworkBytes + 4096) {
    return make_error(Errc::invalid_argument, "hosting.offer of " + std::to_string(message.size()) +
                                                  " bytes, over the " + std::to_string(kMaxOfferNetworkBytes) +
                                                  "-byte network limit");
  }
  rapidjson::Document d;
  d.Parse(message.data(), message.size());
  if (d.HasParseError() || !d.IsObject()) return make_error(Errc::invalid_argument, "not a JSON object");
  auto idm = d.FindMember("id");
  if (idm == d.MemberEnd() || !idm->value.IsUint64()) {
    return make_error(Errc::invalid_argument, "'id' must be an unsigned integer");
  }
  id = idm->value.GetUint64();
  Hosting::Offer o;
  ENTENTE_ASSIGN_OR_RETURN(o.query, string_member(d, "query", kMaxName, true));
  ENTENTE_ASSIGN_OR_RETURN(o.fragment, string_member(d, "fragment", kMaxName, true));
  auto net = d.FindMember("network");
  if (net == d.MemberEnd() || !net->value.IsObject()) {
    return make_error(Errc::invalid_argument, "'network' must be a query network (a JSON object)");
  }
  o.network_json = json_of(net->value);
  if (o.network_json.size() > kMaxOfferNetworkBytes) {
    return make_error(Errc::invalid_argument, "'network' is over " + std::to_string(kMaxOfferNetworkBytes) + " bytes");
  }
  auto load = d.FindMember("load");
  if (load == d.MemberEnd() || !load->value.IsUint64() || load->value.GetUint64() < 1 ||
      load->value.GetUint64() > contracts::kMaxLoad) {
    return make_error(Errc::invalid_argument,
                      "'load' must be 1.." + std::to_string(contracts::kMaxLoad) + " CPU ms per second");
  }
  o.load = load->value.GetUint64();
  return o;
}

Hosting::Hosting(const contracts::Ledger& ledger, std::string self_domain, Hooks hooks)
    : ledger_(ledger), self_domain_(std::move(self_domain)), hooks_(std::move(hooks)) {}

uint64_t Hosting::add_pending(Pending p, std::string& why) {
  std::lock_guard lock(mu_);
  if (stopped_) {
    why = "this node is stopping";
    return 0;
  }
  if (pending_.size() >= kMaxPendingOffers) {
    why = std::to_string(kMaxPendingOffers) + " hosting offers and calls wait for a reply already; retry later";
    return 0;
  }
  const uint64_t id = next_id_++;
  pending_[id] = std::move(p);
  return id;
}

std::optional<Hosting::Pending> Hosting::take_pending(uint64_t id, const certs::Identity& peer) {
  std::lock_guard lock(mu_);
  auto it = pending_.find(id);
  // Only the node the offer or call went to answers it.
  if (it == pending_.end() || !(it->second.host == peer)) return std::nullopt;
  Pending p = std::move(it->second);
  pending_.erase(it);
  return p;
}

void Hosting::offer(const certs::Identity& host, const Offer& offer, Done done, std::chrono::milliseconds timeout) {
  std::string why;
  const uint64_t id = add_pending(Pending{host, Clock::now() + timeout, done, nullptr}, why);
  // Refusals outside the lock: `done` may call back into this object.
  if (id == 0) {
    done(make_error(Errc::unavailable, why));
    return;
  }
  if (!hooks_.send_to_peer(host, encode_offer(id, offer))) {
    // (Failed meanwhile, the link down: done ran.)
    if (auto mine = take_pending(id, host)) mine->done(make_error(Errc::unavailable, "no link up to " + host.uri()));
  }
}

void Hosting::call(const certs::Identity& host, const std::string& type, const std::string& fields, CallDone done,
                   std::chrono::milliseconds timeout) {
  std::string why;
  const uint64_t id = add_pending(Pending{host, Clock::now() + timeout, nullptr, done}, why);
  if (id == 0) {
    done(make_error(Errc::unavailable, why));
    return;
  }
  std::string message = "{\"type\":\"" + type + "\",\"id\":" + std::to_string(id);
  if (!fields.empty()) message += "," + fields;
  message += "}";
  if (message.size() > kMaxHostingMessageBytes) {
    if (auto mine = take_pending(id, host))
      mine->call_done(make_error(Errc::invalid_argument, type + " of " + std::to_string(message.size()) +
                                                             " bytes, over the " +
                                                             std::to_string(kMaxHostingMessageBytes) + "-byte limit"));
    return;
  }
  if (!hooks_.send_to_peer(host, message)) {
    if (auto mine = take_pending(id, host))
      mine->call_done(make_error(Errc::unavailable, "no link up to " + host.uri()));
  }
}

bool Hosting::notify(const certs::Identity& owner, const std::string& type, const std::string& fields) {
  std::string message = "{\"type\":\"" + type + "\"";
  if (!fields.empty()) message += "," + fields;
  message += "}";
  if (message.size() > kMaxHostingMessageBytes) return false;
  return hooks_.send_to_peer(owner, message);
}

void Hosting::on_answer(const certs::Identity& peer, const rapidjson::Document& d) {
  auto idm = d.FindMember("id");
  auto okm = d.FindMember("ok");
  auto reason = string_member(d, "reason", kMaxReason, false);
  auto body = d.FindMember("body");
  if (idm == d.MemberEnd() || !idm->value.IsUint64() || okm == d.MemberEnd() || !okm->value.IsBool() ||
      !reason.ok() || body == d.MemberEnd() || !body->value.IsObject()) {
    if (hooks_.log) hooks_.log("hosting: a malformed answer from " + peer.uri() + " was dropped");
    return;
  }
  auto mine = take_pending(idm->value.GetUint64(), peer);
  if (!mine || !mine->call_done) return;
  if (!okm->value.GetBool()) {
    mine->call_done(make_error(Errc::conflict, *reason));
    return;
  }
  mine->call_done(json_of(body->value));
}

void Hosting::serve(const certs::Identity& peer, const std::string& type, std::string_view message,
                    const rapidjson::Document& d) {
  if (!hooks_.serve) {
    if (hooks_.log) hooks_.log("hosting: " + type + " from " + peer.uri() + " dropped: no hosted runs here");
    return;
  }
  Answer answer;
  if (type != "hosting.usage") {
    auto idm = d.FindMember("id");
    if (idm == d.MemberEnd() || !idm->value.IsUint64()) {
      if (hooks_.log) hooks_.log("hosting: " + type + " from " + peer.uri() + " without an id was dropped");
      return;
    }
    const uint64_t id = idm->value.GetUint64();
    answer = [this, peer, id](bool ok, const std::string& reason, const std::string& body) {
      const std::string r = reason.substr(0, kMaxReason);
      rapidjson::StringBuffer sb;
      rapidjson::Writer<rapidjson::StringBuffer> w(sb);
      w.StartObject();
      w.Key("type");
      w.String("hosting.answer");
      w.Key("id");
      w.Uint64(id);
      w.Key("ok");
      w.Bool(ok);
      w.Key("reason");
      w.String(r.c_str(), static_cast<rapidjson::SizeType>(r.size()));
      w.Key("body");
      w.RawValue(body.empty() ? "{}" : body.c_str(), body.empty() ? 2 : body.size(), rapidjson::kObjectType);
      w.EndObject();
      if (!hooks_.send_to_peer(peer, std::string(sb.GetString(), sb.GetSize())) && hooks_.log)
        hooks_.log("hosting: the answer to call " + std::to_string(id) + " from " + peer.uri() +
                   " was not sent: the link is down");
    };
  }
  hooks_.serve(peer, type, std::string(message), std::move(answer));
}

Hosting::Reply Hosting::check(const std::string& owner, const Offer& offer) const {
  Diagnostics diag;
  auto net = engine::QueryNetwork::parse(offer.network_json, diag);
  if (!net.ok()) {
    const std::string first =
        diag.items().empty() ? net.error().message : diag.items()[0].path + ": " + diag.items()[0].message;
    return Reply{false, "", "the fragment's network does not validate on " + self_domain_ + ": " + first};
  }
  rapidjson::Document d;
  d.Parse(offer.network_json.data(), offer.network_json.size());
  const std::vector<std::string> kinds = box_kinds_of(d);
  const int64_t now = hooks_.now_ms ? hooks_.now_ms() : system_now_ms();
  auto grant = contracts::may_host_fragment(
      ledger_, contracts::FragmentHostingRequest{owner, self_domain_, kinds, offer.load, 0}, now);
  if (!grant.ok()) return Reply{false, "", grant.error().message};
  return Reply{true, grant->contract_id, "admitted under contract " + grant->contract_id};
}

void Hosting::reply(const certs::Identity& peer, uint64_t id, const Reply& r) {
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  w.StartObject();
  w.Key("type");
  w.String("hosting.reply");
  w.Key("id");
  w.Uint64(id);
  w.Key("admitted");
  w.Bool(r.admitted);
  w.Key("contract");
  w.String(r.contract.c_str(), static_cast<rapidjson::SizeType>(r.contract.size()));
  const std::string reason = r.reason.substr(0, kMaxReason);
  w.Key("reason");
  w.String(reason.c_str(), static_cast<rapidjson::SizeType>(reason.size()));
  w.EndObject();
  if (!hooks_.send_to_peer(peer, std::string(sb.GetString(), sb.GetSize())) && hooks_.log) {
    hooks_.log("hosting: the reply to offer " + std::to_string(id) + " from " + peer.uri() +
               " was not sent: the link is down");
  }
}

void Hosting::on_control(const certs::Identity& peer, std::string_view message) {
  if (message.size() > kMaxHostingMessageBytes) {
    if (hooks_.log) hooks_.log("hosting: a message of " + std::to_string(message.size()) + " bytes from " +
                               peer.uri() + " was dropped");
    return;
  }
  rapidjson::Document d;
  d.Parse(message.data(), message.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("type") || !d["type"].IsString()) {
    if (hooks_.log) hooks_.log("hosting: a malformed message from " + peer.uri() + " was dropped");
    return;
  }
  const std::string_view type(d["type"].GetString(), d["type"].GetStringLength());
  if (type == "hosting.offer") {
    uint64_t id = 0;
    auto offer = decode_offer(message, id);
    if (!offer.ok()) {
      if (id != 0) reply(peer, id, Reply{false, "", "malformed offer: " + offer.error().message});
      else if (hooks_.log) hooks_.log("hosting: an offer from " + peer.uri() + " without an id was dropped");
      return;
    }
    const Reply r = check(peer.domain, *offer);
    if (hooks_.log) {
      hooks_.log("hosting: offer of fragment " + offer->fragment + " of query '" + offer->query + "' from " +
                 peer.uri() + " (load " + std::to_string(offer->load) + " CPU ms/s): " +
                 (r.admitted ? "admitted" : "refused") + ": " + r.reason);
    }
    reply(peer, id, r);
    return;
  }
  if (type == "hosting.reply") {
    auto idm = d.FindMember("id");
    auto adm = d.FindMember("admitted");
    auto contract = string_member(d, "contract", kMaxName, false);
    auto reason = string_member(d, "reason", kMaxReason, false);
    if (idm == d.MemberEnd() || !idm->value.IsUint64() || adm == d.MemberEnd() || !adm->value.IsBool() ||
        !contract.ok() || !reason.ok()) {
      if (hooks_.log) hooks_.log("hosting: a malformed reply from " + peer.uri() + " was dropped");
      return;
    }
    auto mine = take_pending(idm->value.GetUint64(), peer);
    if (!mine || !mine->done) return;
    mine->done(Reply{adm->value.GetBool(), std::move(*contract), std::move(*reason)});
    return;
  }
  if (type == "hosting.answer") {
    on_answer(peer, d);
    return;
  }
  if (type == "hosting.run" || type == "hosting.chunk" || type == "hosting.warm" || type == "hosting.end" ||
      type == "hosting.release" || type == "hosting.usage") {
    serve(peer, std::string(type), message, d);
    return;
  }
  if (hooks_.log) hooks_.log("hosting: unknown message type '" + std::string(type.substr(0, 64)) + "' from " +
                             peer.uri());
}

void Hosting::fail_where(const std::function<bool(const Pending&)>& which, const std::string& why) {
  std::vector<Pending> failed;
  {
    std::lock_guard lock(mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (which(it->second)) {
        failed.push_back(std::move(it->second));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& p : failed) {
    auto e = make_error(Errc::unavailable, p.host.uri() + ": " + why);
    if (p.done) p.done(e);
    else p.call_done(e);
  }
}

void Hosting::on_link_down(const certs::Identity& peer) {
  fail_where([&](const Pending& p) { return p.host == peer; }, "the link went down before a reply");
}

void Hosting::expire(Clock::time_point now) {
  fail_where([&](const Pending& p) { return p.deadline <= now; }, "no reply to the hosting offer or call in time");
}

void Hosting::stop() {
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
  }
  fail_where([](const Pending&) { return true; }, "this node is stopping");
}

}  // namespace entente::federation
