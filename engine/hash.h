// Key hashing and key groups.
//
// Keyed state (group-by keys, join keys) is partitioned into kKeyGroups key
// groups, as in Flink: a key's group is its hash modulo kKeyGroups. A keyed
// box can hand any subset of its groups to another instance (box splitting)
// without touching the rest. The hash is fixed across versions and machines:
// it decides where state lives.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "engine/batch.h"

namespace entente::engine {

inline constexpr uint32_t kKeyGroups = 128;

// 64-bit mixers (stable; never change them: checkpoints depend on them).
uint64_t hash_int(int64_t v) noexcept;
uint64_t hash_double(double v) noexcept;  // -0.0 hashes as 0.0
uint64_t hash_bytes(std::string_view s) noexcept;
inline uint64_t hash_combine(uint64_t seed, uint64_t h) noexcept {
  return (seed ^ h) * 0x9E3779B97F4A7C15ULL + (seed >> 29);
}
uint64_t hash_value(const Column& c, size_t row) noexcept;

// Hash of the key made of columns `key_cols` of `b` for every row, into
// `out` (resized to b.rows()). No key columns: every hash is 0.
void hash_rows(const Batch& b, std::span<const size_t> key_cols, std::vector<uint64_t>& out);

inline uint32_t key_group_of(uint64_t hash) noexcept {
  return static_cast<uint32_t>(hash % kKeyGroups);
}

// A half-open range [begin, end) of key groups.
struct KeyGroupRange {
  uint32_t begin = 0;
  uint32_t end = kKeyGroups;
  bool contains(uint32_t g) const noexcept { return g >= begin && g < end; }
  bool operator==(const KeyGroupRange&) const = default;
  // The i-th of n contiguous, near-equal ranges covering all groups: the
  // ranges a Split box by key hash assigns to its n outputs.
  static KeyGroupRange part(uint32_t i, uint32_t n) noexcept {
    return {i * kKeyGroups / n, (i + 1) * kKeyGroups / n};
  }
};

}  // namespace entente::engine
