#include "tests/integration/support/federation.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include <gtest/gtest.h>

#include "rapidjson/document.h"

namespace entente::testing {

using namespace std::chrono_literals;

namespace {

std::string json_list(const std::vector<std::string>& items) {
  std::string s = "[";
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ",\"" : "\"") + items[i] + "\"";
  return s + "]";
}

std::string str_member(const rapidjson::Value& v, const char* key) {
  if (!v.IsObject() || !v.HasMember(key) || !v[key].IsString()) return {};
  return v[key].GetString();
}

uint64_t u64_member(const rapidjson::Value& v, const char* key) {
  if (!v.IsObject() || !v.HasMember(key) || !v[key].IsUint64()) return 0;
  return v[key].GetUint64();
}

int64_t i64_member(const rapidjson::Value& v, const char* key, int64_t fallback) {
  if (!v.IsObject() || !v.HasMember(key) || !v[key].IsInt64()) return fallback;
  return v[key].GetInt64();
}

// Runs `entente certs ARGS`; fails the test with its output on an error.
bool entente_certs(const std::string& args) {
  std::string out;
  const std::string command = std::string(ENTENTE_BIN) + " certs " + args + " 2>&1";
  const int code = run_command(command, out);
  EXPECT_EQ(code, 0) << command << "\n" << out;
  return code == 0;
}

}  // namespace


std::string url_name(const std::string& stream) {
  std::string s;
  for (char c : stream) s += c == '/' ? std::string("%2F") : std::string(1, c);
  return s;
}

bool eventually(std::chrono::milliseconds timeout, const std::function<bool()>& probe) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (probe()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// ---------------------------------------------------------------- FedNode

FedNode::FedNode(std::string domain, std::string node, std::string cert_dir, std::string ca_file,
                 uint16_t federation_port)
    : domain_(std::move(domain)),
      node_(std::move(node)),
      cert_dir_(std::move(cert_dir)),
      ca_file_(std::move(ca_file)),
      federation_port_(federation_port) {}

FedNode& FedNode::pins(const FedNode& peer, const std::string& address, const std::string& ca_file) {
  PeerEntry& e = peers_[peer.domain()];
  e.ca_file = ca_file;
  e.nodes.emplace_back(peer.node(), address);
  return *this;
}

FedNode& FedNode::exports(const std::string& stream, std::vector<std::string> to, std::vector<std::string> fields) {
  std::string e = "{\"stream\":\"" + stream + "\",\"to\":" + json_list(to);
  if (!fields.empty()) e += ",\"fields\":" + json_list(fields);
  exports_.push_back(e + "}");
  return *this;
}

FedNode& FedNode::federation_extra(std::string json) {
  federation_extra_ = std::move(json);
  return *this;
}

FedNode& FedNode::config_extra(std::string json) {
  config_extra_ = std::move(json);
  return *this;
}

FedNode& FedNode::api_extra(std::string json) {
  api_extra_ = std::move(json);
  return *this;
}

std::string FedNode::federation_json() const {
  std::ostringstream f;
  f << "\"federation\":{";
  f << "\"listen\":\"" << federation_address() << "\",";
  f << "\"cert_file\":\"" << cert_dir_ << "/node.crt\",";
  f << "\"key_file\":\"" << cert_dir_ << "/node.key\",";
  f << "\"ca_file\":\"" << ca_file_ << "\",";
  if (!federation_extra_.empty()) f << federation_extra_ << ",";
  f << "\"peers\":[";
  bool first = true;
  for (const auto& [domain, entry] : peers_) {
    f << (first ? "" : ",") << "{\"domain\":\"" << domain << "\",\"ca_file\":\"" << entry.ca_file << "\",\"nodes\":[";
    for (size_t i = 0; i < entry.nodes.size(); ++i) {
      f << (i ? "," : "") << "{\"node\":\"" << entry.nodes[i].first << "\"";
      if (!entry.nodes[i].second.empty()) f << ",\"address\":\"" << entry.nodes[i].second << "\"";
      f << "}";
    }
    f << "]}";
    first = false;
  }
  f << "],\"exports\":[";
  for (size_t i = 0; i < exports_.size(); ++i) f << (i ? "," : "") << exports_[i];
  f << "]}";
  return f.str();
}

bool FedNode::start() {
  if (!process_) {
    BrokerOptions o;
    o.domain = domain_;
    o.node = node_;
    o.extra_config = federation_json();
    if (!config_extra_.empty()) o.extra_config += "," + config_extra_;
    o.extra_api = api_extra_;
    process_ = std::make_unique<BrokerProcess>(std::move(o));
  }
  if (process_->start()) return true;
  error_ = identity() + ": " + process_->last_error();
  return false;
}

BrokerProcess& FedNode::process() {
  if (!process_) throw std::logic_error(identity() + " has not been started");
  return *process_;
}

const BrokerProcess& FedNode::process() const {
  if (!process_) throw std::logic_error(identity() + " has not been started");
  return *process_;
}

std::string FedNode::last_error() const { return error_; }

// ---------------------------------------------------------------- Federation

Federation::Federation() : dir_(make_temp_dir("fed")) {}

Federation::~Federation() {
  nodes_.clear();  // kill the processes before their certificates go
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string Federation::domain(const std::string& name) {
  const std::string ca_dir = dir_ + "/" + name + "-ca";
  if (!std::filesystem::exists(ca_dir + "/ca.crt")) entente_certs("init-domain " + name + " --out " + ca_dir);
  return ca_file(name);
}

std::string Federation::impostor_ca(const std::string& domain) {
  const std::string ca_dir = dir_ + "/" + domain + "-impostor-ca";
  if (!std::filesystem::exists(ca_dir + "/ca.crt")) entente_certs("init-domain " + domain + " --out " + ca_dir);
  return ca_dir + "/ca.crt";
}

FedNode& Federation::add(const std::string& domain, const std::string& node) {
  this->domain(domain);
  const std::string ca_dir = dir_ + "/" + domain + "-ca";
  const std::string node_dir = dir_ + "/" + domain + "-" + node;
  entente_certs("issue-node " + domain + " " + node + " --ca " + ca_dir + " --san 127.0.0.1,localhost --out " +
                node_dir);
  return nodes_.emplace_back(domain, node, node_dir, ca_file(domain), free_loopback_port());
}

FedNode& Federation::add_impostor(const std::string& domain, const std::string& node) {
  const std::string ca = impostor_ca(domain);
  const std::string ca_dir = dir_ + "/" + domain + "-impostor-ca";
  const std::string node_dir = dir_ + "/" + domain + "-" + node + "-impostor";
  entente_certs("issue-node " + domain + " " + node + " --ca " + ca_dir + " --san 127.0.0.1,localhost --out " +
                node_dir);
  return nodes_.emplace_back(domain, node, node_dir, ca, free_loopback_port());
}

void Federation::link(FedNode& a, FedNode& b) {
  a.pins(b);
  b.pins(a);
}

bool Federation::start_all() {
  for (auto& n : nodes_) {
    if (n.running()) continue;
    if (!n.start()) {
      error_ = n.last_error();
      return false;
    }
  }
  return true;
}

Result<http::ClientResponse> slow_request(const BrokerProcess& node, const std::string& method,
                                                  const std::string& target, const std::string& body,
                                                  int64_t timeout_ms) {
  http::ClientOptions o = node.client_options();
  o.timeout_ms = timeout_ms;
  auto c = http::Client::connect(o);
  if (!c.ok()) return c.error();
  return (*c)->request(method, target, body, "application/json",
                       {{"authorization", std::string("Bearer ") + kAdminToken}});
}

// ---------------------------------------------------------------- views

const PeerView* PeersView::find(const std::string& identity) const {
  for (const auto& p : peers)
    if (p.identity == identity) return &p;
  return nullptr;
}

std::string PeersView::state_of(const std::string& identity) const {
  const PeerView* p = find(identity);
  return p ? p->state : "absent";
}

PeersView get_peers(const BrokerProcess& node) {
  PeersView v;
  auto r = node.try_request("GET", "/v1/peers", "", kReaderToken);
  if (!r.ok()) {
    v.body = r.error().message;
    return v;
  }
  v.status = r->status;
  v.body = r->body;
  rapidjson::Document d;
  d.Parse(v.body.c_str());
  if (d.HasParseError() || !d.IsObject()) return v;
  v.self = str_member(d, "self");
  v.listen = str_member(d, "listen");
  if (d.HasMember("refusals") && d["refusals"].IsObject()) {
    for (auto& m : d["refusals"].GetObject())
      if (m.value.IsUint64()) v.refusals[m.name.GetString()] = m.value.GetUint64();
  }
  if (d.HasMember("peers") && d["peers"].IsArray()) {
    for (auto& p : d["peers"].GetArray()) {
      PeerView pv;
      pv.identity = str_member(p, "identity");
      pv.domain = str_member(p, "domain");
      pv.node = str_member(p, "node");
      pv.state = str_member(p, "state");
      pv.address = str_member(p, "address");
      pv.last_error = str_member(p, "last_error");
      pv.dialed = p.HasMember("dialed") && p["dialed"].IsBool() && p["dialed"].GetBool();
      pv.rtt_us = i64_member(p, "rtt_us", -1);
      pv.last_heartbeat_ms = i64_member(p, "last_heartbeat_ms", 0);
      pv.bytes_in = u64_member(p, "bytes_in");
      pv.bytes_out = u64_member(p, "bytes_out");
      pv.tuples_in = u64_member(p, "tuples_in");
      pv.tuples_out = u64_member(p, "tuples_out");
      pv.connects = u64_member(p, "connects");
      v.peers.push_back(std::move(pv));
    }
  }
  return v;
}

std::vector<std::string> schema_names(const std::string& body) {
  std::vector<std::string> names;
  rapidjson::Document d;
  d.Parse(body.c_str());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("schema") || !d["schema"].IsArray()) return names;
  for (auto& f : d["schema"].GetArray()) names.push_back(str_member(f, "name"));
  return names;
}

std::string problem_detail(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.c_str());
  if (d.HasParseError() || !d.IsObject()) return {};
  std::string detail = str_member(d, "detail");
  return detail.empty() ? str_member(d, "title") : detail;
}

ImportView get_import(const BrokerProcess& node, const std::string& stream) {
  ImportView v;
  auto r = node.try_request("GET", "/v1/imports/" + stream, "", kReaderToken);
  if (!r.ok()) {
    v.body = r.error().message;
    return v;
  }
  v.status = r->status;
  v.body = r->body;
  rapidjson::Document d;
  d.Parse(v.body.c_str());
  if (d.HasParseError() || !d.IsObject()) return v;
  v.stream = str_member(d, "stream");
  v.owner = str_member(d, "owner");
  v.state = str_member(d, "state");
  v.reason = str_member(d, "reason");
  v.schema = schema_names(v.body);
  v.next_seq = u64_member(d, "next_seq");
  v.acked = u64_member(d, "acked");
  v.tuples = u64_member(d, "tuples");
  return v;
}

// ---------------------------------------------------------------- Feeder

Feeder::Feeder(const BrokerProcess& node, std::string stream, std::function<std::string(uint64_t)> row,
               int rows_per_batch, std::chrono::milliseconds pause)
    : options_(node.client_options()),
      stream_(std::move(stream)),
      row_(std::move(row)),
      rows_per_batch_(rows_per_batch),
      pause_(pause),
      port_(node.port()) {
  options_.timeout_ms = 3000;
}

Feeder::~Feeder() { stop(); }

void Feeder::start() {
  stop_ = false;
  thread_ = std::thread([this] { run(); });
}

void Feeder::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void Feeder::run() {
  const std::vector<std::pair<std::string, std::string>> auth{{"authorization",
                                                               std::string("Bearer ") + kPublisherToken}};
  std::unique_ptr<http::Client> client;
  uint64_t next_row = 0;
  while (!stop_) {
    if (!client) {
      http::ClientOptions o = options_;
      o.port = port_;
      auto c = http::Client::connect(o);
      if (!c.ok()) {
        ++failures_;
        last_failure_ = "connect: " + c.error().message;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      client = std::move(c).value();
    }
    const uint64_t first_row = next_row;
    std::string body;
    for (int i = 0; i < rows_per_batch_; ++i) body += row_(next_row++) + "\n";
    auto r = client->request("POST", "/v1/streams/" + stream_ + "/tuples", body, "application/x-ndjson", auth);
    if (!r.ok() || r->status != 200) {
      ++failures_;
      last_failure_ = r.ok() ? std::to_string(r->status) + " " + r->body : r.error().message;
      client.reset();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    rapidjson::Document d;
    d.Parse(r->body.c_str());
    const uint64_t first = u64_member(d, "first_seq");
    const uint64_t last = u64_member(d, "last_seq");
    if (first == 0 || last < first || last - first + 1 != static_cast<uint64_t>(rows_per_batch_)) {
      ++failures_;
      last_failure_ = "unexpected acknowledgement: " + r->body;
      continue;
    }
    ranges_.emplace_back(first, last);
    for (uint64_t s = first; s <= last; ++s) rows_[s] = first_row + (s - first);
    acked_count_ += last - first + 1;
    if (pause_.count() > 0) std::this_thread::sleep_for(pause_);
  }
}

// ---------------------------------------------------------------- bids

int64_t price_of(uint64_t i) { return static_cast<int64_t>((i * 7919) % 1000); }
std::string bid(uint64_t i) {
  return "{\"auction\":" + std::to_string(1000 + i % 37) + ",\"bidder\":" + std::to_string(i) +
         ",\"price\":" + std::to_string(price_of(i)) + ",\"date_time\":" + std::to_string(kBidTimeZero + 10 * i) + "}";
}

void create_stream(const FedNode& n, const std::string& name, const std::string& schema_json) {
  auto r = n.process().request("POST", "/v1/streams", "{\"name\":\"" + name +
                                                         "\",\"event_time\":\"date_time\",\"schema\":" +
                                                         schema_json + "}");
  ASSERT_EQ(r.status, 201u) << n.identity() << " POST /v1/streams " << name << ": " << r.body;
}

// Publishes rows [from, from + count) to `stream` in batches of 200.
void publish(const FedNode& n, const std::string& stream, uint64_t from, uint64_t count) {
  for (uint64_t i = from; i < from + count;) {
    std::string body;
    for (uint64_t end = std::min(from + count, i + 200); i < end; ++i) body += bid(i) + "\n";
    auto r = n.process().request("POST", "/v1/streams/" + stream + "/tuples", body, kPublisherToken,
                                 "application/x-ndjson");
    ASSERT_EQ(r.status, 200u) << n.identity() << " publish to " << stream << ": " << r.body;
  }
}

// Both nodes see each other up in GET /v1/peers.
void wait_linked(const FedNode& a, const FedNode& b, std::chrono::milliseconds timeout) {
  PeersView va, vb;
  const bool up = eventually(timeout, [&] {
    va = get_peers(a.process());
    vb = get_peers(b.process());
    return va.state_of(b.identity()) == "up" && vb.state_of(a.identity()) == "up";
  });
  ASSERT_TRUE(up) << a.identity() << " GET /v1/peers -> " << va.status << " " << va.body << "\n"
                  << b.identity() << " GET /v1/peers -> " << vb.status << " " << vb.body << "\n"
                  << a.identity() << " stderr:\n" << a.process().stderr_text() << "\n"
                  << b.identity() << " stderr:\n" << b.process().stderr_text();
}

// An admin POST that the node may answer only after hearing from the owner
// (at most 10 s); a status of 0 and the error in the body when no answer came.
http::ClientResponse post_slow(const FedNode& n, const std::string& target, const std::string& body) {
  auto r = slow_request(n.process(), "POST", target, body);
  if (r.ok()) return std::move(r).value();
  http::ClientResponse none;
  none.body = "no answer to POST " + target + ": " + r.error().message;
  return none;
}

// POST /v1/imports; a 503 (no link up yet) is retried for 10 s as its
// Retry-After invites.
http::ClientResponse import_stream(const FedNode& n, const std::string& stream) {
  http::ClientResponse r;
  eventually(10s, [&] {
    r = post_slow(n, "/v1/imports", "{\"stream\":\"" + stream + "\"}");
    return r.status != 503;
  });
  return r;
}

// The import's next_seq reaches `next` (the owner's next_seq).
void wait_caught_up(const FedNode& importer, const std::string& stream, uint64_t next,
                    std::chrono::milliseconds timeout) {
  ImportView v;
  const bool done = eventually(timeout, [&] {
    v = get_import(importer.process(), stream);
    return v.status == 200 && v.next_seq >= next;
  });
  ASSERT_TRUE(done) << importer.identity() << " GET /v1/imports/" << stream << " -> " << v.status << " " << v.body
                    << "; waited for next_seq " << next;
  ASSERT_EQ(v.next_seq, next) << "the mirror is ahead of its owner: " << v.body;
}

Result<std::unique_ptr<federation::LinkManager>> hand_link(const FedNode& self, const FedNode& peer,
                                                           federation::LinkHandler& handler,
                                                           std::function<void(std::string_view)> log) {
  auto trust = std::make_shared<certs::TrustStore>();
  for (const FedNode* n : {&self, &peer}) {
    if (Status s = trust->pin(n->domain(), n->ca_file()); !s.ok()) return s.error();
  }
  federation::LinkOptions o;
  o.self = {self.domain(), self.node()};
  o.cert_file = self.cert_file();
  o.key_file = self.key_file();
  o.trust = trust;
  const certs::Identity to{peer.domain(), peer.node()};
  o.peers.push_back({to, "127.0.0.1", peer.federation_port()});
  o.log = log ? std::move(log) : [](std::string_view) {};
  auto started = federation::LinkManager::start(std::move(o), handler);
  if (!started.ok()) return started.error();
  std::unique_ptr<federation::LinkManager> links = std::move(*started);
  if (!eventually(10s, [&] { return links->is_up(to); })) {
    return make_error(Errc::unavailable, self.identity() + " never linked with " + peer.identity() +
                                             (peer.running() ? "; its log:\n" + peer.process().stderr_text() : ""));
  }
  return links;
}

}  // namespace entente::testing
