// libFuzzer target for the peer-link wire format: FrameDecoder and every
// message decoder, fed bytes the way a hostile peer could send them.
// Built and run by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,
// undefined); any invariant broken here calls abort().
//
// Input layout (so that the fuzzer also explores limits and read sizes):
//   byte 0      max_frame until the first frame (index into kLimits)
//   byte 1      max_frame after the first frame, as after a handshake
//   bytes 2..5  read sizes, used in turn: n % 64 + 1 bytes, or everything
//               left when n is 0
//   rest        the byte stream from the peer
//
// Built with -DENTENTE_FUZZ_SEED_MAIN instead, the file is a small program
// that writes the seed corpus (scripts/fuzz.sh --seed).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>
#include <string_view>

#include "federation/frame.h"
#include "federation/messages.h"

namespace entente::federation {
namespace {

constexpr uint32_t kLimits[] = {32, 128, 4096, kHandshakeMaxFrame, kMaxMaxFrame};
constexpr std::size_t kConfigSize = 6;

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "frame_fuzz: invariant violated: %s\n", what);
  std::abort();
}

void check(bool ok, const char* what) {
  if (!ok) violated(what);
}

bool same(const Hello& a, const Hello& b) {
  return a.min_version == b.min_version && a.max_version == b.max_version && a.domain == b.domain &&
         a.node == b.node && a.max_frame == b.max_frame && a.heartbeat_ms == b.heartbeat_ms;
}
bool same(const Heartbeat& a, const Heartbeat& b) {
  return a.sent_ns == b.sent_ns && a.echo_ns == b.echo_ns && a.echo_delay_ns == b.echo_delay_ns;
}
bool same(const GoAway& a, const GoAway& b) { return a.code == b.code && a.reason == b.reason; }
bool same(const Open& a, const Open& b) {
  return a.stream == b.stream && a.from_seq == b.from_seq && a.credit == b.credit;
}
bool same(const OpenOk& a, const OpenOk& b) {
  return a.schema_json == b.schema_json && a.first_seq == b.first_seq && a.next_seq == b.next_seq;
}
bool same(const Reset& a, const Reset& b) { return a.code == b.code && a.reason == b.reason; }
bool same(const Data& a, const Data& b) {
  return a.first_seq == b.first_seq && a.count == b.count && a.body == b.body && a.named == b.named;
}
bool same(const Ack& a, const Ack& b) { return a.through == b.through; }
bool same(const Credit& a, const Credit& b) { return a.bytes == b.bytes; }

// A message that decodes must re-encode to the very same bytes (the format
// has one encoding per value) and decode again to equal fields. A message
// that does not decode must say why.
template <class T>
void round_trip(std::string_view payload, Result<T> (*decode)(std::string_view)) {
  auto first = decode(payload);
  if (!first.ok()) {
    check(first.error().code == Errc::parse_error, "message error is not parse_error");
    check(!first.error().message.empty(), "message error without a message");
    return;
  }
  const std::string again = encode(*first);
  check(again == payload, "re-encoding differs from the payload");
  auto second = decode(again);
  check(second.ok(), "re-encoded message does not decode");
  check(same(*first, *second), "re-decoded fields differ");
}

void decode_payload(const FrameView& frame) {
  switch (frame.type) {
    case FrameType::hello:
      return round_trip(frame.payload, &decode_hello);
    case FrameType::heartbeat:
      return round_trip(frame.payload, &decode_heartbeat);
    case FrameType::goaway:
      return round_trip(frame.payload, &decode_goaway);
    case FrameType::open:
      return round_trip(frame.payload, &decode_open);
    case FrameType::open_ok:
      return round_trip(frame.payload, &decode_open_ok);
    case FrameType::reset:
      return round_trip(frame.payload, &decode_reset);
    case FrameType::data:
      return round_trip(frame.payload, &decode_data);
    case FrameType::data_named:
      return round_trip(frame.payload, &decode_data_named);
    case FrameType::ack:
      return round_trip(frame.payload, &decode_ack);
    case FrameType::credit:
      return round_trip(frame.payload, &decode_credit);
    case FrameType::control:
      // A JSON object for the layer above (contract negotiation), which
      // parses and bounds it; the link passes it on as it is.
      return;
  }
  violated("decoder returned an unknown frame type");
}

// The frame, encoded again and decoded by a fresh decoder, is the same.
void reframe(const FrameView& frame, uint32_t max_frame) {
  std::string bytes;
  append_frame(bytes, frame.type, frame.channel, frame.payload);
  check(bytes.size() == kFrameHeaderSize + frame.payload.size(), "append_frame size");
  FrameDecoder decoder(max_frame);
  decoder.feed(bytes);
  auto r = decoder.next();
  check(r.ok() && r->has_value(), "re-framed frame does not decode");
  const FrameView& again = **r;
  check(again.type == frame.type && again.channel == frame.channel && again.payload == frame.payload,
        "re-framed frame differs");
  check(decoder.buffered() == 0, "re-framed frame leaves bytes behind");
}

[[maybe_unused]] void run(const uint8_t* data, std::size_t size) {
  if (size < kConfigSize) return;
  const uint32_t first_limit = kLimits[data[0] % std::size(kLimits)];
  const uint32_t later_limit = kLimits[data[1] % std::size(kLimits)];
  const uint8_t* reads = data + 2;
  std::string_view stream(reinterpret_cast<const char*>(data + kConfigSize), size - kConfigSize);

  FrameDecoder decoder(first_limit);
  bool first_frame = true;
  std::size_t read_index = 0;
  std::size_t pos = 0;
  while (pos < stream.size()) {
    const uint8_t n = reads[read_index++ % 4];
    const std::size_t take =
        n == 0 ? stream.size() - pos : std::min<std::size_t>(n % 64 + 1, stream.size() - pos);
    const std::size_t before = decoder.buffered();
    decoder.feed(stream.substr(pos, take));
    pos += take;
    check(decoder.buffered() == before + take, "feed did not keep every byte");
    for (;;) {
      const uint32_t limit = decoder.max_frame();
      auto r = decoder.next();
      if (!r.ok()) {
        const Error error = r.error();
        check(error.code == Errc::parse_error || error.code == Errc::limit_exceeded, "frame error code");
        // Sticky: the same error again, and later bytes are dropped.
        auto again = decoder.next();
        check(!again.ok() && again.error().code == error.code && again.error().message == error.message,
              "frame error is not sticky");
        const std::size_t held = decoder.buffered();
        decoder.feed(stream.substr(pos));
        check(decoder.buffered() == held, "a failed decoder buffers more bytes");
        return;
      }
      if (!r->has_value()) break;
      const FrameView frame = **r;
      check(known_frame_type(static_cast<uint8_t>(frame.type)), "unknown type returned");
      check(frame.payload.size() <= limit, "payload above max_frame");
      decode_payload(frame);
      reframe(frame, limit);
      if (first_frame) {
        first_frame = false;
        decoder.set_max_frame(later_limit);
      }
    }
    // Drained: less than one whole frame is left.
    check(decoder.buffered() < kFrameHeaderSize + decoder.max_frame() || decoder.buffered() < 4,
          "more than one frame buffered after draining");
  }
}

}  // namespace
}  // namespace entente::federation

#ifndef ENTENTE_FUZZ_SEED_MAIN

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  entente::federation::run(data, size);
  return 0;
}

#else

namespace entente::federation {
namespace {

// Writes one seed: config bytes, then the frames.
bool write_seed(const std::string& dir, const char* name, std::string_view config,
                const std::string& frames) {
  const std::string path = dir + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const std::string bytes = std::string(config) + frames;
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}

std::string frame(FrameType type, uint32_t channel, const std::string& payload) {
  std::string out;
  append_frame(out, type, channel, payload);
  return out;
}

int write_seeds(const std::string& dir) {
  Hello hello;
  hello.domain = "acme";
  hello.node = "n1";
  hello.max_frame = 4096;
  hello.heartbeat_ms = 250;
  const std::string h = frame(FrameType::hello, 0, encode(hello));
  const std::string hb = frame(FrameType::heartbeat, 0, encode(Heartbeat{1000, 999, 250000}));
  const std::string open = frame(FrameType::open, 1, encode(Open{"acme/trades", 1, 65536}));
  const std::string open_ok =
      frame(FrameType::open_ok, 1, encode(OpenOk{R"({"fields":[{"name":"px","type":"int64"}]})", 1, 3}));
  const std::string data = frame(FrameType::data, 1, encode(Data{1, 2, "\x01\x02\x03\x04", {}}));
  const std::string ack = frame(FrameType::ack, 1, encode(Ack{2}));
  const std::string credit = frame(FrameType::credit, 1, encode(Credit{4096}));
  const std::string reset = frame(FrameType::reset, 1, encode(Reset{WireError::not_exported, "no"}));
  const std::string goaway = frame(FrameType::goaway, 0, encode(GoAway{WireError::shutdown, "bye"}));
  // Version 3: DATA with the publishers' names of the batches it completes.
  const std::string data_named =
      frame(FrameType::data_named, 1,
            encode(Data{1, 4, "\x01\x02\x03\x04", {{"loader-7", 42, 1, 2, 0}, {"p", 9, 3, 4, 8}}}));
  // Version 2: a RESET moved, whose reason is an address to dial.
  const std::string moved = frame(FrameType::reset, 1, encode(Reset{WireError::moved, "n1@10.0.0.7:7443"})) +
                            frame(FrameType::reset, 3, encode(Reset{WireError::moved, "node-2@[fe80::1]:1"}));

  // Config: 4096 before and after the first frame; reads of 8, 1, 64, all.
  const std::string_view cfg("\x02\x02\x07\x00\x3f\x00", 6);
  // Whole input in one read.
  const std::string_view whole("\x03\x04\x00\x00\x00\x00", 6);
  bool ok = true;
  ok &= write_seed(dir, "session", cfg, h + hb + open + open_ok + data + ack + credit + reset + goaway);
  ok &= write_seed(dir, "hello", whole, h);
  ok &= write_seed(dir, "heartbeat", whole, hb);
  ok &= write_seed(dir, "open", whole, open);
  ok &= write_seed(dir, "open_ok", whole, open_ok);
  ok &= write_seed(dir, "data", whole, data);
  ok &= write_seed(dir, "data_named", whole, data_named);
  ok &= write_seed(dir, "ack_credit", whole, ack + credit);
  ok &= write_seed(dir, "reset_goaway", whole, reset + goaway);
  ok &= write_seed(dir, "reset_moved", whole, moved);
  // Errors: an oversized frame under the 32-byte limit, a length below 5
  // after a good frame, an unknown type.
  ok &= write_seed(dir, "too_large", std::string_view("\x00\x00\x01\x01\x01\x01", 6), data);
  ok &= write_seed(dir, "short_length", whole, hb + std::string("\x00\x00\x00\x04", 4));
  ok &= write_seed(dir, "unknown_type", whole, std::string("\x00\x00\x00\x05\x7f\x00\x00\x00\x01", 9));
  if (!ok) {
    std::fprintf(stderr, "frame_fuzz_seed: cannot write seeds to %s\n", dir.c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace entente::federation

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: frame_fuzz_seed DIR\n");
    return 2;
  }
  return entente::federation::write_seeds(argv[1]);
}

#endif
