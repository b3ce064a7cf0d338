// A query fragment's state stream (broker/detail/query.h, docs/cluster.md,
// "A fragment's state stream") over a real RocksDB store, group commit and
// engine worker: the runner journals into the state stream, its outputs
// wait until the journal rows are durable and released by the followers
// (Env::when_replicated, played here by a gate the test opens), a refused
// release fails the runner naming the state stream, checkpoints go to the
// state stream in chunks (not to the store), and a new runner recovers
// from the state stream alone, trimmed to its last checkpoint, also when
// the journal leads further than the outputs. Concurrent: run under TSan
// too (scripts/test.sh).
#include "broker/detail/query.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include "engine/batch.h"
#include "engine/codec.h"
#include "store/group_commit.h"
#include "store/store.h"
#include "store/stream_log.h"
#include "tests/support/temp_dir.h"

namespace entente::broker::detail {
namespace {

using namespace std::chrono_literals;

const engine::SchemaPtr kInSchema =
    engine::make_schema({{"k", engine::Type::Int64}, {"ts", engine::Type::Timestamp}});
const engine::SchemaPtr kOutSchema = engine::make_schema({{"k", engine::Type::Int64},
                                                          {"window_start", engine::Type::Timestamp},
                                                          {"window_end", engine::Type::Timestamp},
                                                          {"n", engine::Type::Int64}});
constexpr int64_t kHourMs = 3'600'000;

// Counts per k in tumbling windows of an hour: its state grows with the
// number of keys, and a row an hour later closes the window.
const char* kNetwork = R"({"name":"q--f","inputs":[{"name":"in","event_time":"ts","schema":[
    {"name":"k","type":"int64"},{"name":"ts","type":"timestamp"}]}],
  "boxes":[{"id":"c","type":"aggregate","options":{"group_by":["k"],"window":{"type":"tumbling","size":"1h"},
    "aggregates":[{"fn":"count","as":"n"}]}}],
  "arcs":[{"from":"in","to":"c"}],"outputs":[{"name":"out","from":"c"}]})";

// Rows k = first .. first + n - 1, all at event time `ts`.
engine::Batch rows(int64_t first, int64_t n, int64_t ts) {
  engine::BatchBuilder b(kInSchema);
  for (int64_t i = 0; i < n; ++i) {
    b.column(0).ints.push_back(first + i);
    b.column(1).ints.push_back(ts);
    b.event_time().push_back(ts);
    b.seq().push_back(0);
  }
  return b.finish();
}

bool eventually(const std::function<bool()>& done, std::chrono::milliseconds limit = 20s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return done();
}

// Plays the followers: holds each release until the test opens the gate,
// or answers at once (open) or with `refusal`.
class Gate {
 public:
  void open() {
    std::vector<std::function<void(const Status&)>> held;
    {
      std::lock_guard lock(mu_);
      open_ = true;
      held.swap(held_);
    }
    for (auto& r : held) r(Status::Ok());
  }
  void close() {
    std::lock_guard lock(mu_);
    open_ = false;
  }
  // Every (stream, last) asked for so far.
  std::vector<std::pair<std::string, uint64_t>> asked() const {
    std::lock_guard lock(mu_);
    return asked_;
  }
  void refuse(Error e) {
    std::lock_guard lock(mu_);
    refusal_ = std::move(e);
  }
  size_t held() const {
    std::lock_guard lock(mu_);
    return held_.size();
  }
  uint64_t asked_last() const {
    std::lock_guard lock(mu_);
    return last_;
  }
  QueryRunner::Env::WhenReplicated fn() {
    return [this](const std::string& stream, uint64_t last, std::function<void(const Status&)> release) {
      std::unique_lock lock(mu_);
      // (h-state, h-out: a standby promoted to other streams.)
      EXPECT_TRUE(stream == "q--f--state" || stream == "out" || stream == "h-state" || stream == "h-out") << stream;
      asked_.emplace_back(stream, last);
      if (stream == "q--f--state") last_ = std::max(last_, last);
      if (refusal_) {
        Error e = *refusal_;
        lock.unlock();
        release(e);
        return;
      }
      if (!open_) {
        held_.push_back(std::move(release));
        return;
      }
      lock.unlock();
      release(Status::Ok());
    };
  }

 private:
  mutable std::mutex mu_;
  bool open_ = false;
  std::optional<Error> refusal_;
  uint64_t last_ = 0;
  std::vector<std::pair<std::string, uint64_t>> asked_;
  std::vector<std::function<void(const Status&)>> held_;
};

// The state stream's rows: kind, a, b, c, d per row.
struct StateRow {
  uint64_t seq;
  int64_t kind, a, b, c, d;
  size_t data_bytes;
};

class QueryStateStream : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = entente::testing::make_temp_dir("query-state-test");
    store::StoreOptions o;
    o.path = dir_ + "/db";
    auto s = store::Store::open(o);
    ASSERT_TRUE(s.ok()) << s.error().message;
    store_ = std::move(s).value();
    store::GroupCommitOptions gco;
    gco.durability = store::Durability::buffered;
    gc_ = std::make_unique<store::GroupCommit>(*store_, gco);
    gc_->start();
    pool_ = std::make_unique<EnginePool>(1);
    in_ = make_stream("in", 1, kInSchema);
    out_ = make_stream("out", 2, kOutSchema);
    state_ = make_stream("q--f--state", 3, state_stream_schema());
  }
  void TearDown() override {
    gate_.open();  // a worker waiting on it would hold the runner
    if (runner_) runner_->stop();
    runner_.reset();
    pool_->stop();
    gc_->stop();
    gc_.reset();
    store_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // A stream as the node loads it: its next seq from its log.
  StreamPtr make_stream(const std::string& name, uint64_t id, engine::SchemaPtr schema) {
    StreamMeta m;
    m.name = name;
    m.id.value = id;
    m.schema = std::move(schema);
    m.producer = name == "in" ? "api" : "query:q";
    auto last = store::StreamLog::last(*store_, m.id);
    EXPECT_TRUE(last.ok());
    return std::make_shared<Stream>(m, last.ok() && *last ? (*last)->last + 1 : 1);
  }

  // A new runner over the same log, as after a restart (or on a node
  // taking the fragment over): recovered, then started.
  Status start_runner() {
    if (runner_) runner_->stop();
    runner_.reset();
    flush();
    out_ = make_stream("out", 2, kOutSchema);
    state_ = make_stream("q--f--state", 3, state_stream_schema());
    QueryMeta m;
    m.name = "q--f";
    m.network_json = kNetwork;
    m.inputs = {"in"};
    m.outputs = {"out"};
    m.start = {1};
    m.query = "q";
    m.fragment = "f";
    m.state_stream = "q--f--state";
    QueryRunner::Env env{store_.get(), gc_.get(), pool_.get(), nullptr, gate_.fn()};
    auto r = QueryRunner::create(m, {in_}, {out_}, env, state_);
    if (!r.ok()) return r.error();
    runner_ = std::move(r).value();
    ENTENTE_RETURN_IF_ERROR(runner_->recover());
    runner_->start();
    return Status::Ok();
  }

  // Waits until every append submitted so far is written.
  void flush() {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    ASSERT_TRUE(gc_->submit(
                       store::WriteBatch(),
                       [&](const Status&) {
                         std::lock_guard lock(mu);
                         done = true;
                         cv.notify_all();
                       },
                       store::Admission::wait)
                    .ok());
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done; });
  }

  void publish(engine::Batch b) {
    ASSERT_TRUE(in_->append(std::move(b), *gc_, store::Admission::wait, store::WriteBatch(), nullptr).ok());
  }

  // Reads the store after every append submitted so far is written (the
  // flush orders the read after the committer's writes, which TSan cannot
  // see inside RocksDB); callers read when no append is in flight.
  std::vector<StateRow> state_rows() {
    flush();
    std::vector<StateRow> out;
    std::vector<store::LogRecord> recs;
    EXPECT_TRUE(store::StreamLog::read(*store_, state_->meta().id, 0, 100000, 1u << 30, recs).ok());
    for (auto& rec : recs) {
      std::string_view p = rec.payload;
      auto b = engine::decode_batch(p);
      EXPECT_TRUE(b.ok());
      if (!b.ok()) break;
      for (size_t i = 0; i < b->rows(); ++i)
        out.push_back({rec.first + i, b->columns[0]->ints[i], b->columns[1]->ints[i], b->columns[2]->ints[i],
                       b->columns[3]->ints[i], b->columns[4]->ints[i], b->columns[5]->str(i).size()});
    }
    return out;
  }

  // Sum of n and number of rows over the output's log.
  std::pair<int64_t, size_t> output_counts() {
    flush();
    std::vector<store::LogRecord> recs;
    EXPECT_TRUE(store::StreamLog::read(*store_, out_->meta().id, 0, 100000, 1u << 30, recs).ok());
    int64_t sum = 0;
    size_t n = 0;
    uint64_t next = 1;
    for (auto& rec : recs) {
      EXPECT_EQ(rec.first, next) << "a gap or a repeat in the output";
      next = rec.last + 1;
      std::string_view p = rec.payload;
      auto b = engine::decode_batch(p);
      EXPECT_TRUE(b.ok());
      if (!b.ok()) break;
      for (size_t i = 0; i < b->rows(); ++i) sum += b->columns[3]->ints[i];
      n += b->rows();
    }
    return {sum, n};
  }

  std::string dir_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<store::GroupCommit> gc_;
  std::unique_ptr<EnginePool> pool_;
  StreamPtr in_, out_, state_;
  Gate gate_;
  std::shared_ptr<QueryRunner> runner_;
};

TEST_F(QueryStateStream, OutputsWaitUntilTheirJournalIsDurableAndReplicated) {
  ASSERT_TRUE(start_runner().ok());
  publish(rows(0, 10, 1000));
  publish(rows(0, 1, 2 * kHourMs));  // closes the first window: 10 rows out
  // The journal rows are in the state stream, the release is held, and
  // no output is written meanwhile.
  ASSERT_TRUE(eventually([&] { return gate_.held() > 0; }));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(out_->committed_next(), 1u) << "an output was written before its journal was replicated";
  const auto held = state_rows();
  ASSERT_FALSE(held.empty());
  EXPECT_EQ(gate_.asked_last(), held.back().seq) << "the release asked for is not the last journal row";
  uint64_t journaled_through = 0;
  for (const auto& r : held) {
    ASSERT_EQ(r.kind, kStateJournal);
    EXPECT_EQ(r.a, static_cast<int64_t>(&r - &held[0])) << "journal seqs not contiguous from 0";
    EXPECT_EQ(r.b, 0);
    EXPECT_EQ(static_cast<uint64_t>(r.c), journaled_through + 1);
    journaled_through = static_cast<uint64_t>(r.d);
  }
  EXPECT_EQ(journaled_through, 11u);
  // While the run waits for the followers (holding the runner), info()
  // still answers, with what it read last and the positions now: a
  // /metrics scrape that waited here held the metrics registry, which the
  // peer links need to bring that release (a node deadlocked so).
  auto info = std::async(std::launch::async, [&] { return runner_->info(); });
  ASSERT_EQ(info.wait_for(2s), std::future_status::ready) << "info() waits for the run";
  EXPECT_EQ(info.get().positions.at(0), 12u);
  gate_.open();
  ASSERT_TRUE(eventually([&] { return out_->committed_next() == 11; })) << out_->committed_next();
  EXPECT_EQ(runner_->info().state, "running");
  // The journal is not in the store's log family, as a whole query's is.
  ASSERT_TRUE(store::Checkpoints::latest(*store_, "query/q--f").ok());
  EXPECT_FALSE(*store::Checkpoints::latest(*store_, "query/q--f"));
}

// A node taking over reproduces only the outputs after the checkpoint its
// copy of the state stream holds: a checkpoint is written once the outputs
// before it are held by the outputs' followers.
TEST_F(QueryStateStream, ACheckpointWaitsUntilTheOutputsBeforeItAreReplicated) {
  gate_.open();
  ASSERT_TRUE(start_runner().ok());
  publish(rows(0, 10, 1000));
  publish(rows(0, 1, 2 * kHourMs));
  ASSERT_TRUE(eventually([&] { return out_->committed_next() == 11; }));
  gate_.close();
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Result<CheckpointInfo>> taken;
  runner_->request_checkpoint([&](const Result<CheckpointInfo>& r) {
    std::lock_guard lock(mu);
    taken = r;
    cv.notify_all();
  });
  ASSERT_TRUE(eventually([&] { return gate_.held() > 0; }));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(gate_.asked().back(), (std::pair<std::string, uint64_t>{"out", 10}));
  for (const auto& r : state_rows()) EXPECT_NE(r.kind, kStateCheckpoint) << "a checkpoint before its outputs' release";
  gate_.open();
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 20s, [&] { return taken.has_value(); }));
  ASSERT_TRUE(taken->ok()) << taken->error().message;
  lock.unlock();
  bool chunk = false;
  for (const auto& r : state_rows()) chunk |= r.kind == kStateCheckpoint;
  EXPECT_TRUE(chunk);
  EXPECT_GT(runner_->state_trim_before(), 0u);
}

TEST_F(QueryStateStream, ARefusedReleaseFailsTheRunnerNamingTheStateStreamAndWritesNoOutput) {
  gate_.refuse(Error{Errc::io_error, "stream 'q--f--state' is led by n2 now"});
  ASSERT_TRUE(start_runner().ok());
  publish(rows(0, 3, 1000));
  publish(rows(0, 1, 2 * kHourMs));
  ASSERT_TRUE(eventually([&] { return runner_->info().state != "running"; }));
  const std::string state = runner_->info().state;
  EXPECT_NE(state.find("failed: state stream 'q--f--state'"), std::string::npos) << state;
  EXPECT_NE(state.find("led by n2"), std::string::npos) << state;
  EXPECT_EQ(out_->committed_next(), 1u);
  // And appends nothing more.
  const size_t rows_then = state_rows().size();
  publish(rows(5, 3, 3 * kHourMs));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(state_rows().size(), rows_then);
}

TEST_F(QueryStateStream, CheckpointsGoToTheStateStreamInChunksAndANewRunnerRecoversFromItTrimmed) {
  gate_.open();
  ASSERT_TRUE(start_runner().ok());
  // Enough keys for a snapshot of several chunks.
  constexpr int64_t kKeys = 60'000;
  for (int64_t k = 0; k < kKeys; k += 5'000) publish(rows(k, 5'000, 1000));
  ASSERT_TRUE(eventually([&] { return runner_->info().positions[0] == kKeys + 1; }));
  auto cp = runner_->drain_and_checkpoint();
  ASSERT_TRUE(cp.ok()) << cp.error().message;
  EXPECT_GT(cp->bytes, kStateChunkBytes) << "the snapshot fits one chunk: raise kKeys";
  // In the state stream, not in the store.
  EXPECT_FALSE(store::Checkpoints::latest(*store_, "query/q--f").value().has_value());
  std::vector<StateRow> chunks;
  for (const auto& r : state_rows())
    if (r.kind == kStateCheckpoint && r.a == static_cast<int64_t>(cp->id)) chunks.push_back(r);
  ASSERT_GT(chunks.size(), 1u);
  size_t bytes = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].b, static_cast<int64_t>(i));
    EXPECT_EQ(chunks[i].c, static_cast<int64_t>(chunks.size()));
    EXPECT_LE(chunks[i].data_bytes, kStateChunkBytes);
    bytes += chunks[i].data_bytes;
  }
  EXPECT_EQ(bytes, cp->bytes);
  EXPECT_EQ(runner_->state_trim_before(), chunks.front().seq);
  {
    // A follower's copy, which has no runner, finds the same place by
    // reading the records (NodeImpl::trim_state_streams); a checkpoint cut
    // short after it does not move it.
    std::vector<store::LogRecord> recs;
    ASSERT_TRUE(store::StreamLog::read(*store_, state_->meta().id, 0, 100000, 1u << 30, recs).ok());
    engine::BatchBuilder partial(state_stream_schema());
    partial.column(0).ints.push_back(kStateCheckpoint);
    partial.column(1).ints.push_back(static_cast<int64_t>(cp->id) + 1);
    partial.column(2).ints.push_back(0);
    partial.column(3).ints.push_back(2);
    partial.column(4).ints.push_back(0);
    partial.column(5).append_str("x");
    partial.event_time().push_back(0);
    partial.seq().push_back(recs.back().last + 1);
    store::LogRecord cut{recs.back().last + 1, recs.back().last + 1, 0, {}};
    engine::encode_batch(partial.finish(), cut.payload);
    recs.push_back(std::move(cut));
    StateCheckpoints seen;
    for (const auto& rec : recs) ASSERT_TRUE(seen.feed(rec).ok());
    EXPECT_EQ(seen.last_complete_first(), chunks.front().seq);
    store::LogRecord junk{recs.back().last + 1, recs.back().last + 1, 0, "not a batch"};
    EXPECT_EQ(seen.feed(junk).error().code, Errc::corrupt);
  }

  // The window closes after the checkpoint: a journal row, then every
  // key's count.
  publish(rows(0, 100, 2 * kHourMs));
  ASSERT_TRUE(eventually([&] { return out_->committed_next() == static_cast<uint64_t>(kKeys + 1); }))
      << out_->committed_next();
  ASSERT_FALSE(state_rows().empty());
  EXPECT_EQ(state_rows().back().kind, kStateJournal);
  // What the node's maintenance does after a checkpoint: the journal rows
  // before it go.
  auto trimmed = store::StreamLog::erase_before(*store_, state_->meta().id, runner_->state_trim_before());
  ASSERT_TRUE(trimmed.ok());
  EXPECT_GT(trimmed->records_removed, 0u);
  EXPECT_EQ(state_rows().front().seq, chunks.front().seq);

  // A new runner (as after kill -9, or on another node): the checkpoint
  // and the journal after it, from the state stream alone; the outputs the
  // replay reproduces are in the log already and are dropped.
  ASSERT_TRUE(start_runner().ok());
  auto info = runner_->info();
  ASSERT_TRUE(info.checkpoint.has_value());
  EXPECT_EQ(info.checkpoint->id, cp->id);
  EXPECT_EQ(info.positions[0], static_cast<uint64_t>(kKeys + 101));
  EXPECT_EQ(out_->committed_next(), static_cast<uint64_t>(kKeys + 1));
  // The second window (keys 0..99 once each) closes.
  publish(rows(0, 1, 4 * kHourMs));
  ASSERT_TRUE(eventually([&] { return out_->committed_next() == static_cast<uint64_t>(kKeys + 101); }))
      << out_->committed_next();
  auto [sum, n] = output_counts();
  EXPECT_EQ(n, static_cast<size_t>(kKeys + 100));
  EXPECT_EQ(sum, kKeys + 100);
}

// Splitting a fragment (docs/cluster.md, "Splitting a fragment"): a
// stopped runner's state seeds a new runner, which continues where it
// stood: no tuple read twice, the outputs numbered on without a gap. A
// seed of another shape, or one that would leave a gap or repeat in an
// output, is refused.
TEST_F(QueryStateStream, AStoppedRunnersStateSeedsANewRunnerThatContinuesItsOutputs) {
  gate_.open();
  ASSERT_TRUE(start_runner().ok());
  publish(rows(0, 10, 1000));
  publish(rows(0, 1, 2 * kHourMs));  // 10 counts out
  publish(rows(0, 4, 2 * kHourMs + 5));  // 5 rows of key 0..3 in the open window
  ASSERT_TRUE(eventually([&] { return runner_->info().positions[0] == 16; }));
  ASSERT_TRUE(eventually([&] { return out_->committed_next() == 11; })) << out_->committed_next();
  runner_->stop();
  auto state = runner_->stopped_state();
  ASSERT_TRUE(state.ok()) << state.error().message;
  EXPECT_EQ(state->positions, std::vector<uint64_t>{16});
  EXPECT_EQ(state->out_next, std::vector<uint64_t>{11});
  EXPECT_FALSE(state->snapshot.empty());
  runner_.reset();

  // A runner as a split deploys one: created, seeded, started.
  QueryMeta m;
  m.name = "q--f";
  m.network_json = kNetwork;
  m.inputs = {"in"};
  m.outputs = {"out"};
  m.start = {16};
  m.query = "q";
  m.fragment = "f";
  m.state_stream = "q--f--state";
  QueryRunner::Env env{store_.get(), gc_.get(), pool_.get(), nullptr, gate_.fn()};
  auto made = QueryRunner::create(m, {in_}, {out_}, env, state_);
  ASSERT_TRUE(made.ok()) << made.error().message;
  runner_ = std::move(made).value();
  QueryRunner::State two_inputs = *state;
  two_inputs.positions.push_back(1);
  EXPECT_EQ(runner_->seed(two_inputs).error().code, Errc::invalid_argument);
  QueryRunner::State gap = *state;
  gap.out_next = {15};
  auto refused = runner_->seed(gap);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("output 'out' continues at 11; the seed at 15"), std::string::npos)
      << refused.error().message;
  QueryRunner::State bad_snapshot = *state;
  bad_snapshot.snapshot = "not a snapshot";
  EXPECT_FALSE(runner_->seed(bad_snapshot).ok());
  ASSERT_TRUE(runner_->seed(*state).ok());
  runner_->start();
  EXPECT_EQ(runner_->info().positions[0], 16u);
  // The second window closes: keys 0..3 with the rows before the seed
  // (key 0 twice), numbered on from 11.
  publish(rows(0, 1, 4 * kHourMs));
  ASSERT_TRUE(eventually([&] { return out_->committed_next() == 15; })) << out_->committed_next();
  auto [sum, n] = output_counts();
  EXPECT_EQ(n, 14u);
  EXPECT_EQ(sum, 10 + 5);
}

TEST_F(QueryStateStream, AJournalAheadOfTheOutputsIsReplayedIntoThem) {
  gate_.open();
  ASSERT_TRUE(start_runner().ok());
  publish(rows(0, 10, 1000));
  ASSERT_TRUE(eventually([&] { return runner_->info().positions[0] == 11; }));
  auto cp = runner_->drain_and_checkpoint();
  ASSERT_TRUE(cp.ok()) << cp.error().message;
  runner_->stop();
  // As if the node died between the journal's append and the outputs':
  // a closing row consumed and journaled, its outputs never written.
  publish(rows(0, 1, 2 * kHourMs));
  ASSERT_TRUE(eventually([&] { return in_->committed_next() == 12; }));
  int64_t next_journal = 0;
  for (const auto& r : state_rows())
    if (r.kind == kStateJournal) next_journal = r.a + 1;
    else if (r.kind == kStateCheckpoint) next_journal = std::max(next_journal, r.d);
  engine::BatchBuilder b(state_stream_schema());
  b.column(0).ints.push_back(kStateJournal);
  b.column(1).ints.push_back(next_journal);
  b.column(2).ints.push_back(0);
  b.column(3).ints.push_back(11);
  b.column(4).ints.push_back(11);
  b.column(5).append_str("");
  b.event_time().push_back(0);
  b.seq().push_back(0);
  ASSERT_TRUE(state_->append(b.finish(), *gc_, store::Admission::wait, store::WriteBatch(), nullptr).ok());
  ASSERT_TRUE(eventually([&] { return state_->committed_next() == state_->next_seq(); }));
  ASSERT_FALSE(state_rows().empty());
  ASSERT_EQ(state_rows().back().kind, kStateJournal);
  ASSERT_EQ(out_->committed_next(), 1u);

  ASSERT_TRUE(start_runner().ok());
  ASSERT_TRUE(eventually([&] { return out_->committed_next() == 11; })) << out_->committed_next();
  auto [sum, n] = output_counts();
  EXPECT_EQ(n, 10u);
  EXPECT_EQ(sum, 10);
  EXPECT_EQ(runner_->info().positions[0], 12u);
}

TEST_F(QueryStateStream, AGapInTheJournalIsCorruptionNamingTheQueryAndTheEntry) {
  gate_.open();
  ASSERT_TRUE(start_runner().ok());
  publish(rows(0, 3, 1000));
  ASSERT_TRUE(eventually([&] { return runner_->info().positions[0] == 4; }));
  runner_->stop();
  // A journal row numbered past the next one.
  engine::BatchBuilder b(state_stream_schema());
  b.column(0).ints.push_back(kStateJournal);
  b.column(1).ints.push_back(1000);
  b.column(2).ints.push_back(0);
  b.column(3).ints.push_back(4);
  b.column(4).ints.push_back(4);
  b.column(5).append_str("");
  b.event_time().push_back(0);
  b.seq().push_back(0);
  ASSERT_TRUE(state_->append(b.finish(), *gc_, store::Admission::wait, store::WriteBatch(), nullptr).ok());
  ASSERT_TRUE(eventually([&] { return state_->committed_next() == state_->next_seq(); }));
  ASSERT_FALSE(state_rows().empty());
  ASSERT_EQ(state_rows().back().a, 1000);
  Status s = start_runner();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::corrupt);
  EXPECT_NE(s.error().message.find("query 'q--f'"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("journal entry"), std::string::npos) << s.error().message;
  runner_.reset();
}

TEST_F(QueryStateStream, AWarmStandbyFollowsTheJournalWritesNothingAndContinuesWhereTheOutputEnds) {
  gate_.open();
  ASSERT_TRUE(start_runner().ok());
  publish(rows(0, 1'000, 1000));
  ASSERT_TRUE(eventually([&] { return runner_->info().positions[0] == 1'001; }));
  ASSERT_TRUE(runner_->drain_and_checkpoint().ok());
  publish(rows(0, 500, 1000));

  // A move's target: the same fragment over the same logs (a follower's
  // copies, on another node), warming while the runner still runs.
  QueryMeta m = runner_->meta();
  QueryRunner::Env env{store_.get(), gc_.get(), pool_.get(), nullptr, gate_.fn()};
  auto made = QueryRunner::create(m, {in_}, {out_}, env, state_);
  ASSERT_TRUE(made.ok()) << made.error().message;
  std::shared_ptr<QueryRunner> standby = *made;
  standby->begin_warm();
  EXPECT_EQ(standby->info().state, "warm");
  auto warmed = standby->warm();
  ASSERT_TRUE(warmed.ok()) << warmed.error().message;

  // The runner closes the first window (1,000 counts) and goes on; the
  // standby replays each journal entry as it comes, and writes nothing.
  publish(rows(0, 200, 2 * kHourMs));
  ASSERT_TRUE(eventually([&] { return out_->committed_next() == 1'001; })) << out_->committed_next();
  publish(rows(200, 100, 2 * kHourMs));
  ASSERT_TRUE(eventually([&] { return runner_->info().positions[0] == 1'801; }));
  ASSERT_TRUE(eventually([&] {
    auto w = standby->warm();
    return w.ok() && *w == runner_->journal_next();
  }));
  EXPECT_EQ(out_->committed_next(), 1'001u) << "the standby wrote outputs";

  // Promoting it with other input streams than it read is refused.
  StreamPtr other_in = make_stream("in", 1, kInSchema);
  EXPECT_EQ(standby->promote({other_in}, {out_}, state_).error().code, Errc::conflict);

  // The move: the runner stops, a last entry or two land, the standby
  // takes the rest and continues; the output has no gap and no repeat.
  publish(rows(300, 50, 2 * kHourMs));
  ASSERT_TRUE(eventually([&] { return runner_->info().positions[0] == 1'851; }));
  runner_->stop();
  flush();
  const uint64_t journal = runner_->journal_next();
  Status promoted = standby->promote({in_}, {out_}, state_);
  ASSERT_TRUE(promoted.ok()) << promoted.error().message;
  EXPECT_EQ(standby->journal_next(), journal);
  EXPECT_EQ(standby->info().state, "running");
  runner_ = standby;
  runner_->start();
  publish(rows(0, 1, 4 * kHourMs));  // closes the second window: 350 keys
  ASSERT_TRUE(eventually([&] { return out_->committed_next() == 1'351; })) << out_->committed_next();
  auto [sum, n] = output_counts();
  EXPECT_EQ(n, 1'350u);
  EXPECT_EQ(sum, 1'500 + 350);
}

// A fragment moved to another domain (docs/cluster.md, "The hosted run"):
// the host's standby reads a copy of the owner's state stream and counts
// its outputs on streams it never writes; once the owner's runner stops,
// it replays the rest of the journal and writes to the host's own output
// and state streams, which start at the owner's next numbers.
TEST_F(QueryStateStream, AStandbyPromotedToOtherStreamsContinuesTheOwnersOutputsAndJournalThere) {
  gate_.open();
  ASSERT_TRUE(start_runner().ok());
  publish(rows(0, 1'000, 1000));
  ASSERT_TRUE(eventually([&] { return runner_->info().positions[0] == 1'001; }));
  ASSERT_TRUE(runner_->drain_and_checkpoint().ok());
  publish(rows(0, 500, 1000));
  publish(rows(0, 200, 2 * kHourMs));  // closes the first window: 1,000 rows out
  ASSERT_TRUE(eventually([&] { return out_->committed_next() == 1'001; })) << out_->committed_next();

  // The standby: its outputs counted on a stream of no log.
  QueryMeta m = runner_->meta();
  m.outputs = {"counted"};
  StreamMeta cm;
  cm.name = "counted";
  cm.schema = kOutSchema;
  QueryRunner::Env env{store_.get(), gc_.get(), pool_.get(), nullptr, gate_.fn()};
  auto made = QueryRunner::create(m, {in_}, {std::make_shared<Stream>(cm, 1)}, env, state_);
  ASSERT_TRUE(made.ok()) << made.error().message;
  std::shared_ptr<QueryRunner> standby = *made;
  standby->begin_warm();
  ASSERT_TRUE(standby->warm().ok());

  // The owner's runner stops where it stands.
  publish(rows(200, 50, 2 * kHourMs));
  ASSERT_TRUE(eventually([&] { return runner_->info().positions[0] == 1'751; }));
  runner_->stop();
  flush();
  const uint64_t journal = runner_->journal_next();
  const uint64_t out_next = out_->committed_next(), state_next = state_->next_seq();
  auto hidden = [](const std::string& name, uint64_t id, engine::SchemaPtr schema, uint64_t first) {
    StreamMeta sm;
    sm.name = name;
    sm.id.value = id;
    sm.schema = std::move(schema);
    sm.producer = "hosted:acme";
    return std::make_shared<Stream>(sm, first);
  };
  StreamPtr host_state = hidden("h-state", 11, state_stream_schema(), state_next);
  // An output that does not start where the standby's count ends, a
  // journal the copy does not hold yet: refused, the standby kept.
  StreamPtr wrong = hidden("h-out", 10, kOutSchema, out_next + 1);
  EXPECT_EQ(standby->promote_to(journal, {wrong}, {"h-out"}, host_state, "h-state").error().code, Errc::conflict);
  EXPECT_EQ(standby->promote_to(journal + 1, {wrong}, {"h-out"}, host_state, "h-state").error().code,
            Errc::unavailable);
  StreamPtr host_out = hidden("h-out", 10, kOutSchema, out_next);
  Status promoted = standby->promote_to(journal, {host_out}, {"h-out"}, host_state, "h-state");
  ASSERT_TRUE(promoted.ok()) << promoted.error().message;
  EXPECT_EQ(standby->journal_next(), journal);
  EXPECT_EQ(standby->meta().outputs, std::vector<std::string>{"h-out"});
  EXPECT_EQ(standby->meta().state_stream, "h-state");
  runner_ = standby;
  runner_->start();
  publish(rows(0, 1, 4 * kHourMs));  // closes the second window: 250 keys
  ASSERT_TRUE(eventually([&] { return host_out->committed_next() == out_next + 250; })) << host_out->committed_next();
  // The owner's streams got nothing more: the journal goes on in the
  // host's state stream, from the owner's next number.
  flush();
  EXPECT_EQ(out_->committed_next(), out_next);
  EXPECT_EQ(state_->next_seq(), state_next);
  EXPECT_GT(host_state->committed_next(), state_next);
  std::vector<store::LogRecord> recs;
  ASSERT_TRUE(store::StreamLog::read(*store_, host_state->meta().id, 0, 10, 1u << 20, recs).ok());
  ASSERT_FALSE(recs.empty());
  EXPECT_EQ(recs.front().first, state_next);
}

TEST_F(QueryStateStream, AStandbyWhoseCopyWasTrimmedPastWhatItReadCannotGoOn) {
  gate_.open();
  ASSERT_TRUE(start_runner().ok());
  publish(rows(0, 100, 1000));
  ASSERT_TRUE(eventually([&] { return runner_->info().positions[0] == 101; }));
  QueryRunner::Env env{store_.get(), gc_.get(), pool_.get(), nullptr, gate_.fn()};
  auto made = QueryRunner::create(runner_->meta(), {in_}, {out_}, env, state_);
  ASSERT_TRUE(made.ok());
  std::shared_ptr<QueryRunner> standby = *made;
  standby->begin_warm();
  ASSERT_TRUE(standby->warm().ok());
  // More journal, a checkpoint, and the copy trimmed to it before the
  // standby read what came between.
  publish(rows(100, 100, 1000));
  ASSERT_TRUE(eventually([&] { return runner_->info().positions[0] == 201; }));
  ASSERT_TRUE(runner_->drain_and_checkpoint().ok());
  flush();
  ASSERT_TRUE(store::StreamLog::erase_before(*store_, state_->meta().id, runner_->state_trim_before()).ok());
  auto w = standby->warm();
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().code, Errc::conflict);
  EXPECT_NE(w.error().message.find("trimmed"), std::string::npos) << w.error().message;
  // A runner that is not a standby is not promoted.
  EXPECT_EQ(runner_->promote({in_}, {out_}, state_).error().code, Errc::conflict);
}

}  // namespace
}  // namespace entente::broker::detail
