// broker_bench: throughput and latency of a running node over its API.
//
//   broker_bench --port P [--host H] [--token T] [--tls --ca FILE] [--seconds S]
//                [--process-port P2]
//
// Prints one JSON line per figure:
//   http_ndjson_ingest   NDJSON over HTTP, durable (tuples/s)
//   ws_publish_subscribe WebSocket publish → WebSocket subscribe, durable (tuples/s)
//   e2e_latency          publish → subscriber arrival at a fixed offered rate (p50/p99/p999)
// Every line names the node's ingest_durability mode ("fsync" or "process"),
// read from its /metrics. With --process-port, e2e_latency is measured a
// second time against that node (one started with ingest_durability
// "process"), so both modes are compared in the same run.
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
#include <cstdio>
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
  double latency_rate = 100000;
  std::string fsync_dir = "/tmp";  // where the fsync baseline writes: the node's disk
  uint16_t process_port = 0;       // a second node, for the latency of the other mode
};

std::string durability_mode(const Args& a) { return bench::durability_mode(a.node); }

std::string ndjson_body(int rows, int64_t base) {
  std::string s;
  s.reserve(static_cast<size_t>(rows) * 120);
  for (int i = 0; i < rows; ++i) {
    s += "{\"ts\":" + std::to_string(now_ns()) + ",\"k\":" + std::to_string(base + i) + ",\"payload\":\"" +
         bench::payload() + "\"}\n";
  }
  return s;
}

// The streams are replaced at the start of each figure: a rerun measures an
// empty stream, not one a previous run filled.
bool create_stream(const Args& a, const std::string& name) {
  return bench::create_stream(a.node, name, /*replace=*/true, "broker_bench");
}

// ------------------------------------------------------------ HTTP ingest

void bench_http_ingest(const Args& a, const std::string& mode) {
  if (!create_stream(a, "bench_http")) return;
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
      auto r = (*c)->request("POST", "/v1/streams/bench_http/tuples", body, "application/x-ndjson", headers);
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
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i) ts.emplace_back(worker);
  std::this_thread::sleep_for(std::chrono::duration<double>(a.seconds));
  stop = true;
  for (auto& t : ts) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf(
      "{\"bench\":\"http_ndjson_ingest\",\"ingest_durability\":\"%s\",\"tuples\":%llu,\"seconds\":%.3f,\"tuples_per_s\":%.0f,"
      "\"target_tuples_per_s\":300000,\"rejected_requests\":%llu,\"tuple_bytes\":%zu,\"batch\":%d,"
      "\"baseline\":\"ndjson_parse_in_process\",\"baseline_tuples_per_s\":%.0f}\n",
      mode.c_str(), static_cast<unsigned long long>(tuples.load()), secs,
      static_cast<double>(tuples.load()) / secs, static_cast<unsigned long long>(rejected.load()), body.size() / static_cast<size_t>(a.batch), a.batch,
      parse_rate);
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
  if (!create_stream(a, "bench_ws")) return;
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
  std::thread st([&] { subscribe_loop(a, "bench_ws", sub, false); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto ws = http::WsClient::connect(
      client_options(a.node), "/v1/streams/bench_ws/publish?producer_id=bench-ws-" + std::to_string(::getpid()) +
                             "&producer_seq=1",
      auth(a.node));
  if (!ws.ok()) {
    std::fprintf(stderr, "broker_bench: publish: %s\n", ws.error().message.c_str());
    sub.stop = true;
    st.join();
    return;
  }
  const std::string msg = binary_batch(a.batch, 0, 0);
  constexpr int kWindow = 16;
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
    if (in_flight == kWindow && !read_ack()) break;
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
  std::printf(
      "{\"bench\":\"ws_publish_subscribe\",\"ingest_durability\":\"%s\",\"tuples\":%llu,\"received\":%llu,\"seconds\":%.3f,\"tuples_per_s\":%.0f,"
      "\"target_tuples_per_s\":1000000,\"tuple_bytes\":%zu,\"batch\":%d,\"errors\":%llu,\"subscriber_error\":\"%s\","
      "\"baseline\":\"binary_codec_in_process\",\"baseline_tuples_per_s\":%.0f}\n",
      mode.c_str(), static_cast<unsigned long long>(acked), static_cast<unsigned long long>(sub.received.load()),
      secs,
      static_cast<double>(sub.received.load()) / secs, msg.size() / static_cast<size_t>(a.batch), a.batch,
      static_cast<unsigned long long>(errors), sub.error.c_str(), codec_rate);
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
  if (!create_stream(a, "bench_lat")) return;
  Subscription sub;
  sub.latencies_ms.reserve(static_cast<size_t>(a.latency_rate * a.seconds * 1.2));
  std::thread st([&] { subscribe_loop(a, "bench_lat", sub, true); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto ws = http::WsClient::connect(
      client_options(a.node), "/v1/streams/bench_lat/publish?producer_id=bench-lat-" + std::to_string(::getpid()) +
                             "&producer_seq=1",
      auth(a.node));
  if (!ws.ok()) {
    sub.stop = true;
    st.join();
    return;
  }
  // 1 ms ticks, each a batch of rate/1000 tuples stamped with the send time.
  const int per_tick = std::max(1, static_cast<int>(a.latency_rate / 1000));
  const auto t0 = Clock::now();
  uint64_t sent = 0;
  int64_t tick = 0;
  int in_flight = 0;
  while (Clock::now() - t0 < std::chrono::duration<double>(a.seconds)) {
    std::this_thread::sleep_until(t0 + std::chrono::milliseconds(tick));
    ++tick;
    if (!(*ws)->send(binary_batch(per_tick, static_cast<int64_t>(sent), now_ns()), true).ok()) break;
    sent += static_cast<uint64_t>(per_tick);
    ++in_flight;
    // Drain acknowledgements that are already there without waiting.
    while (in_flight > 0) {
      auto m = (*ws)->receive(0);
      if (!m.ok() || m->closed) break;
      --in_flight;
    }
  }
  const auto wait_end = Clock::now() + std::chrono::seconds(10);
  while (sub.received < sent && Clock::now() < wait_end) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  sub.stop = true;
  st.join();
  const FsyncBaseline fs = measure_fsync(a.fsync_dir);
  const bench::Percentiles l = bench::percentiles(sub.latencies_ms);
  std::printf(
      "{\"bench\":\"e2e_latency\",\"ingest_durability\":\"%s\",\"offered_tuples_per_s\":%.0f,\"tuples\":%zu,\"p50_ms\":%.3f,\"p99_ms\":%.3f,"
      "\"p999_ms\":%.3f,\"max_ms\":%.3f,\"target_p99_ms\":5,\"baseline\":\"fdatasync_10kB_append\","
      "\"baseline_p50_ms\":%.3f,\"baseline_p99_ms\":%.3f}\n",
      mode.c_str(), a.latency_rate, sub.latencies_ms.size(), l.p50, l.p99, l.p999, l.max, fs.p50_ms, fs.p99_ms);
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
    else if (s == "--only") only.push_back(r.value());
    else if (s == "--fsync-dir") a.fsync_dir = r.value();
    else if (s == "--process-port") a.process_port = r.port();
    else {
      std::fprintf(stderr,
                   "usage: broker_bench --port P [--host H] [--token T] [--tls --ca FILE] [--seconds S] "
                   "[--batch N] [--only http|ws|latency] [--fsync-dir DIR] [--process-port P2]\n");
      return 2;
    }
  }
  if (a.node.port == 0 || a.batch <= 0 || a.seconds <= 0) {
    std::fprintf(stderr, "broker_bench: --port is required; --batch and --seconds must be positive\n");
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
  return 0;
}
