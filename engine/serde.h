// Little-endian byte writer and reader for snapshots and binary encodings.
// The reader never reads past its input: every get reports failure instead.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace entente::engine {

class ByteWriter {
 public:
  explicit ByteWriter(std::string& out) : out_(out) {}
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void varint(uint64_t v) {
    while (v >= 0x80) { out_.push_back(static_cast<char>((v & 0x7f) | 0x80)); v >>= 7; }
    out_.push_back(static_cast<char>(v));
  }
  void svarint(int64_t v) { varint((static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63)); }
  void fixed64(uint64_t v) { char b[8]; std::memcpy(b, &v, 8); out_.append(b, 8); }
  void i64(int64_t v) { fixed64(static_cast<uint64_t>(v)); }
  void f64(double v) { uint64_t u; std::memcpy(&u, &v, 8); fixed64(u); }
  void bytes(std::string_view s) { varint(s.size()); out_.append(s.data(), s.size()); }
  void raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string& buffer() { return out_; }

 private:
  std::string& out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::string_view in) : in_(in) {}
  bool u8(uint8_t& v) {
    if (in_.empty()) return false;
    v = static_cast<uint8_t>(in_[0]); in_.remove_prefix(1); return true;
  }
  bool varint(uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!u8(b)) return false;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  bool svarint(int64_t& v) {
    uint64_t u;
    if (!varint(u)) return false;
    v = static_cast<int64_t>((u >> 1) ^ (~(u & 1) + 1));
    return true;
  }
  bool fixed64(uint64_t& v) {
    if (in_.size() < 8) return false;
    std::memcpy(&v, in_.data(), 8); in_.remove_prefix(8); return true;
  }
  bool i64(int64_t& v) { uint64_t u; if (!fixed64(u)) return false; v = static_cast<int64_t>(u); return true; }
  bool f64(double& v) { uint64_t u; if (!fixed64(u)) return false; std::memcpy(&v, &u, 8); return true; }
  bool bytes(std::string_view& s) {
    uint64_t n;
    if (!varint(n) || n > in_.size()) return false;
    s = in_.substr(0, n); in_.remove_prefix(n); return true;
  }
  bool bytes(std::string& s) { std::string_view v; if (!bytes(v)) return false; s.assign(v); return true; }
  bool raw(void* p, size_t n) {
    if (in_.size() < n) return false;
    std::memcpy(p, in_.data(), n); in_.remove_prefix(n); return true;
  }
  std::string_view rest() const noexcept { return in_; }
  bool empty() const noexcept { return in_.empty(); }
  size_t remaining() const noexcept { return in_.size(); }

 private:
  std::string_view in_;
};

}  // namespace entente::engine
