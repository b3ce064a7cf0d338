#include "cluster/membership.h"

#include <chrono>
#include <cstdio>
#include <map>

#include "base/json_read.h"
#include "base/log.h"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace entente::cluster {
namespace {

// What one node may put in its load: the lists are for people reading
// GET /v1/nodes, so they are capped rather than grown with the catalog.
constexpr size_t kMaxListed = 256;
constexpr size_t kMaxNameBytes = 256;

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

using Writer = rapidjson::Writer<rapidjson::StringBuffer>;

void write_string(Writer& w, std::string_view key, std::string_view value) {
  w.Key(key.data(), static_cast<rapidjson::SizeType>(key.size()));
  w.String(value.data(), static_cast<rapidjson::SizeType>(value.size()));
}

void write_list(Writer& w, std::string_view key, const std::vector<std::string>& names) {
  w.Key(key.data(), static_cast<rapidjson::SizeType>(key.size()));
  w.StartArray();
  for (size_t i = 0; i < names.size() && i < kMaxListed; ++i) {
    w.String(names[i].data(), static_cast<rapidjson::SizeType>(std::min(names[i].size(), kMaxNameBytes)));
  }
  w.EndArray();
}

Result<rapidjson::Document> parse_object(std::string_view json, std::string_view what) {
  rapidjson::Document doc;
  if (auto p = base::read_json(json, doc)) {
    return make_error(Errc::corrupt, std::string(what) + " in etcd is not JSON: " + p->message());
  }
  if (!doc.IsObject()) return make_error(Errc::corrupt, std::string(what) + " in etcd is not a JSON object");
  return doc;
}

std::string string_member(const rapidjson::Value& o, const char* key) {
  auto it = o.FindMember(key);
  if (it == o.MemberEnd() || !it->value.IsString()) return {};
  return std::string(it->value.GetString(), it->value.GetStringLength());
}

std::vector<std::string> list_member(const rapidjson::Value& o, const char* key) {
  std::vector<std::string> out;
  auto it = o.FindMember(key);
  if (it == o.MemberEnd() || !it->value.IsArray()) return out;
  for (const auto& v : it->value.GetArray()) {
    if (out.size() >= kMaxListed) break;
    if (v.IsString()) out.emplace_back(v.GetString(), v.GetStringLength());
  }
  return out;
}

}  // namespace

std::string Membership::record_json(const NodeRecord& r) {
  rapidjson::StringBuffer sb;
  Writer w(sb);
  w.StartObject();
  write_string(w, "node", r.node);
  write_string(w, "api", r.api_url);
  write_string(w, "peer", r.peer_address);
  write_string(w, "version", r.version);
  w.Key("started_ms");
  w.Int64(r.started_ms);
  w.EndObject();
  return {sb.GetString(), sb.GetSize()};
}

Result<NodeRecord> Membership::record_from_json(std::string_view json) {
  ENTENTE_ASSIGN_OR_RETURN(rapidjson::Document doc, parse_object(json, "a node record"));
  NodeRecord r;
  r.node = string_member(doc, "node");
  r.api_url = string_member(doc, "api");
  r.peer_address = string_member(doc, "peer");
  r.version = string_member(doc, "version");
  if (auto it = doc.FindMember("started_ms"); it != doc.MemberEnd() && it->value.IsInt64()) {
    r.started_ms = it->value.GetInt64();
  }
  if (r.node.empty()) return make_error(Errc::corrupt, "a node record in etcd has no node name");
  return r;
}

std::string Membership::load_json(const NodeLoad& l) {
  rapidjson::StringBuffer sb;
  Writer w(sb);
  w.StartObject();
  w.Key("cpu");
  w.Double(l.cpu);
  w.Key("lag_tuples");
  w.Uint64(l.lag_tuples);
  write_list(w, "streams_led", l.streams_led);
  write_list(w, "fragments", l.fragments);
  write_string(w, "tokens", l.tokens);
  w.EndObject();
  return {sb.GetString(), sb.GetSize()};
}

Result<NodeLoad> Membership::load_from_json(std::string_view json) {
  ENTENTE_ASSIGN_OR_RETURN(rapidjson::Document doc, parse_object(json, "a node's load"));
  NodeLoad l;
  if (auto it = doc.FindMember("cpu"); it != doc.MemberEnd() && it->value.IsNumber()) {
    l.cpu = it->value.GetDouble();
  }
  if (auto it = doc.FindMember("lag_tuples"); it != doc.MemberEnd() && it->value.IsUint64()) {
    l.lag_tuples = it->value.GetUint64();
  }
  l.streams_led = list_member(doc, "streams_led");
  l.fragments = list_member(doc, "fragments");
  l.tokens = string_member(doc, "tokens");
  return l;
}

Membership::Membership(Etcd& etcd, MembershipOptions options, NodeRecord self, LoadFn load, RoleFn on_role,
                       TickFn on_tick)
    : etcd_(etcd),
      options_(std::move(options)),
      self_(std::move(self)),
      load_(std::move(load)),
      on_role_(std::move(on_role)),
      on_tick_(std::move(on_tick)) {}

Membership::~Membership() { stop(false); }

void Membership::start() {
  std::lock_guard lock(mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  watch_stop_.store(false);
  thread_ = std::thread([this] { run(); });
  if (on_tick_) work_thread_ = std::thread([this] { work(); });
  watch_thread_ = std::thread([this] { watch_for_departures(options_.prefix + "controller", false); });
  alive_watch_thread_ = std::thread([this] { watch_for_departures(options_.prefix + "alive/", true); });
}

void Membership::stop(bool leave) {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  watch_stop_.store(true);
  cv_.notify_all();
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (work_thread_.joinable()) work_thread_.join();
  if (watch_thread_.joinable()) watch_thread_.join();
  if (alive_watch_thread_.joinable()) alive_watch_thread_.join();
  if (leave && lease_ != 0) {
    // Revoking deletes alive/<node> and, when held, the controller key:
    // the others see this node leave at once (their controller watch).
    (void)etcd_.revoke_lease(lease_);
    lease_ = 0;
  }
  set_controller(false);
}

void Membership::run() {
  const auto period = std::chrono::milliseconds(std::max<int64_t>(100, options_.lease_ttl_ms / 3));
  constexpr auto kMinGap = std::chrono::milliseconds(20);  // between ticks asked for
  std::unique_lock lock(mu_);
  while (!stopping_) {
    tick_now_ = false;
    const auto started = std::chrono::steady_clock::now();
    lock.unlock();
    tick();
    lock.lock();
    cv_.wait_for(lock, period, [this] { return stopping_ || tick_now_; });
    if (!stopping_) cv_.wait_until(lock, started + kMinGap, [this] { return stopping_; });
  }
}

void Membership::work() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stopping_ || work_due_; });
    if (stopping_) return;
    work_due_ = false;
    lock.unlock();
    on_tick_();
    lock.lock();
  }
}

void Membership::tick_soon() {
  {
    std::lock_guard lock(mu_);
    tick_now_ = true;
  }
  cv_.notify_all();
}

void Membership::watch_for_departures(const std::string& key, bool prefix) {
  // When the controller key goes (its holder's lease revoked or expired),
  // campaign at once rather than at the next tick: the role passes within
  // milliseconds of etcd deleting the key. When a node's alive/ key goes,
  // read the members at once: the controller's tick then fails over what
  // that node led without waiting for its period.
  while (!watch_stop_.load()) {
    auto on_events = [this](const std::vector<WatchEvent>& events, int64_t) {
      for (const auto& e : events) {
        if (e.type != WatchEvent::Type::erase) continue;
        {
          std::lock_guard lock(mu_);
          tick_now_ = true;
        }
        cv_.notify_all();
      }
      return true;
    };
    Status s = etcd_.watch(key, prefix, 0, on_events, watch_stop_);
    if (s.ok()) break;  // stopped
    // etcd unreachable: the ticks report it; try again shortly.
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stopping_; });
  }
}

void Membership::tick() {
  Status s = keep_registered();
  if (s.ok()) s = campaign();
  if (s.ok()) s = read_members();
  if (s.ok() && on_tick_) {
    {
      std::lock_guard lock(mu_);
      work_due_ = true;
    }
    work_cv_.notify_one();
  }
  if (!s.ok()) {
    set_error(s.error());
    // The lease may have expired in etcd already: a node cut off from
    // etcd for a whole TTL stops acting as controller.
    if (controller_.load() && steady_ms() - lease_renewed_steady_ms_.load() >= options_.lease_ttl_ms) {
      set_controller(false);
    }
  }
}

Status Membership::keep_registered() {
  if (lease_ != 0) {
    // The lease runs from when etcd renews it, which is after this.
    const int64_t asked = steady_ms();
    auto ttl = etcd_.keep_alive(lease_);
    if (!ttl.ok() && ttl.error().code == Errc::not_found) {
      // Expired while etcd could not be reached (or this process was
      // stopped): whatever it held under it is gone; start over.
      base::logf(base::LogLevel::warn, "cluster", "%s's lease %lld expired; registering again\n", self_.node.c_str(),
                   static_cast<long long>(lease_));
      lease_ = 0;
      lease_id_.store(0);
      registered_ = false;
      set_controller(false);
    } else if (!ttl.ok()) {
      return ttl.error();
    } else {
      lease_renewed_steady_ms_.store(asked);
    }
  }
  if (lease_ == 0) {
    const int64_t asked = steady_ms();
    ENTENTE_ASSIGN_OR_RETURN(lease_, etcd_.grant_lease(lease_ttl_s()));
    lease_renewed_steady_ms_.store(asked);
    lease_id_.store(lease_);
  }
  if (!registered_) {
    ENTENTE_RETURN_IF_ERROR(etcd_.put(options_.prefix + "nodes/" + self_.node, record_json(self_)));
    registered_ = true;
  }
  const NodeLoad load = load_ ? load_() : NodeLoad{};
  ENTENTE_RETURN_IF_ERROR(etcd_.put(options_.prefix + "alive/" + self_.node, load_json(load), lease_));
  return {};
}

Status Membership::campaign() {
  const std::string key = options_.prefix + "controller";
  Compare absent;
  absent.key = key;
  absent.target = Compare::Target::version;
  absent.op = Compare::Op::equal;
  absent.number = 0;
  TxnOp claim;
  claim.kind = TxnOp::Kind::put;
  claim.key = key;
  claim.value = self_.node;
  claim.lease = lease_;
  TxnOp read;
  read.kind = TxnOp::Kind::get;
  read.key = key;
  ENTENTE_ASSIGN_OR_RETURN(TxnResult r, etcd_.txn({absent}, {claim}, {read}));
  bool mine = r.succeeded;
  if (!r.succeeded && !r.gets.empty() && !r.gets[0].kvs.empty()) {
    const KeyValue& kv = r.gets[0].kvs[0];
    mine = kv.value == self_.node && kv.lease == lease_;
  }
  set_controller(mine);
  return {};
}

Status Membership::read_members() {
  ENTENTE_ASSIGN_OR_RETURN(RangeResult nodes, etcd_.get_prefix(options_.prefix + "nodes/"));
  ENTENTE_ASSIGN_OR_RETURN(RangeResult alive, etcd_.get_prefix(options_.prefix + "alive/"));
  ENTENTE_ASSIGN_OR_RETURN(RangeResult controller, etcd_.get(options_.prefix + "controller"));
  std::map<std::string, Member> by_name;
  for (const auto& kv : nodes.kvs) {
    auto r = record_from_json(kv.value);
    if (!r.ok()) {
      base::logf(base::LogLevel::warn, "cluster", "skipping %s: %s\n", kv.key.c_str(), r.error().message.c_str());
      continue;
    }
    Member m;
    m.record = std::move(*r);
    by_name.emplace(m.record.node, std::move(m));
  }
  const std::string alive_prefix = options_.prefix + "alive/";
  for (const auto& kv : alive.kvs) {
    const std::string name = kv.key.substr(alive_prefix.size());
    auto it = by_name.find(name);
    if (it == by_name.end()) continue;  // registered between the two reads
    it->second.up = true;
    if (auto l = load_from_json(kv.value); l.ok()) it->second.load = std::move(*l);
  }
  MembershipView v;
  if (!controller.kvs.empty()) v.controller = controller.kvs[0].value;
  for (auto& [name, m] : by_name) {
    m.controller = name == v.controller;
    v.members.push_back(std::move(m));
  }
  v.is_controller = is_controller();
  v.read_ms = wall_ms();
  std::lock_guard lock(mu_);
  if (view_.etcd_error) base::logf(base::LogLevel::info, "cluster", "etcd reachable again\n");
  view_ = std::move(v);
  return {};
}

void Membership::set_error(const Error& e) {
  std::lock_guard lock(mu_);
  if (!view_.etcd_error) {
    view_.etcd_error_since_ms = wall_ms();
    base::logf(base::LogLevel::warn, "cluster", "etcd unreachable: %s\n", e.message.c_str());
  }
  view_.etcd_error = e.message;
  view_.is_controller = is_controller();
}

void Membership::set_controller(bool controller) {
  if (controller_.exchange(controller) == controller) return;
  base::logf(base::LogLevel::info, "cluster", "%s %s the controller role\n", self_.node.c_str(),
               controller ? "holds" : "no longer holds");
  if (on_role_) on_role_(controller);
}

MembershipView Membership::view() const {
  std::lock_guard lock(mu_);
  MembershipView v = view_;
  v.is_controller = is_controller();
  return v;
}

int64_t Membership::lease_id() const {
  const int64_t id = lease_id_.load();
  if (id == 0 || steady_ms() - lease_renewed_steady_ms_.load() >= options_.lease_ttl_ms) return 0;
  return id;
}

bool Membership::is_controller() const {
  return controller_.load() && steady_ms() - lease_renewed_steady_ms_.load() < options_.lease_ttl_ms;
}

}  // namespace entente::cluster
