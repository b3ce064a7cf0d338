// A runner's load (broker/detail/cpu_load.h): CPU ms per second over the
// last 10 s, measured on the thread's CPU clock.
#include "broker/detail/cpu_load.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace entente::broker::detail {
namespace {

using namespace std::chrono_literals;
using Clock = CpuLoad::Clock;

TEST(CpuLoad, IsTheCpuTimeOfTheWindowOverItsLength) {
  const Clock::time_point t0 = Clock::now();
  CpuLoad load(t0);
  EXPECT_EQ(load.read(t0).cpu_ms_per_s, 0);
  // 50 ms of CPU in each of 20 seconds: 50 ms/s, and 1 s in all.
  for (int s = 0; s < 20; ++s) load.add(50'000'000, t0 + std::chrono::seconds(s) + 500ms);
  const CpuLoad::Reading r = load.read(t0 + 19s + 900ms);
  EXPECT_DOUBLE_EQ(r.cpu_ms_per_s, 50.0);
  EXPECT_DOUBLE_EQ(r.cpu_seconds, 1.0);
}

TEST(CpuLoad, ARunnerStartedLessThanAWindowAgoIsMeasuredOverItsLife) {
  const Clock::time_point t0 = Clock::now();
  CpuLoad load(t0);
  load.add(30'000'000, t0 + 100ms);
  load.add(30'000'000, t0 + 2s);
  // 60 ms over 4 s of life, not over 10 s.
  EXPECT_DOUBLE_EQ(load.read(t0 + 4s).cpu_ms_per_s, 15.0);
  // Under a second of life counts as one second.
  CpuLoad young(t0);
  young.add(5'000'000, t0 + 10ms);
  EXPECT_DOUBLE_EQ(young.read(t0 + 200ms).cpu_ms_per_s, 5.0);
}

TEST(CpuLoad, WorkOlderThanTheWindowNoLongerCountsButStaysInTheTotal) {
  const Clock::time_point t0 = Clock::now();
  CpuLoad load(t0);
  load.add(1'000'000'000, t0 + 1s);  // a busy second
  EXPECT_DOUBLE_EQ(load.read(t0 + 10s).cpu_ms_per_s, 100.0);
  const CpuLoad::Reading later = load.read(t0 + 11s);  // the busy second left the window
  EXPECT_EQ(later.cpu_ms_per_s, 0);
  EXPECT_DOUBLE_EQ(later.cpu_seconds, 1.0);
  // A slot reused 10 s later holds only the new second's time.
  load.add(20'000'000, t0 + 11s + 1ms);
  EXPECT_DOUBLE_EQ(load.read(t0 + 12s).cpu_ms_per_s, 2.0);
  EXPECT_DOUBLE_EQ(load.read(t0 + 12s).cpu_seconds, 1.02);
}

TEST(ThreadCpuSpan, CountsTheThreadsCpuTimeNotItsSleep) {
  CpuLoad load;
  {
    ThreadCpuSpan span(load);
    std::this_thread::sleep_for(200ms);  // no CPU
  }
  const double slept = load.read().cpu_seconds;
  EXPECT_LT(slept, 0.05);
  {
    ThreadCpuSpan span(load);
    const auto until = Clock::now() + 100ms;
    volatile uint64_t x = 0;
    while (Clock::now() < until) x = x + 1;  // CPU
  }
  // At least part of the 100 ms spinning (the machine is shared).
  EXPECT_GT(load.read().cpu_seconds - slept, 0.01);
}

}  // namespace
}  // namespace entente::broker::detail
