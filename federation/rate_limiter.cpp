#include "federation/rate_limiter.h"

#include <algorithm>

namespace entente::federation {

uint64_t RateLimiter::available() {
  std::lock_guard lock(mu_);
  refill_locked();
  return tokens_ < 1 ? 0 : static_cast<uint64_t>(tokens_);
}

void RateLimiter::consume(uint64_t n) {
  std::lock_guard lock(mu_);
  tokens_ -= static_cast<double>(n);
}

void RateLimiter::throttled() {
  std::lock_guard lock(mu_);
  if (throttled_since_ == Clock::time_point{}) throttled_since_ = Clock::now();
}

void RateLimiter::waiting_over() {
  std::lock_guard lock(mu_);
  if (throttled_since_ == Clock::time_point{}) return;
  throttled_total_ += Clock::now() - throttled_since_;
  throttled_since_ = {};
}

double RateLimiter::throttled_seconds() const {
  std::lock_guard lock(mu_);
  auto total = throttled_total_;
  if (throttled_since_ != Clock::time_point{}) total += Clock::now() - throttled_since_;
  return std::chrono::duration<double>(total).count();
}

void RateLimiter::refill_locked() {
  const auto now = Clock::now();
  const double add = std::chrono::duration<double>(now - last_).count() * static_cast<double>(rate_);
  last_ = now;
  tokens_ = std::min(static_cast<double>(rate_), tokens_ + add);
}

}  // namespace entente::federation
