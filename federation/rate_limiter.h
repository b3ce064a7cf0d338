#pragma once
// A stream contract's rate cap (tuples per second, across all its channels):
// a token bucket holding at most one second of tokens, starting empty (a new
// contract has saved nothing up). Senders look at available() before they
// send and consume() what they sent, under their own lock; two channels
// that looked at once may both send, leaving a debt that later refills pay
// back, so the long-run rate never exceeds the cap.
//
// Also keeps how long a sender waited for tokens, for /metrics.
// Threading: any thread; one mutex, never held while calling out.

#include <chrono>
#include <cstdint>
#include <mutex>

namespace entente::federation {

class RateLimiter final {
 public:
  using Clock = std::chrono::steady_clock;

  explicit RateLimiter(uint64_t per_second) : rate_(per_second), last_(Clock::now()) {}

  uint64_t rate() const { return rate_; }

  // Whole tokens there are now (0 while in debt).
  uint64_t available();
  void consume(uint64_t n);
  // A sender stopped with rows to send and no token.
  void throttled();
  // A sender caught up with its stream, or its channel ended: it waits for
  // nothing any more. (With several channels waiting, the first to stop
  // ends the period; the next refusal starts another.)
  void waiting_over();
  double throttled_seconds() const;

 private:
  void refill_locked();  // REQUIRES: mu_

  const uint64_t rate_;
  mutable std::mutex mu_;
  double tokens_ = 0;                    // REQUIRES: mu_; below 0 is a debt
  Clock::time_point last_;               // REQUIRES: mu_; last refill
  Clock::time_point throttled_since_{};  // REQUIRES: mu_; {} when no one waits
  Clock::duration throttled_total_{};    // REQUIRES: mu_
};

}  // namespace entente::federation
