// The dashboard (docs/dashboard.md) against a real broker process: its
// static files as compiled in, the session cookie a browser trades its
// token for, and the token offered in a WebSocket subprotocol. The page
// itself is tested in a browser by scripts/ui-test.sh.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "broker/config.h"
#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/cluster.h"
#include "tests/integration/support/ws_reader.h"

namespace entente::testing {
namespace {

using Headers = std::vector<std::pair<std::string, std::string>>;

const char* kStream = R"({"name":"ticks","schema":[{"name":"k","type":"int64"}]})";

std::string source_file(const std::string& path) {
  std::ifstream f(std::string(ENTENTE_SOURCE_DIR) + "/" + path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class BrokerUi : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(broker_.start()) << broker_.last_error();
    ASSERT_EQ(broker_.request("POST", "/v1/streams", kStream).status, 201u);
    auto r = broker_.request("POST", "/v1/streams/ticks/tuples", "{\"k\":1}\n{\"k\":2}\n", kPublisherToken,
                             "application/x-ndjson");
    ASSERT_EQ(r.status, 200u) << r.body;
  }

  // One request with exactly these headers (no token unless given).
  http::ClientResponse get(const std::string& method, const std::string& target, const Headers& headers,
                           const std::string& body = {}) {
    auto c = broker_.client();
    if (!c) return {};
    auto r = c->request(method, target, body, "application/json", headers);
    EXPECT_TRUE(r.ok()) << target << ": " << (r.ok() ? "" : r.error().message);
    return r.ok() ? std::move(r).value() : http::ClientResponse{};
  }

  // POST /v1/ui/session with `token`; the cookie's "name=value".
  std::string session(const std::string& token, const std::string& body = {}) {
    auto r = get("POST", "/v1/ui/session", {{"authorization", "Bearer " + token}}, body);
    EXPECT_EQ(r.status, 201u) << r.body;
    const std::string c(r.header("set-cookie").value_or(""));
    return c.substr(0, c.find(';'));
  }

  // Subscribes to ticks from 1 with these upgrade headers and reads the
  // two tuples; the refusal's message when the upgrade is refused.
  std::string subscribe(const Headers& headers) {
    auto ws =
        http::WsClient::connect(broker_.client_options(), "/v1/streams/ticks/subscribe?from=1", headers);
    if (!ws.ok()) return ws.error().message;
    std::vector<Tuple> got;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (got.size() < 2 && std::chrono::steady_clock::now() < deadline) {
      auto m = (*ws)->receive(200);
      if (!m.ok()) continue;
      if (m->closed) return "closed: " + m->close_reason;
      for (auto& t : parse_lines(m->data)) got.push_back(t);
    }
    return got.size() == 2 && got[1].seq == 2 ? "ok" : "read " + std::to_string(got.size()) + " tuples";
  }

  BrokerProcess broker_;
};

TEST_F(BrokerUi, StaticFilesAreServedWithoutATokenWithTypesAndValidators) {
  auto redirect = get("GET", "/ui", {});
  EXPECT_EQ(redirect.status, 301u);
  EXPECT_EQ(redirect.header("location").value_or(""), "/ui/");

  struct File {
    const char* target;
    const char* source;
    const char* type;
  };
  for (const File& f : {File{"/ui/", "broker/ui/index.html", "text/html; charset=utf-8"},
                        File{"/ui/app.js", "broker/ui/app.js", "text/javascript; charset=utf-8"},
                        File{"/ui/style.css", "broker/ui/style.css", "text/css; charset=utf-8"}}) {
    SCOPED_TRACE(f.target);
    auto r = get("GET", f.target, {});
    ASSERT_EQ(r.status, 200u) << r.body;
    EXPECT_EQ(r.header("content-type").value_or(""), f.type);
    EXPECT_EQ(r.body, source_file(f.source));  // exactly the file, compiled in
    EXPECT_EQ(r.header("cache-control").value_or(""), "no-cache");
    EXPECT_EQ(r.header("x-content-type-options").value_or(""), "nosniff");
    EXPECT_NE(r.header("content-security-policy").value_or("").find("connect-src 'self'"), std::string::npos);
    const std::string etag(r.header("etag").value_or(""));
    ASSERT_GE(etag.size(), 10u);
    // Revalidation: the same ETag is a 304 without a body, another a 200.
    auto same = get("GET", f.target, {{"if-none-match", etag}});
    EXPECT_EQ(same.status, 304u);
    EXPECT_TRUE(same.body.empty());
    EXPECT_EQ(get("GET", f.target, {{"if-none-match", "\"other\""}}).status, 200u);
  }
  auto missing = get("GET", "/ui/secrets.json", {});
  EXPECT_EQ(missing.status, 404u);
  EXPECT_NE(missing.body.find("the dashboard has no file 'secrets.json'"), std::string::npos) << missing.body;
  EXPECT_EQ(get("GET", "/ui/..%2Fnode.json", {}).status, 404u);
}

// The next message on a live dashboard socket, parsed; a null document on
// a close (its code in `closed`) or after 10 s without one.
rapidjson::Document next_message(http::WsClient& ws, uint16_t* closed = nullptr) {
  rapidjson::Document d;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    auto m = ws.receive(200);
    if (!m.ok()) continue;
    if (m->closed) {
      if (closed) *closed = m->close_code;
      break;
    }
    d.Parse(m->data.c_str());
    return d;
  }
  d.SetNull();
  return d;
}

// The stream names in a snapshot's part for /v1/streams.
std::vector<std::string> streams_in(const rapidjson::Document& snap) {
  std::vector<std::string> out;
  const auto& part = snap["parts"]["/v1/streams"];
  for (const auto& s : part["body"]["streams"].GetArray()) out.emplace_back(s["name"].GetString());
  return out;
}

TEST_F(BrokerUi, TheLiveSocketPushesSnapshotsOfTheWatchedResourcesAsTheRestApiAnswersThem) {
  const std::string offer = std::string("entente.v1, entente.bearer.") + kReaderToken;
  auto ws = http::WsClient::connect(broker_.client_options(), "/v1/ui/live", {{"sec-websocket-protocol", offer}});
  ASSERT_TRUE(ws.ok()) << ws.error().message;
  ASSERT_TRUE((*ws)->send(R"({"watch":["/v1/streams","/v1/nodes","/v1/imports"],"interval_ms":250})").ok());
  auto first = next_message(**ws);
  ASSERT_TRUE(first.IsObject());
  EXPECT_STREQ(first["type"].GetString(), "snapshot");
  EXPECT_EQ(streams_in(first), std::vector<std::string>{"ticks"});
  EXPECT_EQ(first["parts"]["/v1/nodes"]["status"].GetUint(), 200u);
  // A node with no federation section has no imports: the REST answer, as is.
  EXPECT_EQ(first["parts"]["/v1/imports"]["status"].GetUint(),
            broker_.request("GET", "/v1/imports", "", kReaderToken).status);

  // A stream created meanwhile is in a later snapshot, unasked.
  ASSERT_EQ(broker_.request("POST", "/v1/streams", R"({"name":"fresh","schema":[{"name":"k","type":"int64"}]})")
                .status,
            201u);
  bool seen = false;
  for (int i = 0; i < 20 && !seen; ++i) {
    auto snap = next_message(**ws);
    ASSERT_TRUE(snap.IsObject());
    EXPECT_GT(snap["seq"].GetUint64(), first["seq"].GetUint64());
    const auto names = streams_in(snap);
    seen = std::find(names.begin(), names.end(), "fresh") != names.end();
  }
  EXPECT_TRUE(seen) << "no snapshot listed the stream created after the first";

  // What may not be watched is refused with a reason; the socket stays.
  const std::pair<const char*, const char*> refused[] = {
      {R"({"watch":["/v1/streams/ticks/tuples"]})", "no GET resource at /v1/streams/ticks/tuples"},
      {R"({"watch":["/v1/ui/live"]})", "no GET resource at /v1/ui/live"},
      {R"({"watch":["/metrics"]})", "is not under /v1/"},
      {R"({"watch":["/v1/streams?x=1"]})", "is not a plain path"},
      {R"({"watch":["/v1/streams"],"interval_ms":10})", "interval_ms: expected an integer from 250 to 60000"},
      {R"({"watch":"/v1/streams"})", "watch: expected an array of paths"},
      {R"({"watch":[],"other":1})", "unknown member 'other'"},
      {"not json", "expected a JSON object"},
  };
  for (const auto& [message, why] : refused) {
    ASSERT_TRUE((*ws)->send(message).ok());
    bool answered = false;
    for (int i = 0; i < 20 && !answered; ++i) {
      auto m = next_message(**ws);
      ASSERT_TRUE(m.IsObject()) << message;
      if (std::string_view(m["type"].GetString()) != "error") continue;  // a snapshot already on its way
      answered = true;
      EXPECT_NE(std::string(m["detail"].GetString()).find(why), std::string::npos)
          << message << ": " << m["detail"].GetString();
    }
    EXPECT_TRUE(answered) << message;
  }
  std::string many = R"({"watch":[)";
  for (int i = 0; i < 33; ++i) many += std::string(i ? "," : "") + "\"/v1/streams/s" + std::to_string(i) + "\"";
  ASSERT_TRUE((*ws)->send(many + "]}").ok());
  bool limited = false;
  for (int i = 0; i < 20 && !limited; ++i) {
    auto m = next_message(**ws);
    ASSERT_TRUE(m.IsObject());
    limited = std::string_view(m["type"].GetString()) == "error" &&
              std::string(m["detail"].GetString()).find("at most 32 paths") != std::string::npos;
  }
  EXPECT_TRUE(limited);
  // Still served after the refusals: the last list taken is pushed.
  auto after = next_message(**ws);
  ASSERT_TRUE(after.IsObject());
  EXPECT_STREQ(after["type"].GetString(), "snapshot");

  // A bad token is refused at the upgrade.
  auto bad = http::WsClient::connect(broker_.client_options(), "/v1/ui/live",
                                     {{"sec-websocket-protocol", "entente.v1, entente.bearer.not-a-token"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("HTTP 401"), std::string::npos) << bad.error().message;
}

TEST(BrokerUiLive, ATokenRemovedByAReloadEndsItsLiveSessionWith4401) {
  BrokerOptions options;
  options.extra_tokens = R"({"name":"wall","role":"reader","sha256":")" + broker::hash_token("wall-screen-token") + "\"}";
  BrokerProcess broker(options);
  ASSERT_TRUE(broker.start()) << broker.last_error();
  auto ws = http::WsClient::connect(broker.client_options(), "/v1/ui/live",
                                    {{"sec-websocket-protocol", "entente.v1, entente.bearer.wall-screen-token"}});
  ASSERT_TRUE(ws.ok()) << ws.error().message;
  ASSERT_TRUE((*ws)->send(R"({"watch":["/v1/nodes"],"interval_ms":250})").ok());
  ASSERT_TRUE(next_message(**ws).IsObject());

  // The configuration without the token, then SIGHUP.
  std::ifstream in(broker.config_path());
  std::stringstream text;
  text << in.rdbuf();
  std::string config = text.str();
  const size_t at = config.find(R"(,{"name":"wall")");
  ASSERT_NE(at, std::string::npos) << config;
  config.erase(at, config.find('}', at) + 1 - at);
  std::ofstream(broker.config_path(), std::ios::trunc) << config;
  ASSERT_EQ(::kill(broker.pid(), SIGHUP), 0);

  uint16_t code = 0;
  for (int i = 0; i < 50 && code == 0; ++i) {
    if (next_message(**ws, &code).IsNull()) break;
  }
  EXPECT_EQ(code, 4401) << broker.stderr_text();
}

TEST_F(BrokerUi, WebSocketTakesTheTokenInASubprotocolAndEchoesTheRealOne) {
  const std::string good = std::string("entente.v1, entente.bearer.") + kReaderToken;
  EXPECT_EQ(subscribe({{"sec-websocket-protocol", good}}), "ok");
  // The answer names entente.v1, never the token: read on a raw upgrade.
  auto c = broker_.client();
  ASSERT_TRUE(c);
  auto raw = c->raw(
      "GET /v1/streams/ticks/subscribe HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: "
      "websocket\r\n"
      "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: " +
      good + "\r\n\r\n");
  ASSERT_TRUE(raw.ok()) << raw.error().message;
  EXPECT_EQ(raw->status, 101u) << raw->body;
  EXPECT_EQ(raw->header("sec-websocket-protocol").value_or(""), "entente.v1");

  auto bad = subscribe({{"sec-websocket-protocol", "entente.v1, entente.bearer.not-a-token"}});
  EXPECT_NE(bad.find("HTTP 401"), std::string::npos) << bad;
  EXPECT_NE(bad.find("the bearer token is not valid for this node"), std::string::npos) << bad;
  // Without the protocol to answer with, a browser would fail the handshake.
  auto alone = subscribe({{"sec-websocket-protocol", std::string("entente.bearer.") + kReaderToken}});
  EXPECT_NE(alone.find("HTTP 400"), std::string::npos) << alone;
  EXPECT_NE(alone.find("needs the subprotocol entente.v1"), std::string::npos) << alone;
  // The token's role still counts: a reader may not publish.
  auto publish = http::WsClient::connect(broker_.client_options(), "/v1/streams/ticks/publish",
                                         {{"sec-websocket-protocol", good}});
  ASSERT_FALSE(publish.ok());
  EXPECT_NE(publish.error().message.find("HTTP 403"), std::string::npos) << publish.error().message;
}

TEST_F(BrokerUi, SessionCookieReadsUntilItEndsAndNeverWrites) {
  auto none = get("POST", "/v1/ui/session", {});
  EXPECT_EQ(none.status, 401u) << none.body;
  auto r = get("POST", "/v1/ui/session", {{"authorization", std::string("Bearer ") + kReaderToken}});
  ASSERT_EQ(r.status, 201u) << r.body;
  EXPECT_NE(r.body.find("\"role\":\"reader\""), std::string::npos) << r.body;
  const std::string set(r.header("set-cookie").value_or(""));
  for (const char* attr :
       {"entente_session=", "; Path=/", "; Max-Age=600", "; HttpOnly", "; SameSite=Strict"})
    EXPECT_NE(set.find(attr), std::string::npos) << attr << " in " << set;
  const std::string cookie = set.substr(0, set.find(';'));

  EXPECT_EQ(get("GET", "/v1/streams", {{"cookie", "theme=dark; " + cookie}}).status, 200u);
  EXPECT_EQ(subscribe({{"cookie", cookie}}), "ok");
  // A cookie never stands for a token on a change, even an admin's.
  const std::string admin = session(kAdminToken);
  auto write = get("POST", "/v1/streams", {{"cookie", admin}}, R"({"name":"other","schema":[]})");
  EXPECT_EQ(write.status, 401u) << write.body;
  auto renew = get("POST", "/v1/ui/session", {{"cookie", admin}});
  EXPECT_EQ(renew.status, 401u) << renew.body;

  auto unknown = get("GET", "/v1/streams", {{"cookie", "entente_session=0123abcd"}});
  EXPECT_EQ(unknown.status, 401u);
  EXPECT_NE(unknown.body.find("the dashboard session has ended or is unknown"), std::string::npos)
      << unknown.body;
  EXPECT_NE(subscribe({{"cookie", "entente_session=0123abcd"}}).find("HTTP 401"), std::string::npos);

  // Signing out ends it.
  auto out = get("DELETE", "/v1/ui/session", {{"cookie", cookie}});
  EXPECT_EQ(out.status, 204u);
  EXPECT_NE(std::string(out.header("set-cookie").value_or("")).find("Max-Age=0"), std::string::npos);
  EXPECT_EQ(get("GET", "/v1/streams", {{"cookie", cookie}}).status, 401u);
}

TEST_F(BrokerUi, SessionExpiresAndItsLifeIsBounded) {
  const std::string short_lived = session(kReaderToken, R"({"ttl_seconds":1})");
  EXPECT_EQ(get("GET", "/v1/streams", {{"cookie", short_lived}}).status, 200u);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_EQ(get("GET", "/v1/streams", {{"cookie", short_lived}}).status, 401u);

  for (const char* body : {R"({"ttl_seconds":0})", R"({"ttl_seconds":3601})", R"({"ttl":5})", "[1]", "{"}) {
    auto r = get("POST", "/v1/ui/session", {{"authorization", std::string("Bearer ") + kReaderToken}}, body);
    EXPECT_EQ(r.status, 400u) << body << ": " << r.body;
    EXPECT_NE(r.body.find("\"detail\""), std::string::npos) << r.body;
  }
}

// In a domain of two nodes, what n2 forwards to n1 (which leads the
// stream) carries the browser's token: a cookie on a GET, a subprotocol on
// a subscription.
TEST(BrokerUiCluster, CookieAndSubprotocolTokensAreForwardedToTheLeader) {
  if (EtcdProcess::binary().empty()) GTEST_SKIP() << EtcdProcess::kNotInstalled;
  EtcdProcess etcd("etcd-ui");
  ASSERT_TRUE(etcd.start()) << etcd.last_error();
  std::vector<std::unique_ptr<BrokerProcess>> nodes;
  for (const char* name : {"n1", "n2"}) {
    BrokerOptions o;
    o.node = name;
    o.extra_config = cluster_section(etcd);
    nodes.push_back(std::make_unique<BrokerProcess>(o));
    ASSERT_TRUE(nodes.back()->start()) << nodes.back()->last_error();
  }
  BrokerProcess& n2 = *nodes[1];
  ASSERT_TRUE(eventually(20, [&] { return domain_up({nodes[0].get(), &n2}, 2); }));
  auto created = n2.request("POST", "/v1/streams",
                            R"({"name":"ticks","node":"n1","schema":[{"name":"k","type":"int64"}]})");
  ASSERT_EQ(created.status, 201u) << created.body;
  auto posted = n2.request("POST", "/v1/streams/ticks/tuples", "{\"k\":1}\n{\"k\":2}\n", kPublisherToken,
                           "application/x-ndjson");
  ASSERT_EQ(posted.status, 200u) << posted.body;

  auto r = n2.client()->request("POST", "/v1/ui/session", {}, "application/json",
                                {{"authorization", std::string("Bearer ") + kReaderToken}});
  ASSERT_TRUE(r.ok() && r->status == 201u);
  const std::string set(r->header("set-cookie").value_or(""));
  const std::string cookie = set.substr(0, set.find(';'));
  auto info = n2.client()->request("GET", "/v1/streams/ticks", {}, "application/json", {{"cookie", cookie}});
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->status, 200u) << info->body;
  EXPECT_NE(info->body.find("\"next_seq\":3"), std::string::npos) << info->body;

  auto ws = http::WsClient::connect(
      n2.client_options(), "/v1/streams/ticks/subscribe?from=1",
      {{"sec-websocket-protocol", std::string("entente.v1, entente.bearer.") + kReaderToken}});
  ASSERT_TRUE(ws.ok()) << ws.error().message;
  std::vector<Tuple> got;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (got.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    auto m = (*ws)->receive(200);
    if (!m.ok()) continue;
    ASSERT_FALSE(m->closed) << m->close_reason;
    for (auto& t : parse_lines(m->data)) got.push_back(t);
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].seq, 2u);
  // Both went to n1, with the token as an Authorization header.
  auto metrics = n2.request("GET", "/metrics", {}, kReaderToken);
  EXPECT_NE(metrics.body.find(R"(entente_cluster_forwarded_total{kind="websocket",node="n1"} 1)"),
            std::string::npos);
  EXPECT_NE(metrics.body.find(R"(entente_cluster_forwarded_total{kind="http",node="n1"})"),
            std::string::npos);
}

}  // namespace
}  // namespace entente::testing
