#pragma once
// Polls `pred` every 50 ms until it holds or `timeout` passes, and says
// whether it held: a test waits for an end state, never a fixed sleep
// (a loaded machine takes its time).

#include <chrono>
#include <functional>
#include <thread>

namespace entente::testing {

inline bool eventually(const std::function<bool()>& pred,
                       std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

}  // namespace entente::testing
