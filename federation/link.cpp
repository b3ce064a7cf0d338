#include "federation/link.h"

// GCC 12 misreports Asio's coroutine-frame allocator (its own operator new
// paired with its own sized delete) as a mismatched new/delete where frames
// are destroyed inline, in the sanitizer build; the pairing is Asio's and is
// correct.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "base/log.h"
#include "base/openssl_error.h"
#include "federation/messages.h"
#include "net/address.h"
#include "net/tls.h"

namespace entente::federation {
namespace {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;
using error_code = boost::system::error_code;
using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

inline constexpr auto use_tuple = net::as_tuple(net::use_awaitable);

constexpr std::size_t kReadChunk = 64 * 1024;

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             SteadyClock::now().time_since_epoch())
      .count();
}

int64_t unix_ms() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

using base::openssl_reason;

// What the certificate callback of one connection decided. Lives in the
// connection's coroutine frame; the SSL object points at it through ex_data.
// It holds the trust store it started with: a reload does not change the
// pins under a handshake in progress.
struct VerifyState {
  std::shared_ptr<const certs::TrustStore> trust;
  std::optional<std::string> expected_domain;
  std::optional<certs::Verdict> verdict;
  std::string claimed;  // the identity the certificate claims, trusted or not
};

// The entente:// identity a certificate claims, for the log and the refused
// list, before (and whether or not) it is trusted; empty when none parses.
std::string claimed_identity(X509* leaf) {
  auto* names = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(leaf, NID_subject_alt_name, nullptr, nullptr));
  if (names == nullptr) return {};
  std::string out;
  for (int i = 0; i < sk_GENERAL_NAME_num(names) && out.empty(); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(names, i);
    if (n->type != GEN_URI) continue;
    const ASN1_IA5STRING* uri = n->d.uniformResourceIdentifier;
    std::string_view text(reinterpret_cast<const char*>(ASN1_STRING_get0_data(uri)),
                          static_cast<std::size_t>(ASN1_STRING_length(uri)));
    if (auto id = certs::parse_identity(text); id.ok()) out = id->uri();
  }
  GENERAL_NAMES_free(names);
  return out;
}

// The verification error a refusal is reported with. OpenSSL turns it
// into the TLS alert the peer receives, which is all a refused peer learns:
// "unknown ca" (untrusted_chain, not_pinned), "certificate expired"
// (expired), "bad certificate" (the others). See refusal_by_alert().
int verify_error_for(const std::string& refusal) {
  if (refusal == "untrusted_chain" || refusal == "not_pinned") {
    return X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY;
  }
  if (refusal == "expired") return X509_V_ERR_CERT_HAS_EXPIRED;
  if (refusal == "not_yet_valid") return X509_V_ERR_CERT_NOT_YET_VALID;
  return X509_V_ERR_CERT_REJECTED;
}

// The OpenSSL reason code of a TLS error, 0 for another error.
int ssl_reason(const error_code& ec) {
  if (ec.category() != net::error::get_ssl_category()) return 0;
  return ERR_GET_REASON(static_cast<unsigned long>(ec.value()));
}

// A TLS alert from the peer that says it refused this node's certificate,
// as a refusal label and a line an admin can act on. `peer` names the peer
// ("entente://beta/n1 at 127.0.0.1:7001", or an address); `self` is this
// node's identity URI.
struct PeerRefusal {
  std::string label;
  std::string reason;
};
std::optional<PeerRefusal> refusal_by_alert(const error_code& ec, const std::string& peer,
                                            const certs::Identity& self) {
  const std::string head = peer + " refused this node's certificate (" + self.uri() + ", TLS alert '";
  switch (ssl_reason(ec)) {
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
      return PeerRefusal{"untrusted_chain",
                         head +
                             "unknown ca'): it does not trust the CA that signed it; the CA it pins for "
                             "domain " +
                             self.domain + " is another one, or it pins none"};
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
      return PeerRefusal{"expired", head +
                                        "certificate expired'): expired as that node sees it; compare "
                                        "the certificate's dates (entente certs show) and both clocks"};
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
      return PeerRefusal{"bad_certificate",
                         head +
                             "bad certificate'): not yet valid there, a CA certificate, no or another "
                             "identity than that node expects; its log names the reason"};
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
      return PeerRefusal{"no_identity", head + "certificate required'): this node sent no certificate"};
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
    case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE:
      return PeerRefusal{"refused", head + std::string(ec.message()) + "'); its log names the reason"};
    default:
      return std::nullopt;
  }
}

// A certificate chain and its key, loaded and checked (net/tls.h, the same
// checks and messages as at start-up) before a reload replaces the ones in
// use. The 1 MiB bound keeps a wrong path (a log, a device) from being read
// whole.
Result<inet::TlsCredentials> load_credentials(const std::string& cert_file, const std::string& key_file) {
  constexpr std::uintmax_t kMaxPemBytes = 1 << 20;
  std::error_code size_ec;
  for (const auto* path : {&cert_file, &key_file}) {
    const auto size = std::filesystem::file_size(*path, size_ec);
    if (!size_ec && size > kMaxPemBytes) {
      return make_error(Errc::invalid_argument, "federation: " + *path + " is over 1 MiB");
    }
  }
  return inet::load_tls_credentials(cert_file, key_file, "federation ");
}

int verify_state_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

// Replaces OpenSSL's chain building: the peer is checked only against the
// pinned CA of the domain its certificate claims (TrustStore::verify).
int verify_peer_certificate(X509_STORE_CTX* store_ctx, void*) {
  auto* ssl_conn = static_cast<SSL*>(
      X509_STORE_CTX_get_ex_data(store_ctx, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* state = ssl_conn == nullptr
                    ? nullptr
                    : static_cast<VerifyState*>(SSL_get_ex_data(ssl_conn, verify_state_index()));
  X509* leaf = X509_STORE_CTX_get0_cert(store_ctx);
  if (state == nullptr || state->trust == nullptr || leaf == nullptr) {
    X509_STORE_CTX_set_error(store_ctx, X509_V_ERR_APPLICATION_VERIFICATION);
    return 0;
  }
  std::optional<std::string_view> expected;
  if (state->expected_domain) expected = *state->expected_domain;
  state->claimed = claimed_identity(leaf);
  state->verdict =
      state->trust->verify(leaf, X509_STORE_CTX_get0_untrusted(store_ctx), expected);
  if (!state->verdict->ok()) {
    X509_STORE_CTX_set_error(store_ctx, verify_error_for(state->verdict->refusal));
    return 0;
  }
  return 1;
}

// Closes a socket when a deadline passes, unless disarmed first. The timer's
// handler only touches the socket while armed, and the owner disarms before
// the socket moves or dies, so a handler already queued when the deadline
// is disarmed does nothing.
class Watchdog {
 public:
  Watchdog(net::io_context& io, milliseconds after, tcp::socket& socket)
      : state_(std::make_shared<int>(kArmed)), timer_(io, after) {
    timer_.async_wait([state = state_, &socket](error_code ec) {
      if (ec || *state != kArmed) return;
      *state = kFired;
      error_code ignored;
      socket.close(ignored);
    });
  }
  ~Watchdog() { disarm(); }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void disarm() {
    if (*state_ == kArmed) *state_ = kDisarmed;
    timer_.cancel();
  }
  bool fired() const { return *state_ == kFired; }

 private:
  static constexpr int kArmed = 0, kFired = 1, kDisarmed = 2;
  std::shared_ptr<int> state_;
  net::steady_timer timer_;
};

// An accepted connection's place among those whose peer is not verified
// yet (LinkOptions::max_handshaking_connections): taken at accept, given
// back when the peer's certificate has been verified or when the
// connection ends, whichever comes first. Dialed connections hold none.
// io thread only.
class UnverifiedSlot {
 public:
  UnverifiedSlot() = default;
  explicit UnverifiedSlot(std::size_t& count) : count_(&count) { ++count; }
  UnverifiedSlot(UnverifiedSlot&& o) noexcept : count_(std::exchange(o.count_, nullptr)) {}
  UnverifiedSlot& operator=(UnverifiedSlot&&) = delete;
  UnverifiedSlot(const UnverifiedSlot&) = delete;
  UnverifiedSlot& operator=(const UnverifiedSlot&) = delete;
  ~UnverifiedSlot() { release(); }

  void release() {
    if (count_ != nullptr) --*count_;
    count_ = nullptr;
  }

 private:
  std::size_t* count_ = nullptr;
};

using inet::address_key;  // per-address budgets (net/address.h)

Hello my_hello(const LinkOptions& opt) {
  Hello h;
  h.domain = opt.self.domain;
  h.node = opt.self.node;
  h.max_frame = opt.max_frame;
  h.heartbeat_ms = static_cast<uint32_t>(opt.heartbeat_interval.count());
  return h;
}

}  // namespace

class Link;

struct PeerEntry {
  PeerStatus status;
  std::optional<PeerConfig> config;
  // `config` was added at run time (add_dial_target), not configured.
  bool runtime = false;
  std::shared_ptr<Link> link;  // the link that is up, if any
  // Totals of links that ended, so counters survive reconnects.
  uint64_t bytes_in = 0, bytes_out = 0, frames_in = 0, frames_out = 0;
  // Wakes the dialer when the link goes down (or at stop).
  std::shared_ptr<net::steady_timer> dial_wake;
};

struct LinkManager::Impl {
  Impl(LinkOptions o, LinkHandler& h)
      : opt(std::move(o)), handler(h), ctx(ssl::context::tls), acceptor(io) {}

  LinkOptions opt;
  LinkHandler& handler;
  // The listener's budget besides `connections`; io thread only. Declared
  // before `io`: connection frames destroyed with it give their places back.
  std::size_t unverified = 0;  // accepted, peer certificate not verified yet
  std::map<std::string, std::size_t> per_address;  // accepted, by address_key(); no zeros
  net::io_context io{1};
  ssl::context ctx;
  tcp::acceptor acceptor;
  std::thread thread;
  std::promise<void> io_done;
  std::atomic<bool> stopped{false};

  mutable std::mutex mu;                   // guards peers, refusals, refused, opt.trust
  std::map<std::string, PeerEntry> peers;  // by identity URI
  std::map<std::string, uint64_t> refusals;
  // Refused accepted connections by claimed identity, or by client host
  // when there is none; at most kMaxRefused (the oldest goes).
  static constexpr std::size_t kMaxRefused = 32;
  std::map<std::string, RefusedStatus> refused;
  std::size_t connections = 0;  // io thread only
  // Closes each connection still in its handshake, for shutdown; io thread.
  std::map<uint64_t, std::function<void()>> handshaking;
  uint64_t next_handshake = 0;

  void log(std::string_view line) const {
    if (opt.log) {
      opt.log(line);
    } else {
      base::log(base::LogLevel::info, "federation", line);
    }
  }

  // Refusals are logged at most kRefusalLogBurst a kRefusalLogWindow, then
  // summed up in one line when the next window starts: a flood of bad
  // connections must not flood the log (each is still counted in
  // `refusals`, and shown in `refused`).
  static constexpr std::size_t kRefusalLogBurst = 20;
  static constexpr std::chrono::seconds kRefusalLogWindow{10};
  SteadyClock::time_point refusal_window_start{};  // REQUIRES: mu
  std::size_t refusal_lines = 0;                    // REQUIRES: mu; logged in this window
  std::size_t refusals_unlogged = 0;                // REQUIRES: mu; not logged in this window

  void log_refusal(const std::string& line) {
    std::size_t unlogged = 0;
    {
      std::lock_guard lock(mu);
      const auto now = SteadyClock::now();
      if (now - refusal_window_start >= kRefusalLogWindow) {
        unlogged = refusals_unlogged;
        refusal_window_start = now;
        refusal_lines = 0;
        refusals_unlogged = 0;
      }
      if (refusal_lines >= kRefusalLogBurst) {
        ++refusals_unlogged;
        return;
      }
      ++refusal_lines;
    }
    if (unlogged > 0) {
      log("federation: " + std::to_string(unlogged) + " more refusals in the last " +
          std::to_string(kRefusalLogWindow.count()) +
          " s were not logged (entente_federation_refusals_total counts every one)");
    }
    log(line);
  }

  void refuse(const std::string& label, const std::string& reason) {
    {
      std::lock_guard lock(mu);
      ++refusals[label];
    }
    log_refusal("federation: refused " + reason);
  }

  // A refused connection with a known label, as GET /v1/peers shows it: on
  // the configured peer it was with (dialed, or claimed by the client's
  // certificate) and, for an accepted one, in `refused`. Counted under
  // `label`, or "refused_by_peer" when the peer refused this node.
  void refused_connection(const std::string& label, const std::string& reason,
                          const std::optional<PeerConfig>& dialed, const std::string& address,
                          const std::string& claimed, bool by_peer);

  std::shared_ptr<const certs::TrustStore> trust() const {
    std::lock_guard lock(mu);
    return opt.trust;
  }

  net::awaitable<void> accept_loop();
  net::awaitable<void> dial_loop(PeerConfig peer, std::shared_ptr<net::steady_timer> wake);
  // Handshakes and, when that succeeds, runs the link until it ends.
  // `slot`: an accepted connection's unverified place, released once the
  // peer's certificate is verified.
  net::awaitable<void> run_connection(tcp::socket socket, std::optional<PeerConfig> dialed,
                                      std::string address, UnverifiedSlot slot = {});
  // The steps of run_connection. The TLS handshake: the verified peer, or
  // nullopt once the refusal is recorded.
  net::awaitable<std::optional<certs::Identity>> tls_handshake(ssl::stream<tcp::socket>& stream,
                                                               const std::optional<PeerConfig>& dialed,
                                                               const std::string& address, const std::string& who,
                                                               Watchdog& deadline);
  // Sends this node's HELLO and reads the peer's (within `deadline`).
  struct HelloExchange {
    std::optional<Hello> theirs;
    uint16_t version = 0;  // negotiated, once `theirs` is checked
    std::string problem;  // empty when `theirs` arrived well formed
    WireError problem_code = WireError::protocol;
    // In TLS 1.3 the client's handshake ends before the server checks the
    // client's certificate: a refusal of this node arrives as an alert here.
    std::optional<PeerRefusal> refused_by_peer;
    error_code write_error;
  };
  net::awaitable<HelloExchange> exchange_hello(ssl::stream<tcp::socket>& stream, FrameDecoder& decoder,
                                               const std::string& who, Watchdog& deadline);
  // The peer's HELLO against its certificate and this node's versions;
  // sets hello.problem when it does not fit.
  void check_hello(HelloExchange& hello, const certs::Identity& peer) const;
  // Installs an established link; false when an existing link wins.
  bool install(const std::shared_ptr<Link>& link);
  // The connection a pair of nodes keeps is the one dialed by the smaller
  // identity URI; both sides compute the same answer.
  bool preferred(const Link& link) const;
  bool is_smaller(const certs::Identity& peer) const { return opt.self.uri() < peer.uri(); }
  void uninstall(const std::shared_ptr<Link>& link, const std::string& reason);
  void shutdown();
};

// One established connection: reader, writer and heartbeat coroutines over
// one TLS stream. Everything but the send queue is io-thread only.
class Link : public std::enable_shared_from_this<Link> {
 public:
  Link(LinkManager::Impl& impl, ssl::stream<tcp::socket> stream, certs::Identity peer,
       bool dialed, std::string address, uint32_t peer_max_frame)
      : impl_(impl),
        stream_(std::move(stream)),
        peer_(std::move(peer)),
        uri_(peer_.uri()),
        dialed_(dialed),
        address_(std::move(address)),
        peer_max_frame_(peer_max_frame),
        writer_wake_(stream_.get_executor()),
        heartbeat_timer_(stream_.get_executor()),
        last_rx_(SteadyClock::now()),
        next_channel_(dialed ? 1 : 2) {}

  const certs::Identity& peer() const { return peer_; }
  const std::string& uri() const { return uri_; }
  bool dialed() const { return dialed_; }
  const std::string& address() const { return address_; }
  uint32_t peer_max_frame() const { return peer_max_frame_; }

  // Any thread.
  Status enqueue(FrameType type, uint32_t channel, std::string_view payload) {
    if (payload.size() > peer_max_frame_) {
      return make_error(Errc::limit_exceeded,
                        "frame payload of " + std::to_string(payload.size()) +
                            " bytes is over the link's maximum of " +
                            std::to_string(peer_max_frame_));
    }
    {
      std::lock_guard lock(send_mu_);
      if (closing_) return make_error(Errc::unavailable, "link to " + uri_ + " is closing");
      if (pending_.size() > impl_.opt.max_send_queue_bytes) {
        return make_error(Errc::unavailable, "send queue to " + uri_ + " is full");
      }
      append_frame(pending_, type, channel, payload);
    }
    wake_writer();
    return {};
  }

  Result<uint32_t> new_channel() {
    uint32_t c = next_channel_.fetch_add(2);
    if (c > 0xFFFFFFF0u) return make_error(Errc::unavailable, "channel numbers exhausted");
    return c;
  }

  // Queues a GOAWAY and closes once it is written. Any thread.
  void close_with(WireError code, const std::string& reason) {
    {
      std::lock_guard lock(send_mu_);
      if (closing_) return;
      append_frame(pending_, FrameType::goaway, 0, encode(GoAway{code, reason}));
      closing_ = true;
    }
    if (close_reason_.empty()) close_reason_ = reason;
    wake_writer();
  }

  // Immediately, io thread.
  void abort(const std::string& reason) {
    if (close_reason_.empty()) close_reason_ = reason;
    {
      std::lock_guard lock(send_mu_);
      closing_ = true;
    }
    error_code ignored;
    stream_.lowest_layer().cancel(ignored);
    stream_.lowest_layer().close(ignored);
    writer_wake_.cancel();
    heartbeat_timer_.cancel();
  }

  const std::string& close_reason() const { return close_reason_; }

  // Runs until the connection ends; `decoder` may hold frames read with
  // the HELLO.
  net::awaitable<void> run(FrameDecoder decoder) {
    decoder_ = std::move(decoder);
    auto self = shared_from_this();
    net::steady_timer all_done(stream_.get_executor());
    int finished = 0;
    bool writer_done = false;
    net::co_spawn(stream_.get_executor(), writer(),
                  [self, &finished, &writer_done, &all_done](std::exception_ptr) {
                    ++finished;
                    writer_done = true;
                    all_done.cancel();
                  });
    net::co_spawn(stream_.get_executor(), heartbeats(),
                  [self, &finished, &all_done](std::exception_ptr) {
                    ++finished;
                    all_done.cancel();
                  });
    if (dispatch_buffered()) co_await reader();
    // A GOAWAY queued by either side of this code is flushed first, within
    // a bound: a peer that stopped reading does not hold the link open.
    if (closing_flag() && !writer_done) {
      all_done.expires_after(milliseconds(500));
      co_await all_done.async_wait(use_tuple);
    }
    abort(close_reason_.empty() ? "closed" : close_reason_);
    while (finished < 2) {
      all_done.expires_at(net::steady_timer::time_point::max());
      co_await all_done.async_wait(use_tuple);
    }
  }

  std::atomic<uint64_t> bytes_in{0}, bytes_out{0}, frames_in{0}, frames_out{0};
  std::atomic<int64_t> rtt_us{-1};
  std::atomic<int64_t> last_heartbeat_ms{0};
  // The protocol version negotiated in HELLO; set before install().
  uint16_t version = 1;

 private:
  bool closing_flag() {
    std::lock_guard lock(send_mu_);
    return closing_;
  }

  void wake_writer() {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->writer_wake_.cancel(); });
  }

  net::awaitable<void> reader() {
    std::string chunk(kReadChunk, '\0');
    for (;;) {
      auto [ec, n] = co_await stream_.async_read_some(net::buffer(chunk), use_tuple);
      if (ec) {
        if (close_reason_.empty()) {
          close_reason_ = ec == net::error::eof || ec == ssl::error::stream_truncated
                              ? "closed by peer"
                              : "read failed: " + ec.message();
        }
        co_return;
      }
      bytes_in.fetch_add(n, std::memory_order_relaxed);
      decoder_.feed(std::string_view(chunk.data(), n));
      if (!dispatch_buffered()) co_return;
    }
  }

  // Hands every complete frame on; false when the link must end.
  bool dispatch_buffered() {
    for (;;) {
      // A closing link (replaced, refused, stopping) hands nothing more on.
      if (closing_flag()) return false;
      auto next = decoder_.next();
      if (!next) {
        const bool too_large = next.error().code == Errc::limit_exceeded;
        close_with(too_large ? WireError::frame_too_large : WireError::protocol,
                   next.error().message);
        impl_.log("federation: link to " + uri_ + ": " + next.error().message);
        return false;
      }
      if (!next->has_value()) return true;
      const FrameView& f = **next;
      frames_in.fetch_add(1, std::memory_order_relaxed);
      last_rx_ = SteadyClock::now();
      last_heartbeat_ms.store(unix_ms(), std::memory_order_relaxed);
      if (f.channel != 0) {
        if (is_link_frame(f.type)) {
          const std::string problem = "frame type " + std::string(frame_type_name(f.type)) +
                                      " is only allowed on channel 0";
          close_with(WireError::protocol, problem);
          impl_.log("federation: link to " + uri_ + ": " + problem);
          return false;
        }
        if (f.type == FrameType::open && !check_peer_open(f.channel)) return false;
        if (f.type == FrameType::data_named && version < 3) {
          // What a version adds is an error on a link that negotiated less
          // (docs/protocol.md §12).
          const std::string problem =
              "frame type data_named on a link negotiated at protocol version " + std::to_string(version);
          close_with(WireError::protocol, problem);
          impl_.log("federation: link to " + uri_ + ": " + problem);
          return false;
        }
        impl_.handler.on_frame(peer_, f.type, f.channel, f.payload);
        continue;
      }
      if (!on_link_frame(f)) return false;
    }
  }

  static bool is_link_frame(FrameType t) {
    return t == FrameType::hello || t == FrameType::heartbeat || t == FrameType::goaway ||
           t == FrameType::control;
  }

  // The peer opens channels of its own parity (odd when it dialed), each
  // number above the last it opened, so no number is used twice on a link.
  bool check_peer_open(uint32_t channel) {
    const bool peer_dialed = !dialed_;
    const bool odd = (channel % 2) == 1;
    std::string problem;
    if (odd != peer_dialed) {
      problem = "OPEN on channel " + std::to_string(channel) + " of the wrong parity (the " +
                (peer_dialed ? "dialer opens odd" : "acceptor opens even") + " channels)";
    } else if (channel <= last_peer_open_) {
      problem = "OPEN on channel " + std::to_string(channel) + " reuses a number (last was " +
                std::to_string(last_peer_open_) + ")";
    }
    if (problem.empty()) {
      last_peer_open_ = channel;
      return true;
    }
    close_with(WireError::protocol, problem);
    impl_.log("federation: link to " + uri_ + ": " + problem);
    return false;
  }

  bool on_link_frame(const FrameView& f) {
    switch (f.type) {
      case FrameType::heartbeat: {
        auto hb = decode_heartbeat(f.payload);
        if (!hb) {
          close_with(WireError::protocol, hb.error().message);
          return false;
        }
        peer_sent_ns_ = hb->sent_ns;
        peer_sent_received_ns_ = steady_ns();
        if (hb->echo_ns != 0) {
          // Minus the time the peer held our heartbeat before echoing it.
          const int64_t rtt = (steady_ns() - static_cast<int64_t>(hb->echo_ns) -
                               static_cast<int64_t>(hb->echo_delay_ns)) /
                              1000;
          if (rtt >= 0) rtt_us.store(rtt, std::memory_order_relaxed);
        }
        return true;
      }
      case FrameType::control:
        // Link-wide messages of the layer above (contract negotiation).
        impl_.handler.on_frame(peer_, f.type, 0, f.payload);
        return true;
      case FrameType::goaway: {
        auto g = decode_goaway(f.payload);
        close_reason_ = g ? "peer went away (" + std::string(wire_error_name(g->code)) +
                                (g->reason.empty() ? "" : ": " + g->reason) + ")"
                          : "peer went away";
        return false;
      }
      default:
        close_with(WireError::protocol, "frame type " + std::string(frame_type_name(f.type)) +
                                            " is not allowed on channel 0");
        return false;
    }
  }

  net::awaitable<void> writer() {
    std::string out;
    for (;;) {
      bool closing = false;
      {
        std::lock_guard lock(send_mu_);
        out.swap(pending_);
        closing = closing_;
      }
      if (out.empty()) {
        if (closing) break;
        writer_wake_.expires_at(net::steady_timer::time_point::max());
        co_await writer_wake_.async_wait(use_tuple);
        if (!stream_.lowest_layer().is_open()) co_return;
        continue;
      }
      std::size_t frames = 0;
      for (std::size_t pos = 0; pos + 4 <= out.size();) {
        const auto* p = reinterpret_cast<const unsigned char*>(out.data() + pos);
        pos += 4 + (uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3]);
        ++frames;
      }
      auto [ec, n] = co_await net::async_write(stream_, net::buffer(out), use_tuple);
      if (ec) {
        if (close_reason_.empty()) close_reason_ = "write failed: " + ec.message();
        abort(close_reason_);
        co_return;
      }
      bytes_out.fetch_add(n, std::memory_order_relaxed);
      frames_out.fetch_add(frames, std::memory_order_relaxed);
      out.clear();
      if (out.capacity() > (4u << 20)) out.shrink_to_fit();
    }
    // Everything up to the GOAWAY is written: end the connection.
    abort(close_reason_.empty() ? "closed" : close_reason_);
  }

  net::awaitable<void> heartbeats() {
    for (;;) {
      heartbeat_timer_.expires_after(impl_.opt.heartbeat_interval);
      auto [ec] = co_await heartbeat_timer_.async_wait(use_tuple);
      if (ec || !stream_.lowest_layer().is_open() || closing_flag()) co_return;
      const auto silent = SteadyClock::now() - last_rx_;
      if (silent > impl_.opt.failure_timeout) {
        failed_ = true;
        const auto ms = std::chrono::duration_cast<milliseconds>(silent).count();
        abort("failed: nothing received for " + std::to_string(ms) + " ms");
        co_return;
      }
      Heartbeat hb;
      hb.sent_ns = static_cast<uint64_t>(steady_ns());
      hb.echo_ns = peer_sent_ns_;
      if (peer_sent_ns_ != 0) {
        hb.echo_delay_ns = static_cast<uint64_t>(
            std::max<int64_t>(0, static_cast<int64_t>(hb.sent_ns) - peer_sent_received_ns_));
      }
      (void)enqueue(FrameType::heartbeat, 0, encode(hb));
    }
  }

 public:
  bool failed() const { return failed_; }

 private:
  LinkManager::Impl& impl_;
  ssl::stream<tcp::socket> stream_;
  certs::Identity peer_;
  std::string uri_;
  bool dialed_;
  std::string address_;
  uint32_t peer_max_frame_;
  net::steady_timer writer_wake_;
  net::steady_timer heartbeat_timer_;
  FrameDecoder decoder_;
  SteadyClock::time_point last_rx_;
  uint32_t last_peer_open_ = 0;         // highest channel the peer opened
  uint64_t peer_sent_ns_ = 0;           // the peer's last heartbeat, its clock
  int64_t peer_sent_received_ns_ = 0;   // when it arrived, our clock
  bool failed_ = false;
  std::string close_reason_;
  std::atomic<uint32_t> next_channel_;

  std::mutex send_mu_;
  std::string pending_;
  bool closing_ = false;
};

bool LinkManager::Impl::preferred(const Link& link) const {
  const std::string self_uri = opt.self.uri();
  const std::string& dialer = link.dialed() ? self_uri : link.uri();
  return dialer == std::min(self_uri, link.uri());
}

bool LinkManager::Impl::install(const std::shared_ptr<Link>& link) {
  std::shared_ptr<Link> replaced;
  {
    std::lock_guard lock(mu);
    PeerEntry& e = peers[link->uri()];
    if (e.link) {
      // Keep the connection dialed by the smaller identity; between two
      // dialed by the same side, the newer (the older is likely dead).
      if (preferred(*e.link) && !preferred(*link)) return false;
      replaced = e.link;
      e.bytes_in += replaced->bytes_in;
      e.bytes_out += replaced->bytes_out;
      e.frames_in += replaced->frames_in;
      e.frames_out += replaced->frames_out;
    }
    e.link = link;
    e.status.identity = link->peer();
    e.status.state = "up";
    e.status.dialed = link->dialed();
    e.status.address = link->address();
    e.status.connects += 1;
    e.status.last_error.clear();
    e.status.refusal.clear();
  }
  if (replaced) {
    replaced->close_with(WireError::none, "duplicate link");
    handler.on_link_down(replaced->peer(), "replaced by a newer link");
  }
  log("federation: link up with " + link->uri() + " (" + (link->dialed() ? "dialed " : "from ") +
      link->address() + ")");
  handler.on_link_up(link->peer());
  return true;
}

void LinkManager::Impl::uninstall(const std::shared_ptr<Link>& link, const std::string& reason) {
  std::shared_ptr<net::steady_timer> wake;
  {
    std::lock_guard lock(mu);
    auto it = peers.find(link->uri());
    if (it == peers.end() || it->second.link != link) return;  // replaced already
    PeerEntry& e = it->second;
    e.bytes_in += link->bytes_in;
    e.bytes_out += link->bytes_out;
    e.frames_in += link->frames_in;
    e.frames_out += link->frames_out;
    e.status.rtt_us = link->rtt_us;
    e.status.last_heartbeat_ms = link->last_heartbeat_ms;
    e.link.reset();
    e.status.state = link->failed() ? "failed" : "down";
    e.status.last_error = reason;
    wake = e.dial_wake;
  }
  log("federation: link with " + link->uri() + " down: " + reason);
  handler.on_link_down(link->peer(), reason);
  if (wake) wake->cancel();
}

net::awaitable<void> LinkManager::Impl::run_connection(tcp::socket socket,
                                                       std::optional<PeerConfig> dialed,
                                                       std::string address, UnverifiedSlot slot) {
  const std::string who = dialed ? dialed->identity.uri() + " at " + address : address;
  // Frames are written as soon as they are queued (the writer gathers what
  // queued meanwhile): Nagle would hold a small DATA or ACK back until the
  // previous segment is acknowledged.
  error_code nodelay_ec;
  socket.set_option(tcp::no_delay(true), nodelay_ec);
  ssl::stream<tcp::socket> stream(std::move(socket), ctx);

  // One deadline for TLS and HELLO: a peer that stalls is closed.
  Watchdog deadline(io, opt.handshake_timeout, stream.next_layer());
  const uint64_t handshake_id = next_handshake++;
  handshaking[handshake_id] = [&stream] {
    error_code ignored;
    stream.next_layer().close(ignored);
  };
  struct Unregister {
    Impl& m;
    uint64_t id;
    ~Unregister() { m.handshaking.erase(id); }
  } unregister{*this, handshake_id};

  const std::optional<certs::Identity> verified = co_await tls_handshake(stream, dialed, address, who, deadline);
  if (!verified) co_return;
  const certs::Identity peer = *verified;
  slot.release();  // a verified peer: its place comes from the rest of max_connections

  FrameDecoder decoder(kHandshakeMaxFrame);
  HelloExchange hello = co_await exchange_hello(stream, decoder, who, deadline);
  deadline.disarm();
  if (hello.refused_by_peer) {
    refused_connection(hello.refused_by_peer->label, hello.refused_by_peer->reason, dialed, address, peer.uri(),
                       true);
    co_return;
  }
  if (hello.write_error) {
    refused_connection("hello", "could not send HELLO: " + hello.write_error.message(), dialed, address,
                       peer.uri(), false);
    co_return;
  }
  check_hello(hello, peer);
  if (!hello.problem.empty()) {
    refused_connection("hello", hello.problem, dialed, address, peer.uri(), false);
    std::string goaway;
    append_frame(goaway, FrameType::goaway, 0, encode(GoAway{hello.problem_code, hello.problem}));
    Watchdog linger(io, milliseconds(200), stream.next_layer());
    co_await net::async_write(stream, net::buffer(goaway), use_tuple);
    linger.disarm();
    co_return;
  }
  decoder.set_max_frame(opt.max_frame);

  if (stopped.load()) co_return;
  handshaking.erase(handshake_id);
  auto link = std::make_shared<Link>(*this, std::move(stream), peer, dialed.has_value(), address,
                                     std::min(hello.theirs->max_frame, kMaxMaxFrame));
  link->version = hello.version;
  if (!install(link)) {
    link->close_with(WireError::none, "duplicate link");
    co_await link->run(std::move(decoder));
    co_return;
  }
  co_await link->run(std::move(decoder));
  uninstall(link, link->close_reason());
}

net::awaitable<std::optional<certs::Identity>> LinkManager::Impl::tls_handshake(
    ssl::stream<tcp::socket>& stream, const std::optional<PeerConfig>& dialed, const std::string& address,
    const std::string& who, Watchdog& deadline) {
  VerifyState verify;
  verify.trust = trust();
  if (dialed) verify.expected_domain = dialed->identity.domain;
  SSL_set_ex_data(stream.native_handle(), verify_state_index(), &verify);
  ERR_clear_error();
  auto [hec] = co_await stream.async_handshake(
      dialed ? ssl::stream_base::client : ssl::stream_base::server, use_tuple);
  SSL_set_ex_data(stream.native_handle(), verify_state_index(), nullptr);
  if (hec) {
    deadline.disarm();
    const int reason = ssl_reason(hec);
    if (verify.verdict && !verify.verdict->ok()) {
      refused_connection(verify.verdict->refusal, verify.verdict->reason, dialed, address, verify.claimed,
                         false);
    } else if (reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE) {
      // The same label as a certificate without an identity: either way
      // the client did not say who it is.
      refused_connection("no_identity", "presented no certificate", dialed, address, "", false);
    } else if (auto by_peer = refusal_by_alert(hec, who, opt.self)) {
      refused_connection(by_peer->label, by_peer->reason, dialed, address, "", true);
    } else {
      refuse("handshake", who + ": TLS handshake failed: " +
                              (deadline.fired() ? std::string("timed out") : openssl_reason(hec.message())));
    }
    co_return std::nullopt;
  }
  ERR_clear_error();
  if (!verify.verdict || !verify.verdict->ok()) {
    deadline.disarm();
    refuse("handshake", who + ": no verified peer certificate");
    co_return std::nullopt;
  }
  const certs::Identity peer = *verify.verdict->identity;
  if (dialed && !(peer == dialed->identity)) {
    deadline.disarm();
    refused_connection("identity",
                       "expected " + dialed->identity.uri() + ", the certificate is " + peer.uri(), dialed,
                       address, peer.uri(), false);
    co_return std::nullopt;
  }
  co_return peer;
}

net::awaitable<LinkManager::Impl::HelloExchange> LinkManager::Impl::exchange_hello(
    ssl::stream<tcp::socket>& stream, FrameDecoder& decoder, const std::string& who, Watchdog& deadline) {
  HelloExchange out;
  std::string hello_frame;
  append_frame(hello_frame, FrameType::hello, 0, encode(my_hello(opt)));
  auto [wec, wn] = co_await net::async_write(stream, net::buffer(hello_frame), use_tuple);
  out.write_error = wec;
  if (wec) {
    out.refused_by_peer = refusal_by_alert(wec, who, opt.self);
    co_return out;
  }
  std::string chunk(kReadChunk, '\0');
  for (;;) {
    auto next = decoder.next();
    if (!next) {
      out.problem = next.error().message;
      co_return out;
    }
    if (next->has_value()) {
      const FrameView& f = **next;
      if (f.type != FrameType::hello || f.channel != 0) {
        out.problem = "expected HELLO on channel 0, got " + std::string(frame_type_name(f.type));
        co_return out;
      }
      auto h = decode_hello(f.payload);
      if (!h) {
        out.problem = h.error().message;
        co_return out;
      }
      out.theirs = std::move(*h);
      co_return out;
    }
    auto [rec, n] = co_await stream.async_read_some(net::buffer(chunk), use_tuple);
    if (rec) {
      out.refused_by_peer = refusal_by_alert(rec, who, opt.self);
      out.problem = deadline.fired() ? "timed out waiting for HELLO" : "closed before HELLO: " + rec.message();
      co_return out;
    }
    decoder.feed(std::string_view(chunk.data(), n));
  }
}

void LinkManager::Impl::check_hello(HelloExchange& hello, const certs::Identity& peer) const {
  if (!hello.problem.empty()) return;
  if (!hello.theirs) {
    hello.problem = "no HELLO";
    return;
  }
  if (hello.theirs->domain != peer.domain || hello.theirs->node != peer.node) {
    hello.problem = "HELLO names entente://" + hello.theirs->domain + "/" + hello.theirs->node +
                    " but the certificate is " + peer.uri();
    hello.problem_code = WireError::identity;
    return;
  }
  // The link keeps the negotiated version: what a version added (RESET
  // moved, version 2) goes only to peers that speak it (Wire::version).
  auto v = negotiate_version(my_hello(opt), *hello.theirs);
  if (!v) {
    hello.problem = v.error().message;
    hello.problem_code = WireError::version;
    return;
  }
  hello.version = *v;
}

net::awaitable<void> LinkManager::Impl::accept_loop() {
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(use_tuple);
    if (ec) {
      if (!acceptor.is_open() || ec == net::error::operation_aborted) co_return;
      net::steady_timer pause(io, milliseconds(20));
      co_await pause.async_wait(use_tuple);
      continue;
    }
    if (connections >= opt.max_connections) {
      refuse("connections", "a connection: over max_connections (" +
                                std::to_string(opt.max_connections) + ")");
      error_code ignored;
      socket.close(ignored);
      continue;
    }
    error_code rec;
    const auto remote = socket.remote_endpoint(rec);
    if (rec) {
      error_code ignored;
      socket.close(ignored);  // reset before we got to it
      continue;
    }
    std::string address = remote.address().to_string() + ":" + std::to_string(remote.port());
    // Unverified connections may take only part of the budget, so a flood
    // of connections that never finish TLS cannot crowd out verified peers.
    if (unverified >= opt.max_handshaking_connections) {
      refuse("handshaking", address + ": over max_handshaking_connections (" +
                                std::to_string(opt.max_handshaking_connections) +
                                " connections not yet verified)");
      error_code ignored;
      socket.close(ignored);
      continue;
    }
    std::string key = address_key(remote.address());
    if (auto it = per_address.find(key);
        it != per_address.end() && it->second >= opt.max_connections_per_address) {
      refuse("connections_per_address", address + ": over max_connections_per_address (" +
                                            std::to_string(opt.max_connections_per_address) + ")");
      error_code ignored;
      socket.close(ignored);
      continue;
    }
    ++per_address[key];
    ++connections;
    net::co_spawn(io,
                  run_connection(std::move(socket), std::nullopt, std::move(address),
                                 UnverifiedSlot(unverified)),
                  [this, key = std::move(key)](std::exception_ptr) {
                    --connections;
                    if (auto it = per_address.find(key); it != per_address.end() && --it->second == 0) {
                      per_address.erase(it);
                    }
                  });
  }
}

net::awaitable<void> LinkManager::Impl::dial_loop(PeerConfig peer,
                                                  std::shared_ptr<net::steady_timer> wake) {
  const std::string uri = peer.identity.uri();
  std::string address;
  milliseconds backoff = opt.reconnect_min;
  tcp::resolver resolver(io);
  while (!stopped.load()) {
    bool up = false;
    {
      std::lock_guard lock(mu);
      // A reload may have moved the peer (dial the new address) or removed
      // it, or its address (this dialer ends; another may have replaced it).
      PeerEntry& e = peers[uri];
      if (e.dial_wake != wake || !e.config || e.config->port == 0) break;
      peer = *e.config;
      address = peer.host + ":" + std::to_string(peer.port);
      const auto& link = e.link;
      // The smaller identity dials even when the peer's connection is up,
      // so the pair settles on the preferred link.
      up = link != nullptr && (preferred(*link) || !is_smaller(peer.identity));
    }
    if (up) {
      // Sleep until the link goes down (uninstall cancels the timer).
      wake->expires_at(net::steady_timer::time_point::max());
      co_await wake->async_wait(use_tuple);
      backoff = opt.reconnect_min;
      continue;
    }
    {
      std::lock_guard lock(mu);
      PeerEntry& e = peers[uri];
      // "failed" and "refused" stay until a link is up again: they tell the
      // operator why.
      if (e.status.state != "up" && e.status.state != "failed" && e.status.state != "refused") {
        e.status.state = "connecting";
      }
    }
    auto [rec, endpoints] =
        co_await resolver.async_resolve(peer.host, std::to_string(peer.port), use_tuple);
    bool linked = false;
    if (!rec) {
      tcp::socket socket(io);
      Watchdog deadline(io, opt.handshake_timeout, socket);
      auto [cec, ep] = co_await net::async_connect(socket, endpoints, use_tuple);
      deadline.disarm();
      if (!cec) {
        const uint64_t before = [&] {
          std::lock_guard lock(mu);
          return peers[uri].status.connects;
        }();
        co_await run_connection(std::move(socket), peer, address);
        std::lock_guard lock(mu);
        linked = peers[uri].status.connects != before;
      } else {
        std::lock_guard lock(mu);
        PeerEntry& e = peers[uri];
        e.status.last_error = "connect to " + address + ": " + cec.message();
        e.status.refusal.clear();
        if (e.status.state == "connecting" || e.status.state == "refused") e.status.state = "down";
      }
    } else {
      std::lock_guard lock(mu);
      peers[uri].status.last_error = "resolve " + peer.host + ": " + rec.message();
      peers[uri].status.state = "down";
    }
    if (stopped.load()) break;
    if (linked) {
      backoff = opt.reconnect_min;
      continue;  // reconnect promptly after a link that worked
    }
    wake->expires_after(backoff);
    co_await wake->async_wait(use_tuple);
    backoff = std::min(backoff * 2, opt.reconnect_max);
  }
}

void LinkManager::Impl::shutdown() {
  stopped.store(true);
  error_code ignored;
  acceptor.close(ignored);
  std::vector<std::shared_ptr<Link>> links;
  std::vector<std::shared_ptr<net::steady_timer>> wakes;
  {
    std::lock_guard lock(mu);
    for (auto& [uri, e] : peers) {
      if (e.link) links.push_back(e.link);
      if (e.dial_wake) wakes.push_back(e.dial_wake);
    }
  }
  for (auto& l : links) l->close_with(WireError::shutdown, "node stopping");
  for (auto& w : wakes) w->cancel();
  auto closers = std::move(handshaking);
  for (auto& [id, close] : closers) close();
}

void LinkManager::Impl::refused_connection(const std::string& label, const std::string& reason,
                                           const std::optional<PeerConfig>& dialed,
                                           const std::string& address, const std::string& claimed,
                                           bool by_peer) {
  const std::string peer_uri = dialed ? dialed->identity.uri() : claimed;
  std::string who;
  if (dialed) {
    who = dialed->identity.uri() + " at " + address;
  } else if (!claimed.empty()) {
    who = claimed + " (as its certificate claims) from " + address;
  } else {
    who = address;
  }
  {
    std::lock_guard lock(mu);
    ++refusals[by_peer ? "refused_by_peer" : label];
    if (!dialed) {
      // A client's port changes with each attempt: one entry per host.
      const std::string key = !claimed.empty() ? claimed : address.substr(0, address.rfind(':'));
      RefusedStatus& r = refused[key];
      r.identity = claimed;
      r.address = address;
      r.refusal = label;
      r.reason = reason;
      r.by_peer = by_peer;
      r.count += 1;
      r.last_ms = unix_ms();
      if (refused.size() > kMaxRefused) {
        auto oldest = std::min_element(refused.begin(), refused.end(), [](const auto& a, const auto& b) {
          return a.second.last_ms < b.second.last_ms;
        });
        refused.erase(oldest);
      }
    }
    // Only a peer this node knows gets the reason: a claim alone adds no
    // entry.
    auto it = peer_uri.empty() ? peers.end() : peers.find(peer_uri);
    if (it != peers.end() && !it->second.link) {
      it->second.status.state = "refused";
      it->second.status.refusal = label;
      it->second.status.last_error = (by_peer ? "" : "refused " + peer_uri + ": ") + reason;
    }
  }
  log_refusal("federation: refused " + std::string(by_peer ? "by " : "") + who + ": " + label + ": " + reason);
}

LinkManager::LinkManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

LinkManager::~LinkManager() { stop(); }

Result<std::unique_ptr<LinkManager>> LinkManager::start(LinkOptions options,
                                                        LinkHandler& handler) {
  if (!options.trust) {
    return make_error(Errc::invalid_argument, "federation: no trust store (pinned CAs)");
  }
  if (!certs::valid_name(options.self.domain) || !certs::valid_name(options.self.node)) {
    return make_error(Errc::invalid_argument,
                      "federation: invalid own identity " + options.self.uri());
  }
  if (options.max_frame < 4096 || options.max_frame > kMaxMaxFrame) {
    return make_error(Errc::invalid_argument, "federation: max_frame must be 4096.." +
                                                  std::to_string(kMaxMaxFrame));
  }
  if (options.max_connections == 0 || options.max_connections_per_address == 0 ||
      options.max_handshaking_connections == 0 || options.handshake_timeout.count() <= 0) {
    return make_error(Errc::invalid_argument,
                      "federation: connection limits and handshake_timeout must be positive");
  }
  if (options.heartbeat_interval.count() <= 0 ||
      options.failure_timeout <= options.heartbeat_interval) {
    return make_error(Errc::invalid_argument,
                      "federation: failure_timeout must be longer than heartbeat_interval");
  }
  auto impl = std::make_unique<Impl>(std::move(options), handler);
  Impl& m = *impl;
  // Mutual TLS 1.3; the peer is checked only against the pinned CA of the
  // domain it claims. Links live for hours: session resumption buys nothing
  // and would skip the per-connection identity check on the resuming side.
  inet::TlsContextOptions tls;
  tls.versions = inet::TlsVersions::tls13_only;
  tls.cert_file = m.opt.cert_file;
  tls.key_file = m.opt.key_file;
  tls.peer = inet::PeerCheck::require;
  tls.verify_callback = verify_peer_certificate;
  tls.session_resumption = false;
  tls.label = "federation ";
  ENTENTE_RETURN_IF_ERROR(inet::configure_tls_context(m.ctx, tls));

  error_code ec;
  const auto addr = net::ip::make_address(m.opt.listen_host, ec);
  if (ec) {
    return make_error(Errc::invalid_argument,
                      "federation listen address '" + m.opt.listen_host + "': " + ec.message());
  }
  const tcp::endpoint ep(addr, m.opt.listen_port);
  m.acceptor.open(ep.protocol(), ec);
  if (!ec) m.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) m.acceptor.bind(ep, ec);
  if (!ec) m.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return make_error(Errc::io_error, "federation listen " + m.opt.listen_host + ":" +
                                          std::to_string(m.opt.listen_port) + ": " + ec.message());
  }
  for (const PeerConfig& p : m.opt.peers) {
    PeerEntry& e = m.peers[p.identity.uri()];
    e.config = p;
    e.status.identity = p.identity;
    e.status.state = "down";
    if (p.port != 0) e.dial_wake = std::make_shared<net::steady_timer>(m.io);
  }
  net::co_spawn(m.io, m.accept_loop(), net::detached);
  for (auto& [uri, e] : m.peers) {
    if (e.dial_wake) net::co_spawn(m.io, m.dial_loop(*e.config, e.dial_wake), net::detached);
  }
  m.thread = std::thread([&m] {
    m.io.run();
    m.io_done.set_value();
  });
  return std::unique_ptr<LinkManager>(new LinkManager(std::move(impl)));
}

uint16_t LinkManager::port() const {
  error_code ec;
  const auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

namespace {
std::shared_ptr<Link> current_link(const LinkManager::Impl& m, const std::string& uri) {
  std::lock_guard lock(m.mu);
  auto it = m.peers.find(uri);
  return it == m.peers.end() ? nullptr : it->second.link;
}
}  // namespace

Status LinkManager::send(const certs::Identity& peer, FrameType type, uint32_t channel,
                         std::string_view payload) {
  auto link = current_link(*impl_, peer.uri());
  if (!link) return make_error(Errc::unavailable, "no link to " + peer.uri() + " is up");
  return link->enqueue(type, channel, payload);
}

Result<uint32_t> LinkManager::new_channel(const certs::Identity& peer) {
  auto link = current_link(*impl_, peer.uri());
  if (!link) return make_error(Errc::unavailable, "no link to " + peer.uri() + " is up");
  return link->new_channel();
}

bool LinkManager::is_up(const certs::Identity& peer) const {
  return current_link(*impl_, peer.uri()) != nullptr;
}

void LinkManager::remove_dial_target(const certs::Identity& peer) {
  if (!impl_ || !impl_->thread.joinable()) return;
  Impl& m = *impl_;
  std::shared_ptr<net::steady_timer> wake;
  {
    std::lock_guard lock(m.mu);
    auto it = m.peers.find(peer.uri());
    if (it == m.peers.end() || !it->second.runtime || it->second.link) return;
    // The dialer ends when it finds its timer replaced and no config.
    it->second.config.reset();
    it->second.runtime = false;
    wake = std::exchange(it->second.dial_wake, nullptr);
  }
  m.log("federation: no longer dialing " + peer.uri() + " (added at run time, not reached)");
  if (wake) net::post(m.io, [wake] { wake->cancel(); });
}

uint16_t LinkManager::version(const certs::Identity& peer) const {
  auto link = current_link(*impl_, peer.uri());
  return link ? link->version : 0;
}

Status LinkManager::add_dial_target(const PeerConfig& peer) {
  if (!impl_ || !impl_->thread.joinable()) return make_error(Errc::unavailable, "federation: not running");
  Impl& m = *impl_;
  if (m.stopped.load()) return make_error(Errc::unavailable, "federation: stopping");
  if (!certs::valid_name(peer.identity.domain) || !certs::valid_name(peer.identity.node) || peer.host.empty() ||
      peer.port == 0) {
    return make_error(Errc::invalid_argument, "federation: no address to dial " + peer.identity.uri() + " at");
  }
  const std::string uri = peer.identity.uri();
  std::shared_ptr<net::steady_timer> wake;
  bool spawn = false;
  {
    std::lock_guard lock(m.mu);
    // Only a domain this node pins: the target is authenticated like any
    // peer, by its domain's CA and exactly this identity.
    if (!m.opt.trust || !m.opt.trust->pinned(peer.identity.domain)) {
      return make_error(Errc::permission_denied,
                        "federation: domain " + peer.identity.domain + " is not a pinned peer domain");
    }
    auto it = m.peers.find(uri);
    if (it != m.peers.end() && it->second.config && !it->second.runtime && it->second.config->port != 0) {
      return {};  // configured with an address: that one is dialed already
    }
    const bool known = it != m.peers.end() && it->second.config && it->second.runtime;
    if (known && it->second.config->host == peer.host && it->second.config->port == peer.port) return {};
    if (!known) {
      size_t added = 0;
      for (const auto& [u, e] : m.peers) {
        if (e.runtime && e.config && e.config->identity.domain == peer.identity.domain) ++added;
      }
      if (added >= m.opt.max_dial_targets_per_domain) {
        return make_error(Errc::limit_exceeded, "federation: domain " + peer.identity.domain + " has " +
                                                    std::to_string(added) +
                                                    " dial targets added at run time already (at most " +
                                                    std::to_string(m.opt.max_dial_targets_per_domain) +
                                                    "); list its nodes in federation.peers");
      }
    }
    PeerEntry& e = m.peers[uri];
    e.config = peer;
    e.runtime = true;
    e.status.identity = peer.identity;
    if (!e.link && e.status.state.empty()) e.status.state = "down";
    if (!e.dial_wake) {
      e.dial_wake = std::make_shared<net::steady_timer>(m.io);
      spawn = true;
    }
    wake = e.dial_wake;
  }
  m.log("federation: dialing " + uri + " at " + peer.host + ":" + std::to_string(peer.port) +
                  " (added at run time)");
  // The dialer reads the address from the entry: a new one dials now, a
  // running one is woken to dial the new address.
  net::post(m.io, [&m, peer, wake, spawn] {
    if (spawn) {
      net::co_spawn(m.io, m.dial_loop(peer, wake), net::detached);
    } else {
      wake->cancel();
    }
  });
  return {};
}

std::vector<PeerStatus> LinkManager::peers() const {
  std::lock_guard lock(impl_->mu);
  std::vector<PeerStatus> out;
  out.reserve(impl_->peers.size());
  for (const auto& [uri, e] : impl_->peers) {
    PeerStatus s = e.status;
    s.bytes_in = e.bytes_in;
    s.bytes_out = e.bytes_out;
    s.frames_in = e.frames_in;
    s.frames_out = e.frames_out;
    if (e.link) {
      s.bytes_in += e.link->bytes_in;
      s.bytes_out += e.link->bytes_out;
      s.frames_in += e.link->frames_in;
      s.frames_out += e.link->frames_out;
      s.rtt_us = e.link->rtt_us;
      s.last_heartbeat_ms = e.link->last_heartbeat_ms;
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::map<std::string, uint64_t> LinkManager::refusals() const {
  std::lock_guard lock(impl_->mu);
  return impl_->refusals;
}

std::vector<RefusedStatus> LinkManager::refused() const {
  std::vector<RefusedStatus> out;
  {
    std::lock_guard lock(impl_->mu);
    for (const auto& [key, r] : impl_->refused) out.push_back(r);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.last_ms > b.last_ms; });
  return out;
}

Status LinkManager::reload(LinkReload next, std::vector<std::string>& changes) {
  if (!next.trust) return make_error(Errc::invalid_argument, "federation: no trust store (pinned CAs)");
  // Everything that can fail is checked before anything changes.
  ENTENTE_ASSIGN_OR_RETURN(inet::TlsCredentials creds, load_credentials(next.cert_file, next.key_file));
  if (!impl_ || !impl_->thread.joinable()) return make_error(Errc::unavailable, "federation: not running");
  Impl& m = *impl_;
  if (m.stopped.load()) return make_error(Errc::unavailable, "federation: stopping");
  std::promise<std::vector<std::string>> applied;
  auto done = applied.get_future();
  // On the io thread: every SSL object is made there from the context, so
  // replacing the context's certificate races with nothing.
  net::post(m.io, [&m, &next, &creds, &applied] {
    std::vector<std::string> lines;
    std::vector<std::shared_ptr<Link>> to_close;
    std::vector<std::pair<PeerConfig, std::shared_ptr<net::steady_timer>>> to_dial;
    std::vector<std::shared_ptr<net::steady_timer>> to_wake;
    SSL_CTX* native = m.ctx.native_handle();
    X509* old_cert = SSL_CTX_get0_certificate(native);
    const bool new_cert = old_cert == nullptr || X509_cmp(old_cert, creds.cert) != 0;
    if (SSL_CTX_use_cert_and_key(native, creds.cert, creds.key, creds.chain, 1) != 1) {
      applied.set_value(
          {"error: federation cert_file " + next.cert_file + ": " + openssl_reason("rejected")});
      return;
    }
    if (new_cert) {
      lines.push_back("federation certificate " + next.cert_file +
                      ": new connections present the new one (links up keep theirs)");
    }
    {
      std::lock_guard lock(m.mu);
      m.opt.trust = next.trust;
      m.opt.cert_file = next.cert_file;
      m.opt.key_file = next.key_file;
      std::map<std::string, const PeerConfig*> wanted;
      for (const PeerConfig& p : next.peers) wanted[p.identity.uri()] = &p;
      for (auto& [uri, e] : m.peers) {
        if (!e.config || wanted.count(uri)) continue;
        // A dial target added at run time stays while its domain is pinned.
        if (e.runtime && next.trust->pinned(e.config->identity.domain)) continue;
        // No longer configured: not dialed; its link (if any) closes.
        e.config.reset();
        if (e.dial_wake) to_wake.push_back(std::exchange(e.dial_wake, nullptr));
        if (e.link) to_close.push_back(e.link);
        lines.push_back("peer " + uri + " removed");
      }
      for (const auto& [uri, p] : wanted) {
        PeerEntry& e = m.peers[uri];
        const bool added = !e.config;
        const bool moved = !added && (e.config->host != p->host || e.config->port != p->port);
        if (!added && !moved) {
          e.runtime = false;  // configured now
          continue;
        }
        e.config = *p;
        e.runtime = false;
        e.status.identity = p->identity;
        if (added && !e.link && e.status.state.empty()) e.status.state = "down";
        const std::string where = p->port == 0 ? std::string("no address (accepted, not dialed)")
                                               : p->host + ":" + std::to_string(p->port);
        lines.push_back("peer " + uri + (added ? " added at " : " moved to ") + where);
        if (p->port != 0 && !e.dial_wake) {
          e.dial_wake = std::make_shared<net::steady_timer>(m.io);
          to_dial.emplace_back(*p, e.dial_wake);
        } else if (p->port != 0) {
          to_wake.push_back(e.dial_wake);  // dials the new address now
        } else if (e.dial_wake) {
          to_wake.push_back(std::exchange(e.dial_wake, nullptr));
        }
      }
      for (const std::string& d : next.retrust_domains) {
        for (auto& [uri, e] : m.peers) {
          if (e.link && e.link->peer().domain == d &&
              std::find(to_close.begin(), to_close.end(), e.link) == to_close.end()) {
            to_close.push_back(e.link);
          }
        }
      }
    }
    for (auto& l : to_close) l->close_with(WireError::none, "configuration reloaded");
    for (auto& w : to_wake) w->cancel();
    for (auto& [p, wake] : to_dial) net::co_spawn(m.io, m.dial_loop(p, wake), net::detached);
    applied.set_value(std::move(lines));
  });
  auto lines = done.get();
  for (auto& l : lines) {
    if (l.rfind("error: ", 0) == 0) return make_error(Errc::invalid_argument, l.substr(7));
  }
  changes.insert(changes.end(), lines.begin(), lines.end());
  return {};
}

void LinkManager::stop() {
  if (!impl_ || !impl_->thread.joinable()) return;
  Impl& m = *impl_;
  net::post(m.io, [&m] { m.shutdown(); });
  // Links flush their GOAWAY and close; whatever still runs after a grace
  // period (a peer that stopped reading) is cut off.
  auto done = m.io_done.get_future();
  if (done.wait_for(std::chrono::seconds(2)) != std::future_status::ready) m.io.stop();
  m.thread.join();
}

}  // namespace entente::federation
