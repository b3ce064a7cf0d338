#include "base/log.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <ctime>

#include "base/json_text.h"

namespace entente::base {

std::string_view log_level_name(LogLevel l) noexcept {
  switch (l) {
    case LogLevel::error:
      return "error";
    case LogLevel::warn:
      return "warn";
    case LogLevel::info:
      return "info";
    case LogLevel::debug:
      return "debug";
  }
  return "info";
}

std::optional<LogLevel> parse_log_level(std::string_view s) noexcept {
  for (LogLevel l : {LogLevel::error, LogLevel::warn, LogLevel::info, LogLevel::debug})
    if (s == log_level_name(l)) return l;
  return std::nullopt;
}

std::optional<LogFormat> parse_log_format(std::string_view s) noexcept {
  if (s == "text") return LogFormat::text;
  if (s == "json") return LogFormat::json;
  return std::nullopt;
}

std::string utc_timestamp_ms(int64_t unix_ms) {
  const auto secs = static_cast<time_t>(unix_ms >= 0 ? unix_ms / 1000 : (unix_ms - 999) / 1000);
  const auto ms = static_cast<int>(unix_ms - static_cast<int64_t>(secs) * 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[96];  // room for any int the compiler can imagine
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}

namespace {

// A text line stays one line: control characters become '?'.
void append_text(std::string& out, std::string_view s) {
  for (char c : s) out += static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? '?' : c;
}

bool needs_quotes(std::string_view v) {
  if (v.empty()) return true;
  for (char c : v)
    if (static_cast<unsigned char>(c) <= 0x20 || c == '"' || c == '=' || c == 0x7f) return true;
  return false;
}

std::string format_text(const LogRecord& r) {
  std::string out = utc_timestamp_ms(r.unix_ms);
  out += ' ';
  const std::string_view level = log_level_name(r.level);
  out += level;
  out.append(level.size() < 5 ? 6 - level.size() : 1, ' ');  // levels line up
  out += r.component;
  if (!r.node.empty()) out.append(" ").append(r.node);
  out += ": ";
  append_text(out, r.msg);
  if (r.fields) {
    for (const auto& [k, v] : *r.fields) {
      out.append(" ").append(k).append("=");
      if (needs_quotes(v))
        append_json_string(out, v);
      else
        append_text(out, v);
    }
  }
  out += '\n';
  return out;
}

std::string format_json(const LogRecord& r) {
  std::string out = "{\"ts\":\"" + utc_timestamp_ms(r.unix_ms) + "\",\"level\":\"";
  out += log_level_name(r.level);
  out += "\",\"component\":";
  append_json_string(out, r.component);
  out += ",\"node\":";
  append_json_string(out, r.node);
  out += ",\"msg\":";
  append_json_string(out, r.msg);
  if (r.fields) {
    for (const auto& [k, v] : *r.fields) {
      // The fixed members come first and are not repeated.
      if (k == "ts" || k == "level" || k == "component" || k == "node" || k == "msg") continue;
      out += ',';
      append_json_string(out, k);
      out += ':';
      append_json_string(out, v);
    }
  }
  out += "}\n";
  return out;
}

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One write(2) per line: lines of different threads (and processes sharing
// the file) never interleave.
void write_stderr(std::string_view line) {
  while (!line.empty()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nowhere to report a failing stderr
    line.remove_prefix(static_cast<size_t>(n));
  }
}

std::string repeat_key(LogLevel level, std::string_view component, std::string_view msg) {
  std::string key(log_level_name(level));
  key.append("\n").append(component).append("\n").append(msg);
  return key;
}

}  // namespace

std::string format_log_line(LogFormat format, const LogRecord& r) {
  return format == LogFormat::json ? format_json(r) : format_text(r);
}

Logger::Logger(Sink sink, Clock clock) : sink_(std::move(sink)), clock_(std::move(clock)) {}

void Logger::set_format(LogFormat f) {
  std::lock_guard lock(mu_);
  format_ = f;
}

void Logger::set_level(LogLevel l) {
  std::lock_guard lock(mu_);
  level_ = l;
}

void Logger::set_node(std::string node) {
  std::lock_guard lock(mu_);
  node_ = std::move(node);
}

bool Logger::enabled(LogLevel l) const {
  std::lock_guard lock(mu_);
  return l <= level_;
}

void Logger::write_locked(int64_t now, LogLevel level, std::string_view component, std::string_view msg,
                          const LogFields& fields) {
  LogRecord r;
  r.unix_ms = now;
  r.level = level;
  r.component = component;
  r.node = node_;
  r.msg = msg;
  r.fields = fields.empty() ? nullptr : &fields;
  sink_(format_log_line(format_, r));
}

void Logger::flush_repeats_locked(int64_t now, bool all) {
  for (auto it = repeats_.begin(); it != repeats_.end();) {
    if (!all && now - it->second.window_start < kRepeatWindowMs) {
      ++it;
      continue;
    }
    if (it->second.count > 0) {
      // The key is "level\ncomponent\ntext".
      const std::string& key = it->first;
      const size_t a = key.find('\n'), b = key.find('\n', a + 1);
      const LogLevel level = parse_log_level(std::string_view(key).substr(0, a)).value_or(LogLevel::warn);
      const std::string text = "… repeated " + std::to_string(it->second.count) + " times in the last " +
                               std::to_string(kRepeatWindowMs / 1000) + " s: " + key.substr(b + 1);
      write_locked(now, level, std::string_view(key).substr(a + 1, b - a - 1), text, {});
    }
    it = repeats_.erase(it);
  }
}

void Logger::log(LogLevel level, std::string_view component, std::string_view msg, const LogFields& fields) {
  const int64_t now = clock_();
  std::lock_guard lock(mu_);
  if (!repeats_.empty()) flush_repeats_locked(now, false);
  if (level <= level_) write_locked(now, level, component, msg, fields);
}

void Logger::refusal(std::string_view component, std::string_view msg) {
  const int64_t now = clock_();
  std::lock_guard lock(mu_);
  if (!repeats_.empty()) flush_repeats_locked(now, false);
  if (LogLevel::warn > level_) return;
  std::string key = repeat_key(LogLevel::warn, component, msg);
  if (auto it = repeats_.find(key); it != repeats_.end()) {
    ++it->second.count;
    return;
  }
  // Past the bound, the windows so far end early rather than grow the map.
  if (repeats_.size() >= kMaxCollapsed) flush_repeats_locked(now, true);
  repeats_.emplace(std::move(key), Repeat{now, 0});
  write_locked(now, LogLevel::warn, component, msg, {});
}

void Logger::flush_repeats() {
  const int64_t now = clock_();
  std::lock_guard lock(mu_);
  flush_repeats_locked(now, false);
}

Logger& process_log() {
  static Logger logger(write_stderr, wall_ms);
  return logger;
}

void log_audit(std::string_view token, std::string_view action, std::string_view object,
               std::string_view outcome) {
  process_log().log(LogLevel::info, "audit", action,
                    {{"token", std::string(token)},
                     {"object", std::string(object.empty() ? "-" : object)},
                     {"outcome", std::string(outcome)}});
}

void logf(LogLevel level, std::string_view component, const char* format, ...) {
  Logger& logger = process_log();
  if (!logger.enabled(level)) return;
  char stack[1024];
  va_list args;
  va_start(args, format);
  va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(stack, sizeof stack, format, args);
  va_end(args);
  std::string text;
  if (n >= 0 && static_cast<size_t>(n) < sizeof stack) {
    text.assign(stack, static_cast<size_t>(n));
  } else if (n >= 0) {
    text.resize(static_cast<size_t>(n) + 1);
    std::vsnprintf(text.data(), text.size(), format, again);
    text.resize(static_cast<size_t>(n));
  }
  va_end(again);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  logger.log(level, component, text);
}

}  // namespace entente::base
