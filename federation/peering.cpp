#include "federation/peering.h"

#include <algorithm>
#include <fstream>

#include "certs/signing.h"
#include "contracts/contract.h"
#include "contracts/terms.h"
#include "federation/contracting.h"
#include "federation/detail/common.h"
#include "federation/hosting.h"
#include "federation/rate_limiter.h"
#include "rapidjson/document.h"

namespace entente::federation {
namespace {

using detail::Clock;

// A CONTROL message whose "type" starts with "hosting." (federation/hosting.h).
bool is_hosting_message(std::string_view payload) {
  rapidjson::Document d;
  d.Parse(payload.data(), payload.size());
  if (d.HasParseError() || !d.IsObject()) return false;
  auto t = d.FindMember("type");
  return t != d.MemberEnd() && t->value.IsString() &&
         std::string_view(t->value.GetString(), t->value.GetStringLength()).starts_with("hosting.");
}

// A CA file's text, for comparing pins across a reload; at most 1 MiB (a
// CA file is a few KiB). Empty when unreadable.
std::string read_pem(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string out(1 << 20, '\0');
  in.read(out.data(), static_cast<std::streamsize>(out.size()));
  out.resize(static_cast<size_t>(std::max<std::streamsize>(0, in.gcount())));
  return out;
}

std::map<std::string, std::string> pinned_pems(const FederationConfig& c, const std::string& self_domain) {
  std::map<std::string, std::string> out;
  out[self_domain] = read_pem(c.ca_file);
  for (const PeerDomainConfig& d : c.peers) {
    if (d.domain != self_domain) out[d.domain] = read_pem(d.ca_file);
  }
  return out;
}

// The certificate must be this node's: a misplaced file would otherwise
// only show as every peer refusing the link.
Status check_own_certificate(const std::string& cert_file, const certs::Identity& self) {
  auto info = certs::read_certificate(cert_file);
  if (!info.ok()) return make_error(Errc::invalid_argument, "federation.cert_file: " + info.error().message);
  if (!info->identity || !(*info->identity == self)) {
    return make_error(Errc::invalid_argument,
                      "federation.cert_file: " + cert_file + " is the certificate of " +
                          (info->identity ? info->identity->uri() : std::string("no entente identity")) +
                          ", not of this node " + self.uri());
  }
  return {};
}

// The configured exports' text, to tell whether a reload changed them.
std::string exports_text(const FederationConfig& c) {
  std::string t;
  for (const auto& e : c.exports) {
    t += e.stream + "|";
    for (const auto& d : e.to) t += d + ",";
    t += "|";
    for (const auto& f : e.fields) t += f + ",";
    t += ";";
  }
  return t;
}

}  // namespace

// ---------------------------------------------------------------------------
// The links as a Wire.

Status Peering::LinkWire::send(const certs::Identity& peer, FrameType type, uint32_t channel,
                               std::string_view payload) {
  LinkManager* l = links.load(std::memory_order_acquire);
  if (l == nullptr) return make_error(Errc::unavailable, "federation is not running");
  return l->send(peer, type, channel, payload);
}

Result<uint32_t> Peering::LinkWire::new_channel(const certs::Identity& peer) {
  LinkManager* l = links.load(std::memory_order_acquire);
  if (l == nullptr) return make_error(Errc::unavailable, "federation is not running");
  return l->new_channel(peer);
}

bool Peering::LinkWire::is_up(const certs::Identity& peer) const {
  LinkManager* l = links.load(std::memory_order_acquire);
  return l != nullptr && l->is_up(peer);
}

uint16_t Peering::LinkWire::version(const certs::Identity& peer) const {
  LinkManager* l = links.load(std::memory_order_acquire);
  return l == nullptr ? 0 : l->version(peer);
}

Status Peering::LinkWire::add_dial_target(const certs::Identity& peer, const std::string& host, uint16_t port) {
  LinkManager* l = links.load(std::memory_order_acquire);
  if (l == nullptr) return make_error(Errc::unavailable, "federation is not running");
  return l->add_dial_target(PeerConfig{peer, host, port});
}

Status Peering::dial_own_node(const std::string& node, const std::string& host, uint16_t port) {
  const certs::Identity id{self_.domain, node};
  if (wire_.is_up(id)) return {};
  return wire_.add_dial_target(id, host, port);
}

void Peering::LinkWire::remove_dial_target(const certs::Identity& peer) {
  if (LinkManager* l = links.load(std::memory_order_acquire)) l->remove_dial_target(peer);
}

// ---------------------------------------------------------------------------

Peering::Peering(Host& host, certs::Identity self, const FederationConfig& config)
    : host_(host),
      self_(std::move(self)),
      config_(config),
      acks_(host.store(),
            [&host](const std::string& stream, const std::string& party, uint64_t through) {
              if (detail::is_internal_party(party)) host.on_internal_ack(stream, party.substr(1), through);
              else host.on_domain_ack(stream, party, through);
            }),
      metering_(host.store(), [&host](const std::string& line) { host.log(line); }),
      exports_(host, ExportSender::Context{wire_, metering_, acks_, traffic_},
               Exports::Options{self_, config.exports, config.max_frame}),
      imports_(host, wire_, traffic_,
               Imports::Options{self_, config.import_window, [this] { return peer_domains(); }}) {}

Peering::~Peering() {
  stop();
  if (collector_ != 0) host_.metrics().remove_collector(collector_);
}

std::string Peering::local_name(const std::string& stream) const {
  auto parts = detail::split_stream(stream);
  if (parts && parts->first == self_.domain) return parts->second;
  return stream;
}

bool Peering::is_remote(const std::string& stream) const {
  auto parts = detail::split_stream(stream);
  return parts && parts->first != self_.domain;
}

Result<LinkOptions> Peering::link_options(std::shared_ptr<certs::TrustStore>& trust) {
  trust = std::make_shared<certs::TrustStore>();
  if (Status s = trust->pin(self_.domain, config_.ca_file); !s.ok()) {
    return make_error(Errc::invalid_argument, "federation.ca_file: " + s.error().message);
  }
  LinkOptions lo;
  lo.self = self_;
  lo.listen_host = config_.listen_host;
  lo.listen_port = config_.listen_port;
  lo.cert_file = config_.cert_file;
  lo.key_file = config_.key_file;
  lo.heartbeat_interval = std::chrono::milliseconds(config_.heartbeat_interval_ms);
  lo.failure_timeout = std::chrono::milliseconds(config_.failure_timeout_ms);
  lo.max_frame = config_.max_frame;
  lo.max_connections = config_.max_connections;
  lo.max_connections_per_address = config_.max_connections_per_address;
  lo.max_handshaking_connections = config_.max_handshaking_connections;
  lo.handshake_timeout = std::chrono::milliseconds(config_.handshake_timeout_ms);
  lo.log = [this](std::string_view line) { host_.log(std::string(line)); };
  for (size_t i = 0; i < config_.peers.size(); ++i) {
    const PeerDomainConfig& d = config_.peers[i];
    if (d.domain != self_.domain) {
      if (Status s = trust->pin(d.domain, d.ca_file); !s.ok()) {
        return make_error(Errc::invalid_argument,
                          "federation.peers[" + std::to_string(i) + "].ca_file: " + s.error().message);
      }
    }
    for (const PeerNodeConfig& n : d.nodes) {
      if (d.domain == self_.domain && n.node == self_.node) continue;
      lo.peers.push_back({{d.domain, n.node}, n.host, n.port});
    }
  }
  ENTENTE_RETURN_IF_ERROR(check_own_certificate(config_.cert_file, self_));
  return lo;
}

// Contracts: this node signs with its own key; the ledger is in the store.
Status Peering::open_contracting() {
  auto signer = certs::Signer::load(config_.key_file, config_.cert_file);
  if (!signer.ok()) return make_error(Errc::invalid_argument, "federation.key_file: " + signer.error().message);
  std::vector<std::string> peer_domains;
  for (const PeerDomainConfig& d : config_.peers) {
    if (d.domain != self_.domain &&
        std::find(peer_domains.begin(), peer_domains.end(), d.domain) == peer_domains.end()) {
      peer_domains.push_back(d.domain);
    }
  }
  Contracting::Hooks hooks;
  hooks.send_to_domain = [this](const std::string& domain, const std::string& message) {
    return send_to_domain(domain, message);
  };
  hooks.send_to_peer = [this](const certs::Identity& peer, const std::string& message) {
    return wire_.send(peer, FrameType::control, 0, message).ok();
  };
  hooks.changed = [this](const contracts::Contract& c) { contract_changed(c); };
  hooks.log = [this](const std::string& line) { host_.log(line); };
  auto contracting = Contracting::open(host_.store(), std::move(*signer), trust_, std::move(peer_domains),
                                       host_.metrics(), std::move(hooks));
  if (!contracting.ok()) return contracting.error();
  contracting_ = std::move(*contracting);
  Hosting::Hooks hosting_hooks;
  hosting_hooks.send_to_peer = [this](const certs::Identity& peer, const std::string& message) {
    return wire_.send(peer, FrameType::control, 0, message).ok();
  };
  hosting_hooks.log = [this](const std::string& line) { host_.log(line); };
  hosting_hooks.serve = [this](const certs::Identity& peer, const std::string& type, const std::string& message,
                               Hosting::Answer answer) { host_.on_hosting(peer, type, message, std::move(answer)); };
  hosting_ = std::make_unique<Hosting>(contracting_->ledger(), self_.domain, std::move(hosting_hooks));
  exports_.set_ledger(&contracting_->ledger());
  metering_.set_ledger(&contracting_->ledger());
  return {};
}

Status Peering::start() {
  std::shared_ptr<certs::TrustStore> trust;
  ENTENTE_ASSIGN_OR_RETURN(LinkOptions lo, link_options(trust));
  trust_ = trust;
  lo.trust = std::move(trust);
  pinned_pems_ = pinned_pems(config_, self_.domain);
  {
    std::lock_guard lock(peers_mu_);
    peers_ = std::make_shared<const std::vector<PeerDomainConfig>>(config_.peers);
  }
  ENTENTE_RETURN_IF_ERROR(open_contracting());
  // What importing domains acknowledged, and what was sent under a contract
  // and not charged, before the restart; the imports in the catalog.
  ENTENTE_RETURN_IF_ERROR(acks_.load());
  ENTENTE_RETURN_IF_ERROR(metering_.load());
  ENTENTE_RETURN_IF_ERROR(imports_.load());

  auto links = LinkManager::start(std::move(lo), *this);
  if (!links.ok()) return links.error();
  links_ = std::move(*links);
  wire_.links.store(links_.get(), std::memory_order_release);
  register_collectors();
  timer_ = std::thread([this] { timer_loop(); });
  host_.log("federation listening on " + config_.listen_host + ":" + std::to_string(links_->port()) + " as " +
            self_.uri());
  return {};
}

void Peering::stop() {
  {
    std::lock_guard lock(timer_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  timer_cv_.notify_all();
  if (timer_.joinable()) timer_.join();
  if (hosting_) hosting_->stop();
  exports_.stop();
  if (links_) links_->stop();
  if (contracting_) contracting_->flush_usage();
}

uint16_t Peering::port() const { return links_ ? links_->port() : 0; }

void Peering::create_import(const std::string& stream, engine::SchemaPtr expected, ImportDone done,
                            std::chrono::milliseconds timeout, uint64_t from_seq) {
  imports_.create(stream, std::move(expected), std::move(done), timeout, from_seq);
}

void Peering::create_internal_import(const std::string& stream, const std::string& node, engine::SchemaPtr expected,
                                     ImportDone done, std::chrono::milliseconds timeout) {
  imports_.create_internal(stream, node, std::move(expected), std::move(done), timeout);
}

// ---------------------------------------------------------------------------
// Link events.

void Peering::on_link_up(const certs::Identity& peer) {
  if (contracting_) contracting_->on_link_up(peer);
  imports_.on_link_up(peer);
}

void Peering::on_link_down(const certs::Identity& peer, std::string_view reason) {
  exports_.on_link_down(peer);
  imports_.on_link_down(peer, reason);
  if (hosting_) hosting_->on_link_down(peer);
}

void Peering::on_frame(const certs::Identity& peer, FrameType type, uint32_t channel, std::string_view payload) {
  switch (type) {
    case FrameType::control:
      // Hosting offers and replies to Hosting, the rest (contracts) to
      // Contracting, which refuses what it does not know.
      if (hosting_ && is_hosting_message(payload)) hosting_->on_control(peer, payload);
      else if (contracting_) contracting_->on_control(peer, payload);
      return;
    case FrameType::open:
      exports_.on_open(peer, channel, payload);
      return;
    case FrameType::credit:
    case FrameType::ack:
    case FrameType::reset:
      // A RESET that is not for one of this node's exports ends an import.
      if (exports_.on_frame(peer, type, channel, payload)) return;
      break;
    default:
      break;
  }
  (void)imports_.on_frame(peer, type, channel, payload);
}

// ---------------------------------------------------------------------------
// Contracts and the timer.

void Peering::contract_changed(const contracts::Contract& c) {
  exports_.recheck_contracts();
  imports_.retry_refused(c);
  check_offer(c);
}

void Peering::check_offer(const contracts::Contract& c) {
  const contracts::Version& v = c.current();
  if (v.by == self_.domain || v.terms.kind != contracts::Kind::stream || v.terms.stream.provider != self_.domain ||
      (v.state != contracts::State::proposed && v.state != contracts::State::countered)) {
    return;
  }
  Diagnostics diag;
  contracts::check_stream_catalog(
      v.terms,
      [this](const std::string& name) -> engine::SchemaPtr {
        auto s = host_.find_stream(name);
        return s ? s->schema() : nullptr;
      },
      diag);
  if (diag.ok()) return;
  std::string problems;
  for (const auto& d : diag.items()) problems += (problems.empty() ? "" : "; ") + d.path + ": " + d.message;
  host_.log("contracts: " + v.by + "'s offer " + std::to_string(v.number) + " of " + c.id +
            " cannot be accepted as it stands (counter or reject it): " + problems);
}

bool Peering::send_to_domain(const std::string& domain, const std::string& message) {
  for (const PeerDomainConfig& d : *peer_domains()) {
    if (d.domain != domain) continue;
    for (const PeerNodeConfig& n : d.nodes) {
      if (wire_.send(certs::Identity{d.domain, n.node}, FrameType::control, 0, message).ok()) return true;
    }
  }
  return false;
}

void Peering::timer_loop() {
  std::unique_lock lock(timer_mu_);
  auto next_usage_flush = Clock::now() + std::chrono::seconds(1);
  while (!stopping_) {
    timer_cv_.wait_for(lock, std::chrono::milliseconds(100));
    if (stopping_) break;
    lock.unlock();
    // Contracts end on time: within one timer tick of valid_until.
    exports_.recheck_contracts();
    exports_.tick();
    if (hosting_) hosting_->expire();
    if (contracting_ && Clock::now() >= next_usage_flush) {
      contracting_->flush_usage();
      next_usage_flush = Clock::now() + std::chrono::seconds(1);
    }
    imports_.tick();
    lock.lock();
  }
}

// ---------------------------------------------------------------------------
// Status.

PeersReport Peering::peers_report() const {
  PeersReport r;
  r.self = self_.uri();
  r.listen = config_.listen_host + ":" + std::to_string(port());
  if (!links_) return r;
  r.refusals = links_->refusals();
  for (auto& p : links_->peers()) {
    const auto [in, out] = traffic_.tuples(p.identity.uri());
    r.peers.push_back({std::move(p), in, out});
  }
  r.refused = links_->refused();
  return r;
}

void Peering::register_collectors() {
  collector_ = host_.metrics().add_collector([this](base::MetricsWriter& w) {
    for (const auto& [contract, l] : exports_.limiters()) {
      w.gauge("entente_contract_rate_cap", "A stream contract's rate cap, tuples per second",
              {{"contract", contract}}, static_cast<double>(l->rate()));
      w.counter("entente_contract_throttled_seconds_total",
                "Time a stream contract's senders waited for its rate cap", {{"contract", contract}},
                l->throttled_seconds());
    }
    if (!links_) return;
    for (const auto& [label, n] : links_->refusals()) {
      w.counter("entente_federation_refusals_total", "Peer connections refused, by reason (see docs/federation.md)",
                {{"reason", label}}, static_cast<double>(n));
    }
    for (const auto& p : links_->peers()) {
      const std::string peer = p.identity.uri();
      w.gauge("entente_peer_up", "1 when the link to a peer node is up", {{"peer", peer}}, p.state == "up" ? 1 : 0);
      if (p.rtt_us >= 0) {
        w.gauge("entente_peer_rtt_seconds", "Round-trip time of a peer link's heartbeats", {{"peer", peer}},
                static_cast<double>(p.rtt_us) / 1e6);
      }
      w.counter("entente_peer_bytes_total", "Bytes over a peer link", {{"peer", peer}, {"direction", "in"}},
                static_cast<double>(p.bytes_in));
      w.counter("entente_peer_bytes_total", "Bytes over a peer link", {{"peer", peer}, {"direction", "out"}},
                static_cast<double>(p.bytes_out));
    }
  });
}

// ---------------------------------------------------------------------------
// Reload (SIGHUP).

Status Peering::reload(const FederationConfig& next, std::vector<std::string>& changes,
                       std::vector<std::string>& kept) {
  if (!links_) return make_error(Errc::unavailable, "federation is not running");
  // Everything is checked before anything changes, as at start-up.
  auto trust = std::make_shared<certs::TrustStore>();
  std::map<std::string, std::string> pems;
  auto pin = [&](const std::string& domain, const std::string& file, const std::string& key) -> Status {
    pems[domain] = read_pem(file);
    if (Status s = trust->pin(domain, file); !s.ok()) return make_error(Errc::invalid_argument, key + ": " + s.error().message);
    return {};
  };
  ENTENTE_RETURN_IF_ERROR(pin(self_.domain, next.ca_file, "federation.ca_file"));
  LinkReload lr;
  for (size_t i = 0; i < next.peers.size(); ++i) {
    const PeerDomainConfig& d = next.peers[i];
    if (d.domain != self_.domain) {
      ENTENTE_RETURN_IF_ERROR(pin(d.domain, d.ca_file, "federation.peers[" + std::to_string(i) + "].ca_file"));
    }
    for (const PeerNodeConfig& n : d.nodes) {
      if (d.domain == self_.domain && n.node == self_.node) continue;
      lr.peers.push_back({{d.domain, n.node}, n.host, n.port});
    }
  }
  ENTENTE_RETURN_IF_ERROR(check_own_certificate(next.cert_file, self_));
  std::vector<std::string> pin_changes;
  for (const auto& [domain, pem] : pinned_pems_) {
    auto it = pems.find(domain);
    if (it == pems.end()) {
      lr.retrust_domains.push_back(domain);
      pin_changes.push_back("domain " + domain + " unpinned");
    } else if (it->second != pem) {
      lr.retrust_domains.push_back(domain);
      pin_changes.push_back("pinned CA of domain " + domain + " replaced; its links authenticate again");
    }
  }
  for (const auto& [domain, pem] : pems) {
    if (!pinned_pems_.count(domain)) pin_changes.push_back("domain " + domain + " pinned");
  }
  lr.trust = trust;
  lr.cert_file = next.cert_file;
  lr.key_file = next.key_file;
  ENTENTE_RETURN_IF_ERROR(links_->reload(std::move(lr), changes));
  changes.insert(changes.end(), pin_changes.begin(), pin_changes.end());
  {
    std::lock_guard lock(peers_mu_);
    peers_ = std::make_shared<const std::vector<PeerDomainConfig>>(next.peers);
  }
  pinned_pems_ = std::move(pems);
  trust_ = std::move(trust);
  // Contracts keep what they were opened with (Contracting holds them).
  if (!pin_changes.empty()) kept.push_back("contract verification (the pinned CAs and peer domains contracts use)");
  if (next.cert_file != config_.cert_file || next.key_file != config_.key_file) {
    kept.push_back("contract signing (the key and certificate contracts are signed with)");
  }
  auto differs = [&](bool changed, const char* key) {
    if (changed) kept.push_back(std::string("federation.") + key);
  };
  differs(next.listen_host != config_.listen_host || next.listen_port != config_.listen_port, "listen");
  differs(next.heartbeat_interval_ms != config_.heartbeat_interval_ms, "heartbeat_interval");
  differs(next.failure_timeout_ms != config_.failure_timeout_ms, "failure_timeout");
  differs(next.max_frame != config_.max_frame, "max_frame");
  differs(next.import_window != config_.import_window, "import_window");
  differs(exports_text(next) != exports_text(config_), "exports");
  return {};
}

std::shared_ptr<const std::vector<PeerDomainConfig>> Peering::peer_domains() const {
  std::lock_guard lock(peers_mu_);
  return peers_ ? peers_ : std::make_shared<const std::vector<PeerDomainConfig>>(config_.peers);
}

}  // namespace entente::federation
