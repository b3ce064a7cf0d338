#include "federation/messages.h"

#include <algorithm>
#include <limits>

#include "certs/certs.h"
#include "federation/frame.h"

namespace entente::federation {
namespace {

constexpr std::size_t kMaxString = std::numeric_limits<uint16_t>::max();

// Appends big-endian fields to a payload under construction.
class Writer {
 public:
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  // Encoders refuse nothing: a string over 65535 bytes (which callers never
  // pass) is cut there so that the length prefix stays truthful.
  void str(std::string_view s) {
    s = s.substr(0, kMaxString);
    u16(static_cast<uint16_t>(s.size()));
    out_.append(s);
  }
  // A u32 length + bytes, for DATA bodies (bounded by the frame size).
  void blob(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  std::string take() { return std::move(out_); }

 private:
  void put(uint64_t v, int width) {
    for (int shift = (width - 1) * 8; shift >= 0; shift -= 8) {
      out_.push_back(static_cast<char>(v >> shift));
    }
  }
  std::string out_;
};

// Reads big-endian fields from one payload. Every read names the message
// and field it is for, so that an error says exactly what was wrong; no
// read goes past the payload and nothing is allocated beyond its size.
class Reader {
 public:
  Reader(std::string_view message, std::string_view in) : message_(message), in_(in) {}

  Result<uint16_t> u16(std::string_view field) { return get<uint16_t>(field, 2); }
  Result<uint32_t> u32(std::string_view field) { return get<uint32_t>(field, 4); }
  Result<uint64_t> u64(std::string_view field) { return get<uint64_t>(field, 8); }

  Result<std::string> str(std::string_view field) {
    ENTENTE_ASSIGN_OR_RETURN(const uint16_t size, get<uint16_t>(field, 2));
    if (remaining() < size) return truncated(field, size);
    std::string s(in_.substr(pos_, size));
    pos_ += size;
    return s;
  }

  Result<std::string> blob(std::string_view field) {
    ENTENTE_ASSIGN_OR_RETURN(const uint32_t size, get<uint32_t>(field, 4));
    if (remaining() < size) return truncated(field, size);
    std::string s(in_.substr(pos_, size));
    pos_ += size;
    return s;
  }

  Status finish() const {
    if (remaining() == 0) return {};
    return make_error(Errc::parse_error, std::string(message_) + ": " + std::to_string(remaining()) +
                                             " trailing bytes after the last field");
  }

  Error invalid(std::string_view field, const std::string& what) const {
    return make_error(Errc::parse_error, std::string(message_) + "." + std::string(field) + ": " + what);
  }

 private:
  std::size_t remaining() const { return in_.size() - pos_; }

  Error truncated(std::string_view field, std::size_t need) const {
    return invalid(field, "truncated: needs " + std::to_string(need) + " bytes, " +
                              std::to_string(remaining()) + " left");
  }

  template <class T>
  Result<T> get(std::string_view field, std::size_t width) {
    if (remaining() < width) return truncated(field, width);
    uint64_t v = 0;
    for (std::size_t i = 0; i < width; ++i) {
      v = v << 8 | static_cast<unsigned char>(in_[pos_ + i]);
    }
    pos_ += width;
    return static_cast<T>(v);
  }

  std::string_view message_;
  std::string_view in_;
  std::size_t pos_ = 0;
};

// Codes are only ever added together with a new protocol version, so an
// unknown code from a peer speaking a version we negotiated is a broken
// frame, not something to pass on.
bool known_wire_error(uint16_t code) { return code <= static_cast<uint16_t>(WireError::moved); }

Result<WireError> read_code(Reader& r) {
  ENTENTE_ASSIGN_OR_RETURN(const uint16_t code, r.u16("code"));
  if (!known_wire_error(code)) return r.invalid("code", "unknown code " + std::to_string(code));
  return static_cast<WireError>(code);
}

// Stream names as the broker accepts them: [a-z][a-z0-9_-]*, at most 63.
bool valid_stream_name(std::string_view name) {
  if (name.empty() || name.size() > 63) return false;
  if (name.front() < 'a' || name.front() > 'z') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

// A peer's string, quoted for an error message: bounded and with control
// and non-ASCII bytes escaped, so that hostile bytes never reach a log raw.
std::string shown(std::string_view s) {
  constexpr std::size_t kShown = 80;
  std::string out = "'";
  for (char c : s.substr(0, kShown)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '\'' && c != '\\') {
      out.push_back(c);
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xf]);
    }
  }
  out += "'";
  if (s.size() > kShown) out += "...";
  return out;
}

std::string range(uint16_t lo, uint16_t hi) { return std::to_string(lo) + ".." + std::to_string(hi); }

}  // namespace

std::string_view wire_error_name(WireError e) {
  switch (e) {
    case WireError::none:
      return "none";
    case WireError::protocol:
      return "protocol";
    case WireError::version:
      return "version";
    case WireError::frame_too_large:
      return "frame_too_large";
    case WireError::identity:
      return "identity";
    case WireError::not_found:
      return "not_found";
    case WireError::not_exported:
      return "not_exported";
    case WireError::flow_control:
      return "flow_control";
    case WireError::shutdown:
      return "shutdown";
    case WireError::internal:
      return "internal";
    case WireError::bad_position:
      return "bad_position";
    case WireError::moved:
      return "moved";
  }
  return "unknown";
}

Result<uint16_t> negotiate_version(const Hello& mine, const Hello& theirs) {
  const uint16_t lo = std::max(mine.min_version, theirs.min_version);
  const uint16_t hi = std::min(mine.max_version, theirs.max_version);
  if (lo > hi || hi == 0) {
    return make_error(Errc::unsupported, "no common protocol version: this node speaks " +
                                             range(mine.min_version, mine.max_version) + ", the peer " +
                                             range(theirs.min_version, theirs.max_version));
  }
  return hi;
}

uint32_t negotiated_max_frame(const Hello& mine, const Hello& theirs) {
  return std::min(mine.max_frame, theirs.max_frame);
}

// ---- encode ----

std::string encode(const Hello& m) {
  Writer w;
  w.u16(m.min_version);
  w.u16(m.max_version);
  w.str(m.domain);
  w.str(m.node);
  w.u32(m.max_frame);
  w.u32(m.heartbeat_ms);
  return w.take();
}

std::string encode(const Heartbeat& m) {
  Writer w;
  w.u64(m.sent_ns);
  w.u64(m.echo_ns);
  w.u64(m.echo_delay_ns);
  return w.take();
}

std::string encode(const GoAway& m) {
  Writer w;
  w.u16(static_cast<uint16_t>(m.code));
  w.str(m.reason);
  return w.take();
}

std::string encode(const Open& m) {
  Writer w;
  w.str(m.stream);
  w.u64(m.from_seq);
  w.u32(m.credit);
  return w.take();
}

std::string encode(const OpenOk& m) {
  Writer w;
  w.str(m.schema_json);
  w.u64(m.first_seq);
  w.u64(m.next_seq);
  return w.take();
}

std::string encode(const Reset& m) {
  Writer w;
  w.u16(static_cast<uint16_t>(m.code));
  w.str(m.reason);
  return w.take();
}

std::string encode(const Data& m) {
  Writer w;
  w.u64(m.first_seq);
  w.u32(m.count);
  // A length of its own, although the frame's length bounds it too, so
  // that a cut or padded payload is caught like in every other message.
  w.blob(m.body);
  if (!m.named.empty()) {
    // DATA_NAMED: the named batches after DATA's own fields.
    w.u32(static_cast<uint32_t>(m.named.size()));
    for (const NamedBatch& n : m.named) {
      w.str(n.producer);
      w.u64(n.producer_seq);
      w.u64(n.first);
      w.u64(n.last);
      w.u64(n.floor);
    }
  }
  return w.take();
}

std::string encode(const Ack& m) {
  Writer w;
  w.u64(m.through);
  return w.take();
}

std::string encode(const Credit& m) {
  Writer w;
  w.u32(m.bytes);
  return w.take();
}

// ---- decode ----

Result<Hello> decode_hello(std::string_view payload) {
  Reader r("hello", payload);
  Hello m;
  ENTENTE_ASSIGN_OR_RETURN(m.min_version, r.u16("min_version"));
  ENTENTE_ASSIGN_OR_RETURN(m.max_version, r.u16("max_version"));
  ENTENTE_ASSIGN_OR_RETURN(m.domain, r.str("domain"));
  ENTENTE_ASSIGN_OR_RETURN(m.node, r.str("node"));
  ENTENTE_ASSIGN_OR_RETURN(m.max_frame, r.u32("max_frame"));
  ENTENTE_ASSIGN_OR_RETURN(m.heartbeat_ms, r.u32("heartbeat_ms"));
  ENTENTE_RETURN_IF_ERROR(r.finish());
  if (m.min_version == 0) return r.invalid("min_version", "0 is not a protocol version");
  if (m.min_version > m.max_version) {
    return r.invalid("max_version", std::to_string(m.max_version) + " is below min_version " +
                                        std::to_string(m.min_version));
  }
  if (!certs::valid_name(m.domain)) {
    return r.invalid("domain", shown(m.domain) + " is not [a-z][a-z0-9-]* of at most 63");
  }
  if (!certs::valid_name(m.node)) {
    return r.invalid("node", shown(m.node) + " is not [a-z][a-z0-9-]* of at most 63");
  }
  if (m.max_frame < kMinMaxFrame || m.max_frame > kMaxMaxFrame) {
    return r.invalid("max_frame", std::to_string(m.max_frame) + " is outside " +
                                      std::to_string(kMinMaxFrame) + ".." + std::to_string(kMaxMaxFrame));
  }
  if (m.heartbeat_ms == 0 || m.heartbeat_ms > kMaxHeartbeatMs) {
    return r.invalid("heartbeat_ms",
                     std::to_string(m.heartbeat_ms) + " is outside 1.." + std::to_string(kMaxHeartbeatMs));
  }
  return m;
}

Result<Heartbeat> decode_heartbeat(std::string_view payload) {
  Reader r("heartbeat", payload);
  Heartbeat m;
  ENTENTE_ASSIGN_OR_RETURN(m.sent_ns, r.u64("sent_ns"));
  ENTENTE_ASSIGN_OR_RETURN(m.echo_ns, r.u64("echo_ns"));
  ENTENTE_ASSIGN_OR_RETURN(m.echo_delay_ns, r.u64("echo_delay_ns"));
  ENTENTE_RETURN_IF_ERROR(r.finish());
  if (m.echo_ns == 0 && m.echo_delay_ns != 0) {
    return r.invalid("echo_delay_ns", std::to_string(m.echo_delay_ns) + " without an echo");
  }
  return m;
}

Result<GoAway> decode_goaway(std::string_view payload) {
  Reader r("goaway", payload);
  GoAway m;
  ENTENTE_ASSIGN_OR_RETURN(m.code, read_code(r));
  ENTENTE_ASSIGN_OR_RETURN(m.reason, r.str("reason"));
  ENTENTE_RETURN_IF_ERROR(r.finish());
  return m;
}

Result<Open> decode_open(std::string_view payload) {
  Reader r("open", payload);
  Open m;
  ENTENTE_ASSIGN_OR_RETURN(m.stream, r.str("stream"));
  ENTENTE_ASSIGN_OR_RETURN(m.from_seq, r.u64("from_seq"));
  ENTENTE_ASSIGN_OR_RETURN(m.credit, r.u32("credit"));
  ENTENTE_RETURN_IF_ERROR(r.finish());
  const auto slash = m.stream.find('/');
  if (m.stream.empty()) return r.invalid("stream", "empty");
  if (slash == std::string::npos || !certs::valid_name(m.stream.substr(0, slash)) ||
      !valid_stream_name(std::string_view(m.stream).substr(slash + 1))) {
    return r.invalid("stream", shown(m.stream) + " is not DOMAIN/NAME");
  }
  if (m.credit > CreditWindow::kMaxCredit) {
    return r.invalid("credit", std::to_string(m.credit) + " exceeds the maximum of " +
                                   std::to_string(CreditWindow::kMaxCredit));
  }
  return m;
}

Result<OpenOk> decode_open_ok(std::string_view payload) {
  Reader r("open_ok", payload);
  OpenOk m;
  ENTENTE_ASSIGN_OR_RETURN(m.schema_json, r.str("schema_json"));
  ENTENTE_ASSIGN_OR_RETURN(m.first_seq, r.u64("first_seq"));
  ENTENTE_ASSIGN_OR_RETURN(m.next_seq, r.u64("next_seq"));
  ENTENTE_RETURN_IF_ERROR(r.finish());
  if (m.schema_json.empty()) return r.invalid("schema_json", "empty");
  if (m.first_seq == 0) return r.invalid("first_seq", "0 (sequence numbers start at 1)");
  if (m.first_seq > m.next_seq) {
    return r.invalid("next_seq",
                     std::to_string(m.next_seq) + " is below first_seq " + std::to_string(m.first_seq));
  }
  return m;
}

Result<Reset> decode_reset(std::string_view payload) {
  Reader r("reset", payload);
  Reset m;
  ENTENTE_ASSIGN_OR_RETURN(m.code, read_code(r));
  ENTENTE_ASSIGN_OR_RETURN(m.reason, r.str("reason"));
  ENTENTE_RETURN_IF_ERROR(r.finish());
  // A moved RESET's reason is an address the receiver may dial: malformed
  // unless it is exactly the documented form.
  if (m.code == WireError::moved) {
    if (auto where = parse_moved(m.reason); !where.ok()) return r.invalid("reason", where.error().message);
  }
  return m;
}

std::string moved_reason(const Moved& m) {
  const bool v6 = m.host.find(':') != std::string::npos;
  return m.node + "@" + (v6 ? "[" + m.host + "]" : m.host) + ":" + std::to_string(m.port);
}

Result<Moved> parse_moved(std::string_view reason) {
  auto bad = [&](const std::string& what) {
    return make_error(Errc::parse_error, shown(reason) + " is not NODE@HOST:PORT: " + what);
  };
  if (reason.size() > kMaxMovedReason) return bad("longer than " + std::to_string(kMaxMovedReason) + " bytes");
  const size_t at = reason.find('@');
  const size_t colon = reason.rfind(':');
  if (at == std::string_view::npos || colon == std::string_view::npos || colon < at) return bad("no '@' or ':'");
  Moved m;
  m.node = std::string(reason.substr(0, at));
  if (!certs::valid_name(m.node)) return bad("the node is not [a-z][a-z0-9-]* of at most 63");
  std::string_view host = reason.substr(at + 1, colon - at - 1);
  const std::string_view port = reason.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    // An IPv6 address: hex digits, ':' and '.' (an embedded IPv4), at most 45.
    host = host.substr(1, host.size() - 2);
    const bool ok = !host.empty() && host.size() <= 45 && host.find(':') != std::string_view::npos &&
                    std::all_of(host.begin(), host.end(), [](char c) {
                      return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') ||
                             c == ':' || c == '.';
                    });
    if (!ok) return bad("the host in brackets is not an IPv6 address");
  } else {
    // A DNS name or an IPv4 address: dot-separated labels of letters,
    // digits and '-', 1..63 each, not starting or ending with '-'.
    bool ok = !host.empty() && host.size() <= 253;
    size_t label = 0;
    for (size_t i = 0; ok && i <= host.size(); ++i) {
      if (i == host.size() || host[i] == '.') {
        ok = label > 0 && label <= 63 && host[i - 1] != '-' && host[i - label] != '-';
        label = 0;
        continue;
      }
      const char c = host[i];
      ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
      ++label;
    }
    if (!ok) return bad("the host is not a DNS name, an IPv4 address or a bracketed IPv6 address");
  }
  m.host = std::string(host);
  uint32_t p = 0;
  const bool digits = !port.empty() && port.size() <= 5 && port.front() != '0' &&
                      std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (digits) {
    for (char c : port) p = p * 10 + static_cast<uint32_t>(c - '0');
  }
  if (!digits || p == 0 || p > 65535) return bad("the port is not 1..65535 in decimal");
  m.port = static_cast<uint16_t>(p);
  return m;
}

namespace {

// DATA's own fields, checked; the caller finishes the payload.
Status read_data_fields(Reader& r, Data& m) {
  ENTENTE_ASSIGN_OR_RETURN(m.first_seq, r.u64("first_seq"));
  ENTENTE_ASSIGN_OR_RETURN(m.count, r.u32("count"));
  ENTENTE_ASSIGN_OR_RETURN(m.body, r.blob("body"));
  if (m.first_seq == 0) return r.invalid("first_seq", "0 (sequence numbers start at 1)");
  if (m.count == 0) return r.invalid("count", "0 tuples");
  if (m.first_seq - 1 > std::numeric_limits<uint64_t>::max() - m.count) {
    return r.invalid("count", std::to_string(m.count) + " tuples from " + std::to_string(m.first_seq) +
                                  " run past the last sequence number");
  }
  if (m.body.empty()) return r.invalid("body", "empty for " + std::to_string(m.count) + " tuples");
  return {};
}

// The smallest encoding of one named batch: a producer id of one byte.
constexpr std::size_t kMinNamedBytes = 2 + 1 + 4 * 8;

}  // namespace

bool valid_producer_id(std::string_view id) {
  if (id.empty() || id.size() > kMaxProducerBytes) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '-';
  });
}

Result<Data> decode_data(std::string_view payload) {
  Reader r("data", payload);
  Data m;
  // Fields first, then the trailing bytes: a DATA_NAMED's payload sent as
  // DATA is malformed here, as any padded DATA.
  ENTENTE_RETURN_IF_ERROR(read_data_fields(r, m));
  ENTENTE_RETURN_IF_ERROR(r.finish());
  return m;
}

Result<Data> decode_data_named(std::string_view payload) {
  Reader r("data_named", payload);
  Data m;
  ENTENTE_RETURN_IF_ERROR(read_data_fields(r, m));
  ENTENTE_ASSIGN_OR_RETURN(const uint32_t n, r.u32("named_count"));
  if (n == 0) return r.invalid("named_count", "0 (a DATA without names is a DATA)");
  // Each batch has a tuple of its own whose number ends it in the range.
  if (n > m.count) {
    return r.invalid("named_count",
                     std::to_string(n) + " batches end in a range of " + std::to_string(m.count) + " tuples");
  }
  if (n > payload.size() / kMinNamedBytes) {
    return r.invalid("named_count", std::to_string(n) + " batches cannot fit in " +
                                        std::to_string(payload.size()) + " bytes");
  }
  const uint64_t range_last = m.first_seq + m.count - 1;
  m.named.reserve(n);
  uint64_t prev_last = 0;
  for (uint32_t i = 0; i < n; ++i) {
    NamedBatch b;
    ENTENTE_ASSIGN_OR_RETURN(b.producer, r.str("producer"));
    ENTENTE_ASSIGN_OR_RETURN(b.producer_seq, r.u64("producer_seq"));
    ENTENTE_ASSIGN_OR_RETURN(b.first, r.u64("first"));
    ENTENTE_ASSIGN_OR_RETURN(b.last, r.u64("last"));
    ENTENTE_ASSIGN_OR_RETURN(b.floor, r.u64("floor"));
    const std::string at = " (batch " + std::to_string(i) + ")";
    if (!valid_producer_id(b.producer)) {
      return r.invalid("producer", shown(b.producer) + " is not 1..64 of A-Z a-z 0-9 . _ : -" + at);
    }
    if (b.producer_seq == 0) return r.invalid("producer_seq", "0 (batch numbers start at 1)" + at);
    // Any floor: a batch numbered below it may still be remembered (it was
    // being written, out of order, when the window moved past it).
    if (b.first == 0 || b.first > b.last) {
      return r.invalid("first",
                       std::to_string(b.first) + ".." + std::to_string(b.last) + " is not a range" + at);
    }
    if (b.last < m.first_seq || b.last > range_last) {
      return r.invalid("last", std::to_string(b.last) + " is outside the covered " +
                                   std::to_string(m.first_seq) + ".." + std::to_string(range_last) + at);
    }
    // Batches are records: they do not overlap, and come in order.
    if (b.first <= prev_last) {
      return r.invalid("first", std::to_string(b.first) + " is not above the previous batch's last " +
                                    std::to_string(prev_last) + at);
    }
    prev_last = b.last;
    m.named.push_back(std::move(b));
  }
  ENTENTE_RETURN_IF_ERROR(r.finish());
  return m;
}

Result<Ack> decode_ack(std::string_view payload) {
  Reader r("ack", payload);
  Ack m;
  ENTENTE_ASSIGN_OR_RETURN(m.through, r.u64("through"));
  ENTENTE_RETURN_IF_ERROR(r.finish());
  return m;
}

Result<Credit> decode_credit(std::string_view payload) {
  Reader r("credit", payload);
  Credit m;
  ENTENTE_ASSIGN_OR_RETURN(m.bytes, r.u32("bytes"));
  ENTENTE_RETURN_IF_ERROR(r.finish());
  if (m.bytes == 0) return r.invalid("bytes", "0 (a grant adds at least one byte)");
  return m;
}

Status CreditWindow::grant(uint64_t bytes) {
  if (bytes > kMaxCredit || available_ > kMaxCredit - bytes) {
    return make_error(Errc::limit_exceeded, "credit grant of " + std::to_string(bytes) + " bytes on top of " +
                                                std::to_string(available_) +
                                                " exceeds the maximum window of " +
                                                std::to_string(kMaxCredit));
  }
  available_ += bytes;
  return {};
}

}  // namespace entente::federation
