// cluster::Etcd against a real etcd (tests/support/etcd_process.h): keys
// and values as bytes, ranges, transactions, leases, watches, failover
// between endpoints, and what a caller sees when etcd is unreachable,
// paused or killed and restarted. Skipped, saying why, when etcd is not
// installed.

#include "cluster/etcd.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "http/client.h"
#include "http/server.h"
#include "tests/support/etcd_process.h"
#include "tests/support/eventually.h"

namespace entente::cluster {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::EtcdProcess;

using testing::eventually;

std::unique_ptr<Etcd> make_etcd(std::vector<std::string> endpoints, int64_t timeout_ms = 5'000) {
  EtcdOptions o;
  o.endpoints = std::move(endpoints);
  o.timeout_ms = timeout_ms;
  auto e = Etcd::create(std::move(o));
  EXPECT_TRUE(e.ok()) << e.error().message;
  return e.ok() ? std::move(*e) : nullptr;
}

// A closed port on 127.0.0.1: connecting to it is refused.
std::string closed_endpoint() { return "http://127.0.0.1:" + std::to_string(EtcdProcess::free_port()); }

// ---------------------------------------------------------------------------
// Without etcd

TEST(EtcdPrefixEnd, IncrementsTheLastByteAndDropsTrailingFf) {
  EXPECT_EQ(prefix_end("a"), "b");
  EXPECT_EQ(prefix_end("nodes/"), "nodes0");
  EXPECT_EQ(prefix_end(std::string("ab\x00", 3)), std::string("ab\x01", 3));
  EXPECT_EQ(prefix_end("a\xff"), "b");
  EXPECT_EQ(prefix_end("a\xfe\xff\xff"), "a\xff");
  // No successor: "\0", etcd's "to the end of the key space".
  EXPECT_EQ(prefix_end("\xff\xff"), std::string(1, '\0'));
  EXPECT_EQ(prefix_end(""), std::string(1, '\0'));
}

TEST(EtcdOptions, BadEndpointsAreRefusedByName) {
  for (const std::string bad :
       {"127.0.0.1:2379", "ftp://127.0.0.1:2379", "http://", "http://h:0", "http://h:65536",
        "http://h:x", "http://h:2379/v3", "http://user@h:2379", "http://[::1"}) {
    EtcdOptions o;
    o.endpoints = {bad};
    auto e = Etcd::create(o);
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_EQ(e.error().code, Errc::invalid_argument) << bad;
    EXPECT_NE(e.error().message.find("'" + bad + "'"), std::string::npos) << e.error().message;
  }
  EtcdOptions none;
  auto e = Etcd::create(none);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, Errc::invalid_argument);
  EtcdOptions zero;
  zero.endpoints = {"http://127.0.0.1:2379"};
  zero.timeout_ms = 0;
  EXPECT_FALSE(Etcd::create(zero).ok());
  for (const std::string good :
       {"http://127.0.0.1:2379", "http://localhost", "https://etcd-1.example:2379/", "http://[::1]:2379"}) {
    EtcdOptions o;
    o.endpoints = {good};
    auto ok = Etcd::create(o);
    EXPECT_TRUE(ok.ok()) << good << ": " << (ok.ok() ? "" : ok.error().message);
  }
}

TEST(EtcdUnreachable, IsUnavailablePromptly) {
  const std::string endpoint = closed_endpoint();
  auto etcd = make_etcd({endpoint}, 1'000);
  ASSERT_TRUE(etcd);
  const auto start = Clock::now();
  auto r = etcd->get("k");
  const auto elapsed = Clock::now() - start;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unavailable);
  EXPECT_NE(r.error().message.find(endpoint.substr(7)), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("refused"), std::string::npos) << r.error().message;
  EXPECT_LT(elapsed, 1500ms);
  // A watch too.
  std::atomic<bool> stop{false};
  auto w = etcd->watch("k", false, 0, [](const auto&, int64_t) { return true; }, stop);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().code, Errc::unavailable);
}

// A stand-in for an etcd member that answers every request with the same
// status and body: a member without a leader, or one that speaks nonsense.
class FakeMember final : public http::Handler {
 public:
  FakeMember(unsigned status, std::string body) : status_(status), body_(std::move(body)) {
    http::ServerOptions o;
    o.tls = false;
    auto server = http::Server::create(o, *this);
    EXPECT_TRUE(server.ok()) << server.error().message;
    if (!server.ok()) return;
    server_ = std::move(*server);
    auto started = server_->start();
    EXPECT_TRUE(started.ok()) << started.error().message;
  }
  ~FakeMember() override {
    if (server_) server_->stop();
  }
  void handle(http::Request&&, http::Respond respond) override {
    requests.fetch_add(1);
    respond(http::Response::json(status_, body_));
  }
  std::shared_ptr<http::WebSocketSession> upgrade(const http::Request&, http::Response& reject) override {
    reject = http::Response::json(404, "{}");
    return nullptr;
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }

  std::atomic<int> requests{0};

 private:
  unsigned status_;
  std::string body_;
  std::unique_ptr<http::Server> server_;
};

constexpr const char* kNoLeader =
    R"({"error":"etcdserver: no leader","message":"etcdserver: no leader","code":14})";

TEST(EtcdAnswers, AMemberWithoutALeaderIsUnavailableWithEtcdsMessage) {
  FakeMember member(503, kNoLeader);
  auto etcd = make_etcd({member.endpoint()});
  ASSERT_TRUE(etcd);
  auto r = etcd->put("k", "v");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unavailable);
  EXPECT_NE(r.error().message.find("etcdserver: no leader"), std::string::npos) << r.error().message;
  EXPECT_EQ(member.requests.load(), 1);
}

TEST(EtcdAnswers, AnswersOfTheWrongShapeAreCorrupt) {
  for (const std::string body :
       {R"(not json)", R"([1,2])", R"({"kvs":"no"})", R"({"kvs":[{"key":"!!notbase64"}]})",
        R"({"count":"12x"})", R"({"kvs":[{"key":"YQ==","version":{"a":1}}]})"}) {
    FakeMember member(200, body);
    auto etcd = make_etcd({member.endpoint()});
    ASSERT_TRUE(etcd);
    auto r = etcd->get_prefix("a");
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error().code, Errc::corrupt) << body << ": " << r.error().message;
    EXPECT_NE(r.error().message.find("/v3/kv/range"), std::string::npos) << r.error().message;
  }
}

TEST(EtcdAnswers, EtcdsErrorCodesBecomeErrcs) {
  const std::pair<int, Errc> cases[] = {{3, Errc::invalid_argument}, {5, Errc::not_found},
                                        {7, Errc::permission_denied}, {8, Errc::limit_exceeded},
                                        {11, Errc::conflict}, {12, Errc::unsupported}};
  for (const auto& [code, errc] : cases) {
    FakeMember member(400, R"({"error":"etcdserver: boom","message":"etcdserver: boom","code":)" +
                               std::to_string(code) + "}");
    auto etcd = make_etcd({member.endpoint()});
    ASSERT_TRUE(etcd);
    auto r = etcd->erase("k");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, errc) << code << ": " << r.error().message;
    EXPECT_NE(r.error().message.find("etcdserver: boom"), std::string::npos) << r.error().message;
  }
}

// ---------------------------------------------------------------------------
// One etcd shared by the tests that do not hurt it; each uses its own keys.

class EtcdTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (EtcdProcess::binary().empty()) return;
    process_ = new EtcdProcess("etcd-shared");
    if (!process_->start()) {
      start_error_ = process_->last_error();
      delete process_;
      process_ = nullptr;
    }
  }
  static void TearDownTestSuite() {
    delete process_;
    process_ = nullptr;
  }
  void SetUp() override {
    if (EtcdProcess::binary().empty()) GTEST_SKIP() << EtcdProcess::kNotInstalled;
    ASSERT_NE(process_, nullptr) << start_error_;
    etcd_ = make_etcd({process_->endpoint()});
    ASSERT_TRUE(etcd_);
    // Keys of this test only: "<TestName>/...".
    prefix_ = std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "/";
  }

  std::string key(const std::string& k) const { return prefix_ + k; }

  // The value of `k`, or "<absent>".
  std::string value_of(const std::string& k) {
    auto r = etcd_->get(k);
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (!r.ok() || r->kvs.empty()) return "<absent>";
    return r->kvs[0].value;
  }

  static EtcdProcess* process_;
  static std::string start_error_;
  std::unique_ptr<Etcd> etcd_;
  std::string prefix_;
};

EtcdProcess* EtcdTest::process_ = nullptr;
std::string EtcdTest::start_error_;

TEST_F(EtcdTest, PutThenGetReturnsTheValueAndItsRevisions) {
  auto r1 = etcd_->put(key("a"), "one");
  ASSERT_TRUE(r1.ok()) << r1.error().message;
  EXPECT_GT(*r1, 0);
  auto g1 = etcd_->get(key("a"));
  ASSERT_TRUE(g1.ok()) << g1.error().message;
  ASSERT_EQ(g1->kvs.size(), 1u);
  EXPECT_EQ(g1->kvs[0].key, key("a"));
  EXPECT_EQ(g1->kvs[0].value, "one");
  EXPECT_EQ(g1->kvs[0].version, 1);
  EXPECT_EQ(g1->kvs[0].create_revision, *r1);
  EXPECT_EQ(g1->kvs[0].mod_revision, *r1);
  EXPECT_EQ(g1->kvs[0].lease, 0);
  EXPECT_EQ(g1->count, 1);
  EXPECT_GE(g1->revision, *r1);

  auto r2 = etcd_->put(key("a"), "two");
  ASSERT_TRUE(r2.ok()) << r2.error().message;
  EXPECT_GT(*r2, *r1);
  auto g2 = etcd_->get(key("a"));
  ASSERT_TRUE(g2.ok());
  ASSERT_EQ(g2->kvs.size(), 1u);
  EXPECT_EQ(g2->kvs[0].value, "two");
  EXPECT_EQ(g2->kvs[0].version, 2);
  EXPECT_EQ(g2->kvs[0].create_revision, *r1);
  EXPECT_EQ(g2->kvs[0].mod_revision, *r2);

  // A missing key: no kvs, count 0, but the store's revision.
  auto missing = etcd_->get(key("missing"));
  ASSERT_TRUE(missing.ok()) << missing.error().message;
  EXPECT_TRUE(missing->kvs.empty());
  EXPECT_EQ(missing->count, 0);
  EXPECT_GE(missing->revision, *r2);

  // An empty value is a value (the gateway leaves it out of the answer).
  ASSERT_TRUE(etcd_->put(key("empty"), "").ok());
  auto empty = etcd_->get(key("empty"));
  ASSERT_TRUE(empty.ok());
  ASSERT_EQ(empty->kvs.size(), 1u);
  EXPECT_EQ(empty->kvs[0].value, "");
}

TEST_F(EtcdTest, KeysAndValuesAreBytes) {
  const std::string k = key(std::string("bin\x00\xff\x01", 6));
  const std::string v("\x00\xff\xfe\"\\\n{}", 9);
  ASSERT_TRUE(etcd_->put(k, v).ok());
  auto g = etcd_->get(k);
  ASSERT_TRUE(g.ok()) << g.error().message;
  ASSERT_EQ(g->kvs.size(), 1u);
  EXPECT_EQ(g->kvs[0].key, k);
  EXPECT_EQ(g->kvs[0].value, v);
  // The key without its last bytes is another key.
  auto shorter = etcd_->get(key(std::string("bin\x00", 4)));
  ASSERT_TRUE(shorter.ok());
  EXPECT_TRUE(shorter->kvs.empty());
  // Under a prefix ending in 0x00 and 0xff.
  auto under = etcd_->get_prefix(key(std::string("bin\x00\xff", 5)));
  ASSERT_TRUE(under.ok()) << under.error().message;
  ASSERT_EQ(under->kvs.size(), 1u);
  EXPECT_EQ(under->kvs[0].value, v);
}

TEST_F(EtcdTest, GetPrefixReturnsKeysInOrderAndHonoursTheLimit) {
  for (const char* k : {"p/c", "p/a", "p/b", "p0", "p", "o/z"}) ASSERT_TRUE(etcd_->put(key(k), k).ok());
  auto all = etcd_->get_prefix(key("p/"));
  ASSERT_TRUE(all.ok()) << all.error().message;
  ASSERT_EQ(all->kvs.size(), 3u);
  EXPECT_EQ(all->kvs[0].key, key("p/a"));
  EXPECT_EQ(all->kvs[1].key, key("p/b"));
  EXPECT_EQ(all->kvs[2].key, key("p/c"));
  EXPECT_EQ(all->count, 3);
  EXPECT_FALSE(all->more);

  auto two = etcd_->get_prefix(key("p/"), 2);
  ASSERT_TRUE(two.ok()) << two.error().message;
  ASSERT_EQ(two->kvs.size(), 2u);
  EXPECT_EQ(two->kvs[1].key, key("p/b"));
  EXPECT_EQ(two->count, 3);
  EXPECT_TRUE(two->more);

  auto none = etcd_->get_prefix(key("q/"));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->kvs.empty());

  auto bad = etcd_->get_prefix(key("p/"), -1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, Errc::invalid_argument);
}

TEST_F(EtcdTest, PrefixEndingInFfBytes) {
  const std::string p = key("x\xff");
  ASSERT_TRUE(etcd_->put(p + std::string(1, '\0'), "0").ok());
  ASSERT_TRUE(etcd_->put(p + "\xff", "ff").ok());
  ASSERT_TRUE(etcd_->put(key("y"), "outside").ok());
  auto r = etcd_->get_prefix(p);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->kvs.size(), 2u);
  EXPECT_EQ(r->kvs[0].value, "0");
  EXPECT_EQ(r->kvs[1].value, "ff");
}

TEST_F(EtcdTest, EraseAndErasePrefixReturnHowManyKeysWent) {
  for (const char* k : {"e/1", "e/2", "e/3", "e0"}) ASSERT_TRUE(etcd_->put(key(k), "v").ok());
  auto one = etcd_->erase(key("e/1"));
  ASSERT_TRUE(one.ok()) << one.error().message;
  EXPECT_EQ(*one, 1);
  auto again = etcd_->erase(key("e/1"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 0);
  auto rest = etcd_->erase_prefix(key("e/"));
  ASSERT_TRUE(rest.ok()) << rest.error().message;
  EXPECT_EQ(*rest, 2);
  auto left = etcd_->get_prefix(key("e"));
  ASSERT_TRUE(left.ok());
  ASSERT_EQ(left->kvs.size(), 1u);
  EXPECT_EQ(left->kvs[0].key, key("e0"));
}

TEST_F(EtcdTest, TxnCreateIfAbsentWinsOnceAndTheLoserReadsTheWinner) {
  const std::string k = key("controller");
  auto claim = [&](const std::string& who) {
    Compare absent;
    absent.key = k;
    absent.target = Compare::Target::version;
    absent.op = Compare::Op::equal;
    absent.number = 0;
    return etcd_->txn({absent}, {TxnOp::put_op(k, who)}, {TxnOp::get_op(k)});
  };
  auto first = claim("n1");
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_TRUE(first->succeeded);
  EXPECT_GT(first->revision, 0);
  EXPECT_TRUE(first->gets.empty());  // the success branch has no get

  auto second = claim("n2");
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_FALSE(second->succeeded);
  ASSERT_EQ(second->gets.size(), 1u);
  ASSERT_EQ(second->gets[0].kvs.size(), 1u);
  EXPECT_EQ(second->gets[0].kvs[0].value, "n1");
  EXPECT_EQ(second->gets[0].kvs[0].mod_revision, first->revision);
  EXPECT_EQ(value_of(k), "n1");
}

TEST_F(EtcdTest, TxnCompareAndSwapOnModRevision) {
  const std::string k = key("catalog");
  auto r = etcd_->put(k, "v1");
  ASSERT_TRUE(r.ok());
  auto cas = [&](int64_t expected, const std::string& value) {
    Compare c{k, Compare::Target::mod_revision, Compare::Op::equal, expected, {}};
    return etcd_->txn({c}, {TxnOp::put_op(k, value)}, {TxnOp::get_op(k)});
  };
  auto won = cas(*r, "v2");
  ASSERT_TRUE(won.ok()) << won.error().message;
  EXPECT_TRUE(won->succeeded);
  auto lost = cas(*r, "v3");  // the revision moved on: stale
  ASSERT_TRUE(lost.ok()) << lost.error().message;
  EXPECT_FALSE(lost->succeeded);
  ASSERT_EQ(lost->gets.size(), 1u);
  ASSERT_EQ(lost->gets[0].kvs.size(), 1u);
  EXPECT_EQ(lost->gets[0].kvs[0].value, "v2");
  EXPECT_EQ(lost->gets[0].kvs[0].mod_revision, won->revision);
  EXPECT_EQ(value_of(k), "v2");
}

TEST_F(EtcdTest, TxnComparesValuesAndRunsPrefixOperations) {
  ASSERT_TRUE(etcd_->put(key("state"), std::string("on\x00", 3)).ok());
  for (const char* k : {"items/1", "items/2"}) ASSERT_TRUE(etcd_->put(key(k), "x").ok());
  Compare on{key("state"), Compare::Target::value, Compare::Op::equal, 0, std::string("on\x00", 3)};
  Compare newer{key("state"), Compare::Target::create_revision, Compare::Op::greater, 0, {}};
  auto t = etcd_->txn({on, newer}, {TxnOp::get_op(key("items/"), true), TxnOp::erase_op(key("items/"), true),
                                    TxnOp::put_op(key("state"), "off")});
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_TRUE(t->succeeded);
  ASSERT_EQ(t->gets.size(), 1u);
  EXPECT_EQ(t->gets[0].kvs.size(), 2u);  // read before the erase, in the same revision
  auto left = etcd_->get_prefix(key("items/"));
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->kvs.empty());
  EXPECT_EQ(value_of(key("state")), "off");
  // The value no longer matches: the (empty) failure branch.
  auto no = etcd_->txn({on}, {TxnOp::put_op(key("state"), "again")});
  ASSERT_TRUE(no.ok()) << no.error().message;
  EXPECT_FALSE(no->succeeded);
  EXPECT_EQ(value_of(key("state")), "off");
}

TEST_F(EtcdTest, LeaseKeepAliveAndRevoke) {
  auto lease = etcd_->grant_lease(30);
  ASSERT_TRUE(lease.ok()) << lease.error().message;
  EXPECT_NE(*lease, 0);
  ASSERT_TRUE(etcd_->put(key("member"), "alive", *lease).ok());
  auto g = etcd_->get(key("member"));
  ASSERT_TRUE(g.ok());
  ASSERT_EQ(g->kvs.size(), 1u);
  EXPECT_EQ(g->kvs[0].lease, *lease);
  auto ttl = etcd_->keep_alive(*lease);
  ASSERT_TRUE(ttl.ok()) << ttl.error().message;
  EXPECT_GT(*ttl, 0);
  EXPECT_LE(*ttl, 30);
  auto revoked = etcd_->revoke_lease(*lease);
  ASSERT_TRUE(revoked.ok()) << revoked.error().message;
  EXPECT_EQ(value_of(key("member")), "<absent>");
  auto after = etcd_->keep_alive(*lease);
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.error().code, Errc::not_found) << after.error().message;
  auto twice = etcd_->revoke_lease(*lease);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.error().code, Errc::not_found) << twice.error().message;
  EXPECT_NE(twice.error().message.find("lease not found"), std::string::npos) << twice.error().message;
  // A put with a lease that does not exist: etcd's error, by its code.
  auto orphan = etcd_->put(key("orphan"), "x", *lease);
  ASSERT_FALSE(orphan.ok());
  EXPECT_EQ(orphan.error().code, Errc::not_found) << orphan.error().message;
  auto bad = etcd_->grant_lease(0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, Errc::invalid_argument);
}

TEST_F(EtcdTest, AnExpiredLeaseTakesItsKeysAndIsNotFound) {
  auto lease = etcd_->grant_lease(1);
  ASSERT_TRUE(lease.ok()) << lease.error().message;
  ASSERT_TRUE(etcd_->put(key("member"), "alive", *lease).ok());
  EXPECT_TRUE(eventually([&] { return value_of(key("member")) == "<absent>"; }))
      << "the key outlived its 1 s lease";
  auto ttl = etcd_->keep_alive(*lease);
  ASSERT_FALSE(ttl.ok());
  EXPECT_EQ(ttl.error().code, Errc::not_found) << ttl.error().message;
}

// Collects watch events on a thread until told to stop.
struct Watcher {
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<WatchEvent> events;
  std::vector<int64_t> revisions;
  Status result;
  std::atomic<bool> done{false};
  std::thread thread;

  void start(Etcd& etcd, std::string key, bool prefix, int64_t from) {
    thread = std::thread([this, &etcd, key = std::move(key), prefix, from] {
      result = etcd.watch(key, prefix, from,
                          [this](const std::vector<WatchEvent>& batch, int64_t revision) {
                            std::lock_guard lock(mu);
                            events.insert(events.end(), batch.begin(), batch.end());
                            revisions.push_back(revision);
                            return true;
                          },
                          stop);
      done = true;
    });
  }
  size_t count() {
    std::lock_guard lock(mu);
    return events.size();
  }
  void join() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
  ~Watcher() { join(); }
};

TEST_F(EtcdTest, WatchFromAStartRevisionReplaysThenFollows) {
  const std::string k = key("w");
  auto r1 = etcd_->put(k, "v1");
  ASSERT_TRUE(r1.ok());
  ASSERT_TRUE(etcd_->put(k, "v2").ok());
  ASSERT_TRUE(etcd_->erase(k).ok());
  ASSERT_TRUE(etcd_->put(key("w2"), "not watched").ok());
  Watcher w;
  w.start(*etcd_, k, false, *r1);
  ASSERT_TRUE(eventually([&] { return w.count() >= 3 || w.done; }));
  auto r4 = etcd_->put(k, "v4");
  ASSERT_TRUE(r4.ok());
  ASSERT_TRUE(eventually([&] { return w.count() >= 4 || w.done; }));
  w.join();
  EXPECT_TRUE(w.result.ok()) << w.result.error().message;
  ASSERT_EQ(w.events.size(), 4u);
  EXPECT_EQ(w.events[0].type, WatchEvent::Type::put);
  EXPECT_EQ(w.events[0].kv.value, "v1");
  EXPECT_EQ(w.events[0].kv.mod_revision, *r1);
  EXPECT_EQ(w.events[1].kv.value, "v2");
  EXPECT_EQ(w.events[2].type, WatchEvent::Type::erase);
  EXPECT_EQ(w.events[2].kv.key, k);
  EXPECT_EQ(w.events[3].type, WatchEvent::Type::put);
  EXPECT_EQ(w.events[3].kv.value, "v4");
  EXPECT_EQ(w.revisions.back(), *r4);
}

TEST_F(EtcdTest, PrefixWatchSeesPutsAndDeletesUnderThePrefixOnly) {
  auto now = etcd_->get(key("nothing"));
  ASSERT_TRUE(now.ok());
  Watcher w;
  w.start(*etcd_, key("nodes/"), true, now->revision + 1);
  ASSERT_TRUE(etcd_->put(key("nodes/n1"), std::string("a\x00", 2)).ok());
  ASSERT_TRUE(etcd_->put(key("nodes0"), "outside").ok());
  ASSERT_TRUE(etcd_->put(key("nodes/n2"), "b").ok());
  auto del = etcd_->erase(key("nodes/n1"));
  ASSERT_TRUE(del.ok());
  ASSERT_TRUE(eventually([&] { return w.count() >= 3 || w.done; }));
  w.join();
  EXPECT_TRUE(w.result.ok()) << w.result.error().message;
  ASSERT_EQ(w.events.size(), 3u);
  EXPECT_EQ(w.events[0].kv.key, key("nodes/n1"));
  EXPECT_EQ(w.events[0].kv.value, std::string("a\x00", 2));
  EXPECT_EQ(w.events[1].kv.key, key("nodes/n2"));
  EXPECT_EQ(w.events[2].type, WatchEvent::Type::erase);
  EXPECT_EQ(w.events[2].kv.key, key("nodes/n1"));
}

TEST_F(EtcdTest, WatchReturnsWhenTheCallbackSaysSo) {
  auto r = etcd_->put(key("k"), "v");
  ASSERT_TRUE(r.ok());
  std::atomic<bool> stop{false};
  int calls = 0;
  auto s = etcd_->watch(key("k"), false, *r,
                        [&](const std::vector<WatchEvent>& events, int64_t revision) {
                          ++calls;
                          EXPECT_EQ(events.size(), 1u);
                          EXPECT_EQ(revision, *r);
                          return false;
                        },
                        stop);
  EXPECT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(calls, 1);
}

TEST_F(EtcdTest, WatchStopsWithin200MsOfTheFlag) {
  Watcher w;
  w.start(*etcd_, key("quiet"), false, 0);
  std::this_thread::sleep_for(300ms);  // let it block on the quiet stream
  ASSERT_FALSE(w.done);
  const auto start = Clock::now();
  w.stop = true;
  ASSERT_TRUE(eventually([&] { return w.done.load(); }, 2s));
  // 200 ms promised; the margin is for a loaded machine.
  EXPECT_LT(Clock::now() - start, 600ms);
  w.join();
  EXPECT_TRUE(w.result.ok()) << w.result.error().message;
}

TEST_F(EtcdTest, WatchOfACompactedRevisionIsConflict) {
  const std::string k = key("c");
  auto first = etcd_->put(k, "1");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(etcd_->put(k, "2").ok());
  auto last = etcd_->put(k, "3");
  ASSERT_TRUE(last.ok());
  // Compact through the gateway itself (the client has no compaction: a
  // node never compacts, etcd's own --auto-compaction does).
  http::ClientOptions o;
  o.port = process_->client_port();
  auto raw = http::Client::connect(o);
  ASSERT_TRUE(raw.ok()) << raw.error().message;
  auto c = (*raw)->request("POST", "/v3/kv/compaction",
                           "{\"revision\":\"" + std::to_string(*last) + "\",\"physical\":true}");
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_EQ(c->status, 200u) << c->body;
  std::atomic<bool> stop{false};
  auto s = etcd_->watch(k, false, *first, [](const auto&, int64_t) { return true; }, stop);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::conflict) << s.error().message;
  EXPECT_NE(s.error().message.find("compacted"), std::string::npos) << s.error().message;
  // From the compaction's revision on, it works.
  Watcher w;
  w.start(*etcd_, k, false, *last);
  ASSERT_TRUE(eventually([&] { return w.count() >= 1 || w.done; }));
  w.join();
  EXPECT_TRUE(w.result.ok()) << w.result.error().message;
  ASSERT_EQ(w.events.size(), 1u);
  EXPECT_EQ(w.events[0].kv.value, "3");
}

TEST_F(EtcdTest, FailsOverFromADeadEndpoint) {
  const std::string dead = closed_endpoint();
  auto etcd = make_etcd({dead, process_->endpoint()});
  ASSERT_TRUE(etcd);
  auto p = etcd->put(key("f"), "v");
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(value_of(key("f")), "v");
  auto g = etcd->get(key("f"));
  ASSERT_TRUE(g.ok()) << g.error().message;
  // A watch fails over the same way.
  Watcher w;
  w.start(*etcd, key("f"), false, *p);
  ASSERT_TRUE(eventually([&] { return w.count() >= 1 || w.done; }));
  w.join();
  EXPECT_TRUE(w.result.ok()) << w.result.error().message;
  EXPECT_EQ(w.count(), 1u);
}

TEST_F(EtcdTest, FailsOverFromAMemberWithoutALeader) {
  FakeMember member(503, kNoLeader);
  auto etcd = make_etcd({member.endpoint(), process_->endpoint()});
  ASSERT_TRUE(etcd);
  auto p = etcd->put(key("k"), "v");
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(member.requests.load(), 1);
  // The endpoint that answered is tried first from now on.
  ASSERT_TRUE(etcd->get(key("k")).ok());
  EXPECT_EQ(member.requests.load(), 1);
  EXPECT_EQ(value_of(key("k")), "v");
}

TEST_F(EtcdTest, ConcurrentCallsShareThePool) {
  constexpr int kThreads = 6;
  constexpr int kPuts = 20;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPuts; ++i) {
        const std::string k = key("t" + std::to_string(t) + "/" + std::to_string(i));
        if (!etcd_->put(k, std::to_string(i)).ok() || value_of(k) != std::to_string(i)) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  auto all = etcd_->get_prefix(key("t"));
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->kvs.size(), static_cast<size_t>(kThreads * kPuts));
}

// ---------------------------------------------------------------------------
// An etcd of their own, which they pause, kill and restart.

class EtcdFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdProcess::binary().empty()) GTEST_SKIP() << EtcdProcess::kNotInstalled;
    process_ = std::make_unique<EtcdProcess>("etcd-faults");
    ASSERT_TRUE(process_->start()) << process_->last_error();
  }
  std::unique_ptr<EtcdProcess> process_;
};

TEST_F(EtcdFaultTest, PausedIsUnavailableWithinTheTimeoutAndWorksAfterResume) {
  auto etcd = make_etcd({process_->endpoint()}, 1'000);
  ASSERT_TRUE(etcd);
  ASSERT_TRUE(etcd->put("k", "before").ok());
  process_->pause();
  const auto start = Clock::now();
  auto r = etcd->get("k");
  const auto elapsed = Clock::now() - start;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unavailable) << r.error().message;
  EXPECT_NE(r.error().message.find(std::to_string(process_->client_port())), std::string::npos)
      << r.error().message;
  EXPECT_GE(elapsed, 900ms);
  EXPECT_LT(elapsed, 2500ms);  // the 1 s timeout, once, and a margin for a loaded machine
  process_->resume();
  std::string value;
  EXPECT_TRUE(eventually([&] {
    auto g = etcd->get("k");
    if (g.ok() && !g->kvs.empty()) value = g->kvs[0].value;
    return g.ok();
  }));
  EXPECT_EQ(value, "before");
  EXPECT_TRUE(etcd->put("k", "after").ok());
}

TEST_F(EtcdFaultTest, KilledAndRestartedTheSameClientWorksAgain) {
  auto etcd = make_etcd({process_->endpoint()}, 2'000);
  ASSERT_TRUE(etcd);
  auto r = etcd->put("k", "durable");
  ASSERT_TRUE(r.ok()) << r.error().message;
  Watcher w;
  w.start(*etcd, "k", false, 0);
  std::this_thread::sleep_for(300ms);  // the watch is established
  process_->kill();
  // The broken watch says so; the caller re-watches.
  ASSERT_TRUE(eventually([&] { return w.done.load(); }, 5s));
  w.join();
  ASSERT_FALSE(w.result.ok());
  EXPECT_EQ(w.result.error().code, Errc::unavailable) << w.result.error().message;
  auto down = etcd->get("k");
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.error().code, Errc::unavailable);

  ASSERT_TRUE(process_->start()) << process_->last_error();
  // The pooled connections died with etcd: the first call notices and
  // reconnects by itself.
  auto g = etcd->get("k");
  ASSERT_TRUE(g.ok()) << g.error().message;
  ASSERT_EQ(g->kvs.size(), 1u);
  EXPECT_EQ(g->kvs[0].value, "durable");
  EXPECT_EQ(g->kvs[0].mod_revision, *r);
  EXPECT_TRUE(etcd->put("k", "again").ok());
}

TEST_F(EtcdFaultTest, StoppedAndRestartedKeepsDataAndPorts) {
  auto etcd = make_etcd({process_->endpoint()});
  ASSERT_TRUE(etcd);
  ASSERT_TRUE(etcd->put("k", "v").ok());
  ASSERT_TRUE(process_->restart()) << process_->last_error();
  auto g = etcd->get("k");
  ASSERT_TRUE(g.ok()) << g.error().message;
  ASSERT_EQ(g->kvs.size(), 1u);
  EXPECT_EQ(g->kvs[0].value, "v");
}

}  // namespace
}  // namespace entente::cluster
