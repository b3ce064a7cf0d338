// FrameDecoder and append_frame: byte layout, reassembly across arbitrary
// read boundaries, the size and type checks, and that errors stick.

#include "federation/frame.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace entente::federation {
namespace {

struct Frame {
  FrameType type;
  uint32_t channel;
  std::string payload;
  friend bool operator==(const Frame&, const Frame&) = default;
};

std::string encoded(const std::vector<Frame>& frames) {
  std::string out;
  for (const auto& f : frames) append_frame(out, f.type, f.channel, f.payload);
  return out;
}

// Drains every complete frame; fails the test on a decoder error.
void drain(FrameDecoder& decoder, std::vector<Frame>& out) {
  for (;;) {
    auto next = decoder.next();
    ASSERT_TRUE(next.ok()) << next.error().message;
    if (!next->has_value()) return;
    const FrameView& v = **next;
    out.push_back({v.type, v.channel, std::string(v.payload)});
  }
}

std::string u32_be(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

// A header announcing `payload_size` bytes of `type` on channel 1.
std::string header(uint32_t payload_size, uint8_t type = 0x13) {
  return u32_be(payload_size + 5) + std::string(1, static_cast<char>(type)) + u32_be(1);
}

std::vector<Frame> sample_frames() {
  std::string big(50000, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  return {
      {FrameType::hello, 0, "hello payload"},
      {FrameType::heartbeat, 0, std::string(16, '\x01')},
      {FrameType::open, 1, "p/s"},
      {FrameType::data, 1, big},
      {FrameType::credit, 1, ""},
      {FrameType::ack, 0xffffffffu, std::string(8, '\xff')},
      {FrameType::open_ok, 2, std::string("\0\0\0", 3)},
      {FrameType::reset, 3, "x"},
      {FrameType::goaway, 0, "bye"},
  };
}

TEST(FrameTypes, ExactlyTheElevenTypesAreKnown) {
  int known = 0;
  for (int t = 0; t < 256; ++t) {
    if (known_frame_type(static_cast<uint8_t>(t))) {
      ++known;
      EXPECT_NE(frame_type_name(static_cast<FrameType>(t)), "unknown") << t;
    } else {
      EXPECT_EQ(frame_type_name(static_cast<FrameType>(t)), "unknown") << t;
    }
  }
  EXPECT_EQ(known, 11);
  EXPECT_EQ(frame_type_name(FrameType::control), "control");
  EXPECT_EQ(frame_type_name(FrameType::open_ok), "open_ok");
  EXPECT_EQ(frame_type_name(FrameType::credit), "credit");
  EXPECT_EQ(frame_type_name(FrameType::data_named), "data_named");
}

TEST(AppendFrame, WritesBigEndianLengthTypeChannelPayload) {
  std::string out = "x";  // appends, keeping what was there
  append_frame(out, FrameType::data, 0x01020304, "abc");
  const std::string want =
      std::string("x") + std::string("\x00\x00\x00\x08", 4) + "\x13" + "\x01\x02\x03\x04" + "abc";
  EXPECT_EQ(out, want);
  std::string empty;
  append_frame(empty, FrameType::heartbeat, 0, "");
  EXPECT_EQ(empty, std::string("\x00\x00\x00\x05\x02\x00\x00\x00\x00", 9));
  EXPECT_EQ(empty.size(), kFrameHeaderSize);
}

TEST(FrameDecoder, DecodesFramesFedAtOnce) {
  const auto frames = sample_frames();
  FrameDecoder decoder;
  decoder.feed(encoded(frames));
  std::vector<Frame> got;
  drain(decoder, got);
  EXPECT_EQ(got, frames);
  EXPECT_EQ(decoder.buffered(), 0u);
}

TEST(FrameDecoder, ByteByByteGivesTheSameFrames) {
  const auto frames = sample_frames();
  const std::string bytes = encoded(frames);
  FrameDecoder decoder;
  std::vector<Frame> got;
  for (char c : bytes) {
    decoder.feed(std::string_view(&c, 1));
    drain(decoder, got);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(got, frames);
  EXPECT_EQ(decoder.buffered(), 0u);
}

TEST(FrameDecoder, RandomChunksGiveTheSameFramesAndBufferAtMostOneFramePlusOneRead) {
  const auto frames = sample_frames();
  const std::string bytes = encoded(frames);
  std::size_t largest_frame = 0;
  for (const auto& f : frames) largest_frame = std::max(largest_frame, f.payload.size());
  std::mt19937 rng(20240611);
  for (int round = 0; round < 50; ++round) {
    std::uniform_int_distribution<std::size_t> chunk_size(1, round % 2 == 0 ? 17 : 70000);
    FrameDecoder decoder;
    std::vector<Frame> got;
    std::size_t pos = 0;
    while (pos < bytes.size()) {
      const std::size_t n = std::min(chunk_size(rng), bytes.size() - pos);
      const std::size_t before = decoder.buffered();
      decoder.feed(std::string_view(bytes).substr(pos, n));
      pos += n;
      EXPECT_EQ(decoder.buffered(), before + n);
      // Drained, what is left is less than one frame.
      EXPECT_LE(before, kFrameHeaderSize + largest_frame);
      drain(decoder, got);
      if (HasFatalFailure()) return;
      EXPECT_LT(decoder.buffered(), kFrameHeaderSize + largest_frame);
    }
    EXPECT_EQ(got, frames) << "round " << round;
    EXPECT_EQ(decoder.buffered(), 0u);
  }
}

TEST(FrameDecoder, PayloadStaysValidUntilTheNextFeed) {
  FrameDecoder decoder;
  std::string bytes;
  append_frame(bytes, FrameType::open, 5, "first");
  append_frame(bytes, FrameType::open, 7, "second");
  decoder.feed(bytes);
  auto a = decoder.next();
  auto b = decoder.next();
  ASSERT_TRUE(a.ok() && a->has_value());
  ASSERT_TRUE(b.ok() && b->has_value());
  // Both views point into the buffer, which next() does not move.
  EXPECT_EQ((*a)->payload, "first");
  EXPECT_EQ((*a)->channel, 5u);
  EXPECT_EQ((*b)->payload, "second");
  EXPECT_EQ((*b)->channel, 7u);
}

TEST(FrameDecoder, NeedsMoreBytesWithoutError) {
  FrameDecoder decoder;
  auto r = decoder.next();
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  decoder.feed(header(10).substr(0, 3));
  r = decoder.next();
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  decoder.feed(header(10).substr(3) + "123456789");  // one payload byte short
  r = decoder.next();
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_EQ(decoder.buffered(), kFrameHeaderSize + 9);
  decoder.feed("0");
  r = decoder.next();
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->payload, "1234567890");
}

TEST(FrameDecoder, PayloadOfExactlyMaxFrameIsAccepted) {
  FrameDecoder decoder(4096);
  std::string bytes;
  append_frame(bytes, FrameType::data, 1, std::string(4096, 'a'));
  decoder.feed(bytes);
  auto r = decoder.next();
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->payload.size(), 4096u);
}

TEST(FrameDecoder, OversizedFrameFailsFromItsLengthAlone) {
  FrameDecoder decoder(4096);
  // Only the length field has arrived: the decoder must not wait for (and
  // buffer) the oversized payload to refuse it.
  decoder.feed(u32_be(4096 + 5 + 1));
  auto r = decoder.next();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::limit_exceeded);
  EXPECT_EQ(r.error().message, "frame payload of 4097 bytes exceeds the maximum of 4096");
}

TEST(FrameDecoder, HugeLengthFailsWithoutOverflow) {
  FrameDecoder decoder(kMaxMaxFrame);
  decoder.feed(u32_be(0xffffffffu));
  auto r = decoder.next();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::limit_exceeded);
  EXPECT_EQ(r.error().message,
            "frame payload of 4294967290 bytes exceeds the maximum of " + std::to_string(kMaxMaxFrame));
}

TEST(FrameDecoder, LengthBelowFiveFails) {
  for (uint32_t length = 0; length < 5; ++length) {
    FrameDecoder decoder;
    decoder.feed(u32_be(length));
    auto r = decoder.next();
    ASSERT_FALSE(r.ok()) << length;
    EXPECT_EQ(r.error().code, Errc::parse_error);
    EXPECT_EQ(r.error().message, "frame length " + std::to_string(length) + " is below the minimum of 5");
  }
}

TEST(FrameDecoder, UnknownTypeFailsAsSoonAsTheTypeByteArrives) {
  for (uint8_t type : {0x00, 0x04, 0x0f, 0x17, 0xff}) {
    FrameDecoder decoder;
    decoder.feed(header(100, type).substr(0, 5));
    auto r = decoder.next();
    ASSERT_FALSE(r.ok()) << int{type};
    EXPECT_EQ(r.error().code, Errc::parse_error);
    EXPECT_EQ(r.error().message, "unknown frame type " + std::to_string(type));
  }
}

TEST(FrameDecoder, FramesBeforeABadOneAreDeliveredThenTheErrorSticks) {
  FrameDecoder decoder;
  std::string bytes;
  append_frame(bytes, FrameType::heartbeat, 0, std::string(16, 'h'));
  bytes += header(3, 0x42) + "abc";
  append_frame(bytes, FrameType::heartbeat, 0, std::string(16, 'h'));
  decoder.feed(bytes);
  auto first = decoder.next();
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ((*first)->type, FrameType::heartbeat);
  for (int i = 0; i < 3; ++i) {
    auto r = decoder.next();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, Errc::parse_error);
    EXPECT_EQ(r.error().message, "unknown frame type 66");
  }
  // A stream that failed stays failed: new bytes are dropped, not buffered.
  const std::size_t buffered = decoder.buffered();
  std::string good;
  append_frame(good, FrameType::ack, 1, std::string(8, '\0'));
  decoder.feed(good);
  EXPECT_EQ(decoder.buffered(), buffered);
  auto r = decoder.next();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "unknown frame type 66");
}

TEST(FrameDecoder, LimitErrorSticksAcrossRaisingTheLimit) {
  FrameDecoder decoder(4096);
  decoder.feed(header(5000));
  auto r = decoder.next();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::limit_exceeded);
  decoder.set_max_frame(kMaxMaxFrame);
  decoder.feed(std::string(5000, 'x'));
  r = decoder.next();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::limit_exceeded);
  EXPECT_EQ(r.error().message, "frame payload of 5000 bytes exceeds the maximum of 4096");
}

TEST(FrameDecoder, MaxFrameDefaultsToTheHandshakeLimitAndIsClamped) {
  EXPECT_EQ(FrameDecoder().max_frame(), kHandshakeMaxFrame);
  EXPECT_EQ(FrameDecoder(0xffffffffu).max_frame(), kMaxMaxFrame);
  FrameDecoder decoder;
  decoder.set_max_frame(kMaxMaxFrame + 1);
  EXPECT_EQ(decoder.max_frame(), kMaxMaxFrame);
  decoder.set_max_frame(kDefaultMaxFrame);
  EXPECT_EQ(decoder.max_frame(), kDefaultMaxFrame);
}

TEST(FrameDecoder, RaisingTheLimitAdmitsLargerFrames) {
  // As after a handshake: HELLO under the handshake limit, then a frame
  // above it once both sides agreed on a larger one.
  FrameDecoder decoder;
  std::string bytes;
  append_frame(bytes, FrameType::hello, 0, "h");
  append_frame(bytes, FrameType::data, 1, std::string(kHandshakeMaxFrame + 1, 'd'));
  decoder.feed(bytes);
  auto hello = decoder.next();
  ASSERT_TRUE(hello.ok());
  ASSERT_TRUE(hello->has_value());
  decoder.set_max_frame(kDefaultMaxFrame);
  auto data = decoder.next();
  ASSERT_TRUE(data.ok()) << data.error().message;
  ASSERT_TRUE(data->has_value());
  EXPECT_EQ((*data)->payload.size(), kHandshakeMaxFrame + 1);
}

TEST(FrameDecoder, WithoutRaisingTheSameFrameIsRefused) {
  FrameDecoder decoder;
  std::string bytes;
  append_frame(bytes, FrameType::data, 1, std::string(kHandshakeMaxFrame + 1, 'd'));
  decoder.feed(bytes);
  auto r = decoder.next();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::limit_exceeded);
}

TEST(FrameDecoder, LoweringTheLimitAppliesToEveryFrameNotYetReturned) {
  // The new bound also covers a frame whose header is already buffered: a
  // conforming peer sends nothing above the agreed limit after the HELLOs,
  // so a frame that breaks it is refused even if it started earlier.
  FrameDecoder decoder;
  decoder.feed(header(10000) + std::string(100, 'x'));
  auto r = decoder.next();
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  decoder.set_max_frame(4096);
  r = decoder.next();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::limit_exceeded);
  EXPECT_EQ(r.error().message, "frame payload of 10000 bytes exceeds the maximum of 4096");

  FrameDecoder small;
  small.set_max_frame(4096);
  std::string bytes;
  append_frame(bytes, FrameType::data, 1, std::string(4096, 'a'));
  append_frame(bytes, FrameType::data, 1, std::string(4097, 'b'));
  small.feed(bytes);
  auto ok = small.next();
  ASSERT_TRUE(ok.ok());
  ASSERT_TRUE(ok->has_value());
  auto bad = small.next();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, Errc::limit_exceeded);
}

TEST(FrameDecoder, ZeroMaxFrameAdmitsOnlyEmptyPayloads) {
  FrameDecoder decoder(0);
  std::string bytes;
  append_frame(bytes, FrameType::credit, 1, "");
  append_frame(bytes, FrameType::credit, 1, "x");
  decoder.feed(bytes);
  auto a = decoder.next();
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->has_value());
  EXPECT_TRUE((*a)->payload.empty());
  auto b = decoder.next();
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().code, Errc::limit_exceeded);
}

TEST(FrameDecoder, RandomGarbageFailsOrWaitsButNeverOverBuffers) {
  // Arbitrary bytes after a good frame: the decoder either reports an
  // error or holds less than one maximal frame plus the read.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  int failures = 0;
  for (int round = 0; round < 200; ++round) {
    FrameDecoder decoder(4096);
    std::string bytes;
    append_frame(bytes, FrameType::heartbeat, 0, std::string(16, '\0'));
    for (int i = 0; i < 64; ++i) bytes.push_back(static_cast<char>(byte(rng)));
    decoder.feed(bytes);
    bool failed = false;
    for (;;) {
      auto r = decoder.next();
      if (!r.ok()) {
        failed = true;
        EXPECT_TRUE(r.error().code == Errc::parse_error || r.error().code == Errc::limit_exceeded);
        break;
      }
      if (!r->has_value()) break;
      EXPECT_LE((*r)->payload.size(), 4096u);
    }
    if (failed) ++failures;
    EXPECT_LE(decoder.buffered(), kFrameHeaderSize + 4096 + bytes.size());
  }
  // Random lengths are almost always far above 4096.
  EXPECT_GT(failures, 150);
}

}  // namespace
}  // namespace entente::federation
