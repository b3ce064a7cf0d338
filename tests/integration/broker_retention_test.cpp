// Retention of stream logs, end to end on a real broker process checking
// every 100 ms (retention_check_interval): bounds by tuples, bytes and age,
// per stream and node-wide; what a subscriber sees afterwards (4008 with the
// first retained sequence number, or the retained tuples from from=0); the
// query pin (retention waits for the query's checkpoint); and that an attached
// subscriber still catching up does not pin the log (docs/operations.md).
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/ws_reader.h"

namespace entente::testing {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint16_t kCloseTooOld = 4008;

// Checks every 100 ms; checkpoints only when asked (so the query pin moves
// only on POST /v1/checkpoints).
BrokerOptions fast_retention(const std::string& extra = {}) {
  return with_config(R"("retention_check_interval":"100ms","checkpoint_interval":"1h")" +
                     (extra.empty() ? "" : "," + extra));
}

std::string stream_spec(const std::string& name, const std::string& retention) {
  return R"({"name":")" + name +
         R"(","schema":[{"name":"k","type":"int64"},{"name":"note","type":"string"}])" +
         (retention.empty() ? "" : R"(,"retention":)" + retention) + "}";
}

rapidjson::Document parse(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.c_str());
  EXPECT_FALSE(d.HasParseError()) << body;
  return d;
}

struct StreamView {
  uint64_t first_seq = 0, next_seq = 0, tuples = 0;
};

StreamView stream_view(const BrokerProcess& b, const std::string& name) {
  auto r = b.request("GET", "/v1/streams/" + name, "", kReaderToken);
  EXPECT_EQ(r.status, 200u) << r.body;
  auto d = parse(r.body);
  StreamView v;
  if (d.IsObject() && d.HasMember("first_seq")) {
    v.first_seq = d["first_seq"].GetUint64();
    v.next_seq = d["next_seq"].GetUint64();
    v.tuples = d["tuples"].GetUint64();
  }
  return v;
}

// Posts `records` batches of `per_record` tuples (one record each).
void post_records(const BrokerProcess& b, const std::string& stream, int records, int per_record,
                  size_t note_bytes = 16) {
  auto c = b.client();
  ASSERT_TRUE(c);
  const std::string note(note_bytes, 'r');
  for (int r = 0; r < records; ++r) {
    std::string body;
    for (int i = 0; i < per_record; ++i)
      body += "{\"k\":" + std::to_string(r * per_record + i) + ",\"note\":\"" + note + "\"}\n";
    auto res = c->request("POST", "/v1/streams/" + stream + "/tuples", body, "application/x-ndjson",
                          {{"authorization", std::string("Bearer ") + kPublisherToken}});
    ASSERT_TRUE(res.ok()) << res.error().message;
    ASSERT_EQ(res->status, 200u) << res->body;
  }
}

// Polls GET /v1/streams/{name} until `pred` holds or 10 s pass.
StreamView wait_for(const BrokerProcess& b, const std::string& name,
                    const std::function<bool(const StreamView&)>& pred) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  StreamView v = stream_view(b, name);
  while (!pred(v) && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    v = stream_view(b, name);
  }
  return v;
}

// What a subscriber from an old position and one from 0 see once the log
// starts at `first`: a 4008 close naming `first`, and the retained tuples.
void expect_resume_points(const BrokerProcess& b, const std::string& stream, uint64_t first, uint64_t last) {
  auto old = read_stream(b, stream, 1, last, 10000);
  EXPECT_TRUE(old.tuples.empty());
  ASSERT_TRUE(old.closed) << old.error;
  EXPECT_EQ(old.close_code, kCloseTooOld);
  EXPECT_EQ(old.close_reason, "from=1 is older than the oldest retained tuple " + std::to_string(first) +
                                  "; resume with from=" + std::to_string(first));

  auto oldest = read_stream(b, stream, 0, last, 10000);
  ASSERT_EQ(oldest.tuples.size(), last - first + 1) << oldest.error << oldest.close_reason;
  for (size_t i = 0; i < oldest.tuples.size(); ++i) EXPECT_EQ(oldest.tuples[i].seq, first + i);

  auto resumed = read_stream(b, stream, first, last, 10000);
  ASSERT_EQ(resumed.tuples.size(), last - first + 1) << resumed.error << resumed.close_reason;
  EXPECT_EQ(resumed.tuples.front().seq, first);
}

TEST(BrokerRetention, ByTuplesPerStream) {
  BrokerProcess broker(fast_retention());
  ASSERT_TRUE(broker.start()) << broker.last_error();
  ASSERT_EQ(broker.request("POST", "/v1/streams", stream_spec("t", R"({"max_tuples":25})")).status, 201u);
  ASSERT_EQ(broker.request("POST", "/v1/streams", stream_spec("keep", "")).status, 201u);
  post_records(broker, "t", 10, 10);  // records 1-10, 11-20, ..., 91-100
  const auto posted = Clock::now();
  post_records(broker, "keep", 10, 10);

  // Whole records go: 81-100 is the longest tail within 25 tuples. It
  // happens within a few 100 ms checks, well before the default 5 s.
  auto v = wait_for(broker, "t", [](const StreamView& s) { return s.first_seq >= 81; });
  EXPECT_LT(Clock::now() - posted, std::chrono::seconds(3));
  EXPECT_EQ(v.first_seq, 81u);
  EXPECT_EQ(v.next_seq, 101u);
  EXPECT_EQ(v.tuples, 20u);
  expect_resume_points(broker, "t", 81, 100);

  // A few more checks change nothing, and the stream with the node's
  // default retention (no tuple bound, 1 GiB, 24 h) keeps everything.
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(stream_view(broker, "t").first_seq, 81u);
  auto keep = stream_view(broker, "keep");
  EXPECT_EQ(keep.first_seq, 1u);
  EXPECT_EQ(keep.tuples, 100u);
  EXPECT_EQ(read_stream(broker, "keep", 1, 100).tuples.size(), 100u);

  // Ingest continues after the trim; the bound follows the head.
  post_records(broker, "t", 3, 10);  // 101-110, 111-120, 121-130
  v = wait_for(broker, "t", [](const StreamView& s) { return s.first_seq == 111; });
  EXPECT_EQ(v.first_seq, 111u);
  EXPECT_EQ(v.next_seq, 131u);
}

TEST(BrokerRetention, ByTuplesNodeDefault) {
  BrokerProcess broker(fast_retention(R"("retention":{"max_tuples":30})"));
  ASSERT_TRUE(broker.start()) << broker.last_error();
  ASSERT_EQ(broker.request("POST", "/v1/streams", stream_spec("d", "")).status, 201u);
  auto d = parse(broker.request("GET", "/v1/streams/d", "", kReaderToken).body);
  ASSERT_TRUE(d.IsObject() && d.HasMember("retention"));
  EXPECT_EQ(d["retention"]["max_tuples"].GetUint64(), 30u);
  post_records(broker, "d", 8, 10);  // 1..80
  auto v = wait_for(broker, "d", [](const StreamView& s) { return s.first_seq >= 51; });
  EXPECT_EQ(v.first_seq, 51u);
  EXPECT_EQ(v.tuples, 30u);
  expect_resume_points(broker, "d", 51, 80);
}

TEST(BrokerRetention, ByBytesKeepsTheNewestRecord) {
  BrokerProcess broker(fast_retention());
  ASSERT_TRUE(broker.start()) << broker.last_error();
  // Any byte bound smaller than one record leaves only the newest record,
  // which always stays (it carries the next sequence number).
  ASSERT_EQ(broker.request("POST", "/v1/streams", stream_spec("b", R"({"max_bytes":1})")).status, 201u);
  post_records(broker, "b", 6, 20, 200);  // 1..120 in records of 20
  auto v = wait_for(broker, "b", [](const StreamView& s) { return s.first_seq >= 101; });
  EXPECT_EQ(v.first_seq, 101u);
  EXPECT_EQ(v.next_seq, 121u);
  expect_resume_points(broker, "b", 101, 120);
}

TEST(BrokerRetention, ByAge) {
  BrokerProcess broker(fast_retention());
  ASSERT_TRUE(broker.start()) << broker.last_error();
  ASSERT_EQ(broker.request("POST", "/v1/streams", stream_spec("a", R"({"max_age":"2s"})")).status, 201u);
  post_records(broker, "a", 4, 10);  // 1..40
  // Younger than max_age: every record is kept through several checks.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto young = stream_view(broker, "a");
  EXPECT_EQ(young.first_seq, 1u);
  EXPECT_EQ(young.tuples, 40u);
  // Once older, all but the newest record go (one check may fall between
  // two records' expiry, so wait for the end state rather than the first
  // change); the newest stays through further checks, and a newer record
  // then lets it go as well.
  auto v = wait_for(broker, "a", [](const StreamView& s) { return s.first_seq >= 31; });
  EXPECT_EQ(v.first_seq, 31u);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(stream_view(broker, "a").first_seq, 31u);
  post_records(broker, "a", 1, 10);  // 41..50
  v = wait_for(broker, "a", [](const StreamView& s) { return s.first_seq >= 41; });
  EXPECT_EQ(v.first_seq, 41u);
  EXPECT_EQ(v.next_seq, 51u);
  expect_resume_points(broker, "a", 41, 50);
}

const char* kReaderQuery = R"({"name":"reader","inputs":[{"name":"q","schema":[
    {"name":"k","type":"int64"},{"name":"note","type":"string"}]}],
  "boxes":[{"id":"f","type":"filter","options":{"predicates":["k < 0"],"drop_unmatched":true}}],
  "arcs":[{"from":"q","to":"f"}],"outputs":[{"name":"none","from":"f"}]})";

uint64_t query_lag(const BrokerProcess& b, const std::string& name) {
  auto d = parse(b.request("GET", "/v1/queries/" + name, "", kReaderToken).body);
  return d.IsObject() && d.HasMember("lag_tuples") ? d["lag_tuples"].GetUint64() : UINT64_MAX;
}

void wait_caught_up(const BrokerProcess& b, const std::string& query) {
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (query_lag(b, query) != 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(query_lag(b, query), 0u);
}

// A query's input is kept until its checkpoint covers it: after a crash the
// query replays from there.
TEST(BrokerRetention, QueryCheckpointPinsItsInput) {
  BrokerProcess broker(fast_retention());
  ASSERT_TRUE(broker.start()) << broker.last_error();
  ASSERT_EQ(broker.request("POST", "/v1/streams", stream_spec("q", R"({"max_tuples":25})")).status, 201u);
  ASSERT_EQ(broker.request("POST", "/v1/queries", kReaderQuery).status, 201u);
  post_records(broker, "q", 10, 10);
  wait_caught_up(broker, "reader");
  // Consumed, but not checkpointed: ten checks later nothing has gone.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  auto pinned = stream_view(broker, "q");
  EXPECT_EQ(pinned.first_seq, 1u);
  EXPECT_EQ(pinned.tuples, 100u);
  auto cp = broker.request("POST", "/v1/checkpoints", "");
  ASSERT_EQ(cp.status, 200u) << cp.body;
  auto v = wait_for(broker, "q", [](const StreamView& s) { return s.first_seq >= 81; });
  EXPECT_EQ(v.first_seq, 81u);
  expect_resume_points(broker, "q", 81, 100);
}

// Subscribers do not pin the log (docs/operations.md): one that is attached
// but still catching up when retention drops its next tuple is closed with
// 4008 and told where to resume, after everything before the gap.
//
// Deterministic set-up: a query pins the log while ~32 MB of tuples are
// ingested and the subscriber attaches from seq 1 and stops reading, so the
// node's catch-up stalls on the subscriber's send buffer (8 MiB) and the
// sockets' buffers, far behind the head. Only then does a checkpoint release
// the pin and let retention (max_tuples 1) trim everything but the newest record.
TEST(BrokerRetention, SubscriberCatchingUpDoesNotPinAndIsClosedWith4008) {
  BrokerProcess broker(fast_retention());
  ASSERT_TRUE(broker.start()) << broker.last_error();
  ASSERT_EQ(broker.request("POST", "/v1/streams", stream_spec("q", R"({"max_tuples":1})")).status, 201u);
  ASSERT_EQ(broker.request("POST", "/v1/queries", kReaderQuery).status, 201u);
  constexpr int kRecords = 320, kPerRecord = 25;
  constexpr size_t kNote = 4000;  // ~100 KB per record, ~32 MB in all
  {
    std::vector<std::thread> feeders;
    for (int t = 0; t < 4; ++t)
      feeders.emplace_back([&] { post_records(broker, "q", kRecords / 4, kPerRecord, kNote); });
    for (auto& f : feeders) f.join();
  }
  const uint64_t last = uint64_t{kRecords} * kPerRecord;
  ASSERT_EQ(stream_view(broker, "q").next_seq, last + 1);
  wait_caught_up(broker, "reader");
  EXPECT_EQ(stream_view(broker, "q").first_seq, 1u);  // pinned by the query

  auto ws = http::WsClient::connect(broker.client_options(), "/v1/streams/q/subscribe?from=1",
                                            {{"authorization", std::string("Bearer ") + kReaderToken}});
  ASSERT_TRUE(ws.ok()) << ws.error().message;
  std::vector<Tuple> got;
  auto first = (*ws)->receive(10000);
  ASSERT_TRUE(first.ok()) << first.error().message;
  ASSERT_FALSE(first->closed) << first->close_reason;
  for (auto& t : parse_lines(first->data)) got.push_back(t);
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.front().seq, 1u);

  // The subscriber is attached and behind; release the query's pin.
  ASSERT_EQ(broker.request("POST", "/v1/checkpoints", "").status, 200u);
  const uint64_t newest_first = last - kPerRecord + 1;
  auto v = wait_for(broker, "q", [&](const StreamView& s) { return s.first_seq == newest_first; });
  ASSERT_EQ(v.first_seq, newest_first);

  // Now read on: what was already on its way arrives in order, then 4008.
  bool closed = false;
  uint16_t code = 0;
  std::string reason;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (!closed && Clock::now() < deadline) {
    auto m = (*ws)->receive(1000);
    if (!m.ok()) {
      ASSERT_EQ(m.error().code, Errc::unavailable) << m.error().message;
      continue;
    }
    if (m->closed) {
      closed = true;
      code = m->close_code;
      reason = m->close_reason;
      break;
    }
    for (auto& t : parse_lines(m->data)) got.push_back(t);
  }
  ASSERT_TRUE(closed);
  EXPECT_EQ(code, kCloseTooOld) << reason;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i].seq, i + 1);
  ASSERT_LT(got.size(), newest_first - 1) << "the subscriber was not behind";
  EXPECT_EQ(reason, "from=" + std::to_string(got.size() + 1) + " is older than the oldest retained tuple " +
                        std::to_string(newest_first) + "; resume with from=" + std::to_string(newest_first));

  // Resuming where it was told gets the rest.
  auto rest = read_stream(broker, "q", newest_first, last, 10000);
  ASSERT_EQ(rest.tuples.size(), static_cast<size_t>(kPerRecord)) << rest.error << rest.close_reason;
  EXPECT_EQ(rest.tuples.front().seq, newest_first);
}

}  // namespace
}  // namespace entente::testing
