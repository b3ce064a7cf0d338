#pragma once
// The node's log: one line per event, with a UTC timestamp (ms), a level, a
// component and the node's name (docs/operations.md, "Logs").
//
//   text: 2026-12-03T11:04:22.123Z info  federation acme/n1: link up with ...
//   json: {"ts":"2026-12-03T11:04:22.123Z","level":"info","component":
//          "federation","node":"acme/n1","msg":"link up with ...", fields...}
//
// A Logger is thread-safe: a line is formatted, then handed to the sink
// whole (the process logger writes it to stderr with one write(2), so lines
// of different threads never interleave). Refusals (`refusal`) are
// collapsed: the same level+component+text within a window (10 s) is
// written once, and when the window ends a line says how many more came
// ("… repeated N times in the last 10 s: TEXT"). A window ends at the first
// line logged after it, or at `flush_repeats`, which the node calls every
// second.

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace entente::base {

enum class LogLevel : uint8_t { error = 0, warn = 1, info = 2, debug = 3 };
enum class LogFormat : uint8_t { text = 0, json = 1 };

std::string_view log_level_name(LogLevel l) noexcept;
std::optional<LogLevel> parse_log_level(std::string_view s) noexcept;
std::optional<LogFormat> parse_log_format(std::string_view s) noexcept;

// Extra key/value pairs of a line (an audit line's token, action, object,
// status): JSON members after "msg", or " key=value" after the text.
using LogFields = std::vector<std::pair<std::string, std::string>>;

struct LogRecord {
  int64_t unix_ms = 0;
  LogLevel level = LogLevel::info;
  std::string_view component;
  std::string_view node;  // "acme/n1"; empty before the configuration is read
  std::string_view msg;
  const LogFields* fields = nullptr;
};

// "2026-12-03T11:04:22.123Z".
std::string utc_timestamp_ms(int64_t unix_ms);
// One whole line, '\n' included. JSON lines are valid JSON whatever the
// bytes of the text (invalid UTF-8 becomes U+FFFD); a text line has its
// control characters (a newline in a message) written as '?'.
std::string format_log_line(LogFormat format, const LogRecord& r);

class Logger final {
 public:
  using Sink = std::function<void(std::string_view line)>;
  using Clock = std::function<int64_t()>;  // unix milliseconds
  static constexpr int64_t kRepeatWindowMs = 10'000;
  static constexpr size_t kMaxCollapsed = 1024;  // distinct refusals tracked at once

  Logger(Sink sink, Clock clock);
  Logger(const Logger&) = delete;
  Logger& operator=(const Logger&) = delete;

  void set_format(LogFormat f);
  void set_level(LogLevel l);  // lines above it (less severe) are dropped
  void set_node(std::string node);
  bool enabled(LogLevel l) const;

  void log(LogLevel level, std::string_view component, std::string_view msg, const LogFields& fields = {});
  // A refusal (warn), collapsed with its repeats.
  void refusal(std::string_view component, std::string_view msg);
  // Writes the summary of every repeat window that has ended.
  void flush_repeats();

 private:
  struct Repeat {
    int64_t window_start = 0;
    uint64_t count = 0;  // repeats not written
  };
  void write_locked(int64_t now, LogLevel level, std::string_view component, std::string_view msg,
                    const LogFields& fields);        // REQUIRES: mu_ held
  void flush_repeats_locked(int64_t now, bool all);  // REQUIRES: mu_ held

  Sink sink_;
  Clock clock_;
  mutable std::mutex mu_;
  LogFormat format_ = LogFormat::text;  // REQUIRES: mu_
  LogLevel level_ = LogLevel::info;     // REQUIRES: mu_
  std::string node_;                    // REQUIRES: mu_
  // By level, component and text (separated by '\n', which a text cannot
  // hold once written); REQUIRES: mu_.
  std::map<std::string, Repeat> repeats_;
};

// The process's logger: stderr, wall clock.
Logger& process_log();

inline void log(LogLevel level, std::string_view component, std::string_view msg,
                const LogFields& fields = {}) {
  process_log().log(level, component, msg, fields);
}
inline void log_refusal(std::string_view component, std::string_view msg) {
  process_log().refusal(component, msg);
}
// An audit line (info, component "audit"): its text is the action ("POST
// /v1/contracts/{id}/accept", "config.reload"), its fields who did it
// ("token": a token's name, "-" for a signal), on what ("object": a
// contract, stream or query id; "-" for none) and the outcome ("outcome":
// an HTTP status, "done", "refused").
void log_audit(std::string_view token, std::string_view action, std::string_view object,
               std::string_view outcome);
// printf-style, for the call sites that used fprintf(stderr, ...): a
// trailing newline of the format is dropped.
void logf(LogLevel level, std::string_view component, const char* format, ...)
    __attribute__((format(printf, 3, 4)));

}  // namespace entente::base
