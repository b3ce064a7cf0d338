#pragma once
// SIGSTOP that returns once the process has stopped: kill() returns before
// every thread is in state T, and a request sent in between would still be
// answered (a test meaning "the node hangs now" would be off by one).

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace entente::testing {

// True when every thread of `pid` is in state T (stopped), from
// /proc/PID/task/*/stat.
inline bool all_threads_stopped(pid_t pid) {
  std::error_code ec;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream in(task.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    // "TID (comm) S ...": the state follows the last ')'.
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'T') return false;
  }
  return !ec;
}

// Sends SIGSTOP and waits (at most 5 s) until every thread has stopped.
// False when the signal could not be sent.
inline bool stop_and_wait(pid_t pid) {
  if (pid <= 0 || ::kill(pid, SIGSTOP) != 0) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!all_threads_stopped(pid) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return true;
}

}  // namespace entente::testing
