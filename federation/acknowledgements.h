#pragma once
// What each importing domain acknowledged of each exported stream: the
// last sequence number it stored durably, per (stream, domain), kept in the
// `meta` family under "export-ack/STREAM/DOMAIN" (8 bytes big-endian). A
// node of the owner's own domain reading the stream is kept as "@NODE"
// instead of a domain (detail::ack_party). It
// pins the stream's retention (Exports::retention_pin), so nothing a
// domain has not stored is trimmed; it never goes down.
//
// Threading: any thread; one mutex, not held across the store write (a
// lost newest value only keeps more of the log).

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "base/result.h"
#include "store/store.h"

namespace entente::federation {

class Acknowledgements final {
 public:
  // Told of every acknowledgement that raised what a party holds, after
  // it is kept (on the thread that recorded it, no lock held).
  using Listener = std::function<void(const std::string& stream, const std::string& party, uint64_t through)>;
  explicit Acknowledgements(store::Store& store, Listener listener = {})
      : store_(store), listener_(std::move(listener)) {}

  // Reads what importing domains acknowledged before a restart.
  Status load();
  // Domain `domain` holds `stream` through `through`; a lower value than
  // the one kept changes nothing.
  void record(const std::string& stream, const std::string& domain, uint64_t through);
  // The last number `domain` acknowledged of `stream`; nullopt when it
  // never did.
  std::optional<uint64_t> acked(const std::string& stream, const std::string& domain) const;
  // Every party that acknowledged `stream`, with what it acknowledged.
  std::map<std::string, uint64_t> of(const std::string& stream) const;
  // `party` no longer reads `stream`: its acknowledgement, and the pin it
  // gave, go (durably).
  Status forget(const std::string& stream, const std::string& party);

 private:
  store::Store& store_;
  const Listener listener_;
  mutable std::mutex mu_;
  std::map<std::string, std::map<std::string, uint64_t>> acks_;  // REQUIRES: mu_; stream -> domain -> seq
};

}  // namespace entente::federation
