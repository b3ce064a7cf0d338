// Prometheus exposition: the exact text for counters, gauges and histograms
// with labels, escaping, collectors merged by name, bad registrations, and
// exact totals under concurrent updates.
#include "base/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <thread>

namespace entente::base {
namespace {

TEST(Metrics, CounterGaugeAndHistogramRenderExactly) {
  Registry reg;
  reg.counter("entente_api_requests_total", "API requests by route and status.",
              {{"route", "/v1/streams"}, {"status", "200"}})
      .inc(3);
  reg.counter("entente_api_requests_total", "API requests by route and status.",
              {{"status", "404"}, {"route", "/v1/nope"}})
      .inc();
  reg.gauge("entente_ingest_queue_bytes", "Bytes waiting for the group commit.").set(1536);
  Histogram& h = reg.histogram("entente_api_request_seconds", "API request latency.",
                               {{"route", "/v1/health"}}, {0.25, 1, 4});
  // Binary fractions, so that the sum is exact.
  h.observe(0.125);
  h.observe(0.25);  // on a bound: "less than or equal"
  h.observe(0.5);
  h.observe(8);

  EXPECT_EQ(reg.render(),
            "# HELP entente_api_request_seconds API request latency.\n"
            "# TYPE entente_api_request_seconds histogram\n"
            "entente_api_request_seconds_bucket{route=\"/v1/health\",le=\"0.25\"} 2\n"
            "entente_api_request_seconds_bucket{route=\"/v1/health\",le=\"1\"} 3\n"
            "entente_api_request_seconds_bucket{route=\"/v1/health\",le=\"4\"} 3\n"
            "entente_api_request_seconds_bucket{route=\"/v1/health\",le=\"+Inf\"} 4\n"
            "entente_api_request_seconds_sum{route=\"/v1/health\"} 8.875\n"
            "entente_api_request_seconds_count{route=\"/v1/health\"} 4\n"
            "# HELP entente_api_requests_total API requests by route and status.\n"
            "# TYPE entente_api_requests_total counter\n"
            "entente_api_requests_total{route=\"/v1/nope\",status=\"404\"} 1\n"
            "entente_api_requests_total{route=\"/v1/streams\",status=\"200\"} 3\n"
            "# HELP entente_ingest_queue_bytes Bytes waiting for the group commit.\n"
            "# TYPE entente_ingest_queue_bytes gauge\n"
            "entente_ingest_queue_bytes 1536\n");
}

TEST(Metrics, SameNameAndLabelsIsTheSameObject) {
  Registry reg;
  Counter& a = reg.counter("c_total", "h", {{"a", "1"}, {"b", "2"}});
  Counter& b = reg.counter("c_total", "h", {{"b", "2"}, {"a", "1"}});  // order does not matter
  Counter& c = reg.counter("c_total", "h", {{"a", "2"}, {"b", "2"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &c);
  Gauge& g1 = reg.gauge("g", "h");
  EXPECT_EQ(&g1, &reg.gauge("g", "h"));
  Histogram& h1 = reg.histogram("h_seconds", "h", {}, {1, 2});
  EXPECT_EQ(&h1, &reg.histogram("h_seconds", "h", {}, {1, 2}));
}

TEST(Metrics, LabelValuesAndHelpAreEscaped) {
  Registry reg;
  reg.gauge("g", "line one\nback\\slash \"quoted\"", {{"path", "C:\\dir\n\"x\""}}).set(-0.25);
  EXPECT_EQ(reg.render(),
            "# HELP g line one\\nback\\\\slash \"quoted\"\n"
            "# TYPE g gauge\n"
            "g{path=\"C:\\\\dir\\n\\\"x\\\"\"} -0.25\n");
}

TEST(Metrics, SpecialGaugeValues) {
  Registry reg;
  reg.gauge("a", "h").set(std::numeric_limits<double>::infinity());
  reg.gauge("b", "h").set(-std::numeric_limits<double>::infinity());
  reg.gauge("c", "h").set(std::nan(""));
  reg.gauge("d", "h").set(1e21);
  reg.gauge("e", "h").set(0.1);
  const std::string text = reg.render();
  EXPECT_NE(text.find("\na +Inf\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nb -Inf\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nc NaN\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nd 1e+21\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\ne 0.1\n"), std::string::npos) << text;
}

TEST(Metrics, CollectorsAreGroupedByNameWithTheRegistry) {
  Registry reg;
  reg.gauge("entente_stream_tuples", "Tuples retained per stream.", {{"stream", "bids"}}).set(10);
  const uint64_t id = reg.add_collector([](MetricsWriter& w) {
    w.gauge("entente_stream_tuples", "ignored: the registry's help wins", {{"stream", "asks"}}, 7);
    w.counter("entente_box_tuples_in_total", "Tuples into each box.", {{"box", "f1"}}, 100);
    w.gauge("entente_queue_depth", "Queue depth.", {}, 2);
  });
  reg.add_collector([](MetricsWriter& w) {
    w.counter("entente_box_tuples_in_total", "Tuples into each box.", {{"box", "a1"}}, 40);
  });
  EXPECT_EQ(reg.render(),
            "# HELP entente_box_tuples_in_total Tuples into each box.\n"
            "# TYPE entente_box_tuples_in_total counter\n"
            "entente_box_tuples_in_total{box=\"f1\"} 100\n"
            "entente_box_tuples_in_total{box=\"a1\"} 40\n"
            "# HELP entente_queue_depth Queue depth.\n"
            "# TYPE entente_queue_depth gauge\n"
            "entente_queue_depth 2\n"
            "# HELP entente_stream_tuples Tuples retained per stream.\n"
            "# TYPE entente_stream_tuples gauge\n"
            "entente_stream_tuples{stream=\"bids\"} 10\n"
            "entente_stream_tuples{stream=\"asks\"} 7\n");

  // Collector samples live for one render only; a removed collector is gone.
  reg.remove_collector(id);
  EXPECT_EQ(reg.render(),
            "# HELP entente_box_tuples_in_total Tuples into each box.\n"
            "# TYPE entente_box_tuples_in_total counter\n"
            "entente_box_tuples_in_total{box=\"a1\"} 40\n"
            "# HELP entente_stream_tuples Tuples retained per stream.\n"
            "# TYPE entente_stream_tuples gauge\n"
            "entente_stream_tuples{stream=\"bids\"} 10\n");
}

TEST(Metrics, BadCollectorSamplesAreLeftOutAndNamed) {
  Registry reg;
  reg.counter("x_total", "h").inc(2);
  reg.add_collector([](MetricsWriter& w) {
    w.gauge("x_total", "h", {}, 1);         // registered as a counter
    w.gauge("bad name", "h", {}, 1);        // not a metric name
    w.gauge("y", "h", {{"le-x", "1"}}, 1);  // not a label name
    w.gauge("z", "h", {{"ok", "1"}}, 5);
  });
  EXPECT_EQ(reg.render(),
            "# HELP x_total h\n"
            "# TYPE x_total counter\n"
            "x_total 2\n"
            "# HELP z h\n"
            "# TYPE z gauge\n"
            "z{ok=\"1\"} 5\n"
            "# entente: sample left out: metric x_total is a counter; a collector wrote it as a gauge\n"
            "# entente: sample left out: bad metric name 'bad name'\n"
            "# entente: sample left out: metric y: bad or duplicate label name 'le-x'\n");
}

TEST(Metrics, BadRegistrationsThrow) {
  Registry reg;
  reg.counter("n_total", "h");
  EXPECT_THROW(reg.gauge("n_total", "h"), std::logic_error);
  EXPECT_THROW(reg.counter("9lives", "h"), std::invalid_argument);
  EXPECT_THROW(reg.counter("a-b", "h"), std::invalid_argument);
  EXPECT_THROW(reg.counter("ok_total", "h", {{"a", "1"}, {"a", "2"}}), std::invalid_argument);
  EXPECT_THROW(reg.counter("ok_total", "h", {{"__name__", "1"}}), std::invalid_argument);
  EXPECT_THROW(reg.histogram("h_seconds", "h", {{"le", "1"}}, {1}), std::invalid_argument);
  EXPECT_THROW(reg.histogram("h_seconds", "h", {}, {2, 1}), std::invalid_argument);
  EXPECT_THROW(reg.histogram("h_seconds", "h", {}, {1, std::numeric_limits<double>::infinity()}),
               std::invalid_argument);
  reg.histogram("h_seconds", "h", {}, {1, 2});
  EXPECT_THROW(reg.histogram("h_seconds", "h", {}, {1, 3}), std::logic_error);
  // Failed registrations left nothing half-made behind.
  EXPECT_EQ(reg.render(),
            "# HELP h_seconds h\n"
            "# TYPE h_seconds histogram\n"
            "h_seconds_bucket{le=\"1\"} 0\n"
            "h_seconds_bucket{le=\"2\"} 0\n"
            "h_seconds_bucket{le=\"+Inf\"} 0\n"
            "h_seconds_sum 0\n"
            "h_seconds_count 0\n"
            "# HELP n_total h\n"
            "# TYPE n_total counter\n"
            "n_total 0\n");
}

TEST(Metrics, HistogramReadAndNaN) {
  Histogram h({1, 10});
  h.observe(0.5);
  h.observe(std::nan(""));  // ignored
  h.observe(10);
  h.observe(11);
  std::vector<uint64_t> cumulative;
  double sum = 0;
  uint64_t count = 0;
  h.read(cumulative, sum, count);
  EXPECT_EQ(cumulative, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_DOUBLE_EQ(sum, 21.5);
  EXPECT_EQ(count, 3u);
}

TEST(Metrics, LatencyBuckets) {
  const auto b = latency_buckets();
  ASSERT_GE(b.size(), 10u);
  EXPECT_DOUBLE_EQ(b.front(), 50e-6);
  EXPECT_DOUBLE_EQ(b.back(), 10.0);
  for (size_t i = 1; i < b.size(); ++i) {
    EXPECT_GT(b[i], b[i - 1]);
    EXPECT_LE(b[i] / b[i - 1], 2.5 + 1e-9);  // 1-2-5 steps
  }
  Registry reg;
  reg.histogram("lat_seconds", "h", {}, latency_buckets());
  EXPECT_NE(reg.render().find("lat_seconds_bucket{le=\"5e-05\"} 0\n"), std::string::npos);
}

TEST(Metrics, ConcurrentUpdatesGiveExactTotals) {
  Registry reg;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 50'000;
  Counter& main_view = reg.counter("ops_total", "h", {{"kind", "all"}});
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&reg, t] {
      // Registration races too: every thread asks for the same objects.
      Counter& c = reg.counter("ops_total", "h", {{"kind", "all"}});
      Histogram& h = reg.histogram("op_seconds", "h", {}, {0.5, 1.5});
      Gauge& g = reg.gauge("last", "h", {{"thread", std::to_string(t)}});
      for (int i = 0; i < kPerThread; ++i) {
        c.inc();
        h.observe(i % 2 == 0 ? 1.0 : 2.0);
        g.set(i);
      }
    });
  }
  // Scrapes while the writers run must not disturb them.
  for (int i = 0; i < 20; ++i) EXPECT_NE(reg.render().find("ops_total{kind=\"all\"} "), std::string::npos);
  for (auto& th : threads) th.join();

  EXPECT_EQ(main_view.value(), uint64_t{kThreads} * kPerThread);
  std::vector<uint64_t> cumulative;
  double sum = 0;
  uint64_t count = 0;
  reg.histogram("op_seconds", "h", {}, {0.5, 1.5}).read(cumulative, sum, count);
  EXPECT_EQ(cumulative, (std::vector<uint64_t>{0, kThreads * kPerThread / 2, kThreads * kPerThread}));
  EXPECT_EQ(count, uint64_t{kThreads} * kPerThread);
  EXPECT_DOUBLE_EQ(sum, 1.5 * kThreads * kPerThread);  // integers: exact in double
  const std::string text = reg.render();
  EXPECT_NE(text.find("ops_total{kind=\"all\"} 200000\n"), std::string::npos) << text;
  EXPECT_NE(text.find("op_seconds_count 200000\n"), std::string::npos) << text;
  EXPECT_NE(text.find("last{thread=\"3\"} 49999\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace entente::base
