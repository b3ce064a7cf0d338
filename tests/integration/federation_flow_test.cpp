// Federation details of issue 4 shown against a real `entente broker`
// process, with certificates made by `entente certs`:
//  - credit-based flow control per channel: the test process is a
//    hand-driven importer (node beta/n1 on a federation::LinkManager) that
//    starves one channel of credit and checks that the other stream still
//    arrives whole, that the owner never sends beyond the credit given, and
//    that the starved stream completes once credit comes;
//  - nodes of one domain link with their own domain's CA, and a node that
//    claims the domain under another CA is refused.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "certs/trust.h"
#include "engine/batch.h"
#include "engine/codec.h"
#include "federation/link.h"
#include "federation/messages.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/federation.h"

namespace entente::testing {
namespace {

using namespace std::chrono_literals;
using federation::FrameType;

constexpr int64_t kT0 = 1'700'000'000'000;

const char* kSchema =
    R"([{"name":"k","type":"int64"},{"name":"v","type":"int64"},{"name":"date_time","type":"timestamp"}])";

// Publishes rows [from, from + count) to `stream` in one request.
void publish_kv(const FedNode& n, const std::string& stream, uint64_t from, uint64_t count) {
  std::string body;
  for (uint64_t i = from; i < from + count; ++i) {
    body += "{\"k\":" + std::to_string(i) + ",\"v\":" + std::to_string(i * 31 % 977) +
            ",\"date_time\":" + std::to_string(kT0 + static_cast<int64_t>(i)) + "}\n";
  }
  auto r = n.process().request("POST", "/v1/streams/" + stream + "/tuples", body, kPublisherToken,
                               "application/x-ndjson");
  ASSERT_EQ(r.status, 200u) << n.identity() << " publish to " << stream << ": " << r.body;
}

// ------------------------------------------------------------------ importer

// A subscriber written by hand on a LinkManager: opens channels, counts the
// credit it grants and the DATA bytes it receives per channel, and checks
// every DATA frame as it arrives (on the link's io thread). On channels in
// auto mode it returns each DATA's size as CREDIT and ACKs what it got, as
// a well-behaved importer does; on the others it returns nothing.
class HandImporter final : public federation::LinkHandler {
 public:
  struct Channel {
    std::string stream;
    bool auto_credit = false;
    bool open_ok = false;
    std::string reset;         // the owner's RESET, decoded
    uint64_t granted = 0;      // credit given in OPEN and CREDIT frames
    uint64_t received = 0;     // DATA payload bytes
    uint64_t max_excess = 0;   // largest received - granted seen after a DATA
    uint64_t frames = 0;
    uint64_t largest_frame = 0;
    uint64_t next_seq = 1;     // the next sequence number expected
    std::vector<std::string> errors;  // broken frames, gaps, duplicates
  };

  void attach(federation::LinkManager* links) {
    std::lock_guard lock(mu_);
    links_ = links;
  }

  void on_link_up(const certs::Identity&) override {
    std::lock_guard lock(mu_);
    ++ups_;
    cv_.notify_all();
  }
  void on_link_down(const certs::Identity& peer, std::string_view reason) override {
    std::lock_guard lock(mu_);
    downs_.push_back(peer.uri() + ": " + std::string(reason));
    cv_.notify_all();
  }

  void on_frame(const certs::Identity& peer, FrameType type, uint32_t channel,
                std::string_view payload) override {
    // Channel 0 carries the node's control messages (contracts), which this
    // importer does not speak; they are not flow-controlled.
    if (channel == 0) return;
    std::lock_guard lock(mu_);
    auto it = channels_.find(channel);
    if (it == channels_.end()) {
      stray_.push_back("frame type " + std::to_string(static_cast<int>(type)) + " on unopened channel " +
                       std::to_string(channel));
      return;
    }
    Channel& c = it->second;
    if (type == FrameType::open_ok) {
      c.open_ok = true;
    } else if (type == FrameType::reset) {
      auto r = federation::decode_reset(payload);
      c.reset = r.ok() ? std::string(federation::wire_error_name(r->code)) + ": " + r->reason : "undecodable";
    } else if (type == FrameType::data) {
      on_data(peer, channel, c, payload);
    } else {
      c.errors.push_back("unexpected frame type " + std::to_string(static_cast<int>(type)));
    }
    cv_.notify_all();
  }

  // Sends OPEN for `stream` from sequence number 1 with `credit`; returns
  // the channel (0 and a test failure when it could not).
  uint32_t open(const certs::Identity& owner, const std::string& stream, uint32_t credit, bool auto_credit) {
    std::lock_guard lock(mu_);
    auto ch = links_->new_channel(owner);
    EXPECT_TRUE(ch.ok()) << ch.error().message;
    if (!ch.ok()) return 0;
    Channel& c = channels_[*ch];
    c.stream = stream;
    c.auto_credit = auto_credit;
    c.granted = credit;  // counted before the owner can use it
    federation::Open o;
    o.stream = stream;
    o.from_seq = 1;
    o.credit = credit;
    Status s = links_->send(owner, FrameType::open, *ch, federation::encode(o));
    EXPECT_TRUE(s.ok()) << s.error().message;
    return *ch;
  }

  // Grants `bytes` more on `channel`.
  void grant(const certs::Identity& owner, uint32_t channel, uint32_t bytes) {
    std::lock_guard lock(mu_);
    channels_[channel].granted += bytes;
    Status s = links_->send(owner, FrameType::credit, channel, federation::encode(federation::Credit{bytes}));
    EXPECT_TRUE(s.ok()) << s.error().message;
  }

  void ack(const certs::Identity& owner, uint32_t channel, uint64_t through) {
    Status s = links_->send(owner, FrameType::ack, channel, federation::encode(federation::Ack{through}));
    EXPECT_TRUE(s.ok()) << s.error().message;
  }

  Channel channel(uint32_t ch) {
    std::lock_guard lock(mu_);
    return channels_[ch];
  }

  // Waits until `pred(*this)` holds (under the lock) or `timeout` passes.
  template <class Pred>
  bool wait(Pred pred, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return pred(channels_); });
  }

  bool link_up() {
    std::lock_guard lock(mu_);
    return ups_ > 0;
  }
  std::vector<std::string> downs() {
    std::lock_guard lock(mu_);
    return downs_;
  }
  std::vector<std::string> stray() {
    std::lock_guard lock(mu_);
    return stray_;
  }

 private:
  // REQUIRES: mu_.
  void on_data(const certs::Identity& peer, uint32_t channel, Channel& c, std::string_view payload) {
    ++c.frames;
    c.received += payload.size();
    c.largest_frame = std::max<uint64_t>(c.largest_frame, payload.size());
    if (c.received > c.granted) c.max_excess = std::max(c.max_excess, c.received - c.granted);
    auto d = federation::decode_data(payload);
    if (!d.ok()) {
      c.errors.push_back("DATA does not decode: " + d.error().message);
      return;
    }
    std::string_view body = d->body;
    auto b = engine::decode_batch(body);
    if (!b.ok() || !body.empty() || b->rows() != d->count || d->count == 0) {
      c.errors.push_back("DATA " + std::to_string(d->first_seq) + " does not hold its " +
                         std::to_string(d->count) + " tuples");
      return;
    }
    for (size_t i = 0; i < b->rows(); ++i) {
      const uint64_t seq = b->seq[i];
      if (seq != d->first_seq + i || seq != c.next_seq) {
        if (c.errors.size() < 10) {
          c.errors.push_back("got seq " + std::to_string(seq) + " (frame first_seq " + std::to_string(d->first_seq) +
                             "), expected " + std::to_string(c.next_seq));
        }
      }
      c.next_seq = seq + 1;
    }
    if (c.auto_credit) {
      const auto bytes = static_cast<uint32_t>(payload.size());
      c.granted += bytes;
      (void)links_->send(peer, FrameType::credit, channel, federation::encode(federation::Credit{bytes}));
      (void)links_->send(peer, FrameType::ack, channel,
                         federation::encode(federation::Ack{d->first_seq + d->count - 1}));
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  federation::LinkManager* links_ = nullptr;  // REQUIRES: mu_ to set
  std::map<uint32_t, Channel> channels_;
  int ups_ = 0;
  std::vector<std::string> downs_, stray_;
};

std::string describe(const HandImporter::Channel& c) {
  std::string s = c.stream + ": granted " + std::to_string(c.granted) + ", received " + std::to_string(c.received) +
                  " bytes in " + std::to_string(c.frames) + " DATA frames (largest " +
                  std::to_string(c.largest_frame) + "), next seq " + std::to_string(c.next_seq);
  if (!c.reset.empty()) s += ", RESET " + c.reset;
  for (const auto& e : c.errors) s += "\n  " + e;
  return s;
}

// ------------------------------------------------------------------ 1

TEST(FederationFlow, OneStarvedChannelDoesNotStallTheOtherAndCreditIsNeverExceeded) {
  Federation fed;
  FedNode& acme = fed.add("acme");
  // beta/n1 is this test process: its certificate comes from `entente
  // certs` like any node's, but no broker starts for it.
  FedNode& beta = fed.add("beta");
  acme.pins(beta, "", beta.ca_file());  // acme accepts beta, never dials it
  acme.exports("slow", {"beta"}).exports("fast", {"beta"});
  ASSERT_TRUE(acme.start()) << acme.last_error();
  ASSERT_NO_FATAL_FAILURE(create_stream(acme, "slow", kSchema));
  ASSERT_NO_FATAL_FAILURE(create_stream(acme, "fast", kSchema));

  const certs::Identity owner{"acme", "n1"};
  std::mutex log_mu;
  std::vector<std::string> log;
  HandImporter importer;
  auto started = hand_link(beta, acme, importer, [&](std::string_view line) {
    std::lock_guard lock(log_mu);
    log.emplace_back(line);
  });
  ASSERT_TRUE(started.ok()) << started.error().message;
  std::unique_ptr<federation::LinkManager> links = std::move(*started);
  importer.attach(links.get());

  constexpr uint32_t kSmallCredit = 4096;
  constexpr uint32_t kNormalCredit = 256 * 1024;
  const uint32_t slow = importer.open(owner, "acme/slow", kSmallCredit, /*auto_credit=*/false);
  const uint32_t fast = importer.open(owner, "acme/fast", kNormalCredit, /*auto_credit=*/true);
  ASSERT_NE(slow, 0u);
  ASSERT_NE(fast, 0u);
  EXPECT_NE(slow, fast);
  EXPECT_EQ(slow % 2, 1u) << "beta dialed, so its channels are odd";
  ASSERT_TRUE(importer.wait(
      [&](auto& chans) {
        return (chans[slow].open_ok || !chans[slow].reset.empty()) && (chans[fast].open_ok || !chans[fast].reset.empty());
      },
      10s));
  ASSERT_TRUE(importer.channel(slow).open_ok) << describe(importer.channel(slow));
  ASSERT_TRUE(importer.channel(fast).open_ok) << describe(importer.channel(fast));

  // Both streams get the same tuples, interleaved, 50 per request (each
  // request is one record of roughly 1.5 KiB: the slow channel's credit
  // holds a couple of them).
  constexpr uint64_t kN = 20000;
  constexpr uint64_t kPerRequest = 50;
  for (uint64_t i = 0; i < kN; i += kPerRequest) {
    ASSERT_NO_FATAL_FAILURE(publish_kv(acme, "slow", i, kPerRequest));
    ASSERT_NO_FATAL_FAILURE(publish_kv(acme, "fast", i, kPerRequest));
  }

  // The fast stream arrives whole while the slow one sits at its credit.
  const bool fast_done = importer.wait([&](auto& chans) { return chans[fast].next_seq > kN; }, 15s);
  ASSERT_TRUE(fast_done) << describe(importer.channel(fast)) << "\n" << describe(importer.channel(slow));
  HandImporter::Channel f = importer.channel(fast);
  EXPECT_EQ(f.next_seq, kN + 1) << describe(f);
  EXPECT_TRUE(f.errors.empty()) << describe(f);
  EXPECT_TRUE(f.reset.empty()) << describe(f);
  EXPECT_EQ(f.max_excess, 0u) << "the owner sent beyond the fast channel's credit: " << describe(f);
  // Give the owner time to (wrongly) push more into the starved channel.
  std::this_thread::sleep_for(300ms);
  HandImporter::Channel s = importer.channel(slow);
  EXPECT_LE(s.received, kSmallCredit) << describe(s);
  EXPECT_EQ(s.max_excess, 0u) << describe(s);
  EXPECT_GT(s.received, 0u) << "the owner sent nothing although a record fits the credit: " << describe(s);
  EXPECT_LT(s.next_seq, kN / 10) << describe(s);
  EXPECT_TRUE(s.errors.empty()) << describe(s);
  EXPECT_TRUE(s.reset.empty()) << describe(s);

  // acme keeps serving, and shows the link up.
  auto health = acme.process().try_request("GET", "/v1/health", "", kReaderToken);
  ASSERT_TRUE(health.ok()) << health.error().message;
  EXPECT_EQ(health->status, 200u) << health->body;
  const PeersView peers = get_peers(acme.process());
  EXPECT_EQ(peers.state_of(beta.identity()), "up") << peers.body;
  ASSERT_NE(peers.find(beta.identity()), nullptr) << peers.body;
  EXPECT_GE(peers.find(beta.identity())->tuples_out, kN) << peers.body;

  // Credit for the slow channel, a little at a time: each step lets the
  // owner send at most that much more, and the stream completes in order.
  constexpr uint32_t kStep = 32 * 1024;
  const auto deadline = std::chrono::steady_clock::now() + 15s;
  int steps = 0;
  while (importer.channel(slow).next_seq <= kN && std::chrono::steady_clock::now() < deadline) {
    importer.grant(owner, slow, kStep);
    ++steps;
    // The owner uses the new credit (or ends the stream) before the next step.
    importer.wait([&](auto& chans) {
      const auto& c = chans[slow];
      return c.next_seq > kN || c.received + f.largest_frame > c.granted || !c.reset.empty();
    }, 2s);
    s = importer.channel(slow);
    ASSERT_LE(s.received, s.granted) << describe(s);
    ASSERT_TRUE(s.reset.empty()) << describe(s);
  }
  s = importer.channel(slow);
  EXPECT_EQ(s.next_seq, kN + 1) << "after " << steps << " credit steps: " << describe(s);
  EXPECT_TRUE(s.errors.empty()) << describe(s);
  EXPECT_EQ(s.max_excess, 0u) << "the owner sent beyond the slow channel's credit: " << describe(s);
  EXPECT_GT(steps, 5) << "the slow stream should have needed many small grants: " << describe(s);
  importer.ack(owner, slow, kN);

  EXPECT_TRUE(importer.downs().empty()) << importer.downs().front();
  EXPECT_TRUE(importer.stray().empty()) << importer.stray().front();
  links->stop();
}

// ------------------------------------------------------------------ 2

TEST(FederationFlow, NodesOfOneDomainLinkWithTheirOwnCa) {
  Federation fed;
  FedNode& n1 = fed.add("acme", "n1");
  FedNode& n2 = fed.add("acme", "n2");
  // Claims acme, but another CA issued its certificate.
  FedNode& n3 = fed.add_impostor("acme", "n3");
  fed.link(n1, n2);
  // n1 dials n3, so n1 is the side that checks n3's certificate.
  n1.pins(n3, n3.federation_address(), n1.ca_file());
  n3.pins(n1, "", n1.ca_file());
  ASSERT_TRUE(fed.start_all()) << fed.last_error();
  ASSERT_NO_FATAL_FAILURE(wait_linked(n1, n2));

  PeersView v1;
  EXPECT_TRUE(eventually(10s, [&] {
    v1 = get_peers(n1.process());
    auto it = v1.refusals.find("untrusted_chain");
    return it != v1.refusals.end() && it->second >= 1;
  })) << "acme/n1 GET /v1/peers: " << v1.body << "\nstderr:\n" << n1.process().stderr_text();
  EXPECT_NE(n1.process().stderr_text().find("does not chain to the pinned CA of domain acme"), std::string::npos)
      << n1.process().stderr_text();
  const auto until = std::chrono::steady_clock::now() + 1500ms;
  while (std::chrono::steady_clock::now() < until) {
    v1 = get_peers(n1.process());
    ASSERT_NE(v1.state_of(n3.identity()), "up") << v1.body;
    ASSERT_EQ(v1.state_of(n2.identity()), "up") << v1.body;
    std::this_thread::sleep_for(100ms);
  }
  const PeersView v2 = get_peers(n2.process());
  ASSERT_NE(v2.find(n1.identity()), nullptr) << v2.body;
  EXPECT_GT(v2.find(n1.identity())->bytes_in, 0u) << v2.body;
  EXPECT_GE(v2.find(n1.identity())->rtt_us, 0) << v2.body;
}

}  // namespace
}  // namespace entente::testing
