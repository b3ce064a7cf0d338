// Peer links between real LinkManagers on loopback, with certificates made
// by certs::init_domain / issue_node: mutual TLS 1.3, identity checks
// against pinned CAs, HELLO, heartbeats, failure detection, reconnect, one
// link per pair, and every refusal counted.

#include "federation/link.h"

#include <gtest/gtest.h>
#include <openssl/ssl.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/write.hpp>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include "federation/messages.h"
#include "tests/support/raw_tcp.h"
#include "tests/support/tcp_proxy.h"

namespace entente::federation {
namespace {

namespace fs = std::filesystem;
namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;

// Records what a LinkManager reports; waits with a deadline.
class Recorder : public LinkHandler {
 public:
  void on_link_up(const certs::Identity& peer) override {
    std::lock_guard lock(mu_);
    ups_.push_back(peer.uri());
    cv_.notify_all();
  }
  void on_link_down(const certs::Identity& peer, std::string_view reason) override {
    std::lock_guard lock(mu_);
    downs_.push_back(peer.uri() + ": " + std::string(reason));
    cv_.notify_all();
  }
  void on_frame(const certs::Identity& peer, FrameType type, uint32_t channel,
                std::string_view payload) override {
    std::lock_guard lock(mu_);
    frames_.push_back({peer.uri(), type, channel, std::string(payload)});
    cv_.notify_all();
  }

  struct Received {
    std::string peer;
    FrameType type;
    uint32_t channel;
    std::string payload;
  };

  template <class Pred>
  bool wait(Pred pred, std::chrono::milliseconds timeout = 10s) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return pred(*this); });
  }

  std::vector<std::string> ups_, downs_;
  std::vector<Received> frames_;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

// Waits for `pred` by polling (for state the manager reports, not events).
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = 10s) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

std::optional<PeerStatus> status_of(const LinkManager& m, const std::string& uri) {
  for (auto& s : m.peers()) {
    if (s.identity.uri() == uri) return s;
  }
  return std::nullopt;
}

uint64_t refusals(const LinkManager& m, const std::string& label) {
  auto r = m.refusals();
  auto it = r.find(label);
  return it == r.end() ? 0 : it->second;
}

class LinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("entente-link-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* d : {"acme", "beta", "gamma"}) make_domain(d);
  }
  void TearDown() override {
    if (HasFailure()) {
      std::lock_guard lock(log_mu_);
      for (const auto& l : log_) std::fprintf(stderr, "  log: %s\n", l.c_str());
    }
    fs::remove_all(dir_);
  }

  void make_domain(const std::string& domain) {
    ASSERT_TRUE(certs::init_domain(domain, dir_ / domain / "ca").ok());
  }
  fs::path node_dir(const std::string& domain, const std::string& node,
                    certs::NodeOptions options = {}, const std::string& ca_domain = "") {
    const fs::path out = dir_ / domain / node;
    options.sans = {"127.0.0.1"};
    options.force = true;
    auto s = certs::issue_node(domain, node, dir_ / (ca_domain.empty() ? domain : ca_domain) / "ca",
                               out, options);
    EXPECT_TRUE(s.ok()) << s.error().message;
    return out;
  }
  std::shared_ptr<certs::TrustStore> trust(std::initializer_list<std::string> domains) {
    auto t = std::make_shared<certs::TrustStore>();
    for (const auto& d : domains) {
      auto s = t->pin(d, dir_ / d / "ca" / "ca.crt");
      EXPECT_TRUE(s.ok()) << s.error().message;
    }
    return t;
  }
  LinkOptions options(const std::string& domain, const std::string& node, const fs::path& certs,
                      std::shared_ptr<certs::TrustStore> t) {
    LinkOptions o;
    o.self = {domain, node};
    o.cert_file = (certs / "node.crt").string();
    o.key_file = (certs / "node.key").string();
    o.trust = std::move(t);
    o.heartbeat_interval = 50ms;
    o.failure_timeout = 400ms;
    o.reconnect_min = 20ms;
    o.reconnect_max = 200ms;
    o.log = [this](std::string_view line) {
      std::lock_guard lock(log_mu_);
      log_.emplace_back(line);
    };
    return o;
  }
  std::unique_ptr<LinkManager> start(LinkOptions o, LinkHandler& h) {
    auto m = LinkManager::start(std::move(o), h);
    EXPECT_TRUE(m.ok()) << m.error().message;
    return m.ok() ? std::move(*m) : nullptr;
  }
  bool logged(std::string_view needle) {
    std::lock_guard lock(log_mu_);
    for (const auto& l : log_) {
      if (l.find(needle) != std::string::npos) return true;
    }
    return false;
  }

  fs::path dir_;
  std::mutex log_mu_;
  std::vector<std::string> log_;
};

TEST_F(LinkTest, TwoDomainsLinkExchangeFramesAndMeasureRoundTrips) {
  Recorder ra, rb;
  auto b = start(options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"})), rb);
  auto oa = options("acme", "n1", node_dir("acme", "n1"), trust({"acme", "beta"}));
  oa.peers.push_back({{"beta", "n1"}, "127.0.0.1", b->port()});
  auto a = start(std::move(oa), ra);

  ASSERT_TRUE(ra.wait([](auto& r) { return !r.ups_.empty(); }));
  ASSERT_TRUE(rb.wait([](auto& r) { return !r.ups_.empty(); }));
  EXPECT_EQ(ra.ups_[0], "entente://beta/n1");
  EXPECT_EQ(rb.ups_[0], "entente://acme/n1");

  auto channel = a->new_channel({"beta", "n1"});
  ASSERT_TRUE(channel.ok());
  EXPECT_EQ(*channel % 2, 1u) << "the dialing side uses odd channels";
  ASSERT_TRUE(a->send({"beta", "n1"}, FrameType::ack, *channel, encode(Ack{42})).ok());
  ASSERT_TRUE(rb.wait([](auto& r) { return !r.frames_.empty(); }));
  EXPECT_EQ(rb.frames_[0].peer, "entente://acme/n1");
  EXPECT_EQ(rb.frames_[0].type, FrameType::ack);
  EXPECT_EQ(rb.frames_[0].channel, *channel);
  EXPECT_EQ(decode_ack(rb.frames_[0].payload)->through, 42u);

  auto back = b->new_channel({"acme", "n1"});
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back % 2, 0u) << "the accepting side uses even channels";

  // Heartbeats give both sides a round-trip time.
  ASSERT_TRUE(eventually([&] {
    auto s = status_of(*a, "entente://beta/n1");
    auto t = status_of(*b, "entente://acme/n1");
    return s && t && s->rtt_us >= 0 && t->rtt_us >= 0;
  }));
  auto s = *status_of(*a, "entente://beta/n1");
  EXPECT_EQ(s.state, "up");
  EXPECT_TRUE(s.dialed);
  EXPECT_GT(s.bytes_out, 0u);
  EXPECT_GT(s.frames_in, 0u);
  EXPECT_GT(s.last_heartbeat_ms, 0);
  EXPECT_FALSE(status_of(*b, "entente://acme/n1")->dialed);

  // A frame over the peer's maximum is refused before it is queued.
  std::string big(kDefaultMaxFrame + 1, 'x');
  auto over = a->send({"beta", "n1"}, FrameType::data, *channel, big);
  EXPECT_EQ(over.error().code, Errc::limit_exceeded);
  // No link to an unknown peer.
  EXPECT_EQ(a->send({"gamma", "n1"}, FrameType::ack, 1, encode(Ack{1})).error().code,
            Errc::unavailable);
}

uint16_t free_port() {
  net::io_context io;
  tcp::acceptor a(io, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
  return a.local_endpoint().port();
}

TEST_F(LinkTest, NodesDialingEachOtherKeepOneLink) {
  Recorder ra, rb;
  auto t = trust({"acme", "beta"});
  auto oa = options("acme", "n1", node_dir("acme", "n1"), t);
  auto ob = options("beta", "n1", node_dir("beta", "n1"), t);
  oa.listen_port = free_port();
  ob.listen_port = free_port();
  oa.peers.push_back({{"beta", "n1"}, "127.0.0.1", ob.listen_port});
  ob.peers.push_back({{"acme", "n1"}, "127.0.0.1", oa.listen_port});
  auto a = start(oa, ra);
  auto b = start(ob, rb);
  // Whatever raced, both end with the link acme (the smaller identity) dialed.
  ASSERT_TRUE(eventually([&] {
    auto s = status_of(*a, "entente://beta/n1");
    auto u = status_of(*b, "entente://acme/n1");
    return s && u && s->state == "up" && u->state == "up" && s->dialed && !u->dialed;
  })) << "acme sees " << status_of(*a, "entente://beta/n1")->state;
  // And it stays that way: no flapping between the two connections.
  std::this_thread::sleep_for(300ms);
  auto s = *status_of(*a, "entente://beta/n1");
  EXPECT_EQ(s.state, "up");
  EXPECT_TRUE(s.dialed);
  EXPECT_LE(s.connects, 2u);
  EXPECT_TRUE(b->is_up({"acme", "n1"}));
}

TEST_F(LinkTest, RefusesCertificateFromUnpinnedCaClaimingAPinnedDomain) {
  // An attacker makes its own CA for "acme" and a node certificate under it.
  const fs::path evil = dir_ / "evil";
  ASSERT_TRUE(certs::init_domain("acme", evil / "ca").ok());
  certs::NodeOptions evil_node;
  evil_node.sans = {"127.0.0.1"};
  ASSERT_TRUE(certs::issue_node("acme", "n1", evil / "ca", evil / "n1", evil_node).ok());
  Recorder ra, rb;
  auto b = start(options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"})), rb);
  auto oa = options("acme", "n1", evil / "n1", trust({"acme", "beta"}));
  oa.peers.push_back({{"beta", "n1"}, "127.0.0.1", b->port()});
  auto a = start(std::move(oa), ra);
  ASSERT_TRUE(eventually([&] { return refusals(*b, "untrusted_chain") >= 1; }));
  EXPECT_TRUE(eventually([&] { return logged("does not chain to the pinned CA of domain acme"); }));
  EXPECT_TRUE(rb.ups_.empty());
  EXPECT_FALSE(b->is_up({"acme", "n1"}));
}

TEST_F(LinkTest, RefusesAPeerThatIsNotTheConfiguredIdentity) {
  // beta dials "acme/n1" but gamma/n1 answers at that address: gamma is
  // pinned, yet it is not the domain beta asked for.
  Recorder rg, rb;
  auto g = start(options("gamma", "n1", node_dir("gamma", "n1"), trust({"beta", "gamma"})), rg);
  auto ob = options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta", "gamma"}));
  ob.peers.push_back({{"acme", "n1"}, "127.0.0.1", g->port()});
  auto b = start(std::move(ob), rb);
  ASSERT_TRUE(eventually([&] { return refusals(*b, "wrong_domain") >= 1; }));
  EXPECT_TRUE(rb.ups_.empty());

  // The right domain but another node than configured.
  Recorder rb2;
  auto ob2 = options("beta", "n2", node_dir("beta", "n2"), trust({"beta", "gamma"}));
  ob2.peers.push_back({{"gamma", "n9"}, "127.0.0.1", g->port()});
  auto b2 = start(std::move(ob2), rb2);
  ASSERT_TRUE(eventually([&] { return refusals(*b2, "identity") >= 1; }));
  EXPECT_TRUE(rb2.ups_.empty());
}

// A dial target added at run time (a RESET moved named it) is dialed like a
// configured peer and trusted no more: the node at the address must prove
// the very identity named, under its domain's pinned CA. One domain adds
// a bounded number; a domain not pinned adds none.
TEST_F(LinkTest, ADialTargetAddedAtRunTimeLinksOnlyWithTheIdentityNamed) {
  Recorder r1, r2, rb;
  auto t = trust({"acme", "beta"});
  auto n1 = start(options("acme", "n1", node_dir("acme", "n1"), t), r1);
  auto n2 = start(options("acme", "n2", node_dir("acme", "n2"), t), r2);
  auto ob = options("beta", "n1", node_dir("beta", "n1"), t);
  ob.max_dial_targets_per_domain = 2;
  auto b = start(std::move(ob), rb);

  // "acme/n1 is at n2's address": n2 answers there and is refused, since
  // its certificate names n2; nothing links.
  ASSERT_TRUE(b->add_dial_target({{"acme", "n1"}, "127.0.0.1", n2->port()}).ok());
  ASSERT_TRUE(eventually([&] { return refusals(*b, "identity") >= 1; }));
  EXPECT_FALSE(b->is_up({"acme", "n1"}));
  EXPECT_TRUE(rb.ups_.empty());
  // Removed (not reached in time, as the importer decides): no more dials,
  // and the peer's status still says why.
  b->remove_dial_target({"acme", "n1"});
  std::this_thread::sleep_for(300ms);  // a dial in flight finishes
  const uint64_t refused = refusals(*b, "identity");
  std::this_thread::sleep_for(600ms);  // several backoffs of 20..200 ms
  EXPECT_EQ(refusals(*b, "identity"), refused);
  auto gone = status_of(*b, "entente://acme/n1");
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->state, "refused");

  // The right address: the same target, moved, links.
  ASSERT_TRUE(b->add_dial_target({{"acme", "n1"}, "127.0.0.1", n1->port()}).ok());
  ASSERT_TRUE(rb.wait([](auto& r) { return !r.ups_.empty(); }));
  EXPECT_EQ(rb.ups_[0], "entente://acme/n1");
  auto s = status_of(*b, "entente://acme/n1");
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->dialed);
  EXPECT_EQ(b->version({"acme", "n1"}), kProtocolVersion);

  // The bound: n1 and n2 are acme's two; a third is refused.
  ASSERT_TRUE(b->add_dial_target({{"acme", "n2"}, "127.0.0.1", n2->port()}).ok());
  ASSERT_TRUE(eventually([&] { return b->is_up({"acme", "n2"}); }));
  auto third = b->add_dial_target({{"acme", "n3"}, "127.0.0.1", n2->port()});
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.error().code, Errc::limit_exceeded);
  // Naming one already added is no new target.
  EXPECT_TRUE(b->add_dial_target({{"acme", "n2"}, "127.0.0.1", n2->port()}).ok());
  // A domain this node does not pin adds nothing.
  auto gamma = b->add_dial_target({{"gamma", "n1"}, "127.0.0.1", n1->port()});
  ASSERT_FALSE(gamma.ok());
  EXPECT_EQ(gamma.error().code, Errc::permission_denied);
}

TEST_F(LinkTest, RefusesExpiredCertificate) {
  certs::NodeOptions old;
  old.not_before = std::chrono::system_clock::now() - std::chrono::hours(24 * 10);
  old.days = 1;
  Recorder ra, rb;
  auto b = start(options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"})), rb);
  auto oa = options("acme", "n1", node_dir("acme", "n1", old), trust({"acme", "beta"}));
  oa.peers.push_back({{"beta", "n1"}, "127.0.0.1", b->port()});
  auto a = start(std::move(oa), ra);
  ASSERT_TRUE(eventually([&] { return refusals(*b, "expired") >= 1; }));
  EXPECT_TRUE(eventually([&] { return logged("expired"); }));
  EXPECT_TRUE(rb.ups_.empty());
}

// A raw client on the federation port: plaintext, or TLS with a valid
// certificate that then sends what it likes.
class RawClient {
 public:
  explicit RawClient(uint16_t port) : socket_(io_) {
    socket_.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  }
  void send_plain(std::string_view bytes) { net::write(socket_, net::buffer(bytes)); }
  // True when the server closed the connection (read ends) within a while.
  bool closed_by_server() {
    socket_.non_blocking(false);
    timeval tv{5, 0};
    ::setsockopt(socket_.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[4096];
    boost::system::error_code ec;
    for (;;) {
      socket_.read_some(net::buffer(buf), ec);
      if (ec) return ec != net::error::would_block && ec != net::error::try_again;
    }
  }

  net::io_context io_;
  tcp::socket socket_;
};

TEST_F(LinkTest, RefusesPlaintextClient) {
  Recorder rb;
  auto b = start(options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"})), rb);
  RawClient c(b->port());
  c.send_plain("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(c.closed_by_server());
  ASSERT_TRUE(eventually([&] { return refusals(*b, "handshake") >= 1; }));
  // And the node still links with a real peer afterwards.
  Recorder ra;
  auto oa = options("acme", "n1", node_dir("acme", "n1"), trust({"acme", "beta"}));
  oa.peers.push_back({{"beta", "n1"}, "127.0.0.1", b->port()});
  auto a = start(std::move(oa), ra);
  EXPECT_TRUE(ra.wait([](auto& r) { return !r.ups_.empty(); }));
}

// A TLS client with a valid acme certificate, speaking raw bytes.
class TlsClient {
 public:
  TlsClient(uint16_t port, const fs::path& node)
      : ctx_(make_context(node)), stream_(io_, ctx_) {
    // The test does not check the server; the server checks the test.
    stream_.set_verify_mode(ssl::verify_none);
    stream_.next_layer().connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    stream_.handshake(ssl::stream_base::client);
  }
  // Credentials go into the context before the stream's SSL object is
  // made from it.
  static ssl::context make_context(const fs::path& node) {
    ssl::context ctx(ssl::context::tls_client);
    ctx.use_certificate_chain_file((node / "node.crt").string());
    ctx.use_private_key_file((node / "node.key").string(), ssl::context::pem);
    SSL_CTX_set_min_proto_version(ctx.native_handle(), TLS1_3_VERSION);
    return ctx;
  }
  void send(std::string_view bytes) { net::write(stream_, net::buffer(bytes)); }
  // Reads frames until the server closes; returns them.
  std::vector<std::pair<FrameType, std::string>> read_until_closed() {
    std::vector<std::pair<FrameType, std::string>> out;
    FrameDecoder d(kMaxMaxFrame);
    char buf[4096];
    for (;;) {
      boost::system::error_code ec;
      std::size_t n = stream_.read_some(net::buffer(buf), ec);
      if (ec) return out;
      d.feed(std::string_view(buf, n));
      while (auto f = d.next()) {
        if (!f->has_value()) break;
        out.emplace_back((*f)->type, std::string((*f)->payload));
      }
    }
  }

  net::io_context io_;
  ssl::context ctx_;
  ssl::stream<tcp::socket> stream_;
};

std::optional<GoAway> find_goaway(const std::vector<std::pair<FrameType, std::string>>& frames) {
  for (auto& [t, p] : frames) {
    if (t == FrameType::goaway) {
      auto g = decode_goaway(p);
      if (g.ok()) return *g;
    }
  }
  return std::nullopt;
}

// The bytes of a HELLO frame naming DOMAIN/NODE, as a hand-driven peer
// sends it first.
std::string hello_frame(const std::string& domain, const std::string& node,
                        uint16_t max_version = Hello::kMaxVersion) {
  Hello h;
  h.max_version = max_version;
  h.domain = domain;
  h.node = node;
  h.max_frame = kDefaultMaxFrame;
  h.heartbeat_ms = 250;
  std::string frame;
  append_frame(frame, FrameType::hello, 0, encode(h));
  return frame;
}

TEST_F(LinkTest, RandomBytesInsteadOfHelloAreRefused) {
  Recorder rb;
  auto b = start(options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"})), rb);
  TlsClient c(b->port(), node_dir("acme", "n1"));
  std::string noise;
  for (int i = 0; i < 64; ++i) noise.push_back(static_cast<char>((i * 97 + 13) & 0xFF));
  c.send(noise);
  auto frames = c.read_until_closed();
  ASSERT_TRUE(eventually([&] { return refusals(*b, "hello") >= 1; }));
  auto g = find_goaway(frames);
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->code, WireError::protocol);
  EXPECT_TRUE(rb.ups_.empty());
}

TEST_F(LinkTest, HelloNamingAnotherIdentityIsRefused) {
  Recorder rb;
  auto b = start(options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"})), rb);
  TlsClient c(b->port(), node_dir("acme", "n1"));
  // HELLO names acme/n2; the certificate says acme/n1.
  std::string frame = hello_frame("acme", "n2");
  c.send(frame);
  auto g = find_goaway(c.read_until_closed());
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->code, WireError::identity);
  EXPECT_EQ(refusals(*b, "hello"), 1u);
}

TEST_F(LinkTest, FrameOverTheMaximumEndsTheLink) {
  Recorder rb;
  auto ob = options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"}));
  ob.max_frame = 4096;
  auto b = start(std::move(ob), rb);
  TlsClient c(b->port(), node_dir("acme", "n1"));
  std::string bytes = hello_frame("acme", "n1");
  append_frame(bytes, FrameType::data, 1, std::string(5000, 'x'));
  c.send(bytes);
  auto frames = c.read_until_closed();
  auto g = find_goaway(frames);
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->code, WireError::frame_too_large);
  ASSERT_TRUE(rb.wait([](auto& r) { return !r.downs_.empty(); }));
  EXPECT_TRUE(rb.frames_.empty()) << "nothing of the oversized frame reaches the layer above";
}

// The dialer opens odd channels, each above the last (docs/protocol.md 8.1).
TEST_F(LinkTest, OpenOnAChannelOfTheWrongParityOrReusedEndsTheLink) {
  for (const std::vector<uint32_t>& opens : {std::vector<uint32_t>{2}, std::vector<uint32_t>{3, 1},
                                            std::vector<uint32_t>{5, 5}}) {
    Recorder rb;
    auto b = start(options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"})), rb);
    TlsClient c(b->port(), node_dir("acme", "n1"));
    std::string bytes = hello_frame("acme", "n1");
    for (uint32_t ch : opens) append_frame(bytes, FrameType::open, ch, "x");
    c.send(bytes);
    auto g = find_goaway(c.read_until_closed());
    ASSERT_TRUE(g.has_value()) << "opens " << opens.size();
    EXPECT_EQ(g->code, WireError::protocol);
    EXPECT_NE(g->reason.find("OPEN on channel " + std::to_string(opens.back())), std::string::npos)
        << g->reason;
    ASSERT_TRUE(rb.wait([](auto& r) { return !r.downs_.empty(); }));
    // Only the valid first OPEN (if any) reached the layer above.
    EXPECT_EQ(rb.frames_.size(), opens.size() - 1);
  }
}

// A peer built before version 3 announces 1..2: the link runs at 2, and a
// DATA_NAMED on it (version 3) ends the link, while on a version-3 link it
// reaches the layer above like a DATA (docs/protocol.md §5.12, §12).
TEST_F(LinkTest, APeerOfVersionTwoLinksAtTwoWhereDataNamedEndsTheLink) {
  for (uint16_t peer_version : {uint16_t{2}, uint16_t{3}}) {
    Recorder rb;
    auto b = start(options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"})), rb);
    TlsClient c(b->port(), node_dir("acme", "n1"));
    c.send(hello_frame("acme", "n1", peer_version));
    ASSERT_TRUE(rb.wait([](auto& r) { return !r.ups_.empty(); }));
    EXPECT_EQ(b->version({"acme", "n1"}), peer_version);
    Data d;
    d.first_seq = 1;
    d.count = 2;
    d.body = "xy";
    std::string bytes;
    append_frame(bytes, FrameType::data, 1, encode(d));
    d.first_seq = 3;
    d.named = {{"loader-7", 1, 3, 4, 0}};
    append_frame(bytes, FrameType::data_named, 1, encode(d));
    c.send(bytes);
    if (peer_version == 2) {
      auto g = find_goaway(c.read_until_closed());
      ASSERT_TRUE(g.has_value());
      EXPECT_EQ(g->code, WireError::protocol);
      EXPECT_EQ(g->reason, "frame type data_named on a link negotiated at protocol version 2");
      ASSERT_TRUE(rb.wait([](auto& r) { return !r.downs_.empty(); }));
      ASSERT_EQ(rb.frames_.size(), 1u);  // the DATA, not what followed
      EXPECT_EQ(rb.frames_[0].type, FrameType::data);
    } else {
      ASSERT_TRUE(rb.wait([](auto& r) { return r.frames_.size() == 2; }));
      EXPECT_EQ(rb.frames_[1].type, FrameType::data_named);
      EXPECT_EQ(rb.frames_[1].payload, encode(d));
      EXPECT_TRUE(rb.wait([](auto& r) { return r.downs_.empty(); }, 0ms));  // the link stays up
    }
  }
}

// CONTROL frames (contract negotiation) travel on channel 0 and reach the
// layer above; a link-level type on another channel ends the link.
TEST_F(LinkTest, ControlFramesReachTheHandlerOnlyOnChannelZero) {
  Recorder rb;
  auto b = start(options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"})), rb);
  {
    TlsClient c(b->port(), node_dir("acme", "n1"));
    std::string bytes = hello_frame("acme", "n1");
    append_frame(bytes, FrameType::control, 0, R"({"type":"sync"})");
    c.send(bytes);
    ASSERT_TRUE(rb.wait([](auto& r) { return !r.frames_.empty(); }));
  }
  ASSERT_TRUE(rb.wait([](auto& r) { return !r.downs_.empty(); }));
  ASSERT_EQ(rb.frames_.size(), 1u);
  EXPECT_EQ(rb.frames_[0].type, FrameType::control);
  EXPECT_EQ(rb.frames_[0].channel, 0u);
  EXPECT_EQ(rb.frames_[0].payload, R"({"type":"sync"})");

  for (FrameType t : {FrameType::control, FrameType::heartbeat}) {
    Recorder rc;
    auto c2 = start(options("beta", "n2", node_dir("beta", "n2"), trust({"acme", "beta"})), rc);
    TlsClient c(c2->port(), node_dir("acme", "n1"));
    std::string bytes = hello_frame("acme", "n1");
    append_frame(bytes, t, 5, "{}");
    c.send(bytes);
    auto g = find_goaway(c.read_until_closed());
    ASSERT_TRUE(g.has_value());
    EXPECT_EQ(g->code, WireError::protocol);
    EXPECT_NE(g->reason.find("only allowed on channel 0"), std::string::npos) << g->reason;
    ASSERT_TRUE(rc.wait([](auto& r) { return !r.downs_.empty(); }));
    EXPECT_TRUE(rc.frames_.empty());
  }
}

TEST_F(LinkTest, SilentPeerIsDeclaredFailedAndTheLinkComesBack) {
  testing::TcpProxy proxy;
  Recorder ra, rb;
  auto b = start(options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"})), rb);
  proxy.start(b->port());
  auto oa = options("acme", "n1", node_dir("acme", "n1"), trust({"acme", "beta"}));
  oa.peers.push_back({{"beta", "n1"}, "127.0.0.1", proxy.port()});
  auto a = start(std::move(oa), ra);
  ASSERT_TRUE(ra.wait([](auto& r) { return !r.ups_.empty(); }));

  // The proxy stops forwarding but keeps the connections open: only the
  // missing heartbeats tell.
  const auto frozen_at = std::chrono::steady_clock::now();
  proxy.freeze();
  ASSERT_TRUE(ra.wait([](auto& r) { return !r.downs_.empty(); }, 5s));
  const auto detected = std::chrono::steady_clock::now() - frozen_at;
  EXPECT_NE(ra.downs_[0].find("nothing received for"), std::string::npos) << ra.downs_[0];
  EXPECT_GE(detected, 350ms);
  EXPECT_LT(detected, 2s);
  EXPECT_EQ(status_of(*a, "entente://beta/n1")->state, "failed");

  // Forwarding again (new connections only): the dialer reconnects.
  proxy.cut();
  proxy.thaw();
  ASSERT_TRUE(eventually([&] { return a->is_up({"beta", "n1"}); }));
  EXPECT_GE(status_of(*a, "entente://beta/n1")->connects, 2u);
}

TEST_F(LinkTest, StopSendsGoAwayAndPeerSeesShutdown) {
  Recorder ra, rb;
  auto b = start(options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"})), rb);
  auto oa = options("acme", "n1", node_dir("acme", "n1"), trust({"acme", "beta"}));
  oa.peers.push_back({{"beta", "n1"}, "127.0.0.1", b->port()});
  auto a = start(std::move(oa), ra);
  ASSERT_TRUE(rb.wait([](auto& r) { return !r.ups_.empty(); }));
  b->stop();
  ASSERT_TRUE(ra.wait([](auto& r) { return !r.downs_.empty(); }));
  EXPECT_NE(ra.downs_[0].find("shutdown"), std::string::npos) << ra.downs_[0];
  b->stop();  // idempotent
}

TEST_F(LinkTest, StartRejectsBadOptions) {
  Recorder r;
  auto o = options("acme", "n1", node_dir("acme", "n1"), trust({"acme"}));
  auto bad_key = o;
  bad_key.key_file = (dir_ / "missing.key").string();
  auto m = LinkManager::start(bad_key, r);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("key_file"), std::string::npos);

  auto no_trust = o;
  no_trust.trust.reset();
  EXPECT_EQ(LinkManager::start(no_trust, r).error().code, Errc::invalid_argument);

  auto bad_timing = o;
  bad_timing.failure_timeout = bad_timing.heartbeat_interval;
  EXPECT_EQ(LinkManager::start(bad_timing, r).error().code, Errc::invalid_argument);

  auto no_budget = o;
  no_budget.max_handshaking_connections = 0;
  EXPECT_EQ(LinkManager::start(no_budget, r).error().code, Errc::invalid_argument);

  auto bad_listen = o;
  bad_listen.listen_host = "not-an-address";
  EXPECT_NE(LinkManager::start(bad_listen, r).error().message.find("listen"), std::string::npos);
}

// Nodes of one domain link as nodes of two domains do, each trusting only
// its own domain's CA (issue 4: "with their own domain's CA").
TEST_F(LinkTest, NodesOfOneDomainLinkWithTheirOwnDomainsCa) {
  Recorder r1, r2;
  auto own = trust({"acme"});  // no other domain is pinned
  auto n1 = start(options("acme", "n1", node_dir("acme", "n1"), own), r1);
  auto o2 = options("acme", "n2", node_dir("acme", "n2"), own);
  o2.peers.push_back({{"acme", "n1"}, "127.0.0.1", n1->port()});
  auto n2 = start(std::move(o2), r2);

  ASSERT_TRUE(r1.wait([](auto& r) { return !r.ups_.empty(); }));
  ASSERT_TRUE(r2.wait([](auto& r) { return !r.ups_.empty(); }));
  EXPECT_EQ(r1.ups_[0], "entente://acme/n2");
  EXPECT_EQ(r2.ups_[0], "entente://acme/n1");

  // Frames both ways, on the dialer's odd and the acceptor's even channels.
  auto up = n2->new_channel({"acme", "n1"});
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(*up % 2, 1u);
  ASSERT_TRUE(n2->send({"acme", "n1"}, FrameType::ack, *up, encode(Ack{7})).ok());
  auto down = n1->new_channel({"acme", "n2"});
  ASSERT_TRUE(down.ok());
  EXPECT_EQ(*down % 2, 0u);
  ASSERT_TRUE(n1->send({"acme", "n2"}, FrameType::credit, *down, encode(Credit{4096})).ok());
  ASSERT_TRUE(r1.wait([](auto& r) { return !r.frames_.empty(); }));
  ASSERT_TRUE(r2.wait([](auto& r) { return !r.frames_.empty(); }));
  EXPECT_EQ(r1.frames_[0].peer, "entente://acme/n2");
  EXPECT_EQ(r1.frames_[0].type, FrameType::ack);
  EXPECT_EQ(r1.frames_[0].channel, *up);
  EXPECT_EQ(decode_ack(r1.frames_[0].payload)->through, 7u);
  EXPECT_EQ(r2.frames_[0].peer, "entente://acme/n1");
  EXPECT_EQ(r2.frames_[0].type, FrameType::credit);
  EXPECT_EQ(r2.frames_[0].channel, *down);
  EXPECT_EQ(decode_credit(r2.frames_[0].payload)->bytes, 4096u);

  ASSERT_TRUE(eventually([&] {
    auto s = status_of(*n2, "entente://acme/n1");
    return s && s->state == "up" && s->rtt_us >= 0;
  }));
  EXPECT_TRUE(status_of(*n2, "entente://acme/n1")->dialed);
  auto accepted = status_of(*n1, "entente://acme/n2");
  ASSERT_TRUE(accepted.has_value()) << "an accepted peer of the same domain is listed";
  EXPECT_EQ(accepted->state, "up");
  EXPECT_FALSE(accepted->dialed);
  EXPECT_TRUE(n1->refusals().empty());
  EXPECT_TRUE(n2->refusals().empty());
}

// A certificate that claims the node's own domain but that another CA
// issued is refused on a same-domain link, whichever side dialed.
TEST_F(LinkTest, SameDomainLinkRefusesACertificateOfAnotherCa) {
  const fs::path evil = dir_ / "evil";
  ASSERT_TRUE(certs::init_domain("acme", evil / "ca").ok());
  certs::NodeOptions evil_node;
  evil_node.sans = {"127.0.0.1"};
  ASSERT_TRUE(certs::issue_node("acme", "n2", evil / "ca", evil / "n2", evil_node).ok());

  // The impostor dials acme/n1.
  Recorder r1, re;
  auto n1 = start(options("acme", "n1", node_dir("acme", "n1"), trust({"acme"})), r1);
  auto oe = options("acme", "n2", evil / "n2", trust({"acme"}));
  oe.peers.push_back({{"acme", "n1"}, "127.0.0.1", n1->port()});
  auto e = start(std::move(oe), re);
  ASSERT_TRUE(eventually([&] { return refusals(*n1, "untrusted_chain") >= 1; }));
  EXPECT_TRUE(eventually([&] { return logged("does not chain to the pinned CA of domain acme"); }));
  EXPECT_TRUE(r1.ups_.empty());
  EXPECT_FALSE(n1->is_up({"acme", "n2"}));

  // acme/n3 dials the impostor's address, believing it is acme/n2.
  Recorder r3;
  auto o3 = options("acme", "n3", node_dir("acme", "n3"), trust({"acme"}));
  o3.peers.push_back({{"acme", "n2"}, "127.0.0.1", e->port()});
  auto n3 = start(std::move(o3), r3);
  ASSERT_TRUE(eventually([&] { return refusals(*n3, "untrusted_chain") >= 1; }));
  EXPECT_TRUE(r3.ups_.empty());
  EXPECT_NE(status_of(*n3, "entente://acme/n2")->state, "up");

  // The refusal is about the CA, not about linking within the domain: the
  // real acme/n2 links with acme/n1.
  Recorder r2;
  auto o2 = options("acme", "n2", node_dir("acme", "n2"), trust({"acme"}));
  o2.peers.push_back({{"acme", "n1"}, "127.0.0.1", n1->port()});
  auto n2 = start(std::move(o2), r2);
  ASSERT_TRUE(r2.wait([](auto& r) { return !r.ups_.empty(); }));
  EXPECT_TRUE(eventually([&] { return n1->is_up({"acme", "n2"}); }));
  // The impostor keeps dialing; its refused attempts never displace the
  // real acme/n2.
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(n1->is_up({"acme", "n2"}));
  EXPECT_GE(refusals(*n1, "untrusted_chain"), 2u);
}

}  // namespace
}  // namespace entente::federation

namespace entente::federation {
namespace {

// A TLS 1.3 client that presents no certificate at all: refused as
// no_identity, the label a certificate without an identity gets (not
// "handshake", which is for TLS failing before any certificate is checked).
TEST_F(LinkTest, ClientWithoutCertificateIsRefusedAsNoIdentity) {
  Recorder rb;
  auto b = start(options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"})), rb);
  net::io_context io;
  ssl::context ctx(ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(ctx.native_handle(), TLS1_3_VERSION);
  ssl::stream<tcp::socket> stream(io, ctx);
  stream.set_verify_mode(ssl::verify_none);
  stream.next_layer().connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), b->port()));
  boost::system::error_code ec;
  stream.handshake(ssl::stream_base::client, ec);
  if (!ec) {
    // TLS 1.3: the server's refusal arrives after the client's handshake.
    char buf[64];
    stream.read_some(net::buffer(buf), ec);
  }
  EXPECT_TRUE(ec) << "the listener kept a client without a certificate";
  ASSERT_TRUE(eventually([&] { return refusals(*b, "no_identity") >= 1; }));
  EXPECT_EQ(refusals(*b, "handshake"), 0u);
  EXPECT_TRUE(eventually([&] { return logged("no_identity: presented no certificate"); }));
  auto refused = b->refused();
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].refusal, "no_identity");
  EXPECT_TRUE(refused[0].identity.empty());
  EXPECT_EQ(refused[0].address.rfind("127.0.0.1:", 0), 0u) << refused[0].address;
}

// An attacker's acme/n1 (its own CA calling itself acme) dials beta: beta
// lists the identity the certificate claimed with the reason; the dialer
// learns from the TLS alert that beta does not trust its CA.
TEST_F(LinkTest, BothSidesOfARefusalSayWhy) {
  const fs::path evil = dir_ / "evil";
  ASSERT_TRUE(certs::init_domain("acme", evil / "ca").ok());
  certs::NodeOptions evil_node;
  evil_node.sans = {"127.0.0.1"};
  ASSERT_TRUE(certs::issue_node("acme", "n1", evil / "ca", evil / "n1", evil_node).ok());
  Recorder ra, rb;
  auto b = start(options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"})), rb);
  auto oa = options("acme", "n1", evil / "n1", trust({"acme", "beta"}));
  oa.peers.push_back({{"beta", "n1"}, "127.0.0.1", b->port()});
  auto a = start(std::move(oa), ra);
  ASSERT_TRUE(eventually([&] {
    auto s = status_of(*a, "entente://beta/n1");
    return s && s->state == "refused";
  }));
  auto s = status_of(*a, "entente://beta/n1");
  EXPECT_EQ(s->refusal, "untrusted_chain");
  EXPECT_NE(s->last_error.find("refused this node's certificate (entente://acme/n1, TLS alert 'unknown ca')"),
            std::string::npos)
      << s->last_error;
  EXPECT_GE(refusals(*a, "refused_by_peer"), 1u);
  ASSERT_TRUE(eventually([&] { return !b->refused().empty(); }));
  auto r = b->refused().front();
  EXPECT_EQ(r.identity, "entente://acme/n1");
  EXPECT_EQ(r.refusal, "untrusted_chain");
  EXPECT_FALSE(r.by_peer);
  EXPECT_NE(r.reason.find("does not chain to the pinned CA of domain acme"), std::string::npos) << r.reason;
  EXPECT_TRUE(eventually(
      [&] { return logged("refused entente://acme/n1 (as its certificate claims) from 127.0.0.1:"); }));
}

// The refusing node's alert for an expired certificate reads as "expired"
// on the dialer that presented it.
TEST_F(LinkTest, ExpiredCertificateIsNamedOnTheRefusedDialer) {
  certs::NodeOptions old;
  old.not_before = std::chrono::system_clock::now() - std::chrono::hours(24 * 10);
  old.days = 1;
  Recorder ra, rb;
  auto b = start(options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"})), rb);
  auto oa = options("acme", "n1", node_dir("acme", "n1", old), trust({"acme", "beta"}));
  oa.peers.push_back({{"beta", "n1"}, "127.0.0.1", b->port()});
  auto a = start(std::move(oa), ra);
  ASSERT_TRUE(eventually([&] {
    auto s = status_of(*a, "entente://beta/n1");
    return s && s->refusal == "expired";
  }));
  auto s = status_of(*a, "entente://beta/n1");
  EXPECT_EQ(s->state, "refused");
  EXPECT_NE(s->last_error.find("TLS alert 'certificate expired'"), std::string::npos) << s->last_error;
  // The refusing side records it on its own thread, maybe after the
  // dialer has read the alert.
  std::vector<federation::RefusedStatus> r;
  ASSERT_TRUE(eventually([&] {
    r = b->refused();
    return !r.empty();
  }));
  EXPECT_EQ(r.front().identity, "entente://acme/n1");
  EXPECT_EQ(r.front().refusal, "expired");
}

// reload() adds a peer and its pin, then removes it; a certificate and key
// that do not match change nothing.
TEST_F(LinkTest, ReloadAddsAndRemovesPeersAndPins) {
  Recorder ra, rb;
  auto b = start(options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"})), rb);
  const fs::path acme = node_dir("acme", "n1");
  auto a = start(options("acme", "n1", acme, trust({"acme"})), ra);
  EXPECT_FALSE(status_of(*a, "entente://beta/n1").has_value());

  LinkReload next;
  next.trust = trust({"acme", "beta"});
  next.cert_file = (acme / "node.crt").string();
  next.key_file = (acme / "node.key").string();
  next.peers.push_back({{"beta", "n1"}, "127.0.0.1", b->port()});
  std::vector<std::string> changes;
  ASSERT_TRUE(a->reload(next, changes).ok());
  EXPECT_NE(std::find(changes.begin(), changes.end(),
                      "peer entente://beta/n1 added at 127.0.0.1:" + std::to_string(b->port())),
            changes.end());
  ASSERT_TRUE(eventually([&] { return a->is_up({"beta", "n1"}) && b->is_up({"acme", "n1"}); }));

  LinkReload broken = next;
  broken.peers.clear();
  broken.key_file = (node_dir("gamma", "n1") / "node.key").string();
  changes.clear();
  auto s = a->reload(broken, changes);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("key_file"), std::string::npos) << s.error().message;
  EXPECT_TRUE(changes.empty());
  EXPECT_TRUE(a->is_up({"beta", "n1"}));

  next.peers.clear();
  ASSERT_TRUE(a->reload(next, changes).ok());
  EXPECT_NE(std::find(changes.begin(), changes.end(), "peer entente://beta/n1 removed"), changes.end());
  ASSERT_TRUE(eventually([&] { return !a->is_up({"beta", "n1"}); }));
}

// One address holding idle connections (they never start TLS) gets at most
// max_connections_per_address of the listener; the rest are refused at
// accept and counted, and a real peer from another address links meanwhile.
TEST_F(LinkTest, OneAddressCannotTakeEveryConnectionSlot) {
  Recorder ra, rb;
  auto ob = options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"}));
  ob.max_connections = 8;
  ob.max_connections_per_address = 3;
  ob.max_handshaking_connections = 6;
  ob.handshake_timeout = 30s;  // the flood is not timed out during the test
  auto b = start(std::move(ob), rb);
  ASSERT_NE(b, nullptr);
  std::vector<entente::testing::RawTcp> flood;
  for (int i = 0; i < 8; ++i) {
    flood.emplace_back("127.0.0.1", b->port(), "127.0.0.2");
    ASSERT_TRUE(flood.back().connected());
  }
  ASSERT_TRUE(eventually([&] { return refusals(*b, "connections_per_address") == 5; }))
      << refusals(*b, "connections_per_address");
  EXPECT_TRUE(eventually([&] { return logged("over max_connections_per_address (3)"); }));
  auto oa = options("acme", "n1", node_dir("acme", "n1"), trust({"acme", "beta"}));
  oa.peers.push_back({{"beta", "n1"}, "127.0.0.1", b->port()});
  auto a = start(std::move(oa), ra);
  ASSERT_TRUE(ra.wait([](auto& r) { return !r.ups_.empty(); }));
  ASSERT_TRUE(rb.wait([](auto& r) { return !r.ups_.empty(); }));
  EXPECT_TRUE(b->is_up({"acme", "n1"}));
  EXPECT_EQ(refusals(*b, "connections"), 0u);
}

// A flood of refused connections logs a burst, not a line each: the
// refusals are all counted, the log holds at most 20 of them.
TEST_F(LinkTest, AFloodOfRefusedConnectionsLogsABurstAndCountsEveryOne) {
  Recorder rb;
  auto ob = options("beta", "n1", node_dir("beta", "n1"), trust({"acme", "beta"}));
  ob.max_connections_per_address = 1;
  ob.handshake_timeout = 30s;  // the one admitted is not timed out during the test
  auto b = start(std::move(ob), rb);
  ASSERT_NE(b, nullptr);
  std::vector<entente::testing::RawTcp> flood;
  for (int i = 0; i < 40; ++i) {
    flood.emplace_back("127.0.0.1", b->port(), "127.0.0.2");
    ASSERT_TRUE(flood.back().connected());
  }
  ASSERT_TRUE(eventually([&] { return refusals(*b, "connections_per_address") == 39; }))
      << refusals(*b, "connections_per_address");
  size_t lines = 0;
  {
    std::lock_guard lock(log_mu_);
    for (const auto& l : log_) lines += l.find("federation: refused") != std::string::npos;
  }
  EXPECT_EQ(lines, 20u);
}

// Connections whose peer is not verified may hold only
// max_handshaking_connections; a verified peer's connection leaves that
// share at once. Idle connections are closed after handshake_timeout.
TEST_F(LinkTest, UnverifiedConnectionsMayUseOnlyPartOfTheBudget) {
  Recorder ra, rb, rg;
  auto t = trust({"acme", "beta", "gamma"});
  auto ob = options("beta", "n1", node_dir("beta", "n1"), t);
  ob.max_connections = 6;
  ob.max_handshaking_connections = 2;
  ob.handshake_timeout = 1500ms;
  auto b = start(std::move(ob), rb);
  ASSERT_NE(b, nullptr);
  // Two verified peers: they hold two connections, none of the unverified share.
  auto oa = options("acme", "n1", node_dir("acme", "n1"), t);
  oa.peers.push_back({{"beta", "n1"}, "127.0.0.1", b->port()});
  auto a = start(std::move(oa), ra);
  auto og = options("gamma", "n1", node_dir("gamma", "n1"), t);
  og.peers.push_back({{"beta", "n1"}, "127.0.0.1", b->port()});
  auto g = start(std::move(og), rg);
  ASSERT_TRUE(ra.wait([](auto& r) { return !r.ups_.empty(); }));
  ASSERT_TRUE(rg.wait([](auto& r) { return !r.ups_.empty(); }));
  ASSERT_TRUE(rb.wait([](auto& r) { return r.ups_.size() == 2; }));
  // Three idle connections from three addresses: two get the unverified
  // share, the third is refused although max_connections has room.
  std::vector<entente::testing::RawTcp> flood;
  for (const char* from : {"127.0.0.2", "127.0.0.3"}) {
    flood.emplace_back("127.0.0.1", b->port(), from);
    ASSERT_TRUE(flood.back().connected());
  }
  std::this_thread::sleep_for(200ms);  // both are accepted before the third arrives
  EXPECT_EQ(refusals(*b, "handshaking"), 0u);
  flood.emplace_back("127.0.0.1", b->port(), "127.0.0.4");
  ASSERT_TRUE(flood.back().connected());
  EXPECT_TRUE(flood.back().closed_within(5s));
  ASSERT_TRUE(eventually([&] { return refusals(*b, "handshaking") == 1; }));
  EXPECT_EQ(refusals(*b, "connections"), 0u);
  // The two that got in are closed when their handshake deadline passes.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(flood[0].closed_within(10s));
  EXPECT_TRUE(flood[1].closed_within(10s));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  ASSERT_TRUE(eventually([&] { return refusals(*b, "handshake") >= 2; }));
  // Both links stayed up throughout.
  EXPECT_TRUE(b->is_up({"acme", "n1"}));
  EXPECT_TRUE(b->is_up({"gamma", "n1"}));
  EXPECT_TRUE(rb.wait([](auto& r) { return r.downs_.empty(); }, 0ms));
}

}  // namespace
}  // namespace entente::federation
