// The threaded Scheduler: same results as the synchronous Executor for every
// box type, bounded queues under a slow consumer, clean shutdown.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/codec.h"

namespace entente::engine {
namespace {

// Every box type: bids are sorted (bsort), split three ways by price
// (filter), the two cheaper streams recombined (union), partitioned by
// auction (split) into two aggregates whose results are recombined
// (merge); the expensive ones are reshaped (map) and joined with auctions
// (join).
constexpr const char* kEveryBoxType = R"({
  "name": "every-box",
  "inputs": [
    {"name": "bids", "schema": [{"name": "auction", "type": "int64"}, {"name": "price", "type": "int64"},
                                {"name": "date_time", "type": "timestamp"}],
     "event_time": "date_time", "watermark_lag": 300},
    {"name": "auctions", "schema": [{"name": "id", "type": "int64"}, {"name": "seller", "type": "int64"},
                                    {"name": "date_time", "type": "timestamp"}],
     "event_time": "date_time", "watermark_lag": "1s"}
  ],
  "boxes": [
    {"id": "sorted", "type": "bsort", "options": {"slack": 8}},
    {"id": "by_price", "type": "filter", "options": {"predicates": ["price > 700", "price > 300"]}},
    {"id": "cheap", "type": "union"},
    {"id": "parts", "type": "split", "options": {"mode": "hash", "keys": ["auction"], "outputs": 2}},
    {"id": "count0", "type": "aggregate",
     "options": {"group_by": ["auction"], "window": {"type": "tumbling", "size": "2s"},
                 "aggregates": [{"fn": "count"}, {"fn": "sum", "field": "price"}]}},
    {"id": "count1", "type": "aggregate",
     "options": {"group_by": ["auction"], "window": {"type": "tumbling", "size": "2s"},
                 "aggregates": [{"fn": "count"}, {"fn": "sum", "field": "price"}]}},
    {"id": "counts", "type": "merge"},
    {"id": "dear", "type": "map",
     "options": {"fields": [{"name": "auction", "expr": "auction"}, {"name": "cents", "expr": "price * 100"}]}},
    {"id": "with_seller", "type": "join",
     "options": {"left_keys": ["auction"], "right_keys": ["id"], "window": {"type": "tumbling", "size": "5s"}}}
  ],
  "arcs": [
    {"from": "bids", "to": "sorted"},
    {"from": "sorted", "to": "by_price"},
    {"from": "by_price.0", "to": "dear"},
    {"from": "by_price.1", "to": "cheap.0"},
    {"from": "by_price.2", "to": "cheap.1"},
    {"from": "cheap", "to": "parts"},
    {"from": "parts.0", "to": "count0"},
    {"from": "parts.1", "to": "count1"},
    {"from": "count0", "to": "counts.0"},
    {"from": "count1", "to": "counts.1"},
    {"from": "dear", "to": "with_seller.0"},
    {"from": "auctions", "to": "with_seller.1"}
  ],
  "outputs": [
    {"name": "counts", "from": "counts"},
    {"name": "joined", "from": "with_seller"},
    {"name": "dear", "from": "dear"}
  ]
})";

QueryNetwork parse_ok(const std::string& json) {
  Diagnostics diag;
  auto net = QueryNetwork::parse(json, diag);
  EXPECT_TRUE(net.ok()) << diag.to_string();
  return net.ok() ? *net : QueryNetwork{};
}

struct Rng {
  uint64_t x;
  uint64_t next() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  }
};

// Batches of three int64-represented columns with times that mostly rise,
// sometimes step back a little (for bsort and lateness).
std::vector<Batch> random_batches(const SchemaPtr& schema, Rng& rng, size_t batches, size_t max_rows,
                                  int64_t keys, int64_t values) {
  std::vector<Batch> out;
  int64_t t = 0;
  Seq seq = 0;
  for (size_t b = 0; b < batches; ++b) {
    BatchBuilder bb(schema);
    size_t rows = rng.next() % (max_rows + 1);  // empty batches too
    for (size_t r = 0; r < rows; ++r) {
      t += int64_t(rng.next() % 60);
      int64_t jitter = (rng.next() % 8 == 0) ? int64_t(rng.next() % 250) : 0;
      bb.column(0).ints.push_back(int64_t(rng.next() % uint64_t(keys)));
      bb.column(1).ints.push_back(int64_t(rng.next() % uint64_t(values)));
      bb.column(2).ints.push_back(std::max<int64_t>(0, t - jitter));
      bb.event_time().push_back(0);
      bb.seq().push_back(seq++);
    }
    out.push_back(bb.finish());
  }
  return out;
}

struct Workload {
  // (input, batch) in push order.
  std::vector<std::pair<size_t, Batch>> pushes;
};

Workload random_workload(const QueryNetwork& net, uint64_t seed, size_t batches) {
  Rng rng{seed * 0x9E3779B97F4A7C15ULL + 11};
  auto bids = random_batches(net.inputs()[0].schema, rng, batches, 64, 12, 1000);
  auto auctions = random_batches(net.inputs()[1].schema, rng, batches, 8, 12, 50);
  Workload w;
  for (size_t i = 0; i < batches; ++i) {
    w.pushes.emplace_back(0, bids[i]);
    if (rng.next() % 3 != 0) w.pushes.emplace_back(1, auctions[i]);
  }
  return w;
}

// Rows per output as JSON lines (values, event time, sequence number).
using Rows = std::map<size_t, std::vector<std::string>>;

void append_rows(Rows& rows, size_t output, const Batch& b) {
  for (size_t r = 0; r < b.rows(); ++r) {
    std::string line;
    row_to_json(b, r, line);
    rows[output].push_back(std::move(line));
  }
}

Rows run_executor(const QueryNetwork& net, const Workload& w) {
  Rows rows;
  auto ex = Executor::create(net, [&](size_t o, const Batch& b) { append_rows(rows, o, b); });
  EXPECT_TRUE(ex.ok());
  if (!ex.ok()) return rows;
  for (const auto& [input, batch] : w.pushes) (*ex)->push(input, batch);
  (*ex)->finish();
  return rows;
}

Rows run_scheduler(const QueryNetwork& net, const Workload& w, SchedulerOptions opts,
                   std::vector<Scheduler::BoxInfo>* stats = nullptr) {
  Rows rows;
  // Sink calls are serialised by the scheduler: no lock needed here.
  auto s = Scheduler::create(net, [&](size_t o, const Batch& b) { append_rows(rows, o, b); }, opts);
  EXPECT_TRUE(s.ok());
  if (!s.ok()) return rows;
  for (const auto& [input, batch] : w.pushes) EXPECT_TRUE((*s)->push(input, batch));
  (*s)->finish();
  if (stats) *stats = (*s)->stats();
  return rows;
}

TEST(Scheduler, EveryBoxTypeGivesTheExecutorsResults) {
  auto net = parse_ok(kEveryBoxType);
  for (uint64_t seed : {1, 2, 3}) {
    auto w = random_workload(net, seed, 120);
    Rows expected = run_executor(net, w);
    ASSERT_EQ(expected.size(), 3u) << "every output should see rows";
    for (const auto& [o, r] : expected) EXPECT_FALSE(r.empty()) << "output " << o;
    for (size_t workers : {1, 2, 4}) {
      for (size_t cap : {1, 3, 64}) {
        SchedulerOptions opts;
        opts.workers = workers;
        opts.queue_batches = cap;
        opts.burst = cap;
        EXPECT_EQ(run_scheduler(net, w, opts), expected) << "seed " << seed << " workers " << workers << " cap " << cap;
      }
    }
  }
}

TEST(Scheduler, StatisticsMatchTheExecutors) {
  auto net = parse_ok(kEveryBoxType);
  auto w = random_workload(net, 9, 60);
  Rows ex_rows;
  auto ex = Executor::create(net, [&](size_t o, const Batch& b) { append_rows(ex_rows, o, b); });
  ASSERT_TRUE(ex.ok());
  for (const auto& [input, batch] : w.pushes) (*ex)->push(input, batch);
  (*ex)->finish();
  auto ex_stats = (*ex)->box_stats();

  std::vector<Scheduler::BoxInfo> stats;
  run_scheduler(net, w, SchedulerOptions{}, &stats);
  ASSERT_EQ(stats.size(), ex_stats.size());
  for (size_t i = 0; i < stats.size(); ++i) {
    EXPECT_EQ(stats[i].id, ex_stats[i].id);
    EXPECT_EQ(stats[i].type, ex_stats[i].type);
    EXPECT_EQ(stats[i].stats.tuples_in, ex_stats[i].stats.tuples_in) << stats[i].id;
    EXPECT_EQ(stats[i].stats.tuples_out, ex_stats[i].stats.tuples_out) << stats[i].id;
    EXPECT_EQ(stats[i].stats.bytes_out, ex_stats[i].stats.bytes_out) << stats[i].id;
    EXPECT_EQ(stats[i].queue_depth, 0u);
    EXPECT_EQ(stats[i].queue_rows, 0u);
    EXPECT_GE(stats[i].max_queue_depth, 1u);
  }
}

TEST(Scheduler, ConcurrentPushersIntoDifferentInputs) {
  auto net = parse_ok(kEveryBoxType);
  auto w = random_workload(net, 5, 100);
  Rows expected = run_executor(net, w);
  Rows rows;
  SchedulerOptions opts;
  opts.workers = 3;
  opts.queue_batches = 4;
  auto s = Scheduler::create(net, [&](size_t o, const Batch& b) { append_rows(rows, o, b); }, opts);
  ASSERT_TRUE(s.ok());
  // Each input keeps its own order; how the two interleave must not matter.
  auto pusher = [&](size_t input) {
    for (const auto& [in, batch] : w.pushes) {
      if (in == input) {
        EXPECT_TRUE((*s)->push(in, batch));
      }
    }
  };
  std::thread a(pusher, 0), b(pusher, 1);
  a.join();
  b.join();
  (*s)->finish();
  EXPECT_EQ(rows, expected);
}

constexpr const char* kPipeline = R"({
  "name": "pipeline",
  "inputs": [{"name": "in", "schema": [{"name": "k", "type": "int64"}, {"name": "v", "type": "int64"},
                                       {"name": "t", "type": "timestamp"}], "event_time": "t"}],
  "boxes": [
    {"id": "f", "type": "filter", "options": {"predicates": ["v >= 0"], "drop_unmatched": true}},
    {"id": "m", "type": "map", "options": {"fields": [{"name": "k", "expr": "k"}, {"name": "v2", "expr": "v * 2"}]}}
  ],
  "arcs": [{"from": "in", "to": "f"}, {"from": "f", "to": "m"}],
  "outputs": [{"name": "out", "from": "m"}]
})";

TEST(Scheduler, SlowConsumerBoundsQueueDepthAndBlocksThePusher) {
  auto net = parse_ok(kPipeline);
  Rng rng{42};
  auto batches = random_batches(net.inputs()[0].schema, rng, 200, 100, 10, 100);
  std::atomic<size_t> delivered{0};
  SchedulerOptions opts;
  opts.workers = 2;
  opts.queue_batches = 4;
  auto s = Scheduler::create(
      net,
      [&](size_t, const Batch& b) {
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        delivered += b.rows();
      },
      opts);
  ASSERT_TRUE(s.ok());

  // With a slow sink, try_push soon finds the queue full instead of
  // growing it.
  size_t accepted = 0;
  while (accepted < batches.size() && (*s)->try_push(0, batches[accepted])) ++accepted;
  EXPECT_LT(accepted, batches.size());
  size_t max_seen = 0;
  for (size_t i = accepted; i < batches.size(); ++i) {
    ASSERT_TRUE((*s)->push(0, batches[i]));
    for (const auto& info : (*s)->stats()) max_seen = std::max(max_seen, info.queue_depth);
  }
  (*s)->finish();
  size_t total = 0;
  for (const auto& b : batches) total += b.rows();
  EXPECT_EQ(delivered.load(), total);
  for (const auto& info : (*s)->stats()) {
    // A full queue stops its producer; one message of overshoot at most.
    EXPECT_LE(info.max_queue_depth, opts.queue_batches + 1) << info.id;
    EXPECT_EQ(info.queue_depth, 0u);
  }
  EXPECT_LE(max_seen, opts.queue_batches + 1);
}

TEST(Scheduler, RowCapacityBoundsQueuedRows) {
  auto net = parse_ok(kPipeline);
  Rng rng{7};
  auto batches = random_batches(net.inputs()[0].schema, rng, 100, 100, 10, 100);
  SchedulerOptions opts;
  opts.workers = 1;
  opts.queue_batches = 1000;
  opts.queue_rows = 150;
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  auto s = Scheduler::create(
      net,
      [&](size_t, const Batch&) {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return open; });
      },
      opts);
  ASSERT_TRUE(s.ok());
  // The sink is shut: the pipeline fills, then the pusher is refused.
  size_t accepted = 0;
  for (int spins = 0; spins < 200 && accepted < batches.size(); ++spins) {
    if ((*s)->try_push(0, batches[accepted])) {
      ++accepted;
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  EXPECT_LT(accepted, batches.size());
  for (const auto& info : (*s)->stats()) EXPECT_LE(info.queue_rows, opts.queue_rows + 100) << info.id;
  {
    std::lock_guard lk(mu);
    open = true;
  }
  cv.notify_all();
  for (size_t i = accepted; i < batches.size(); ++i) ASSERT_TRUE((*s)->push(0, batches[i]));
  (*s)->finish();
}

TEST(Scheduler, StopDiscardsQueuedWorkAndJoins) {
  auto net = parse_ok(kPipeline);
  Rng rng{3};
  auto batches = random_batches(net.inputs()[0].schema, rng, 50, 50, 10, 100);
  std::atomic<int> calls{0};
  SchedulerOptions opts;
  opts.queue_batches = 8;
  auto s = Scheduler::create(
      net,
      [&](size_t, const Batch&) {
        ++calls;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      },
      opts);
  ASSERT_TRUE(s.ok());
  std::thread pusher([&] {
    for (const auto& b : batches)
      if (!(*s)->push(0, b)) return;  // refused once stopped
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  (*s)->stop();
  pusher.join();
  int after_stop = calls.load();
  EXPECT_FALSE((*s)->push(0, batches[0]));
  EXPECT_FALSE((*s)->try_push(0, batches[0]));
  EXPECT_FALSE((*s)->advance_watermark(0, 5));
  (*s)->finish();  // after stop: nothing to drain, returns
  (*s)->wait_idle();
  EXPECT_EQ(calls.load(), after_stop);
}

TEST(Scheduler, FinishRefusesFurtherPushesAndIsIdempotent) {
  auto net = parse_ok(kPipeline);
  Rng rng{4};
  auto batches = random_batches(net.inputs()[0].schema, rng, 5, 20, 10, 100);
  size_t rows = 0;
  auto s = Scheduler::create(net, [&](size_t, const Batch& b) { rows += b.rows(); });
  ASSERT_TRUE(s.ok());
  size_t total = 0;
  for (const auto& b : batches) {
    ASSERT_TRUE((*s)->push(0, b));
    total += b.rows();
  }
  (*s)->wait_idle();
  EXPECT_EQ(rows, total);  // everything pushed so far has arrived
  (*s)->finish();
  (*s)->finish();
  EXPECT_FALSE((*s)->push(0, batches[0]));
  EXPECT_EQ(rows, total);
}

TEST(Scheduler, BadArgumentsAndBadPushes) {
  auto net = parse_ok(kPipeline);
  SchedulerOptions zero;
  zero.workers = 0;
  EXPECT_FALSE(Scheduler::create(net, nullptr, zero).ok());
  SchedulerOptions no_queue;
  no_queue.queue_batches = 0;
  EXPECT_FALSE(Scheduler::create(net, nullptr, no_queue).ok());
  EXPECT_FALSE(Scheduler::create(QueryNetwork{}, nullptr).ok());

  auto s = Scheduler::create(net, nullptr);  // no sink: outputs are dropped
  ASSERT_TRUE(s.ok());
  BatchBuilder other(make_schema({{"x", Type::Int64}}));
  EXPECT_THROW((*s)->push(0, other.finish()), std::invalid_argument);
  EXPECT_THROW((*s)->push(1, Batch{}), std::out_of_range);
  EXPECT_THROW((*s)->advance_watermark(1, 0), std::out_of_range);
  (*s)->tick(1000);
  (*s)->tick(2000);
  (*s)->finish();
}

TEST(Scheduler, DestructorStopsRunningWork) {
  auto net = parse_ok(kEveryBoxType);
  auto w = random_workload(net, 8, 50);
  {
    auto s = Scheduler::create(net, [](size_t, const Batch&) {});
    ASSERT_TRUE(s.ok());
    for (const auto& [input, batch] : w.pushes) ASSERT_TRUE((*s)->push(input, batch));
    // No finish(): the destructor must stop and join the workers.
  }
}

}  // namespace
}  // namespace entente::engine
