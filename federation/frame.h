#pragma once
// The peer-link wire format (docs/protocol.md): length-prefixed binary
// frames, each with a type, a channel and a payload. All integers are
// big-endian.
//
//   u32 length    bytes that follow this field: 1 + 4 + payload size
//   u8  type      FrameType
//   u32 channel   0 = the link itself (hello, heartbeat, goaway);
//                 1.. = one stream subscription each
//   payload       length - 5 bytes, at most the agreed maximum frame size
//
// Pure bytes: no sockets, no clocks. FrameDecoder is the only code that
// reads bytes from a peer before they are trusted, and is fuzzed.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/result.h"

namespace entente::federation {

// The highest version this node speaks (Hello::kMaxVersion).
inline constexpr uint16_t kProtocolVersion = 3;
inline constexpr std::size_t kFrameHeaderSize = 9;
// Payload bound until both HELLOs are exchanged.
inline constexpr uint32_t kHandshakeMaxFrame = 64 * 1024;
inline constexpr uint32_t kDefaultMaxFrame = 1024 * 1024;
// No configuration may raise the maximum frame size above this.
inline constexpr uint32_t kMaxMaxFrame = 16 * 1024 * 1024;

enum class FrameType : uint8_t {
  hello = 0x01,      // channel 0, both sides first
  heartbeat = 0x02,  // channel 0
  goaway = 0x03,     // channel 0, last frame before closing the link
  open = 0x10,       // subscriber → owner: subscribe a stream on a new channel
  open_ok = 0x11,    // owner → subscriber
  reset = 0x12,      // either side: the channel is refused or ends
  data = 0x13,       // owner → subscriber: tuples with sequence numbers
  ack = 0x14,        // subscriber → owner: durable through a sequence number
  credit = 0x15,     // subscriber → owner: more bytes may be sent
  // Version 3, owner → a node of its own domain: DATA and the publishers'
  // names of the batches it completes (docs/protocol.md §5.12).
  data_named = 0x16,
  control = 0x20,    // channel 0, either side: a JSON message for the layer above (contracts)
};

// True for the values of FrameType.
bool known_frame_type(uint8_t type);
// "hello", "data", ...; "unknown" for anything else.
std::string_view frame_type_name(FrameType type);

// One decoded frame. `payload` points into the decoder's buffer and stays
// valid until the next call to feed() or next().
struct FrameView {
  FrameType type;
  uint32_t channel;
  std::string_view payload;
};

// Appends one encoded frame to `out`. The caller keeps payload within the
// agreed maximum.
void append_frame(std::string& out, FrameType type, uint32_t channel, std::string_view payload);

// Reassembles frames from a byte stream read in arbitrary pieces.
//
// After next() returns an error the stream is unusable (the link sends a
// GOAWAY and closes); later calls return the same error. Errors:
//   limit_exceeded  a length above max_frame + 5
//   parse_error     a length below 5, or an unknown frame type
// The decoder never buffers more than one frame plus one read.
class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_frame = kHandshakeMaxFrame);

  // The payload bound for every frame not yet returned by next() (also one
  // whose header is already buffered); at most kMaxMaxFrame.
  void set_max_frame(uint32_t max_frame);
  uint32_t max_frame() const { return max_frame_; }

  void feed(std::string_view bytes);

  // The next complete frame; nullopt when more bytes are needed.
  Result<std::optional<FrameView>> next();

  std::size_t buffered() const { return buffer_.size() - consumed_; }

 private:
  uint32_t max_frame_;
  std::string buffer_;
  std::size_t consumed_ = 0;
  std::optional<Error> failed_;
};

}  // namespace entente::federation
