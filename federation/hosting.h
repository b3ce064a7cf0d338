#pragma once
// Hosting offers between domains (docs/protocol.md §14, docs/cluster.md,
// "Moving a fragment to another domain"): the node of the owner domain
// that runs a fragment offers it to a node of the host domain, sending the
// fragment's declarative definition (its query network JSON: box kinds,
// options and expressions, never code) and its measured load; the host
// checks the offer itself, against its own ledger and with its own engine,
// and replies. The host trusts nothing the owner says but the load: it
// parses the definition, takes the box kinds from it, and asks
// contracts::may_host_fragment with owner = the peer's authenticated
// domain.
//
// Messages (JSON objects on CONTROL frames, channel 0):
//   {"type":"hosting.offer","id":N,"query":Q,"fragment":F,"network":{…},
//    "load":L}
//   {"type":"hosting.reply","id":N,"admitted":true|false,"contract":"c-…",
//    "reason":"…"}
// `id` is the offering node's, echoed back. `admitted` says the offer
// passed every check here (`contract` names the contract it would run
// under); `reason` says why not, or, when admitted, what happens next.
//
// A hosted run (docs/cluster.md, "Moving a fragment to another domain")
// then goes by calls, owner to host, each answered once:
//   {"type":"hosting.warm"|"hosting.run"|"hosting.chunk"|"hosting.end"|
//    "hosting.release", "id":N, …}
//   {"type":"hosting.answer","id":N,"ok":true|false,"reason":"…","body":{…}}
// and by notices, host to owner, never answered:
//   {"type":"hosting.usage", …}
// What the members of each mean is the broker's (Hooks::serve); this class
// carries them, matches answers to calls and bounds them.
//
// Bounds: a network of at most kMaxOfferNetworkBytes, names of at most 64
// characters, at most kMaxPendingOffers offers awaiting a reply per node,
// each for at most the timeout given (kOfferTimeout by default).
//
// Ownership: owned by Peering, which routes "hosting.*" CONTROL messages
// here; borrows the ledger (Contracting's), which outlives it. Threading:
// offer() from any thread, on_control() and on_link_down() on the io
// thread, expire() on Peering's timer thread; one mutex, never held while
// sending or calling `done`.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <optional>
#include <string_view>

#include "base/result.h"
#include "certs/certs.h"
#include "contracts/ledger.h"
#include "rapidjson/fwd.h"

namespace entente::federation {

inline constexpr size_t kMaxOfferNetworkBytes = 256u << 10;
inline constexpr size_t kMaxPendingOffers = 64;
inline constexpr std::chrono::milliseconds kOfferTimeout{10'000};
// The largest hosting message taken or sent (a call's fields included).
inline constexpr size_t kMaxHostingMessageBytes = kMaxOfferNetworkBytes + 4096;

class Hosting final {
 public:
  using Clock = std::chrono::steady_clock;
  struct Offer {
    std::string query;
    std::string fragment;
    std::string network_json;  // the fragment's complete query network
    uint64_t load = 0;         // CPU ms per second, measured by the owner (1..1'000'000)
  };
  struct Reply {
    bool admitted = false;
    std::string contract;  // when admitted
    std::string reason;
  };
  using Done = std::function<void(Result<Reply>)>;
  // The answer to a call: its "body" (a JSON object), or the host's
  // refusal (conflict, its reason), or unavailable (no link, no
  // answer in time).
  using CallDone = std::function<void(Result<std::string>)>;
  // How a served call is answered (once; any thread).
  using Answer = std::function<void(bool ok, const std::string& reason, const std::string& body_json)>;
  struct Hooks {
    // Sends a CONTROL message to one peer node; false when its link is down.
    std::function<bool(const certs::Identity& peer, const std::string& message)> send_to_peer;
    std::function<void(const std::string&)> log;
    std::function<int64_t()> now_ms;  // Unix ms (the ledger's time); null: the system clock
    // A call or notice of a hosted run from `peer`: `type` ("hosting.run",
    // …), `message` the whole JSON object; `answer` is null for a notice.
    // Runs on the link's io thread: it must not block.
    std::function<void(const certs::Identity& peer, const std::string& type, const std::string& message,
                       Answer answer)>
        serve;
  };

  Hosting(const contracts::Ledger& ledger, std::string self_domain, Hooks hooks);
  Hosting(const Hosting&) = delete;
  Hosting& operator=(const Hosting&) = delete;

  // Owner side: sends `offer` to `host`; `done` runs once, with the reply,
  // or unavailable when the link is down, the node has kMaxPendingOffers
  // offers waiting or is stopping, or no reply came within `timeout`.
  void offer(const certs::Identity& host, const Offer& offer, Done done,
             std::chrono::milliseconds timeout = kOfferTimeout);

  // Owner side: a call of a hosted run to `host`: {"type": type, "id": …,
  // `fields`} (`fields`: JSON members, "" for none). `done` runs once.
  void call(const certs::Identity& host, const std::string& type, const std::string& fields, CallDone done,
            std::chrono::milliseconds timeout = kOfferTimeout);
  // Host side: a notice to `owner` ({"type": type, `fields`}); false when
  // the link is down.
  bool notify(const certs::Identity& owner, const std::string& type, const std::string& fields);

  // A "hosting.*" CONTROL message from `peer` (its payload, any size: it
  // is checked here).
  void on_control(const certs::Identity& peer, std::string_view message);
  // Offers waiting on `peer` fail (unavailable).
  void on_link_down(const certs::Identity& peer);
  // Offers past their deadline fail (unavailable).
  void expire(Clock::time_point now = Clock::now());
  // Every offer waiting fails, and offers made afterwards fail at once
  // (the node stops).
  void stop();

  // Host side, the check of one offer from domain `owner` (exposed for
  // tests): the reply this node sends.
  Reply check(const std::string& owner, const Offer& offer) const;

 private:
  struct Pending {
    certs::Identity host;
    Clock::time_point deadline;
    Done done;           // an offer's
    CallDone call_done;  // or a call's
  };
  // Registers a pending offer or call; 0 when refused (`why` says).
  uint64_t add_pending(Pending p, std::string& why);
  // Takes the pending entry `id` if `peer` is its host.
  std::optional<Pending> take_pending(uint64_t id, const certs::Identity& peer);
  void on_answer(const certs::Identity& peer, const rapidjson::Document& d);
  void serve(const certs::Identity& peer, const std::string& type, std::string_view message,
             const rapidjson::Document& d);
  void reply(const certs::Identity& peer, uint64_t id, const Reply& r);
  // Removes and fails the offers `which` selects, outside the lock.
  void fail_where(const std::function<bool(const Pending&)>& which, const std::string& why);

  const contracts::Ledger& ledger_;
  const std::string self_domain_;
  Hooks hooks_;
  std::mutex mu_;
  bool stopped_ = false;                  // guarded by mu_
  uint64_t next_id_ = 1;                  // guarded by mu_
  std::map<uint64_t, Pending> pending_;   // guarded by mu_
};

// The wire form of an offer and its reading (exposed for tests):
// invalid_argument naming the first member that is missing, of the wrong
// type or out of bounds.
std::string encode_offer(uint64_t id, const Hosting::Offer& offer);
Result<Hosting::Offer> decode_offer(std::string_view message, uint64_t& id);

}  // namespace entente::federation
