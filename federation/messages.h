#pragma once
// Payloads of the frame types in frame.h (docs/protocol.md). Each message
// encodes to bytes and decodes with every length and count checked against
// the payload: a decoder never reads past its input and never allocates
// more than the payload's size implies. Strings are u16 length + UTF-8
// bytes; integers big-endian.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "federation/frame.h"

namespace entente::federation {

// Codes carried by GOAWAY (whole link) and RESET (one channel).
enum class WireError : uint16_t {
  none = 0,            // orderly end
  protocol = 1,        // a frame that breaks the protocol
  version = 2,         // no common protocol version
  frame_too_large = 3,
  identity = 4,        // HELLO names another identity than the certificate
  not_found = 5,       // no such stream here
  not_exported = 6,    // the stream is not shared with the peer's domain
  flow_control = 7,    // data beyond the granted credit
  shutdown = 8,        // the node is stopping
  internal = 9,
  bad_position = 10,   // from_seq no longer retained (or in the future)
  // Version 2: the stream is led by another node of the owner's domain;
  // the reason is where, exactly as Moved below (docs/protocol.md §5.6).
  moved = 11,
};
std::string_view wire_error_name(WireError e);

// First frame on channel 0, sent by both sides as soon as TLS is up.
// The link uses the highest version both support, max_frame = min of both,
// and each side sends heartbeats at its own interval.
struct Hello {
  uint16_t min_version = kMinVersion;
  uint16_t max_version = kMaxVersion;
  std::string domain;  // must match the certificate's identity
  std::string node;
  uint32_t max_frame = 0;  // this side's receive limit
  uint32_t heartbeat_ms = 0;

  static constexpr uint16_t kMinVersion = 1;
  // 2: RESET moved; 3: DATA_NAMED (docs/protocol.md §6.2).
  static constexpr uint16_t kMaxVersion = 3;
};

// Bounds a HELLO must respect (decode_hello refuses values outside them).
inline constexpr uint32_t kMinMaxFrame = 4096;  // smallest max_frame a side may announce
inline constexpr uint32_t kMaxHeartbeatMs = 60000;

// The highest version inside both HELLOs' ranges. unsupported, naming both
// ranges, when they do not overlap: the link then sends GOAWAY version.
Result<uint16_t> negotiate_version(const Hello& mine, const Hello& theirs);
// The link's maximum frame payload once both HELLOs are exchanged: the
// smaller of the two receive limits.
uint32_t negotiated_max_frame(const Hello& mine, const Hello& theirs);

// Sent every heartbeat interval. `echo_ns` returns the sent_ns of the last
// heartbeat received from the peer (0 before any), and `echo_delay_ns` how
// long this side held it before sending this one (0 when echo_ns is 0):
// the peer's round-trip time is now - echo_ns - echo_delay_ns on its own
// clock, without the up to one interval the echo waited here.
struct Heartbeat {
  uint64_t sent_ns = 0;
  uint64_t echo_ns = 0;
  uint64_t echo_delay_ns = 0;
};

struct GoAway {
  WireError code = WireError::none;
  std::string reason;
};

// Subscribe `stream` ("domain/name") from sequence number `from_seq`
// (inclusive) on the frame's channel, with an initial byte credit for DATA
// payloads. The subscriber picks channel numbers (odd on the side that
// opened the TCP connection, even on the other, so both can open).
struct Open {
  std::string stream;
  uint64_t from_seq = 0;
  uint32_t credit = 0;
};

struct OpenOk {
  std::string schema_json;  // the stream's schema as in the REST API
  uint64_t first_seq = 0;   // the first sequence number still retained
  uint64_t next_seq = 0;    // the next sequence number the owner will assign
};

struct Reset {
  WireError code = WireError::none;
  std::string reason;  // with `moved`: moved_reason(Moved), and nothing else
};

// Where a stream is, in a RESET moved: a node of the owner's domain and the
// address its peer link listens on. The reason holds exactly
// NODE "@" HOST ":" PORT ("n1@10.0.0.7:7443", "n1@[::1]:7443"): NODE a
// name (§2), HOST a DNS name or IPv4 address of at most 253 bytes or an
// IPv6 address in brackets, PORT 1..65535 in decimal without leading zero.
// Only the address is taken from it: the node dialed there must still
// present the certificate entente://DOMAIN/NODE under DOMAIN's pinned CA.
struct Moved {
  std::string node;
  std::string host;  // IPv6 without the brackets
  uint16_t port = 0;
};
inline constexpr std::size_t kMaxMovedReason = 63 + 1 + 253 + 1 + 5;
std::string moved_reason(const Moved& m);
// parse_error saying what is wrong when `reason` is not exactly that form.
Result<Moved> parse_moved(std::string_view reason);

// Version 3: one batch a publisher named (docs/api.md, "Publishing exactly
// once") as the owner remembers it: the producer's id and number for it,
// the owner's sequence numbers it was stored under, and the producer's
// floor (every number up to it is forgotten). Only ever sent to a node of
// the owner's own domain (docs/protocol.md §5.12): the ids are the owner's.
struct NamedBatch {
  std::string producer;       // 1..kMaxProducerBytes of [A-Za-z0-9._:-]
  uint64_t producer_seq = 0;  // >= 1
  uint64_t first = 0;         // >= 1
  uint64_t last = 0;          // >= first
  uint64_t floor = 0;
  friend bool operator==(const NamedBatch&, const NamedBatch&) = default;
};
inline constexpr std::size_t kMaxProducerBytes = 64;
// The producer id rules of the API (docs/api.md): 1..64 of A-Z a-z 0-9 . _ : -
bool valid_producer_id(std::string_view id);

// Covers tuples first_seq .. first_seq + count - 1 of the channel's stream:
// `body` (the engine's binary batch encoding, engine/codec.h) holds 0..count
// of them, in order, each with its own sequence number; the others were
// filtered out by the contract's predicate (docs/protocol.md §5.7, §9.5).
// The link does not look inside.
//
// `named`, when not empty, are the named batches whose last tuple lies in
// the covered range, by ascending `last`; the message is then a DATA_NAMED
// (version 3, docs/protocol.md §5.12) and goes in a frame of that type
// (frame_type()). A plain DATA never carries them: its decoding stays
// exactly what versions 1 and 2 specify.
struct Data {
  uint64_t first_seq = 0;
  uint32_t count = 0;
  std::string body;
  std::vector<NamedBatch> named;

  FrameType frame_type() const { return named.empty() ? FrameType::data : FrameType::data_named; }
};

// The subscriber has stored every tuple through `through` durably; the
// owner may release them.
struct Ack {
  uint64_t through = 0;
};

// Adds `bytes` to the channel's credit.
struct Credit {
  uint32_t bytes = 0;
};

std::string encode(const Hello& m);
std::string encode(const Heartbeat& m);
std::string encode(const GoAway& m);
std::string encode(const Open& m);
std::string encode(const OpenOk& m);
std::string encode(const Reset& m);
// DATA, or DATA_NAMED when m.named is not empty (see Data).
std::string encode(const Data& m);
std::string encode(const Ack& m);
std::string encode(const Credit& m);

// parse_error naming the message and field on truncated, trailing or
// inconsistent bytes.
Result<Hello> decode_hello(std::string_view payload);
Result<Heartbeat> decode_heartbeat(std::string_view payload);
Result<GoAway> decode_goaway(std::string_view payload);
Result<Open> decode_open(std::string_view payload);
Result<OpenOk> decode_open_ok(std::string_view payload);
Result<Reset> decode_reset(std::string_view payload);
Result<Data> decode_data(std::string_view payload);
// A DATA_NAMED payload: DATA's fields, then at least one named batch, each
// checked against the covered range (docs/protocol.md §5.12).
Result<Data> decode_data_named(std::string_view payload);
Result<Ack> decode_ack(std::string_view payload);
Result<Credit> decode_credit(std::string_view payload);

// Per-channel credit, sender side. The receiver grants bytes; the sender
// may send a DATA frame only when its payload fits the remaining credit.
// The total outstanding credit may not exceed kMaxCredit (a grant that
// would is a flow_control error).
class CreditWindow {
 public:
  static constexpr uint64_t kMaxCredit = uint64_t{1} << 31;

  explicit CreditWindow(uint64_t initial = 0) : available_(initial) {}

  uint64_t available() const { return available_; }
  bool can_send(uint64_t bytes) const { return bytes <= available_; }
  // Precondition: can_send(bytes).
  void consume(uint64_t bytes) { available_ -= bytes; }
  // limit_exceeded when the window would exceed kMaxCredit.
  Status grant(uint64_t bytes);

 private:
  uint64_t available_;
};

}  // namespace entente::federation
