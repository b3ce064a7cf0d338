#pragma once
// Prometheus metrics (text exposition format 0.0.4) for GET /metrics.
//
// Counters, gauges and histograms are created once (by name + labels) and
// then updated lock-free from any thread; the returned references stay valid
// for the Registry's lifetime. Values that are cheaper to compute at scrape
// time (queue depths, per-stream heads) come from collectors, called under
// the registry's lock while rendering.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace entente::base {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void inc(uint64_t n = 1) noexcept { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const noexcept { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

class Gauge {
 public:
  void set(double v) noexcept { v_.store(v, std::memory_order_relaxed); }
  double value() const noexcept { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

// Fixed buckets (upper bounds, ascending); observations in seconds or bytes.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v) noexcept;
  const std::vector<double>& bounds() const noexcept { return bounds_; }
  // Cumulative counts per bound, then +Inf; the sum; the count.
  void read(std::vector<uint64_t>& cumulative, double& sum, uint64_t& count) const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_.size() + 1
  std::atomic<double> sum_{0};
  std::atomic<uint64_t> count_{0};
};

// Latency buckets from 50 µs to 10 s, in seconds.
std::vector<double> latency_buckets();

// Writes samples during a collector call.
class MetricsWriter {
 public:
  virtual ~MetricsWriter() = default;
  virtual void gauge(std::string_view name, std::string_view help, const Labels& labels,
                     double value) = 0;
  virtual void counter(std::string_view name, std::string_view help, const Labels& labels,
                       double value) = 0;
};

class Registry final {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Names: [a-zA-Z_:][a-zA-Z0-9_:]*, e.g. "entente_api_requests_total".
  // Calling again with the same name and labels returns the same object.
  Counter& counter(std::string_view name, std::string_view help, Labels labels = {});
  Gauge& gauge(std::string_view name, std::string_view help, Labels labels = {});
  Histogram& histogram(std::string_view name, std::string_view help, Labels labels,
                       std::vector<double> bounds);

  // Returns an id for remove_collector (an owner going away: a deleted query).
  using Collector = std::function<void(MetricsWriter&)>;
  uint64_t add_collector(Collector c);
  void remove_collector(uint64_t id);

  // The whole exposition, one HELP/TYPE block per metric name, label values
  // escaped (\\, \", \n).
  std::string render() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace entente::base
