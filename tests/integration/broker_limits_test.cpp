// Backpressure of a real broker process: a full group-commit queue answers
// 503 and a query lagging beyond limits.query_max_lag_tuples answers 429,
// both with Retry-After and a problem+json body; nothing refused is stored,
// everything acknowledged is, and the node keeps serving afterwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <latch>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/ws_reader.h"

namespace entente::testing {
namespace {

using Clock = std::chrono::steady_clock;

const char* kStream =
    R"({"name":"feed","schema":[{"name":"k","type":"int64"},{"name":"note","type":"string"}]})";

// Keeps everything (k is never negative): the output has one tuple per input.
const char* kCopyQuery = R"({"name":"copy","inputs":[{"name":"feed","schema":[
    {"name":"k","type":"int64"},{"name":"note","type":"string"}]}],
  "boxes":[{"id":"f","type":"filter","options":{"predicates":["k >= 0"],"drop_unmatched":true}}],
  "arcs":[{"from":"feed","to":"f"}],"outputs":[{"name":"copied","from":"f"}]})";

rapidjson::Document parse(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.c_str());
  EXPECT_FALSE(d.HasParseError()) << body;
  return d;
}

// NDJSON rows k = first .. first + n - 1.
std::string rows(uint64_t first, uint64_t n, size_t note_bytes) {
  std::string s;
  const std::string note(note_bytes, 'n');
  for (uint64_t k = first; k < first + n; ++k)
    s += "{\"k\":" + std::to_string(k) + ",\"note\":\"" + note + "\"}\n";
  return s;
}

// One ingest request's outcome, as a client sees it.
struct Outcome {
  uint64_t k_first = 0, k_count = 0;  // what was sent
  unsigned status = 0;
  std::string body;
  std::string content_type;
  std::string retry_after;
  uint64_t count = 0, first_seq = 0, last_seq = 0;  // when 200
};

Outcome post_rows(http::Client& c, const std::string& stream, uint64_t k_first, uint64_t n,
                  size_t note_bytes) {
  Outcome o;
  o.k_first = k_first;
  o.k_count = n;
  auto r = c.request("POST", "/v1/streams/" + stream + "/tuples", rows(k_first, n, note_bytes),
                     "application/x-ndjson", {{"authorization", std::string("Bearer ") + kPublisherToken}});
  if (!r.ok()) {
    o.body = r.error().message;
    return o;
  }
  o.status = r->status;
  o.body = r->body;
  if (auto ct = r->header("content-type")) o.content_type = std::string(*ct);
  if (auto ra = r->header("retry-after")) o.retry_after = std::string(*ra);
  if (o.status == 200) {
    auto d = parse(o.body);
    if (d.IsObject() && d.HasMember("count") && d.HasMember("first_seq") && d.HasMember("last_seq")) {
      o.count = d["count"].GetUint64();
      o.first_seq = d["first_seq"].GetUint64();
      o.last_seq = d["last_seq"].GetUint64();
    }
  }
  return o;
}

// A refusal a client can act on: the status, Retry-After in whole seconds,
// and an RFC 7807 body whose detail says why.
void expect_retryable_problem(const Outcome& o, unsigned status, const std::string& detail_part) {
  EXPECT_EQ(o.status, status) << o.body;
  EXPECT_EQ(o.retry_after, "1") << o.body;
  EXPECT_EQ(o.content_type, "application/problem+json") << o.body;
  auto d = parse(o.body);
  ASSERT_TRUE(d.IsObject()) << o.body;
  ASSERT_TRUE(d.HasMember("status") && d["status"].IsUint());
  EXPECT_EQ(d["status"].GetUint(), status);
  ASSERT_TRUE(d.HasMember("detail") && d["detail"].IsString()) << o.body;
  EXPECT_NE(std::string(d["detail"].GetString()).find(detail_part), std::string::npos) << o.body;
}

// The acknowledged requests hold sequence numbers 1..N exactly once each,
// with N the stream's next_seq - 1: nothing refused took a number.
void expect_acks_tile_the_stream(const BrokerProcess& b, const std::string& stream,
                                 std::vector<Outcome> acked) {
  std::sort(acked.begin(), acked.end(),
            [](const Outcome& x, const Outcome& y) { return x.first_seq < y.first_seq; });
  uint64_t next = 1;
  for (auto& o : acked) {
    EXPECT_EQ(o.count, o.k_count);
    EXPECT_EQ(o.first_seq, next) << o.body;
    EXPECT_EQ(o.last_seq, o.first_seq + o.count - 1) << o.body;
    next = o.last_seq + 1;
  }
  EXPECT_EQ(next_seq(b, stream), next);
}

// Reads the whole stream and checks that each acknowledged request's rows
// are at its acknowledged sequence numbers, and that nothing else is there.
void expect_stream_holds_exactly(const BrokerProcess& b, const std::string& stream,
                                 const std::vector<Outcome>& acked) {
  uint64_t total = 0;
  for (auto& o : acked) total += o.count;
  auto got = read_stream(b, stream, 1, total, 60000);
  ASSERT_TRUE(got.error.empty()) << got.error;
  ASSERT_EQ(got.tuples.size(), total);
  for (auto& o : acked) {
    for (uint64_t i = 0; i < o.count; ++i) {
      const Tuple& t = got.tuples[o.first_seq - 1 + i];
      ASSERT_EQ(t.seq, o.first_seq + i);
      auto d = parse(t.line);
      ASSERT_TRUE(d.IsObject() && d.HasMember("k")) << t.line;
      ASSERT_EQ(d["k"].GetUint64(), o.k_first + i) << t.line;
    }
  }
}

void expect_healthy_and_ingesting(const BrokerProcess& b, const std::string& stream, uint64_t k_first) {
  auto h = b.request("GET", "/v1/health", "", "");
  ASSERT_EQ(h.status, 200u) << h.body;
  auto c = b.client();
  ASSERT_TRUE(c);
  const uint64_t before = next_seq(b, stream);
  auto o = post_rows(*c, stream, k_first, 3, 8);
  ASSERT_EQ(o.status, 200u) << o.body;
  EXPECT_EQ(o.first_seq, before);
  EXPECT_EQ(o.last_seq, before + 2);
}

double metric(const BrokerProcess& b, const std::string& name) {
  auto r = b.request("GET", "/metrics", "", kReaderToken);
  const std::string key = "\n" + name + " ";
  auto at = ("\n" + r.body).find(key);
  if (at == std::string::npos) return -1;
  return std::stod(r.body.substr(at + key.size() - 1));
}

// ---------------------------------------------------------------------------
// 503: the group-commit queue is bounded by limits.ingest_queue_bytes. At the
// minimum (1 KiB) a batch is admitted only while nothing else is queued or
// being written, so large requests arriving together while one is being
// synced are refused. Rounds of simultaneous requests repeat until at least
// one has been refused (the first round almost always does it); every
// outcome is checked.
TEST(BrokerLimits, FullIngestQueueAnswers503WithRetryAfterAndStoresNothingRefused) {
  BrokerProcess broker(with_config(R"("limits":{"ingest_queue_bytes":"1KiB"},"threads":{"network":2})"));
  ASSERT_TRUE(broker.start()) << broker.last_error();
  ASSERT_EQ(broker.request("POST", "/v1/streams", kStream).status, 201u);

  constexpr int kThreads = 6;
  constexpr int kMaxRounds = 40;
  constexpr uint64_t kRows = 2000;  // ~100 KB encoded: far over the 1 KiB bound
  std::vector<std::unique_ptr<http::Client>> clients;
  for (int t = 0; t < kThreads; ++t) {
    clients.push_back(broker.client());
    ASSERT_TRUE(clients.back());
  }
  std::vector<Outcome> outcomes;
  uint64_t refused = 0;
  for (int round = 0; round < kMaxRounds && refused == 0; ++round) {
    std::vector<Outcome> got(kThreads);
    std::latch go(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        go.arrive_and_wait();
        const uint64_t k_first = static_cast<uint64_t>(round * kThreads + t) * kRows;
        got[t] = post_rows(*clients[t], "feed", k_first, kRows, 32);
      });
    }
    for (auto& th : threads) th.join();
    for (auto& o : got) {
      if (o.status == 503) ++refused;
      outcomes.push_back(std::move(o));
    }
  }
  ASSERT_GT(refused, 0u) << "no request was refused in " << kMaxRounds << " rounds";

  std::vector<Outcome> acked;
  for (auto& o : outcomes) {
    if (o.status == 200) {
      acked.push_back(o);
    } else {
      // Nothing but a retryable refusal: no 500, no dropped connection.
      expect_retryable_problem(o, 503, "ingest queue full");
      EXPECT_NE(o.body.find("retry later"), std::string::npos) << o.body;
    }
  }
  ASSERT_FALSE(acked.empty());
  expect_acks_tile_the_stream(broker, "feed", acked);
  expect_stream_holds_exactly(broker, "feed", acked);
  EXPECT_GE(metric(broker, "entente_ingest_rejected_total"), static_cast<double>(refused));
  expect_healthy_and_ingesting(broker, "feed", 1u << 30);
}

// ---------------------------------------------------------------------------
// 429: limits.query_max_lag_tuples at its minimum (1). Between a batch being
// committed and the query consuming it, the query is more than one tuple
// behind, so publishers sending concurrently are told to slow down. They
// keep sending until one has been refused (bounded by a deadline); then the
// query catches up, its output holds exactly the accepted input, and ingest
// is accepted again.
TEST(BrokerLimits, QueryLaggingBeyondItsBoundAnswers429WithRetryAfter) {
  BrokerProcess broker(with_config(R"("limits":{"query_max_lag_tuples":1},"threads":{"network":2})"));
  ASSERT_TRUE(broker.start()) << broker.last_error();
  ASSERT_EQ(broker.request("POST", "/v1/streams", kStream).status, 201u);
  auto q = broker.request("POST", "/v1/queries", kCopyQuery);
  ASSERT_EQ(q.status, 201u) << q.body;

  constexpr int kThreads = 4;
  constexpr uint64_t kRows = 1000;
  std::atomic<bool> seen_429{false};
  std::atomic<uint64_t> next_k{0};
  std::mutex mu;
  std::vector<Outcome> outcomes;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      auto c = broker.client();
      if (!c) return;
      // A few more requests after the first refusal, so refusals and
      // acceptances interleave.
      int after = 0;
      while (Clock::now() < deadline && after < 5) {
        auto o = post_rows(*c, "feed", next_k.fetch_add(kRows), kRows, 16);
        if (o.status == 429) seen_429 = true;
        if (seen_429) ++after;
        std::lock_guard lock(mu);
        outcomes.push_back(std::move(o));
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(seen_429.load()) << "no 429 within 30 s of concurrent ingest";

  std::vector<Outcome> acked;
  for (auto& o : outcomes) {
    if (o.status == 200)
      acked.push_back(o);
    else
      expect_retryable_problem(o, 429, "query 'copy' is ");
  }
  ASSERT_FALSE(acked.empty());
  expect_acks_tile_the_stream(broker, "feed", acked);

  // The query catches up: lag 0, and its output is one tuple per accepted
  // input tuple (the refused batches never reached it).
  uint64_t accepted = 0;
  for (auto& o : acked) accepted += o.count;
  const auto until = Clock::now() + std::chrono::seconds(30);
  uint64_t lag = UINT64_MAX;
  while (Clock::now() < until) {
    auto d = parse(broker.request("GET", "/v1/queries/copy", "", kReaderToken).body);
    ASSERT_TRUE(d.IsObject() && d.HasMember("lag_tuples"));
    EXPECT_STREQ(d["state"].GetString(), "running");
    lag = d["lag_tuples"].GetUint64();
    if (lag == 0 && next_seq(broker, "copied") == accepted + 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(lag, 0u);
  EXPECT_EQ(next_seq(broker, "copied"), accepted + 1);
  expect_healthy_and_ingesting(broker, "feed", 1u << 30);
}

}  // namespace
}  // namespace entente::testing
