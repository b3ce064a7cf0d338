#pragma once
#if !defined(ENTENTE_IN_BROKER)
#error "broker/detail/ is private to broker/ (docs/architecture.md)"
#endif
// The load of a query runner (docs/cluster.md, "A fragment's load"): the
// CPU time its engine workers spent in its run_some, as CPU milliseconds
// per second over the last kLoadWindowSeconds, and in total. The unit is
// the one of a hosting contract's max_load (docs/contracts.md), so that
// contracts::may_host can be asked with it, and the total is what hosting
// meters as load-seconds.
//
// The time is the thread's CPU clock (CLOCK_THREAD_CPUTIME_ID), read
// around each run: what the runner cost, not how long it waited (a run
// waiting for its followers' acknowledgement costs nothing).
//
// Threading: add() and read() from any thread (one small mutex; add() is
// called once per run_some, which does up to 64 steps).

#include <time.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>

namespace entente::broker::detail {

inline constexpr int kLoadWindowSeconds = 10;

class CpuLoad final {
 public:
  using Clock = std::chrono::steady_clock;
  struct Reading {
    double cpu_ms_per_s = 0;  // over the last kLoadWindowSeconds (or since started, when less)
    double cpu_seconds = 0;   // since started
  };

  explicit CpuLoad(Clock::time_point started = Clock::now()) : started_(started) {}
  CpuLoad(const CpuLoad&) = delete;
  CpuLoad& operator=(const CpuLoad&) = delete;

  // Counts `cpu_ns` of CPU time spent at `now`.
  void add(uint64_t cpu_ns, Clock::time_point now = Clock::now()) {
    const int64_t s = second_of(now);
    std::lock_guard lock(mu_);
    Slot& slot = slots_[static_cast<size_t>(s % kLoadWindowSeconds)];
    if (slot.second != s) slot = Slot{s, 0};
    slot.ns += cpu_ns;
    total_ns_ += cpu_ns;
  }

  // The load at `now`: the CPU time of the whole seconds in the window
  // (the current one included) over the window's length, which is at
  // least one second and at most kLoadWindowSeconds (a runner started 3 s
  // ago is measured over 3 s, not 10).
  Reading read(Clock::time_point now = Clock::now()) const {
    const int64_t s = second_of(now);
    const double elapsed = std::chrono::duration<double>(now - started_).count();
    const double span = elapsed < 1 ? 1 : elapsed > kLoadWindowSeconds ? kLoadWindowSeconds : elapsed;
    std::lock_guard lock(mu_);
    uint64_t ns = 0;
    for (const Slot& slot : slots_)
      if (slot.second >= 0 && slot.second > s - kLoadWindowSeconds && slot.second <= s) ns += slot.ns;
    return Reading{static_cast<double>(ns) / 1e6 / span, static_cast<double>(total_ns_) / 1e9};
  }

 private:
  struct Slot {
    int64_t second = -1;  // whole seconds since started_; -1: unused
    uint64_t ns = 0;
  };
  int64_t second_of(Clock::time_point t) const {
    return t < started_ ? 0 : std::chrono::duration_cast<std::chrono::seconds>(t - started_).count();
  }

  const Clock::time_point started_;
  mutable std::mutex mu_;
  std::array<Slot, kLoadWindowSeconds> slots_{};  // guarded by mu_
  uint64_t total_ns_ = 0;                         // guarded by mu_
};

// This thread's CPU time, in nanoseconds.
inline uint64_t thread_cpu_ns() {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

// Adds the calling thread's CPU time between construction and destruction
// to a CpuLoad: wraps one run, whatever path it returns by.
class ThreadCpuSpan final {
 public:
  explicit ThreadCpuSpan(CpuLoad& load) : load_(load), t0_(thread_cpu_ns()) {}
  ~ThreadCpuSpan() {
    const uint64_t t1 = thread_cpu_ns();
    if (t1 > t0_) load_.add(t1 - t0_);
  }
  ThreadCpuSpan(const ThreadCpuSpan&) = delete;
  ThreadCpuSpan& operator=(const ThreadCpuSpan&) = delete;

 private:
  CpuLoad& load_;
  const uint64_t t0_;
};

}  // namespace entente::broker::detail
