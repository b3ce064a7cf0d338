#include "federation/frame.h"

#include <algorithm>

namespace entente::federation {
namespace {

constexpr std::size_t kLengthSize = 4;
// type + channel, counted in the length field.
constexpr uint32_t kMinLength = 5;

void put_u32(std::string& out, uint32_t v) {
  out.push_back(static_cast<char>(v >> 24));
  out.push_back(static_cast<char>(v >> 16));
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v));
}

uint32_t get_u32(const char* p) {
  auto b = [p](int i) { return static_cast<uint32_t>(static_cast<unsigned char>(p[i])); };
  return b(0) << 24 | b(1) << 16 | b(2) << 8 | b(3);
}

}  // namespace

bool known_frame_type(uint8_t type) {
  switch (static_cast<FrameType>(type)) {
    case FrameType::hello:
    case FrameType::heartbeat:
    case FrameType::goaway:
    case FrameType::open:
    case FrameType::open_ok:
    case FrameType::reset:
    case FrameType::data:
    case FrameType::data_named:
    case FrameType::ack:
    case FrameType::credit:
    case FrameType::control:
      return true;
  }
  return false;
}

std::string_view frame_type_name(FrameType type) {
  switch (type) {
    case FrameType::hello:
      return "hello";
    case FrameType::heartbeat:
      return "heartbeat";
    case FrameType::goaway:
      return "goaway";
    case FrameType::open:
      return "open";
    case FrameType::open_ok:
      return "open_ok";
    case FrameType::reset:
      return "reset";
    case FrameType::data:
      return "data";
    case FrameType::data_named:
      return "data_named";
    case FrameType::ack:
      return "ack";
    case FrameType::credit:
      return "credit";
    case FrameType::control:
      return "control";
  }
  return "unknown";
}

void append_frame(std::string& out, FrameType type, uint32_t channel, std::string_view payload) {
  out.reserve(out.size() + kFrameHeaderSize + payload.size());
  put_u32(out, static_cast<uint32_t>(payload.size()) + kMinLength);
  out.push_back(static_cast<char>(type));
  put_u32(out, channel);
  out.append(payload);
}

FrameDecoder::FrameDecoder(uint32_t max_frame) : max_frame_(std::min(max_frame, kMaxMaxFrame)) {}

void FrameDecoder::set_max_frame(uint32_t max_frame) { max_frame_ = std::min(max_frame, kMaxMaxFrame); }

void FrameDecoder::feed(std::string_view bytes) {
  if (failed_) return;
  // Drop what earlier frames used before growing, so the buffer holds at
  // most one partial frame plus this read.
  if (consumed_ > 0) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  buffer_.append(bytes);
}

Result<std::optional<FrameView>> FrameDecoder::next() {
  if (failed_) return *failed_;
  const std::size_t available = buffer_.size() - consumed_;
  if (available < kLengthSize) return std::optional<FrameView>{};
  const char* p = buffer_.data() + consumed_;
  const uint32_t length = get_u32(p);
  if (length < kMinLength) {
    failed_ =
        Error{Errc::parse_error, "frame length " + std::to_string(length) + " is below the minimum of 5"};
    return *failed_;
  }
  if (length - kMinLength > max_frame_) {
    failed_ = Error{Errc::limit_exceeded, "frame payload of " + std::to_string(length - kMinLength) +
                                              " bytes exceeds the maximum of " + std::to_string(max_frame_)};
    return *failed_;
  }
  if (available >= kLengthSize + 1) {
    const auto type = static_cast<uint8_t>(p[kLengthSize]);
    if (!known_frame_type(type)) {
      failed_ = Error{Errc::parse_error, "unknown frame type " + std::to_string(type)};
      return *failed_;
    }
  }
  if (available < kLengthSize + length) return std::optional<FrameView>{};
  FrameView frame{static_cast<FrameType>(static_cast<uint8_t>(p[kLengthSize])), get_u32(p + kLengthSize + 1),
                  std::string_view(p + kFrameHeaderSize, length - kMinLength)};
  consumed_ += kLengthSize + length;
  return std::optional<FrameView>{frame};
}

}  // namespace entente::federation
