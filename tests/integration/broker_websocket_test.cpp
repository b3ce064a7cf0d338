// WebSocket subscribe and publish against a real broker process.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "engine/codec.h"
#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/ws_reader.h"

namespace entente::testing {
namespace {

const char* kStream = R"({"name":"ticks","schema":[{"name":"k","type":"int64"},{"name":"note","type":"string"}]})";

std::string rows(int from, int n, size_t note_bytes = 8) {
  std::string s;
  for (int i = from; i < from + n; ++i)
    s += "{\"k\":" + std::to_string(i) + ",\"note\":\"" + std::string(note_bytes, 'x') + "\"}\n";
  return s;
}

void post(const BrokerProcess& b, const std::string& body) {
  auto r = b.request("POST", "/v1/streams/ticks/tuples", body, kPublisherToken, "application/x-ndjson");
  ASSERT_EQ(r.status, 200u) << r.body;
}

std::unique_ptr<http::WsClient> connect(const BrokerProcess& b, const std::string& target,
                                                const char* token = kReaderToken) {
  auto ws = http::WsClient::connect(b.client_options(), target,
                                            {{"authorization", std::string("Bearer ") + token}});
  EXPECT_TRUE(ws.ok()) << (ws.ok() ? "" : ws.error().message);
  return ws.ok() ? std::move(ws).value() : nullptr;
}

class BrokerWebSocket : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(broker_.start()) << broker_.last_error();
    ASSERT_EQ(broker_.request("POST", "/v1/streams", kStream).status, 201u);
  }
  BrokerProcess broker_{with_api("\"limits\":{\"ws_send_buffer_bytes\":65536}")};
};

TEST_F(BrokerWebSocket, SubscribeFromTheStartThenLive) {
  post(broker_, rows(0, 10));
  post(broker_, rows(10, 10));
  auto ws = connect(broker_, "/v1/streams/ticks/subscribe?from=1");
  ASSERT_TRUE(ws);
  std::vector<Tuple> got;
  auto receive_until = [&](uint64_t seq) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((got.empty() || got.back().seq < seq) && std::chrono::steady_clock::now() < deadline) {
      auto m = ws->receive(200);
      if (!m.ok()) continue;
      ASSERT_FALSE(m->closed) << m->close_reason;
      for (auto& t : parse_lines(m->data)) got.push_back(t);
    }
  };
  receive_until(20);
  post(broker_, rows(20, 5));  // live
  receive_until(25);
  ASSERT_EQ(got.size(), 25u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].seq, i + 1);
  EXPECT_NE(got[0].line.find("\"k\":0"), std::string::npos) << got[0].line;
}

TEST_F(BrokerWebSocket, ResumeAfterDisconnectHasNoGapNoDuplicate) {
  post(broker_, rows(0, 30));
  auto first = read_stream(broker_, "ticks", 1, 30);
  ASSERT_EQ(first.tuples.size(), 30u);
  post(broker_, rows(30, 30));
  // Resume in the middle of a record.
  auto second = read_stream(broker_, "ticks", 17, 60);
  ASSERT_EQ(second.tuples.size(), 44u) << second.error;
  for (size_t i = 0; i < second.tuples.size(); ++i) EXPECT_EQ(second.tuples[i].seq, 17 + i);
}

TEST_F(BrokerWebSocket, BinaryFormatCarriesTheEngineEncoding) {
  post(broker_, rows(0, 5));
  auto ws = connect(broker_, "/v1/streams/ticks/subscribe?from=1&format=binary");
  ASSERT_TRUE(ws);
  auto m = ws->receive(5000);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->binary);
  std::string_view in = m->data;
  auto b = engine::decode_batch(in);
  ASSERT_TRUE(b.ok()) << b.error().message;
  ASSERT_EQ(b->rows(), 5u);
  EXPECT_EQ(b->seq[0], 1u);
  EXPECT_EQ(b->seq[4], 5u);
}

TEST_F(BrokerWebSocket, SlowConsumerIsClosedWithResumePoint) {
  auto ws = connect(broker_, "/v1/streams/ticks/subscribe?from=1");
  ASSERT_TRUE(ws);
  // Far more than the socket buffers and the 64 KiB send buffer hold,
  // while the client reads nothing.
  for (int i = 0; i < 40; ++i) post(broker_, rows(i * 2000, 2000, 200));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  bool closed = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!closed && std::chrono::steady_clock::now() < deadline) {
    auto m = ws->receive(500);
    if (!m.ok()) {
      if (m.error().code == Errc::unavailable) continue;
      FAIL() << m.error().message;
    }
    if (m->closed) {
      closed = true;
      EXPECT_EQ(m->close_code, 4001);
      EXPECT_NE(m->close_reason.find("resume with from="), std::string::npos) << m->close_reason;
    }
  }
  EXPECT_TRUE(closed);
  // The node keeps serving.
  EXPECT_EQ(broker_.request("GET", "/v1/health", "", "").status, 200u);
}

TEST_F(BrokerWebSocket, PublishAcknowledgesInOrder) {
  auto ws = connect(broker_, "/v1/streams/ticks/publish", kPublisherToken);
  ASSERT_TRUE(ws);
  ASSERT_TRUE(ws->send(rows(0, 3)).ok());
  ASSERT_TRUE(ws->send("[{\"k\":100,\"note\":\"a\"}]").ok());
  ASSERT_TRUE(ws->send("{\"k\":\"not a number\",\"note\":\"b\"}\n").ok());
  ASSERT_TRUE(ws->send(rows(3, 2)).ok());
  std::vector<std::string> answers;
  while (answers.size() < 4) {
    auto m = ws->receive(5000);
    ASSERT_TRUE(m.ok()) << m.error().message;
    ASSERT_FALSE(m->closed);
    answers.push_back(m->data);
  }
  EXPECT_NE(answers[0].find("\"first_seq\":1,\"last_seq\":3"), std::string::npos) << answers[0];
  EXPECT_NE(answers[1].find("\"first_seq\":4,\"last_seq\":4"), std::string::npos) << answers[1];
  EXPECT_NE(answers[2].find("\"error\""), std::string::npos) << answers[2];
  EXPECT_NE(answers[3].find("\"first_seq\":5,\"last_seq\":6"), std::string::npos) << answers[3];
  EXPECT_EQ(next_seq(broker_, "ticks"), 7u);
}

// One rule for the members a subscriber's rows carry (docs/api.md): a
// published row with `_seq` is refused, naming the row and the field; on
// this stream (no event-time field) `_time` sets the event time.
TEST_F(BrokerWebSocket, PublishRefusesRowsCarryingSeq) {
  auto ws = connect(broker_, "/v1/streams/ticks/publish", kPublisherToken);
  ASSERT_TRUE(ws);
  ASSERT_TRUE(ws->send("{\"k\":1,\"note\":\"a\"}\n{\"_seq\":7,\"k\":2,\"note\":\"b\"}\n").ok());
  ASSERT_TRUE(ws->send(R"([{"k":3,"note":"c","_seq":1}])").ok());
  ASSERT_TRUE(ws->send(R"([{"k":4,"note":"d","_time":1234}])").ok());
  std::vector<std::string> answers;
  while (answers.size() < 3) {
    auto m = ws->receive(5000);
    ASSERT_TRUE(m.ok()) << m.error().message;
    ASSERT_FALSE(m->closed);
    answers.push_back(m->data);
  }
  for (int i = 0; i < 2; ++i) {
    rapidjson::Document d;
    d.Parse(answers[i].c_str());
    ASSERT_TRUE(d.IsObject() && d.HasMember("error")) << answers[i];
    EXPECT_EQ(d["error"]["status"].GetUint(), 400u) << answers[i];
    EXPECT_EQ(d["error"]["errors"][0]["row"].GetUint(), i == 0 ? 1u : 0u) << answers[i];
    EXPECT_STREQ(d["error"]["errors"][0]["field"].GetString(), "_seq") << answers[i];
  }
  EXPECT_NE(answers[2].find("\"first_seq\":1,\"last_seq\":1"), std::string::npos) << answers[2];
  auto read = read_stream(broker_, "ticks", 1, 1);
  ASSERT_EQ(read.tuples.size(), 1u) << read.error;
  EXPECT_NE(read.tuples[0].line.find("\"_time\":1234,\"k\":4"), std::string::npos) << read.tuples[0].line;
}

// A binary message is one batch in the engine's encoding with exactly the
// stream's schema (docs/api.md, "Publish"); anything else is refused whole,
// with what is wrong, and nothing of it is stored.
TEST_F(BrokerWebSocket, PublishBinaryBatchesWholeOrNotAtAll) {
  auto first_binary_message = [&](const std::string& stream) {
    auto sub = connect(broker_, "/v1/streams/" + stream + "/subscribe?from=1&format=binary");
    EXPECT_TRUE(sub);
    if (!sub) return std::string();
    auto m = sub->receive(5000);
    EXPECT_TRUE(m.ok() && m->binary);
    return m.ok() ? m->data : std::string();
  };
  post(broker_, rows(0, 5));
  const std::string ticks = first_binary_message("ticks");
  ASSERT_FALSE(ticks.empty());
  ASSERT_EQ(broker_.request("POST", "/v1/streams",
                            R"({"name":"other","schema":[{"name":"k","type":"int64"}]})").status,
            201u);
  ASSERT_EQ(broker_.request("POST", "/v1/streams/other/tuples", "{\"k\":1}\n", kPublisherToken,
                            "application/x-ndjson").status,
            200u);
  const std::string other = first_binary_message("other");
  ASSERT_FALSE(other.empty());

  auto ws = connect(broker_, "/v1/streams/ticks/publish", kPublisherToken);
  ASSERT_TRUE(ws);
  ASSERT_TRUE(ws->send(ticks + "xyz", true).ok());
  ASSERT_TRUE(ws->send(other, true).ok());
  ASSERT_TRUE(ws->send(std::string("\x01\x02", 2), true).ok());
  ASSERT_TRUE(ws->send(ticks, true).ok());
  std::vector<std::string> answers;
  while (answers.size() < 4) {
    auto m = ws->receive(5000);
    ASSERT_TRUE(m.ok()) << m.error().message;
    ASSERT_FALSE(m->closed);
    answers.push_back(m->data);
  }
  const char* refusals[] = {"binary batch: 3 bytes after the batch", "is not the stream's", "binary batch: "};
  for (int i = 0; i < 3; ++i) {
    rapidjson::Document d;
    d.Parse(answers[i].c_str());
    ASSERT_TRUE(d.IsObject() && d.HasMember("error")) << answers[i];
    EXPECT_EQ(d["error"]["status"].GetUint(), 400u) << answers[i];
    EXPECT_NE(std::string(d["error"]["detail"].GetString()).find(refusals[i]), std::string::npos) << answers[i];
  }
  // The same five rows again, numbered after the first five.
  EXPECT_NE(answers[3].find("\"count\":5,\"first_seq\":6,\"last_seq\":10"), std::string::npos) << answers[3];
  EXPECT_EQ(next_seq(broker_, "ticks"), 11u);
}

TEST_F(BrokerWebSocket, UpgradeRefusals) {
  auto ws = http::WsClient::connect(broker_.client_options(), "/v1/streams/ticks/subscribe", {});
  ASSERT_FALSE(ws.ok());
  EXPECT_NE(ws.error().message.find("401"), std::string::npos) << ws.error().message;
  ws = http::WsClient::connect(broker_.client_options(), "/v1/streams/ticks/publish",
                                       {{"authorization", std::string("Bearer ") + kReaderToken}});
  ASSERT_FALSE(ws.ok());
  EXPECT_NE(ws.error().message.find("403"), std::string::npos) << ws.error().message;
  ws = http::WsClient::connect(broker_.client_options(), "/v1/streams/nope/subscribe",
                                       {{"authorization", std::string("Bearer ") + kReaderToken}});
  ASSERT_FALSE(ws.ok());
  EXPECT_NE(ws.error().message.find("404"), std::string::npos) << ws.error().message;
  ws = http::WsClient::connect(broker_.client_options(), "/v1/streams/ticks/subscribe?format=xml",
                                       {{"authorization", std::string("Bearer ") + kReaderToken}});
  ASSERT_FALSE(ws.ok());
  EXPECT_NE(ws.error().message.find("400"), std::string::npos) << ws.error().message;
}

TEST_F(BrokerWebSocket, DeletedStreamClosesSubscribers) {
  auto ws = connect(broker_, "/v1/streams/ticks/subscribe");
  ASSERT_TRUE(ws);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(broker_.request("DELETE", "/v1/streams/ticks").status, 204u);
  auto m = ws->receive(5000);
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_TRUE(m->closed);
  EXPECT_EQ(m->close_code, 4004);
}

}  // namespace
}  // namespace entente::testing
