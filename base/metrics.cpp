// Prometheus text exposition (format 0.0.4) for the registry in
// base/metrics.h. Updates are relaxed atomics; only creating a metric,
// adding a collector and rendering take the registry's mutex.
#include "base/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>

namespace entente::base {
namespace {

enum class Kind : uint8_t { counter, gauge, histogram };

std::string_view kind_name(Kind k) {
  switch (k) {
    case Kind::counter:
      return "counter";
    case Kind::gauge:
      return "gauge";
    case Kind::histogram:
      return "histogram";
  }
  return "untyped";
}

bool valid_metric_name(std::string_view s) {
  if (s.empty()) return false;
  auto first = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
  };
  if (!first(s[0])) return false;
  return std::all_of(s.begin() + 1, s.end(), [&](char c) { return first(c) || (c >= '0' && c <= '9'); });
}

// Label names: [a-zA-Z_][a-zA-Z0-9_]*; "__" prefixes are Prometheus's own.
bool valid_label_name(std::string_view s) {
  if (s.empty() || s.substr(0, 2) == "__") return false;
  auto first = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (!first(s[0])) return false;
  return std::all_of(s.begin() + 1, s.end(), [&](char c) { return first(c) || (c >= '0' && c <= '9'); });
}

// Same labels in any order are the same series: sort by name, refuse
// duplicates and bad names (a programming error, hence an exception).
Labels normalize(Labels labels, std::string_view metric, bool histogram) {
  std::stable_sort(labels.begin(), labels.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < labels.size(); ++i) {
    if (!valid_label_name(labels[i].first) || (histogram && labels[i].first == "le") ||
        (i > 0 && labels[i].first == labels[i - 1].first)) {
      throw std::invalid_argument("metric " + std::string(metric) + ": bad or duplicate label name '" +
                                  labels[i].first + "'");
    }
  }
  return labels;
}

void append_escaped_label_value(std::string& out, std::string_view v) {
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
}

// HELP text escapes only backslash and newline.
void append_escaped_help(std::string& out, std::string_view v) {
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
}

// `{a="x",b="y"}`, with `extra` (the histogram's le) last; "" when empty.
std::string label_text(const Labels& labels, std::string_view extra_name = {},
                       std::string_view extra_value = {}) {
  if (labels.empty() && extra_name.empty()) return {};
  std::string out = "{";
  for (const auto& [k, v] : labels) {
    if (out.size() > 1) out += ',';
    out += k;
    out += "=\"";
    append_escaped_label_value(out, v);
    out += '"';
  }
  if (!extra_name.empty()) {
    if (out.size() > 1) out += ',';
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out += '"';
  }
  out += '}';
  return out;
}

// Shortest text that reads back as the same double; integers without a
// fraction; +Inf, -Inf and NaN as Prometheus spells them.
std::string number_text(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : "NaN";
}

void append_sample(std::string& out, std::string_view name, std::string_view suffix,
                   const std::string& labels, std::string_view value) {
  out += name;
  out += suffix;
  out += labels;
  out += ' ';
  out += value;
  out += '\n';
}

struct Series {
  Labels labels;
  std::unique_ptr<Counter> counter;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<Histogram> histogram;
};

// One sample written by a collector during render().
struct CollectedSample {
  std::string labels;  // rendered
  double value;
};

struct Family {
  Kind kind;
  std::string help;
  std::map<std::string, Series> series;    // by rendered labels: a stable order
  std::vector<CollectedSample> collected;  // collector samples, in one render()'s families only
};

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && bounds_[i] <= bounds_[i - 1])) {
      throw std::invalid_argument("histogram bounds must be finite and strictly ascending");
    }
  }
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe(double v) noexcept {
  // A NaN belongs in no bucket and would poison the sum.
  if (std::isnan(v)) return;
  // The first bound >= v: buckets are "less than or equal".
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

void Histogram::read(std::vector<uint64_t>& cumulative, double& sum, uint64_t& count) const {
  cumulative.resize(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    cumulative[i] = total;
  }
  sum = sum_.load(std::memory_order_relaxed);
  // The count is the +Inf bucket, so that a scrape racing with observe()
  // still satisfies count == bucket{le="+Inf"}, which Prometheus relies on.
  count = total;
}

std::vector<double> latency_buckets() {
  return {50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 20e-3,
          50e-3, 100e-3, 200e-3, 500e-3, 1.0,  2.0,  5.0,  10.0};
}

struct Registry::Impl {
  mutable std::mutex mu;
  // By name: the exposition lists metric names in sorted order.
  std::map<std::string, Family, std::less<>> families;  // guarded by mu
  std::map<uint64_t, Collector> collectors;             // guarded by mu
  uint64_t next_collector_id = 1;                       // guarded by mu

  // REQUIRES: mu held.
  Series& series(std::string_view name, std::string_view help, Kind kind, Labels& labels) {
    if (!valid_metric_name(name)) throw std::invalid_argument("bad metric name '" + std::string(name) + "'");
    labels = normalize(std::move(labels), name, kind == Kind::histogram);
    auto it = families.find(name);
    if (it == families.end()) {
      it = families.emplace(std::string(name), Family{kind, std::string(help), {}, {}}).first;
    } else if (it->second.kind != kind) {
      throw std::logic_error("metric " + std::string(name) + " is a " +
                             std::string(kind_name(it->second.kind)) + ", not a " +
                             std::string(kind_name(kind)));
    }
    Series& s = it->second.series[label_text(labels)];
    if (s.labels.empty()) s.labels = labels;
    return s;
  }
};

Registry::Registry() : impl_(std::make_unique<Impl>()) {}
Registry::~Registry() = default;

Counter& Registry::counter(std::string_view name, std::string_view help, Labels labels) {
  std::lock_guard lock(impl_->mu);
  Series& s = impl_->series(name, help, Kind::counter, labels);
  if (!s.counter) s.counter = std::make_unique<Counter>();
  return *s.counter;
}

Gauge& Registry::gauge(std::string_view name, std::string_view help, Labels labels) {
  std::lock_guard lock(impl_->mu);
  Series& s = impl_->series(name, help, Kind::gauge, labels);
  if (!s.gauge) s.gauge = std::make_unique<Gauge>();
  return *s.gauge;
}

Histogram& Registry::histogram(std::string_view name, std::string_view help, Labels labels,
                               std::vector<double> bounds) {
  // Built before anything is registered, so that bad bounds leave no trace.
  auto fresh = std::make_unique<Histogram>(std::move(bounds));
  std::lock_guard lock(impl_->mu);
  Series& s = impl_->series(name, help, Kind::histogram, labels);
  if (!s.histogram) {
    s.histogram = std::move(fresh);
  } else if (s.histogram->bounds() != fresh->bounds()) {
    throw std::logic_error("histogram " + std::string(name) + " registered again with other bounds");
  }
  return *s.histogram;
}

uint64_t Registry::add_collector(Collector c) {
  std::lock_guard lock(impl_->mu);
  const uint64_t id = impl_->next_collector_id++;
  impl_->collectors.emplace(id, std::move(c));
  return id;
}

void Registry::remove_collector(uint64_t id) {
  std::lock_guard lock(impl_->mu);
  impl_->collectors.erase(id);
}

namespace {

// Gathers collector samples into the registry's families for one render.
// Collector-only names get a family that lives just as long.
class CollectingWriter final : public MetricsWriter {
 public:
  CollectingWriter(const std::map<std::string, Family, std::less<>>& registered,
                   std::map<std::string, Family, std::less<>>& transient, std::vector<std::string>& problems)
      : registered_(registered), transient_(transient), problems_(problems) {}

  void gauge(std::string_view name, std::string_view help, const Labels& labels, double value) override {
    add(name, help, Kind::gauge, labels, value);
  }
  void counter(std::string_view name, std::string_view help, const Labels& labels, double value) override {
    add(name, help, Kind::counter, labels, value);
  }

 private:
  void add(std::string_view name, std::string_view help, Kind kind, const Labels& labels, double value) {
    // A collector runs at scrape time, where throwing would break /metrics
    // for everyone; a bad sample is left out and named in a comment line.
    if (!valid_metric_name(name)) {
      problems_.push_back("bad metric name '" + std::string(name) + "'");
      return;
    }
    Labels sorted;
    try {
      sorted = normalize(labels, name, false);
    } catch (const std::invalid_argument& e) {
      problems_.push_back(e.what());
      return;
    }
    // A name the registry has keeps the registry's type; the samples go into
    // a family of this render only and are listed after the registry's.
    Kind want = kind;
    if (auto it = registered_.find(name); it != registered_.end()) want = it->second.kind;
    auto jt = transient_.find(name);
    if (jt == transient_.end()) {
      jt = transient_.emplace(std::string(name), Family{want, std::string(help), {}, {}}).first;
    }
    Family* f = &jt->second;
    if (f->kind != kind) {
      problems_.push_back("metric " + std::string(name) + " is a " + std::string(kind_name(f->kind)) +
                          "; a collector wrote it as a " + std::string(kind_name(kind)));
      return;
    }
    f->collected.push_back({label_text(sorted), value});
  }

  const std::map<std::string, Family, std::less<>>& registered_;
  std::map<std::string, Family, std::less<>>& transient_;
  std::vector<std::string>& problems_;
};

void render_header(std::string& out, const std::string& name, const Family& f) {
  out += "# HELP ";
  out += name;
  out += ' ';
  append_escaped_help(out, f.help);
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += kind_name(f.kind);
  out += '\n';
}

void render_series(std::string& out, const std::string& name, const Family& f) {
  std::vector<uint64_t> cumulative;
  for (const auto& [labels, s] : f.series) {
    if (s.counter) append_sample(out, name, "", labels, std::to_string(s.counter->value()));
    if (s.gauge) append_sample(out, name, "", labels, number_text(s.gauge->value()));
    if (s.histogram) {
      double sum = 0;
      uint64_t count = 0;
      s.histogram->read(cumulative, sum, count);
      const auto& bounds = s.histogram->bounds();
      for (size_t i = 0; i <= bounds.size(); ++i) {
        const std::string le = i < bounds.size() ? number_text(bounds[i]) : "+Inf";
        append_sample(out, name, "_bucket", label_text(s.labels, "le", le), std::to_string(cumulative[i]));
      }
      append_sample(out, name, "_sum", labels, number_text(sum));
      append_sample(out, name, "_count", labels, std::to_string(count));
    }
  }
  for (const auto& c : f.collected) append_sample(out, name, "", c.labels, number_text(c.value));
}

}  // namespace

std::string Registry::render() const {
  std::lock_guard lock(impl_->mu);
  std::map<std::string, Family, std::less<>> transient;
  std::vector<std::string> problems;
  CollectingWriter writer(impl_->families, transient, problems);
  for (const auto& [id, collect] : impl_->collectors) collect(writer);

  // Registered and collector families merged in name order; one HELP and
  // TYPE per name even when both have samples of it.
  std::string out;
  auto a = impl_->families.begin();
  auto b = transient.begin();
  while (a != impl_->families.end() || b != transient.end()) {
    const bool take_a = b == transient.end() || (a != impl_->families.end() && a->first <= b->first);
    const bool take_b = a == impl_->families.end() || (b != transient.end() && b->first <= a->first);
    const auto& header = take_a ? *a : *b;
    render_header(out, header.first, header.second);
    if (take_a) render_series(out, a->first, a->second), ++a;
    if (take_b) render_series(out, b->first, b->second), ++b;
  }
  for (const auto& p : problems) {
    out += "# entente: sample left out: ";
    append_escaped_help(out, p);
    out += '\n';
  }
  return out;
}

}  // namespace entente::base
