// broker_bench: throughput and latency of a running node over its API.
//
//   broker_bench --port P [--host H] [--token T] [--tls --ca FILE] [--seconds S]
//                [--batch N] [--in-flight T] [--process-port P2]
//                [--replication N [--stream-node NODE] [--durability MODE]]
//
// Prints one JSON line per figure:
//   http_ndjson_ingest   NDJSON over HTTP, durable (tuples/s)
//   ws_publish_subscribe WebSocket publish → WebSocket subscribe, durable (tuples/s)
//   e2e_latency          publish → subscriber arrival at a fixed offered rate (p50/p99/p999)
// Every line names the node's ingest_durability mode ("fsync" or "process"),
// read from its /metrics. With --process-port, e2e_latency is measured a
// second time against that node (one started with ingest_durability
// "process"), so both modes are compared in the same run.
// e2e_latency also times each publish to its acknowledgement (ack_p50_ms
// ...): the subscriber sees a tuple once the leader holds it, the publisher
// once every in-sync follower does too (docs/cluster.md, "Replicated stream
// logs").
//
// With --replication N (a node of a domain of several nodes with peer
// links; scripts/bench-replication.sh), each figure's stream is created
// with "replication": N (and "durability": MODE with --durability, the
// lines' "ingest_durability" then being MODE; "node": NODE with --stream-node, which should
// be the node of --port: the bench publishes to and subscribes from the
// leader) under a name ending in _rN. Before measuring, the bench waits
// until GET /v1/streams/NAME shows factor N and every follower in sync;
// during, it looks every 20 ms; after, it waits until every follower's
// acked equals the head. The line then says "replication": N, the head,
// each follower's acked and how often it left the in-sync set, how many
// looks found a follower out of sync and the largest lag (a follower out
// of the set is not waited for, so the figure would partly be one of a
// smaller factor: "in_sync_throughout"), how far behind the followers were
// when the figure ended and "followers_caught_up". The bench exits 1 when
// a stream does not get its followers in sync or they do not catch up
// within 60 s. --in-flight T keeps at most T tuples unanswered (fewer
// HTTP requests or WebSocket messages at once, "window" in the line).
// Each line carries the baseline measured in the same run on this machine:
// for ingest, the rate at which this process alone parses the same NDJSON
// into batches (the CPU floor of the broker's work); for publish→subscribe,
// the rate at which it encodes and decodes the same binary batches. scripts/
// bench-broker.sh starts a node with a temporary data directory and runs this.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "bench/common/bench_common.h"
#include "http/client.h"
#include "engine/batch.h"
#include "engine/codec.h"
#include "rapidjson/document.h"

using namespace entente;
using bench::auth;
using bench::binary_batch;
using bench::client_options;
using bench::Clock;
using bench::now_ns;
using bench::schema;

namespace {

struct Args {
  bench::Node node;  // --host, --port, --token, --tls, --ca
  double seconds = 5;
  int batch = 5000;          // tuples per request / message
  // --in-flight: at most this many tuples unanswered at once (0: 4 HTTP
  // requests, 16 WebSocket messages). A follower more than 10,000 tuples
  // behind is out of the in-sync set and not waited for, so a figure of
  // replication in which every answer waited for every follower needs
  // fewer than that in flight.
  int in_flight = 0;
  double latency_rate = 100000;
  std::string fsync_dir = "/tmp";  // where the fsync baseline writes: the node's disk
  uint16_t process_port = 0;       // a second node, for the latency of the other mode
  int replication = 0;             // --replication: 1..3, 0 = the node's default, not checked
  std::string stream_node;         // --stream-node: the leader asked for
  std::string durability;          // --durability: the streams' (with --replication)
};

// Set when a replicated stream's followers were not in sync before a figure
// or did not catch up after it: the exit status says so.
std::atomic<bool> g_replication_failed{false};

// The stream's durability when --durability chose it, else the node's
// ingest_durability (what its streams default to).
std::string durability_mode(const Args& a) {
  return a.durability.empty() ? bench::durability_mode(a.node) : a.durability;
}

std::string ndjson_body(int rows, int64_t base) {
  std::string s;
  s.reserve(static_cast<size_t>(rows) * 120);
  for (int i = 0; i < rows; ++i) {
    s += "{\"ts\":" + std::to_string(now_ns()) + ",\"k\":" + std::to_string(base + i) + ",\"payload\":\"" +
         bench::payload() + "\"}\n";
  }
  return s;
}

// ------------------------------------------------------- replication

// A figure's stream: with --replication N its name ends in _rN, so the
// runs for factors 1, 2 and 3 on one domain never reuse a name whose old
// copies the followers may still be dropping.
std::string stream_name(const Args& a, const std::string& base) {
  return a.replication == 0 ? base : base + "_r" + std::to_string(a.replication);
}

// What GET /v1/streams/NAME on the leader says of its copies.
struct ReplicaView {
  std::string node;
  uint64_t acked = 0;
  bool connected = false;
  bool in_sync = false;
};
struct ReplicationView {
  uint64_t head = 0;    // next_seq - 1: the last sequence number appended
  uint64_t factor = 0;  // 0 when the answer has no "replication"
  std::vector<ReplicaView> replicas;
};

Result<ReplicationView> replication_view(const Args& a, const std::string& stream) {
  auto r = bench::call(a.node, "GET", "/v1/streams/" + stream);
  if (!r.ok()) return r.error();
  if (r->status != 200) return make_error(Errc::unavailable, std::to_string(r->status) + " " + r->body);
  rapidjson::Document d;
  d.Parse(r->body.c_str(), r->body.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("next_seq") || !d["next_seq"].IsUint64())
    return make_error(Errc::parse_error, "unexpected answer: " + r->body);
  ReplicationView v;
  const uint64_t next = d["next_seq"].GetUint64();
  v.head = next > 0 ? next - 1 : 0;
  if (!d.HasMember("replication") || !d["replication"].IsObject()) return v;
  const auto& rep = d["replication"];
  if (rep.HasMember("factor") && rep["factor"].IsUint64()) v.factor = rep["factor"].GetUint64();
  if (!rep.HasMember("replicas") || !rep["replicas"].IsArray()) return v;
  for (const auto& x : rep["replicas"].GetArray()) {
    if (!x.IsObject()) continue;
    ReplicaView f;
    if (x.HasMember("node") && x["node"].IsString()) f.node = x["node"].GetString();
    if (x.HasMember("acked") && x["acked"].IsUint64()) f.acked = x["acked"].GetUint64();
    if (x.HasMember("connected") && x["connected"].IsBool()) f.connected = x["connected"].GetBool();
    if (x.HasMember("in_sync") && x["in_sync"].IsBool()) f.in_sync = x["in_sync"].GetBool();
    v.replicas.push_back(std::move(f));
  }
  return v;
}

// entente_stream_replica_left_in_sync_total of `stream` on the leader, per
// follower (0 for one that never left).
std::map<std::string, uint64_t> left_in_sync(const Args& a, const std::string& stream,
                                             const std::vector<ReplicaView>& replicas) {
  std::map<std::string, uint64_t> out;
  auto r = bench::call(a.node, "GET", "/metrics");
  for (const auto& f : replicas) {
    out[f.node] = 0;
    if (!r.ok() || r->status != 200) continue;
    const std::string key =
        "entente_stream_replica_left_in_sync_total{node=\"" + f.node + "\",stream=\"" + stream + "\"} ";
    const size_t at = r->body.find(key);
    if (at != std::string::npos) out[f.node] = std::strtoull(r->body.c_str() + at + key.size(), nullptr, 10);
  }
  return out;
}

// Waits (60 s at most) until `stream` has the factor asked and every
// follower connected and in sync; says why not on stderr otherwise.
bool wait_in_sync(const Args& a, const std::string& stream) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  std::string last;
  while (Clock::now() < deadline) {
    auto v = replication_view(a, stream);
    if (v.ok()) {
      bool all = v->factor == static_cast<uint64_t>(a.replication) &&
                 v->replicas.size() + 1 == static_cast<size_t>(a.replication);
      for (const auto& f : v->replicas) all = all && f.connected && f.in_sync;
      if (all) return true;
      last = "factor " + std::to_string(v->factor) + ", " + std::to_string(v->replicas.size()) + " followers";
      for (const auto& f : v->replicas)
        last += std::string(", ") + f.node + (f.connected ? " connected" : " not connected") +
                (f.in_sync ? " in sync" : " not in sync");
    } else {
      last = v.error().message;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::fprintf(stderr, "broker_bench: stream %s: replication %d not in sync within 60 s (%s)\n", stream.c_str(),
               a.replication, last.c_str());
  g_replication_failed = true;
  return false;
}

// Watches a replicated stream while a figure runs, then checks that its
// followers catch up. Built just before the figure starts: it notes how
// often each follower had left the in-sync set and, every 20 ms until
// finish(), asks the leader for the stream's replication state, keeping
// the largest lag and how many looks found a follower out of sync (a
// follower more than 10,000 tuples behind is not in sync, so appends
// stop waiting for it without it "leaving the set": only these looks show
// it). finish() returns the fields the figure's line ends with (empty
// without --replication). Owns its polling thread; finish() joins it.
class ReplicaWatch final {
 public:
  ReplicaWatch(const Args& a, std::string stream) : a_(a), stream_(std::move(stream)) {
    if (a_.replication == 0) return;
    auto v = replication_view(a_, stream_);
    if (v.ok()) left_before_ = left_in_sync(a_, stream_, v->replicas);
    thread_ = std::thread([this] { poll(); });
  }
  ReplicaWatch(const ReplicaWatch&) = delete;
  ReplicaWatch& operator=(const ReplicaWatch&) = delete;
  ~ReplicaWatch() { stop(); }

  std::string finish();

 private:
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  void poll() {
    while (!stop_) {
      auto v = replication_view(a_, stream_);
      if (v.ok()) {
        ++looks_;
        bool out = false;
        for (const auto& f : v->replicas) {
          out = out || !f.in_sync;
          max_lag_ = std::max(max_lag_, v->head > f.acked ? v->head - f.acked : 0);
        }
        if (out) ++looks_not_in_sync_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  const Args& a_;
  const std::string stream_;
  std::map<std::string, uint64_t> left_before_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  // Written by the polling thread, read after it is joined.
  uint64_t looks_ = 0, looks_not_in_sync_ = 0, max_lag_ = 0;
};

// Waits (60 s at most) until every follower's acked equals the head. The
// first look tells how many tuples the publishers had been answered for
// that a follower did not hold yet ("behind_at_end_tuples").
std::string ReplicaWatch::finish() {
  if (a_.replication == 0) return {};
  stop();
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::seconds(60);
  Result<ReplicationView> v = make_error(Errc::unavailable, "not asked");
  bool caught_up = false;
  int64_t behind_at_end = -1;
  while (Clock::now() < deadline) {
    v = replication_view(a_, stream_);
    if (v.ok()) {
      caught_up = v->replicas.size() + 1 == static_cast<size_t>(a_.replication);
      uint64_t behind = 0;
      for (const auto& f : v->replicas) {
        caught_up = caught_up && f.acked == v->head;
        behind = std::max(behind, v->head > f.acked ? v->head - f.acked : 0);
      }
      if (behind_at_end < 0) behind_at_end = static_cast<int64_t>(behind);
      if (caught_up) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double catch_up_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  std::string out = ",\"replication\":" + std::to_string(a_.replication) + ",\"stream\":\"" + stream_ + "\"";
  if (!a_.stream_node.empty()) out += ",\"stream_node\":\"" + a_.stream_node + "\"";
  if (!v.ok()) {
    std::fprintf(stderr, "broker_bench: stream %s: %s\n", stream_.c_str(), v.error().message.c_str());
    g_replication_failed = true;
    return out + ",\"followers_caught_up\":false";
  }
  const auto left = left_in_sync(a_, stream_, v->replicas);
  out += ",\"head\":" + std::to_string(v->head) + ",\"followers\":[";
  uint64_t left_total = 0;
  for (size_t i = 0; i < v->replicas.size(); ++i) {
    const auto& f = v->replicas[i];
    const auto b = left_before_.find(f.node);
    const auto e = left.find(f.node);
    const uint64_t was = b == left_before_.end() ? 0 : b->second;
    const uint64_t now = e == left.end() ? 0 : e->second;
    left_total += now >= was ? now - was : now;
    out += std::string(i ? "," : "") + "{\"node\":\"" + f.node + "\",\"acked\":" + std::to_string(f.acked) +
           ",\"in_sync\":" + (f.in_sync ? "true" : "false") +
           ",\"left_in_sync\":" + std::to_string(now >= was ? now - was : now) + "}";
  }
  char tail[256];
  std::snprintf(tail, sizeof tail,
                "],\"looks\":%llu,\"looks_not_in_sync\":%llu,\"max_lag_tuples\":%llu,"
                "\"behind_at_end_tuples\":%lld,\"in_sync_throughout\":%s,\"followers_caught_up\":%s,"
                "\"catch_up_ms\":%.1f",
                static_cast<unsigned long long>(looks_), static_cast<unsigned long long>(looks_not_in_sync_),
                static_cast<unsigned long long>(max_lag_), static_cast<long long>(std::max<int64_t>(behind_at_end, 0)),
                looks_not_in_sync_ == 0 && left_total == 0 ? "true" : "false", caught_up ? "true" : "false", catch_up_ms);
  if (!caught_up) {
    std::fprintf(stderr, "broker_bench: stream %s: the followers did not reach head %llu within 60 s\n",
                 stream_.c_str(), static_cast<unsigned long long>(v->head));
    g_replication_failed = true;
  }
  return out + tail;
}

// The streams are replaced at the start of each figure: a rerun measures an
// empty stream, not one a previous run filled. With --replication, the
// stream is created with that factor (and leader) and the figure starts
// once its followers are in sync.
bool create_stream(const Args& a, const std::string& name) {
  if (a.replication == 0) return bench::create_stream(a.node, name, /*replace=*/true, "broker_bench");
  (void)bench::call(a.node, "DELETE", "/v1/streams/" + name);
  std::string body = std::string("{\"name\":\"") + name + "\",\"schema\":" + bench::kSchemaJson +
                     ",\"replication\":" + std::to_string(a.replication);
  if (!a.stream_node.empty()) body += ",\"node\":\"" + a.stream_node + "\"";
  if (!a.durability.empty()) body += ",\"durability\":\"" + a.durability + "\"";
  body += "}";
  auto r = bench::call(a.node, "POST", "/v1/streams", body);
  if (!r.ok() || r->status != 201) {
    std::fprintf(stderr, "broker_bench: creating stream %s: %s\n", name.c_str(),
                 r.ok() ? r->body.c_str() : r.error().message.c_str());
    g_replication_failed = true;
    return false;
  }
  return wait_in_sync(a, name);
}

// How many requests (HTTP) or messages (WebSocket) a figure keeps
// unanswered: `deflt`, or fewer so that they hold at most --in-flight tuples.
int window(const Args& a, int deflt) {
  if (a.in_flight <= 0) return deflt;
  return std::clamp(a.in_flight / a.batch, 1, deflt);
}

// ------------------------------------------------------------ HTTP ingest

void bench_http_ingest(const Args& a, const std::string& mode) {
  const std::string stream = stream_name(a, "bench_http");
  if (!create_stream(a, stream)) return;
  const std::string body = ndjson_body(a.batch, 0);
  // Baseline: parse the same body into a batch, in this process.
  double parse_rate = 0;
  {
    auto s = schema();
    const auto t0 = Clock::now();
    uint64_t n = 0;
    while (Clock::now() - t0 < std::chrono::seconds(1)) {
      rapidjson::Document doc;
      doc.SetArray();
      size_t start = 0;
      std::string copy = body;
      while (start < copy.size()) {
        size_t end = copy.find('\n', start);
        copy[end] = '\0';
        rapidjson::Document one(&doc.GetAllocator());
        one.ParseInsitu(copy.data() + start);
        doc.PushBack(static_cast<rapidjson::Value&>(one).Move(), doc.GetAllocator());
        start = end + 1;
      }
      auto b = engine::rows_from_json(s, doc);
      n += b.ok() ? b->rows() : 0;
    }
    parse_rate = static_cast<double>(n) / std::chrono::duration<double>(Clock::now() - t0).count();
  }
  std::atomic<uint64_t> tuples{0};
  std::atomic<uint64_t> rejected{0};
  std::atomic<bool> stop{false};
  std::atomic<int> workers{0};
  auto worker = [&] {
    auto c = http::Client::connect(client_options(a.node));
    if (!c.ok()) return;
    // Each worker is a producer naming its batches, as a publisher that
    // retries should (docs/api.md): the figure includes that bookkeeping.
    const std::string producer = "bench-http-" + std::to_string(::getpid()) + "-" + std::to_string(workers++);
    uint64_t seq = 1;
    while (!stop) {
      auto headers = auth(a.node);
      headers.emplace_back("entente-producer-id", producer);
      headers.emplace_back("entente-producer-seq", std::to_string(seq));
      auto r = (*c)->request("POST", "/v1/streams/" + stream + "/tuples", body, "application/x-ndjson", headers);
      if (!r.ok()) return;
      if (r->status == 200) {
        tuples += static_cast<uint64_t>(a.batch);
        ++seq;
      } else if (r->status == 429 || r->status == 503) {
        ++rejected;  // the same batch again, under the same number
      } else {
        std::fprintf(stderr, "broker_bench: ingest: %u %s\n", r->status, r->body.c_str());
        return;
      }
    }
  };
  ReplicaWatch watch(a, stream);
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  const int workers_n = window(a, 4);
  for (int i = 0; i < workers_n; ++i) ts.emplace_back(worker);
  std::this_thread::sleep_for(std::chrono::duration<double>(a.seconds));
  stop = true;
  for (auto& t : ts) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string repl = watch.finish();
  std::printf(
      "{\"bench\":\"http_ndjson_ingest\",\"ingest_durability\":\"%s\",\"tuples\":%llu,\"seconds\":%.3f,\"tuples_per_s\":%.0f,"
      "\"target_tuples_per_s\":300000,\"rejected_requests\":%llu,\"tuple_bytes\":%zu,\"batch\":%d,\"window\":%d,"
      "\"baseline\":\"ndjson_parse_in_process\",\"baseline_tuples_per_s\":%.0f%s}\n",
      mode.c_str(), static_cast<unsigned long long>(tuples.load()), secs,
      static_cast<double>(tuples.load()) / secs, static_cast<unsigned long long>(rejected.load()), body.size() / static_cast<size_t>(a.batch), a.batch,
      workers_n,
      parse_rate, repl.c_str());
  std::fflush(stdout);
}

// ------------------------------------------------- WS publish → subscribe

struct Subscription {
  std::atomic<uint64_t> received{0};
  std::atomic<bool> stop{false};
  std::vector<double> latencies_ms;  // filled when measuring latency
  std::string error;              // written by the subscriber thread before `failed`
  std::atomic<bool> failed{false};
};

void subscribe_loop(const Args& a, const std::string& stream, Subscription& sub, bool measure) {
  auto ws = http::WsClient::connect(client_options(a.node), "/v1/streams/" + stream + "/subscribe?format=binary",
                                            auth(a.node));
  if (!ws.ok()) {
    sub.error = ws.error().message;
    sub.failed = true;
    return;
  }
  while (!sub.stop) {
    auto m = (*ws)->receive(200);
    if (!m.ok()) {
      if (m.error().code == Errc::unavailable) continue;
      sub.error = m.error().message;
      sub.failed = true;
      return;
    }
    if (m->closed) {
      sub.error = "closed " + std::to_string(m->close_code) + " " + m->close_reason;
      sub.failed = true;
      return;
    }
    std::string_view in = m->data;
    auto b = engine::decode_batch(in);
    if (!b.ok()) {
      sub.error = b.error().message;
      sub.failed = true;
      return;
    }
    if (measure) {
      const int64_t now = now_ns();
      for (int64_t ts : b->columns[0]->ints) sub.latencies_ms.push_back(static_cast<double>(now - ts) / 1e6);
    }
    sub.received += b->rows();
  }
}

void bench_ws(const Args& a, const std::string& mode) {
  const std::string stream = stream_name(a, "bench_ws");
  if (!create_stream(a, stream)) return;
  // Baseline: encode + decode the same batches in this process.
  double codec_rate = 0;
  {
    const auto t0 = Clock::now();
    uint64_t n = 0;
    while (Clock::now() - t0 < std::chrono::seconds(1)) {
      std::string bytes = binary_batch(a.batch, 0, 0);
      std::string_view in = bytes;
      auto b = engine::decode_batch(in);
      n += b.ok() ? b->rows() : 0;
    }
    codec_rate = static_cast<double>(n) / std::chrono::duration<double>(Clock::now() - t0).count();
  }
  Subscription sub;
  ReplicaWatch watch(a, stream);
  std::thread st([&] { subscribe_loop(a, stream, sub, false); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto ws = http::WsClient::connect(
      client_options(a.node), "/v1/streams/" + stream + "/publish?producer_id=bench-ws-" + std::to_string(::getpid()) +
                             "&producer_seq=1",
      auth(a.node));
  if (!ws.ok()) {
    std::fprintf(stderr, "broker_bench: publish: %s\n", ws.error().message.c_str());
    sub.stop = true;
    st.join();
    return;
  }
  const std::string msg = binary_batch(a.batch, 0, 0);
  const int k_window = window(a, 16);
  int in_flight = 0;
  uint64_t sent = 0, acked = 0, errors = 0;
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(a.seconds);
  auto read_ack = [&]() -> bool {
    auto m = (*ws)->receive(30000);
    if (!m.ok() || m->closed) return false;
    if (m->data.find("\"ack\"") != std::string::npos) acked += static_cast<uint64_t>(a.batch);
    else ++errors;
    --in_flight;
    return true;
  };
  // The publisher may run ahead of the subscriber by at most this many
  // tuples: the figure is the rate both ends sustain, not the rate at which
  // a subscriber falls behind (the node would close it with 4001).
  const uint64_t max_lead = 12 * static_cast<uint64_t>(a.batch);
  while (Clock::now() < end) {
    while (sent > sub.received + max_lead && !sub.failed && Clock::now() < end)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (in_flight == k_window && !read_ack()) break;
    if (!(*ws)->send(msg, true).ok()) break;
    ++in_flight;
    sent += static_cast<uint64_t>(a.batch);
  }
  while (in_flight > 0 && read_ack()) {
  }
  const auto wait_end = Clock::now() + std::chrono::seconds(30);
  while (sub.received < acked && Clock::now() < wait_end && !sub.failed)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  sub.stop = true;
  st.join();
  const std::string repl = watch.finish();
  std::printf(
      "{\"bench\":\"ws_publish_subscribe\",\"ingest_durability\":\"%s\",\"tuples\":%llu,\"received\":%llu,\"seconds\":%.3f,\"tuples_per_s\":%.0f,"
      "\"target_tuples_per_s\":1000000,\"tuple_bytes\":%zu,\"batch\":%d,\"window\":%d,\"errors\":%llu,\"subscriber_error\":\"%s\","
      "\"baseline\":\"binary_codec_in_process\",\"baseline_tuples_per_s\":%.0f%s}\n",
      mode.c_str(), static_cast<unsigned long long>(acked), static_cast<unsigned long long>(sub.received.load()),
      secs,
      static_cast<double>(sub.received.load()) / secs, msg.size() / static_cast<size_t>(a.batch), a.batch, k_window,
      static_cast<unsigned long long>(errors), sub.error.c_str(), codec_rate, repl.c_str());
  std::fflush(stdout);
}

// ---------------------------------------------------------------- latency

// Baseline for latency: what one durable append costs on this machine's
// disk, measured the way the node's log is written (append, fdatasync).
struct FsyncBaseline {
  double p50_ms = 0, p99_ms = 0;
};
FsyncBaseline measure_fsync(const std::string& dir) {
  FsyncBaseline b;
  const std::string path = dir + "/entente-bench-fsync-probe";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_TRUNC, 0600);
  if (fd < 0) return b;
  const std::string block(10000, 'x');
  std::vector<double> lat;
  for (int i = 0; i < 200; ++i) {
    if (::write(fd, block.data(), block.size()) < 0) break;
    const auto t0 = Clock::now();
    ::fdatasync(fd);
    lat.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  ::close(fd);
  ::unlink(path.c_str());
  const bench::Percentiles p = bench::percentiles(lat);
  b.p50_ms = p.p50;
  b.p99_ms = p.p99;
  return b;
}

void bench_latency(const Args& a, const std::string& mode) {
  const std::string stream = stream_name(a, "bench_lat");
  if (!create_stream(a, stream)) return;
  ReplicaWatch watch(a, stream);
  Subscription sub;
  sub.latencies_ms.reserve(static_cast<size_t>(a.latency_rate * a.seconds * 1.2));
  std::thread st([&] { subscribe_loop(a, stream, sub, true); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto ws = http::WsClient::connect(
      client_options(a.node), "/v1/streams/" + stream + "/publish?producer_id=bench-lat-" + std::to_string(::getpid()) +
                             "&producer_seq=1",
      auth(a.node));
  if (!ws.ok()) {
    sub.stop = true;
    st.join();
    return;
  }
  // 1 ms ticks, each a batch of rate/1000 tuples stamped with the send time.
  const int per_tick = std::max(1, static_cast<int>(a.latency_rate / 1000));
  // Send times of the batches not yet acknowledged: the node answers a
  // publisher's batches in order, one answer each.
  std::deque<int64_t> sent_at;
  std::vector<double> ack_ms;
  ack_ms.reserve(static_cast<size_t>(a.seconds * 1000 * 1.2));
  uint64_t ack_errors = 0;
  bool broken = false;
  // One answer within `timeout_ms`, timed as it arrives; false when none
  // came (or the connection ended: `broken`).
  auto take_ack = [&](int64_t timeout_ms) -> bool {
    auto m = (*ws)->receive(timeout_ms);
    if (!m.ok()) {
      if (m.error().code != Errc::unavailable) broken = true;
      return false;
    }
    if (m->closed) {
      broken = true;
      return false;
    }
    if (m->data.find("\"ack\"") == std::string::npos || sent_at.empty()) {
      ++ack_errors;
    } else {
      ack_ms.push_back(static_cast<double>(now_ns() - sent_at.front()) / 1e6);
    }
    if (!sent_at.empty()) sent_at.pop_front();
    return true;
  };
  const auto t0 = Clock::now();
  uint64_t sent = 0;
  int64_t tick = 0;
  while (!broken && Clock::now() - t0 < std::chrono::duration<double>(a.seconds)) {
    // Until the next tick, read answers as they come (receive returns on
    // arrival), so each is timed to within the client's wake-up.
    const auto next = t0 + std::chrono::milliseconds(tick);
    while (!sent_at.empty() && !broken) {
      const auto left = std::chrono::duration<double, std::milli>(next - Clock::now()).count();
      if (left <= 0 || !take_ack(static_cast<int64_t>(std::ceil(left)))) break;
    }
    std::this_thread::sleep_until(next);
    ++tick;
    const int64_t ts = now_ns();
    if (!(*ws)->send(binary_batch(per_tick, static_cast<int64_t>(sent), ts), true).ok()) break;
    sent += static_cast<uint64_t>(per_tick);
    sent_at.push_back(ts);
  }
  while (!sent_at.empty() && !broken && take_ack(10000)) {
  }
  const auto wait_end = Clock::now() + std::chrono::seconds(10);
  while (sub.received < sent && Clock::now() < wait_end) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  sub.stop = true;
  st.join();
  const std::string repl = watch.finish();
  const FsyncBaseline fs = measure_fsync(a.fsync_dir);
  const bench::Percentiles l = bench::percentiles(sub.latencies_ms);
  const bench::Percentiles k = bench::percentiles(ack_ms);
  std::printf(
      "{\"bench\":\"e2e_latency\",\"ingest_durability\":\"%s\",\"offered_tuples_per_s\":%.0f,\"tuples\":%zu,\"p50_ms\":%.3f,\"p99_ms\":%.3f,"
      "\"p999_ms\":%.3f,\"max_ms\":%.3f,\"target_p99_ms\":5,\"acks\":%zu,\"ack_errors\":%llu,\"ack_p50_ms\":%.3f,"
      "\"ack_p99_ms\":%.3f,\"ack_p999_ms\":%.3f,\"ack_max_ms\":%.3f,\"baseline\":\"fdatasync_10kB_append\","
      "\"baseline_p50_ms\":%.3f,\"baseline_p99_ms\":%.3f%s}\n",
      mode.c_str(), a.latency_rate, sub.latencies_ms.size(), l.p50, l.p99, l.p999, l.max, ack_ms.size(),
      static_cast<unsigned long long>(ack_errors), k.p50, k.p99, k.p999, k.max, fs.p50_ms, fs.p99_ms, repl.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  std::vector<std::string> only;
  bench::ArgReader r("broker_bench", argc, argv);
  while (r.next()) {
    const std::string& s = r.name();
    if (s == "--host") a.node.host = r.value();
    else if (s == "--port") a.node.port = r.port();
    else if (s == "--token") a.node.token = r.value();
    else if (s == "--tls") a.node.tls = true;
    else if (s == "--ca") a.node.ca_file = r.value();
    else if (s == "--seconds") a.seconds = r.number();
    else if (s == "--batch") a.batch = r.integer();
    else if (s == "--in-flight") a.in_flight = r.integer();
    else if (s == "--only") only.push_back(r.value());
    else if (s == "--fsync-dir") a.fsync_dir = r.value();
    else if (s == "--process-port") a.process_port = r.port();
    else if (s == "--replication") a.replication = r.integer();
    else if (s == "--stream-node") a.stream_node = r.value();
    else if (s == "--durability") a.durability = r.value();
    else {
      std::fprintf(stderr,
                   "usage: broker_bench --port P [--host H] [--token T] [--tls --ca FILE] [--seconds S] "
                   "[--batch N] [--in-flight TUPLES] [--only http|ws|latency] [--fsync-dir DIR] [--process-port P2] "
                   "[--replication 1..3 [--stream-node NODE] [--durability fsync|replicated|process]]\n");
      return 2;
    }
  }
  if (a.node.port == 0 || a.batch <= 0 || a.seconds <= 0) {
    std::fprintf(stderr, "broker_bench: --port is required; --batch and --seconds must be positive\n");
    return 2;
  }
  if (a.replication < 0 || a.replication > 3 ||
      (a.replication == 0 && (!a.stream_node.empty() || !a.durability.empty())) ||
      (!a.durability.empty() && a.durability != "fsync" && a.durability != "replicated" &&
       a.durability != "process")) {
    std::fprintf(stderr, "broker_bench: --replication is 1, 2 or 3; --stream-node and --durability "
                         "(fsync, replicated, process) need it\n");
    return 2;
  }
  auto want = [&](const char* n) { return only.empty() || std::find(only.begin(), only.end(), n) != only.end(); };
  const std::string mode = durability_mode(a);
  if (want("http")) bench_http_ingest(a, mode);
  if (want("ws")) bench_ws(a, mode);
  if (want("latency")) bench_latency(a, mode);
  if (want("latency") && a.process_port != 0) {
    Args p = a;
    p.node.port = a.process_port;
    bench_latency(p, durability_mode(p));
  }
  return g_replication_failed ? 1 : 0;
}
