// federation_bench: a stream of domain A read by a subscriber in domain B
// over the peer link, against two running nodes.
//
//   federation_bench --owner-port P --importer-port P2 [--host H] [--token T]
//                    [--seconds S] [--batch N] [--latency-rate R] [--lead N]
//                    [--contract]
//   federation_bench --internal --owner-port P1 --importer-port P2 [--tuples N]
//
// The owner (domain "acme") must export its stream `bids` to the importer's
// domain ("beta"), or, with --contract, the bench negotiates a stream
// contract for it (acme proposes, beta accepts, acme countersigns) before
// the import, so the figures include the contract's enforcement and
// metering; scripts/bench-federation.sh sets both nodes up (CONTRACT=1). Prints one
// JSON line per figure:
//   federation_latency     publish → arrival at the importer's subscriber at a
//                          fixed offered rate (p50/p99/p999)
//   federation_throughput  WebSocket publish into acme/bids on the owner as
//                          fast as it takes them → WebSocket subscriber on the
//                          importer following the mirror acme%2Fbids
//                          (tuples/s, MB/s received, lost, duplicated)
// Each carries a baseline measured in the same run: for throughput, the same
// publisher feeding a stream of the owner that is not exported, read by a
// subscriber on the owner; for latency, a subscriber on the owner reading the
// same tuples at the same time. The difference is what crossing the domain
// costs. Every subscriber checks that each sequence number arrives once, in
// order: gaps count as lost, repeats as duplicated.
//
// --internal: the two nodes are acme/n1 and acme/n2 of one domain, and the
// one figure is an internal arc (bench_internal):
//   internal_arc_throughput  n1's log -> peer link -> n2's durable mirror
//                            "@n1/bids" (tuples/s), baseline n1's durable
//                            ingest of the same tuples, plus a live run.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "bench/common/bench_common.h"
#include "http/client.h"
#include "engine/codec.h"
#include "rapidjson/document.h"

using namespace entente;
using bench::auth;
using bench::binary_batch;
using bench::call;
using bench::client_options;
using bench::Clock;
using bench::now_ns;

namespace {

constexpr const char* kOwnerStream = "bids";          // exported to beta
constexpr const char* kLocalStream = "bids_local";    // not exported: the baseline
constexpr const char* kMirror = "acme%2Fbids";        // acme/bids on the importer
constexpr uint16_t kCloseSlowConsumer = 4001;         // the node's close code

struct Args {
  // acme's node and beta's (--owner-port, --importer-port; --host and
  // --token apply to both).
  bench::Node owner, importer;
  double seconds = 5;
  int batch = 5000;  // tuples per published message
  double latency_rate = 100000;
  // How far (in batches) the publisher may run ahead of what its subscriber
  // received: the figure is the rate the whole path sustains.
  int lead = 40;
  // Negotiate a stream contract for acme/bids instead of relying on a
  // configured export; the JSON lines then say "under":"contract".
  bool contract = false;
  // --internal: both nodes are of domain acme (n1, n2): the arc figure
  // (bench_internal) instead of the cross-domain ones.
  bool internal = false;
  uint64_t tuples = 3'000'000;  // --tuples: what the arc figure moves
};

// The streams are made on the owner; a rerun needs fresh nodes
// (scripts/bench-federation.sh starts them).
bool create_stream(const Args& a, const std::string& name) {
  return bench::create_stream(a.owner, name, /*replace=*/false, "federation_bench");
}

// The owner's next sequence number of `stream` (1 when it cannot tell: a
// fresh stream), where a follower of its head starts.
uint64_t next_seq(const Args& a, const std::string& stream) {
  auto r = call(a.owner, "GET", "/v1/streams/" + stream);
  if (!r.ok() || r->status != 200) return 1;
  rapidjson::Document d;
  d.Parse(r->body.c_str(), r->body.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("next_seq") || !d["next_seq"].IsUint64()) return 1;
  return std::max<uint64_t>(1, d["next_seq"].GetUint64());
}

// An RFC 3339 UTC time `offset` from now, as contract terms take it.
std::string rfc3339_from_now(std::chrono::seconds offset) {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now() + offset);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char out[32];
  std::strftime(out, sizeof out, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return out;
}

// A contract's `version` and `in_force` on one node; {0, false} until it
// has the contract.
std::pair<uint64_t, bool> contract_state(const bench::Node& node, const std::string& id) {
  auto r = call(node, "GET", "/v1/contracts/" + id);
  if (!r.ok() || r->status != 200) return {0, false};
  rapidjson::Document d;
  d.Parse(r->body.c_str(), r->body.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("version") || !d["version"].IsUint64()) return {0, false};
  const bool in_force = d.HasMember("in_force") && d["in_force"].IsBool() && d["in_force"].GetBool();
  return {d["version"].GetUint64(), in_force};
}

// Waits (20 s at most) until `pred(version, in_force)` holds on the node.
template <class Pred>
bool wait_contract(const bench::Node& node, const std::string& id, Pred pred) {
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline) {
    auto [version, in_force] = contract_state(node, id);
    if (pred(version, in_force)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// acme proposes a stream contract for bids to beta, beta accepts, acme
// countersigns: in force on both nodes when this returns true.
bool negotiate_contract(const Args& a) {
  // The link may still be coming up: a proposal is refused (503) until then.
  const std::string terms = std::string(R"({"terms":{"kind":"stream","provider":"acme","consumer":"beta",)") +
                            R"("streams":[")" + kOwnerStream + R"("],"price_per_million":1,"valid_from":")" +
                            rfc3339_from_now(std::chrono::seconds(-60)) + R"(","valid_until":")" +
                            rfc3339_from_now(std::chrono::hours(24)) + R"("}})";
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  std::string id, last;
  while (id.empty() && Clock::now() < deadline) {
    auto r = call(a.owner, "POST", "/v1/contracts", terms);
    if (r.ok() && r->status == 201) {
      rapidjson::Document d;
      d.Parse(r->body.c_str(), r->body.size());
      if (!d.HasParseError() && d.IsObject() && d.HasMember("id") && d["id"].IsString()) id = d["id"].GetString();
      break;
    }
    last = r.ok() ? std::to_string(r->status) + " " + r->body : r.error().message;
    if (r.ok() && r->status != 503) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (id.empty()) {
    std::fprintf(stderr, "federation_bench: proposing a contract on the owner: %s\n", last.c_str());
    return false;
  }
  if (!wait_contract(a.importer, id, [](uint64_t v, bool) { return v >= 1; })) {
    std::fprintf(stderr, "federation_bench: the importer never received contract %s\n", id.c_str());
    return false;
  }
  auto r = call(a.importer, "POST", "/v1/contracts/" + id + "/accept", R"({"version":1})");
  if (!r.ok() || r->status != 200) {
    std::fprintf(stderr, "federation_bench: accepting contract %s on the importer: %s\n", id.c_str(),
                 r.ok() ? r->body.c_str() : r.error().message.c_str());
    return false;
  }
  for (const bench::Node* node : {&a.owner, &a.importer}) {
    if (!wait_contract(*node, id, [](uint64_t, bool in_force) { return in_force; })) {
      std::fprintf(stderr, "federation_bench: contract %s never came into force on port %u\n", id.c_str(),
                   static_cast<unsigned>(node->port));
      return false;
    }
  }
  return true;
}

// POST /v1/imports on the importer; the link may still be coming up (503),
// so it retries for a while.
bool create_import(const Args& a) {
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  std::string last;
  while (Clock::now() < deadline) {
    auto r = call(a.importer, "POST", "/v1/imports", "{\"stream\":\"acme/bids\"}");
    if (r.ok() && r->status == 201) return true;
    last = r.ok() ? std::to_string(r->status) + " " + r->body : r.error().message;
    if (r.ok() && r->status != 503) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  std::fprintf(stderr, "federation_bench: POST /v1/imports acme/bids on the importer: %s\n", last.c_str());
  return false;
}

// ------------------------------------------------------------ subscriber

// Follows one stream from a known first sequence number and checks that
// every number arrives once, in order. A node closes a subscriber that
// falls too far behind (4001); the follower then resumes where it stopped,
// which is what a real client does, and counts it.
//
// Threading: run() on its own thread; the atomics are read by the main
// thread while it runs, the rest after join().
struct Follower {
  std::string where;   // "owner" / "importer", for messages
  bench::Node node;
  std::string stream;  // as it appears in the URL
  uint64_t next = 1;   // next sequence number expected
  bool measure = false;

  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<bool> stop{false};
  std::atomic<bool> failed{false};
  uint64_t lost = 0;
  uint64_t duplicated = 0;
  uint64_t reconnects = 0;
  std::vector<double> latencies_ms;
  std::string error;

  void run() {
    while (!stop) {
      auto ws = http::WsClient::connect(
          client_options(node), "/v1/streams/" + stream + "/subscribe?format=binary&from=" + std::to_string(next),
          auth(node));
      if (!ws.ok()) return fail(ws.error().message);
      bool resume = false;
      while (!stop && !resume) {
        auto m = (*ws)->receive(200);
        if (!m.ok()) {
          if (m.error().code == Errc::unavailable) continue;
          return fail(m.error().message);
        }
        if (m->closed) {
          if (m->close_code != kCloseSlowConsumer) {
            return fail("closed " + std::to_string(m->close_code) + " " + m->close_reason);
          }
          ++reconnects;
          resume = true;
          break;
        }
        std::string_view in = m->data;
        auto b = engine::decode_batch(in);
        if (!b.ok()) return fail(b.error().message);
        const int64_t now = measure ? now_ns() : 0;
        const auto& ts = b->columns[0]->ints;
        uint64_t fresh = 0;
        for (size_t r = 0; r < b->rows(); ++r) {
          const uint64_t s = b->seq[r];
          if (s < next) {
            ++duplicated;
            continue;
          }
          if (s > next) lost += s - next;
          next = s + 1;
          ++fresh;
          if (measure) latencies_ms.push_back(static_cast<double>(now - ts[r]) / 1e6);
        }
        bytes += m->data.size();
        received += fresh;
      }
    }
  }

  // After the run: tuples the owner acknowledged that never arrived.
  void account_missing(uint64_t last_acked) {
    if (last_acked + 1 > next) lost += last_acked + 1 - next;
  }

 private:
  void fail(std::string why) {
    error = where + ": " + std::move(why);
    failed = true;
  }
};

// ------------------------------------------------------------- publisher

// The owner's acknowledgement: {"ack":{"count":N,"first_seq":F}}. Returns
// the last sequence number it covers, 0 when it is not an ack.
uint64_t ack_last(const std::string& text) {
  rapidjson::Document d;
  d.Parse(text.c_str(), text.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("ack") || !d["ack"].IsObject()) return 0;
  const auto& ack = d["ack"];
  if (!ack.HasMember("count") || !ack["count"].IsUint64() || !ack.HasMember("first_seq") ||
      !ack["first_seq"].IsUint64() || ack["count"].GetUint64() == 0)
    return 0;
  return ack["first_seq"].GetUint64() + ack["count"].GetUint64() - 1;
}

struct Throughput {
  uint64_t acked = 0;     // tuples the owner acknowledged
  uint64_t last_seq = 0;  // the last one's sequence number
  uint64_t received = 0, bytes = 0, lost = 0, duplicated = 0, reconnects = 0, errors = 0;
  double seconds = 0;
  std::string error;
  double tuples_per_s() const { return seconds > 0 ? static_cast<double>(received) / seconds : 0; }
  double mb_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / 1e6 / seconds : 0; }
};

// Publishes into `stream` on the owner as fast as it acknowledges (a window
// of 16 messages), no further ahead of `sub` than --lead batches, then waits
// for `sub` to receive everything acknowledged.
Throughput run_throughput(const Args& a, const std::string& stream, Follower& sub) {
  Throughput t;
  std::thread st([&] { sub.run(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // A named producer, as a publisher that may resend should be (docs/api.md).
  auto ws = http::WsClient::connect(client_options(a.owner),
                                            "/v1/streams/" + stream + "/publish?producer_id=bench-fed-" +
                                                std::to_string(::getpid()) + "&producer_seq=1",
                                            auth(a.owner));
  if (!ws.ok()) {
    sub.stop = true;
    st.join();
    t.error = "publish: " + ws.error().message;
    return t;
  }
  const std::string msg = binary_batch(a.batch, 0, 0);
  constexpr int kWindow = 16;
  int in_flight = 0;
  uint64_t sent = 0;
  auto read_ack = [&]() -> bool {
    auto m = (*ws)->receive(30000);
    if (!m.ok() || m->closed) return false;
    if (const uint64_t last = ack_last(m->data); last != 0) {
      t.acked += static_cast<uint64_t>(a.batch);
      t.last_seq = std::max(t.last_seq, last);
    } else {
      ++t.errors;
    }
    --in_flight;
    return true;
  };
  const uint64_t max_lead = static_cast<uint64_t>(a.lead) * static_cast<uint64_t>(a.batch);
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(a.seconds);
  while (Clock::now() < end && !sub.failed) {
    while (sent > sub.received + max_lead && !sub.failed && Clock::now() < end)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (in_flight == kWindow && !read_ack()) break;
    if (!(*ws)->send(msg, true).ok()) break;
    ++in_flight;
    sent += static_cast<uint64_t>(a.batch);
  }
  while (in_flight > 0 && read_ack()) {
  }
  const auto wait_end = Clock::now() + std::chrono::seconds(30);
  while (sub.received < t.acked && Clock::now() < wait_end && !sub.failed)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  t.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  sub.stop = true;
  st.join();
  sub.account_missing(t.last_seq);
  t.received = sub.received;
  t.bytes = sub.bytes;
  t.lost = sub.lost;
  t.duplicated = sub.duplicated;
  t.reconnects = sub.reconnects;
  if (t.error.empty()) t.error = sub.error;
  return t;
}

// The importer's link counters for the owner, from GET /v1/peers: bytes
// received over the link (to report what a tuple costs on the wire).
uint64_t link_bytes_in(const Args& a) {
  auto r = call(a.importer, "GET", "/v1/peers");
  if (!r.ok() || r->status != 200) return 0;
  rapidjson::Document d;
  d.Parse(r->body.c_str(), r->body.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("peers") || !d["peers"].IsArray()) return 0;
  uint64_t total = 0;
  for (const auto& p : d["peers"].GetArray()) {
    if (p.IsObject() && p.HasMember("domain") && p["domain"].IsString() &&
        std::string(p["domain"].GetString()) == "acme" && p.HasMember("bytes_in") && p["bytes_in"].IsUint64())
      total += p["bytes_in"].GetUint64();
  }
  return total;
}

void bench_throughput(const Args& a) {
  Follower local;
  local.where = "owner";
  local.node = a.owner;
  local.stream = kLocalStream;
  Throughput base = run_throughput(a, kLocalStream, local);

  Follower remote;
  remote.where = "importer";
  remote.node = a.importer;
  remote.stream = kMirror;
  remote.next = next_seq(a, kOwnerStream);
  const uint64_t link0 = link_bytes_in(a);
  Throughput fed = run_throughput(a, kOwnerStream, remote);
  const uint64_t link1 = link_bytes_in(a);
  const double link_bytes_per_tuple =
      fed.received > 0 && link1 >= link0 ? static_cast<double>(link1 - link0) / static_cast<double>(fed.received) : 0;

  std::printf(
      "{\"bench\":\"federation_throughput\",\"path\":\"acme/bids publish -> peer link -> beta subscriber\","
      "\"under\":\"%s\",\"tuples\":%llu,\"received\":%llu,\"seconds\":%.3f,\"tuples_per_s\":%.0f,\"mb_per_s\":%.1f,"
      "\"target_tuples_per_s\":1000000,\"lost\":%llu,\"duplicated\":%llu,\"resubscribes\":%llu,\"errors\":%llu,"
      "\"tuple_bytes\":%zu,\"link_bytes_per_tuple\":%.1f,\"batch\":%d,\"error\":\"%s\","
      "\"baseline\":\"same_publisher_local_subscriber_on_owner\",\"baseline_tuples_per_s\":%.0f,"
      "\"baseline_mb_per_s\":%.1f,\"baseline_lost\":%llu,\"baseline_duplicated\":%llu,\"baseline_error\":\"%s\"}\n",
      a.contract ? "contract" : "export", static_cast<unsigned long long>(fed.acked),
      static_cast<unsigned long long>(fed.received), fed.seconds,
      fed.tuples_per_s(), fed.mb_per_s(), static_cast<unsigned long long>(fed.lost),
      static_cast<unsigned long long>(fed.duplicated), static_cast<unsigned long long>(fed.reconnects),
      static_cast<unsigned long long>(fed.errors), binary_batch(a.batch, 0, 0).size() / static_cast<size_t>(a.batch),
      link_bytes_per_tuple, a.batch, fed.error.c_str(), base.tuples_per_s(), base.mb_per_s(),
      static_cast<unsigned long long>(base.lost), static_cast<unsigned long long>(base.duplicated),
      base.error.c_str());
  std::fflush(stdout);
}

// ---------------------------------------------------------------- latency

// Publishes acme/bids at a fixed rate (1 ms ticks, each tuple stamped with
// its send time) while one subscriber on the owner and one on the importer
// read the same tuples from the stream's head on.
void bench_latency(const Args& a) {
  const uint64_t next = next_seq(a, kOwnerStream);
  Follower local, remote;
  local.where = "owner";
  local.node = a.owner;
  local.stream = kOwnerStream;
  remote.where = "importer";
  remote.node = a.importer;
  remote.stream = kMirror;
  for (Follower* f : {&local, &remote}) {
    f->next = next;
    f->measure = true;
    f->latencies_ms.reserve(static_cast<size_t>(a.latency_rate * a.seconds * 1.2));
  }
  std::thread lt([&] { local.run(); });
  std::thread rt([&] { remote.run(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto ws = http::WsClient::connect(client_options(a.owner),
                                            std::string("/v1/streams/") + kOwnerStream + "/publish", auth(a.owner));
  uint64_t sent = 0, last_seq = 0;
  if (ws.ok()) {
    const int per_tick = std::max(1, static_cast<int>(a.latency_rate / 1000));
    const auto t0 = Clock::now();
    int64_t tick = 0;
    int in_flight = 0;
    auto drain = [&](int64_t timeout_ms) {
      while (in_flight > 0) {
        auto m = (*ws)->receive(timeout_ms);
        if (!m.ok() || m->closed) return;
        last_seq = std::max(last_seq, ack_last(m->data));
        --in_flight;
      }
    };
    while (Clock::now() - t0 < std::chrono::duration<double>(a.seconds)) {
      std::this_thread::sleep_until(t0 + std::chrono::milliseconds(tick));
      ++tick;
      if (!(*ws)->send(binary_batch(per_tick, static_cast<int64_t>(sent), now_ns()), true).ok()) break;
      sent += static_cast<uint64_t>(per_tick);
      ++in_flight;
      drain(0);  // acknowledgements already there, without waiting
    }
    drain(30000);
  } else {
    std::fprintf(stderr, "federation_bench: publish: %s\n", ws.error().message.c_str());
  }
  const auto wait_end = Clock::now() + std::chrono::seconds(10);
  while ((local.received < sent || remote.received < sent) && Clock::now() < wait_end && !local.failed &&
         !remote.failed)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  local.stop = remote.stop = true;
  lt.join();
  rt.join();
  local.account_missing(last_seq);
  remote.account_missing(last_seq);
  const bench::Percentiles r = bench::percentiles(remote.latencies_ms);
  const bench::Percentiles l = bench::percentiles(local.latencies_ms);
  std::printf(
      "{\"bench\":\"federation_latency\",\"path\":\"acme/bids publish -> peer link -> beta subscriber\","
      "\"under\":\"%s\",\"offered_tuples_per_s\":%.0f,\"tuples\":%llu,\"received\":%llu,\"p50_ms\":%.3f,\"p99_ms\":%.3f,"
      "\"p999_ms\":%.3f,\"max_ms\":%.3f,\"lost\":%llu,\"duplicated\":%llu,\"error\":\"%s\","
      "\"baseline\":\"same_tuples_local_subscriber_on_owner\",\"baseline_p50_ms\":%.3f,\"baseline_p99_ms\":%.3f,"
      "\"baseline_p999_ms\":%.3f,\"baseline_max_ms\":%.3f,\"baseline_lost\":%llu,\"baseline_error\":\"%s\"}\n",
      a.contract ? "contract" : "export", a.latency_rate, static_cast<unsigned long long>(sent),
      static_cast<unsigned long long>(remote.received.load()),
      r.p50, r.p99, r.p999, r.max, static_cast<unsigned long long>(remote.lost),
      static_cast<unsigned long long>(remote.duplicated), remote.error.c_str(), l.p50, l.p99, l.p999, l.max,
      static_cast<unsigned long long>(local.lost), local.error.c_str());
  std::fflush(stdout);
}

// ----------------------------------------------------------- internal arc

// Publishes `n` tuples (batches of --batch, 16 in flight) into `stream` on
// `node`; the seconds from the first send to the last acknowledgement (the
// tuples durable in the node's log), or a negative number on failure.
double publish_all(const Args& a, const bench::Node& node, const std::string& stream, uint64_t n) {
  // A named producer per call: each starts its numbering at 1.
  static int calls = 0;
  auto ws = http::WsClient::connect(client_options(node),
                                    "/v1/streams/" + stream + "/publish?producer_id=bench-arc-" +
                                        std::to_string(::getpid()) + "-" + std::to_string(++calls) +
                                        "&producer_seq=1",
                                    auth(node));
  if (!ws.ok()) {
    std::fprintf(stderr, "federation_bench: publish: %s\n", ws.error().message.c_str());
    return -1;
  }
  const std::string msg = binary_batch(a.batch, 0, 0);
  constexpr int kWindow = 16;
  int in_flight = 0;
  uint64_t sent = 0, acked = 0;
  const auto t0 = Clock::now();
  while (acked < n) {
    if (sent < n && in_flight < kWindow) {
      if (!(*ws)->send(msg, true).ok()) return -1;
      sent += static_cast<uint64_t>(a.batch);
      ++in_flight;
      continue;
    }
    auto m = (*ws)->receive(30000);
    if (!m.ok() || m->closed || ack_last(m->data) == 0) {
      std::fprintf(stderr, "federation_bench: publish: no acknowledgement (%s)\n",
                   m.ok() ? m->data.substr(0, 200).c_str() : m.error().message.c_str());
      return -1;
    }
    acked += static_cast<uint64_t>(a.batch);
    --in_flight;
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// GET /v1/imports/@n1/bids on the reading node: what its mirror holds
// durably (`acked`), 0 when it cannot tell.
uint64_t internal_acked(const Args& a) {
  auto r = call(a.importer, "GET", "/v1/imports/@n1/bids");
  if (!r.ok() || r->status != 200) return 0;
  rapidjson::Document d;
  d.Parse(r->body.c_str(), r->body.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("acked") || !d["acked"].IsUint64()) return 0;
  return d["acked"].GetUint64();
}

// An internal arc (docs/federation.md, "Reading a stream of another node of
// the domain"): --tuples 100-byte tuples are published into n1's `bids`
// first; then n2 starts reading it (POST /v1/imports {"stream":"bids",
// "node":"n1"}) and the figure is tuples/s from n1's log to n2's durable
// mirror (its `acked`, which n2 reports only once the tuples are synced),
// from the POST to the last one. Baseline in the same run: n1's own durable
// ingest of the same tuples over WebSocket. Then a live figure: the same
// publisher into n1 while n2 reads, tuples/s until n2's mirror holds them.
void bench_internal(const Args& a) {
  const uint64_t n = (a.tuples / static_cast<uint64_t>(a.batch)) * static_cast<uint64_t>(a.batch);
  const double ingest_s = publish_all(a, a.owner, kOwnerStream, n);
  if (ingest_s <= 0) return;
  const auto t0 = Clock::now();
  auto r = call(a.importer, "POST", "/v1/imports", "{\"stream\":\"bids\",\"node\":\"n1\"}");
  std::string error;
  if (!r.ok() || r->status != 201) error = r.ok() ? std::to_string(r->status) : r.error().message;
  const auto deadline = t0 + std::chrono::seconds(300);
  uint64_t acked = 0;
  while (error.empty() && acked < n && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    acked = internal_acked(a);
  }
  const double arc_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (error.empty() && acked < n) error = "the mirror held " + std::to_string(acked) + " after 300 s";

  // Live: n2 follows while n1 ingests another n tuples.
  const auto l0 = Clock::now();
  const double live_ingest_s = error.empty() ? publish_all(a, a.owner, kOwnerStream, n) : -1;
  uint64_t live_acked = acked;
  while (error.empty() && live_ingest_s > 0 && live_acked < 2 * n && Clock::now() < l0 + std::chrono::seconds(300)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    live_acked = internal_acked(a);
  }
  const double live_s = std::chrono::duration<double>(Clock::now() - l0).count();
  const double load1 = [] {
    double l[1] = {0};
    return getloadavg(l, 1) == 1 ? l[0] : -1;
  }();
  std::printf(
      "{\"bench\":\"internal_arc_throughput\",\"path\":\"acme/n1 log -> peer link -> acme/n2 durable mirror "
      "@n1/bids\",\"tuples\":%llu,\"tuple_bytes\":%zu,\"seconds\":%.3f,\"tuples_per_s\":%.0f,"
      "\"mb_per_s\":%.1f,\"target_tuples_per_s\":1000000,\"error\":\"%s\","
      "\"baseline\":\"owner_durable_ingest_websocket\",\"baseline_seconds\":%.3f,\"baseline_tuples_per_s\":%.0f,"
      "\"live_tuples\":%llu,\"live_seconds\":%.3f,\"live_tuples_per_s\":%.0f,\"live_ingest_tuples_per_s\":%.0f,"
      "\"batch\":%d,\"loadavg_1m\":%.2f}\n",
      static_cast<unsigned long long>(n), binary_batch(a.batch, 0, 0).size() / static_cast<size_t>(a.batch), arc_s,
      error.empty() ? static_cast<double>(n) / arc_s : 0,
      error.empty() ? static_cast<double>(binary_batch(a.batch, 0, 0).size()) * static_cast<double>(n) /
                          static_cast<double>(a.batch) / 1e6 / arc_s
                    : 0,
      error.c_str(), ingest_s, static_cast<double>(n) / ingest_s,
      static_cast<unsigned long long>(live_acked > acked ? live_acked - acked : 0), live_s,
      live_acked >= 2 * n ? static_cast<double>(n) / live_s : 0,
      live_ingest_s > 0 ? static_cast<double>(n) / live_ingest_s : 0, a.batch, load1);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  std::vector<std::string> only;
  bench::ArgReader r("federation_bench", argc, argv);
  while (r.next()) {
    const std::string& s = r.name();
    if (s == "--host") a.owner.host = a.importer.host = r.value();
    else if (s == "--owner-port") a.owner.port = r.port();
    else if (s == "--importer-port") a.importer.port = r.port();
    else if (s == "--token") a.owner.token = a.importer.token = r.value();
    else if (s == "--seconds") a.seconds = r.number();
    else if (s == "--batch") a.batch = r.integer();
    else if (s == "--latency-rate") a.latency_rate = r.number();
    else if (s == "--lead") a.lead = r.integer();
    else if (s == "--only") only.push_back(r.value());
    else if (s == "--contract") a.contract = true;
    else if (s == "--internal") a.internal = true;
    else if (s == "--tuples") a.tuples = static_cast<uint64_t>(r.integer());
    else {
      std::fprintf(stderr,
                   "usage: federation_bench --owner-port P --importer-port P2 [--host H] [--token T] [--seconds S] "
                   "[--batch N] [--latency-rate R] [--lead BATCHES] [--only throughput|latency] [--contract] "
                   "[--internal [--tuples N]]\n");
      return 2;
    }
  }
  if (a.owner.port == 0 || a.importer.port == 0 || a.batch <= 0 || a.batch > 1000000 || a.seconds <= 0 ||
      a.seconds > 3600 || a.latency_rate < 1000 || a.latency_rate > 1e7 || a.lead <= 0 || a.lead > 10000) {
    std::fprintf(stderr,
                 "federation_bench: --owner-port and --importer-port are required; --batch 1..1000000, "
                 "--seconds up to 3600, --latency-rate 1000..1e7, --lead 1..10000\n");
    return 2;
  }
  if (a.internal) {
    if (a.tuples < static_cast<uint64_t>(a.batch) || a.tuples > 100'000'000) {
      std::fprintf(stderr, "federation_bench: --tuples %llu is outside --batch..100000000\n",
                   static_cast<unsigned long long>(a.tuples));
      return 2;
    }
    if (!create_stream(a, kOwnerStream)) return 1;
    bench_internal(a);
    return 0;
  }
  auto want = [&](const char* n) { return only.empty() || std::find(only.begin(), only.end(), n) != only.end(); };
  if (!create_stream(a, kOwnerStream) || !create_stream(a, kLocalStream)) return 1;
  if (a.contract && !negotiate_contract(a)) return 1;
  if (!create_import(a)) return 1;
  // Latency first, on a quiet node: after the throughput run the owner's and
  // the importer's stores flush and trim hundreds of MB, which would show
  // up in both paths' tails.
  if (want("latency")) bench_latency(a);
  if (want("throughput")) bench_throughput(a);
  return 0;
}
