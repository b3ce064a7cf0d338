// A stream's memory of its producers (Stream::recall / append_once) over a
// real RocksDB store and group commit: a named batch is stored once however
// many threads send it at the same time, retries while it is being written
// get its answer, the window forgets the oldest numbers, and the memory read
// back from the store after a reopen answers as before. Concurrent: run
// under TSan too (scripts/test.sh).
//
// And its two heads (StreamVisibility): what the log holds (committed_next,
// followed by durable taps) and what readers see (visible_next, followed by
// ordinary taps), which waits for the bound the replication code sets and
// releases the waiting records in order, without gaps, from whichever
// thread moves the bound.
#include "broker/detail/streams.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/batch.h"
#include "store/group_commit.h"
#include "store/store.h"
#include "store/stream_log.h"
#include "tests/support/temp_dir.h"

namespace entente::broker::detail {
namespace {

const engine::SchemaPtr kSchema = engine::make_schema({{"k", engine::Type::Int64}});

engine::Batch rows(int n) {
  engine::BatchBuilder b(kSchema);
  for (int i = 0; i < n; ++i) {
    b.column(0).ints.push_back(i);
    b.event_time().push_back(0);
    b.seq().push_back(0);
  }
  return b.finish();
}

// What `done` was told, once it has been told.
struct Outcome {
  std::mutex mu;
  std::condition_variable cv;
  bool called = false;
  Status status;
  Appended appended;
  Stream::AppendedDone done() {
    return [this](const Status& s, const Appended& a) {
      std::lock_guard lock(mu);
      called = true;
      status = s;
      appended = a;
      cv.notify_all();
    };
  }
  bool wait() {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(20), [&] { return called; });
  }
};

class StreamProducers : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = entente::testing::make_temp_dir("streams-test");
    open();
  }
  void TearDown() override {
    close();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  void open() {
    store::StoreOptions o;
    o.path = dir_ + "/db";
    auto s = store::Store::open(o);
    ASSERT_TRUE(s.ok()) << s.error().message;
    store_ = std::move(s).value();
    // Not synced: the reopens here are clean, and a thousand fsyncs would
    // only make the test slow.
    store::GroupCommitOptions gco;
    gco.durability = store::Durability::buffered;
    gc_ = std::make_unique<store::GroupCommit>(*store_, gco);
    gc_->start();
    StreamMeta m;
    m.name = "feed";
    m.id.value = 7;
    m.schema = kSchema;
    m.producer = "api";
    auto last = store::StreamLog::last(*store_, m.id);
    ASSERT_TRUE(last.ok());
    stream_ = std::make_shared<Stream>(m, *last ? (*last)->last + 1 : 1);
    std::vector<store::StreamLog::ProducerBatch> entries;
    ASSERT_TRUE(store::StreamLog::producer_batches(*store_, m.id, entries).ok());
    stream_->load_producers(std::move(entries));
  }
  void close() {
    stream_.reset();
    if (gc_) gc_->stop();
    gc_.reset();
    store_.reset();
  }
  // Appends (or recalls) batch `seq` of `producer` and waits for the answer.
  Outcome& send(const std::string& producer, uint64_t seq, int n) {
    outcomes_.push_back(std::make_unique<Outcome>());
    Outcome& o = *outcomes_.back();
    Status s = stream_->append_once(rows(n), ProducerTag{producer, seq}, *gc_, store::Admission::reject, o.done());
    EXPECT_TRUE(s.ok()) << s.error().message;
    EXPECT_TRUE(o.wait());
    return o;
  }

  std::string dir_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<store::GroupCommit> gc_;
  StreamPtr stream_;
  std::vector<std::unique_ptr<Outcome>> outcomes_;
};

TEST_F(StreamProducers, ABatchSentAgainIsAnsweredWithItsFirstNumbers) {
  Outcome& a = send("p", 1, 3);
  ASSERT_TRUE(a.status.ok());
  EXPECT_EQ(a.appended.first, 1u);
  EXPECT_EQ(a.appended.last, 3u);
  EXPECT_FALSE(a.appended.duplicate);
  Outcome& again = send("p", 1, 5);  // the body is not compared
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(again.appended.first, 1u);
  EXPECT_EQ(again.appended.last, 3u);
  EXPECT_TRUE(again.appended.duplicate);
  EXPECT_EQ(stream_->next_seq(), 4u);

  // recall() alone knows it too, and knows nothing of a new number.
  Outcome r;
  auto done = r.done();
  EXPECT_TRUE(stream_->recall(ProducerTag{"p", 1}, done));
  EXPECT_TRUE(r.wait());
  EXPECT_TRUE(r.appended.duplicate);
  Outcome fresh;
  auto fresh_done = fresh.done();
  EXPECT_FALSE(stream_->recall(ProducerTag{"p", 2}, fresh_done));
  EXPECT_FALSE(stream_->recall(ProducerTag{"q", 1}, fresh_done));
  EXPECT_FALSE(fresh.called);
}

TEST_F(StreamProducers, ConcurrentSendsOfTheSameBatchesStoreEachOnce) {
  constexpr int kThreads = 6, kBatches = 40;
  std::vector<std::thread> threads;
  std::vector<std::vector<std::unique_ptr<Outcome>>> got(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int seq = 1; seq <= kBatches; ++seq) {
        auto o = std::make_unique<Outcome>();
        // Half the threads look the batch up first, as ingest does.
        auto done = o->done();
        if (t % 2 == 1 && stream_->recall(ProducerTag{"p", static_cast<uint64_t>(seq)}, done)) {
          got[t].push_back(std::move(o));
          continue;
        }
        Status s = stream_->append_once(rows(2), ProducerTag{"p", static_cast<uint64_t>(seq)}, *gc_,
                                        store::Admission::reject, done);
        EXPECT_TRUE(s.ok()) << s.error().message;
        got[t].push_back(std::move(o));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int seq = 1; seq <= kBatches; ++seq) {
    int fresh = 0;
    uint64_t first = 0;
    for (int t = 0; t < kThreads; ++t) {
      Outcome& o = *got[t][seq - 1];
      ASSERT_TRUE(o.wait());
      ASSERT_TRUE(o.status.ok()) << o.status.error().message;
      if (first == 0) first = o.appended.first;
      EXPECT_EQ(o.appended.first, first) << "batch " << seq;
      fresh += o.appended.duplicate ? 0 : 1;
    }
    EXPECT_EQ(fresh, 1) << "batch " << seq;
  }
  EXPECT_EQ(stream_->next_seq(), 1u + 2u * kBatches);
}

TEST_F(StreamProducers, TheWindowForgetsTheOldestAndTheMemorySurvivesAReopen) {
  const uint64_t n = Stream::kProducerWindow + 6;
  for (uint64_t seq = 1; seq <= n; ++seq) ASSERT_TRUE(send("p", seq, 1).status.ok());
  Outcome& old = send("p", 6, 1);
  EXPECT_EQ(old.status.error().code, Errc::conflict);
  EXPECT_NE(old.status.error().message.find("no longer remembers batch 6"), std::string::npos)
      << old.status.error().message;
  EXPECT_TRUE(send("p", 7, 1).appended.duplicate);
  ASSERT_TRUE(send("q", 1, 2).status.ok());

  close();
  open();
  EXPECT_EQ(stream_->producer_count(), 2u);
  EXPECT_EQ(send("p", 6, 1).status.error().code, Errc::conflict);
  Outcome& seven = send("p", 7, 1);
  EXPECT_TRUE(seven.appended.duplicate);
  EXPECT_EQ(seven.appended.first, 7u);
  Outcome& q = send("q", 1, 2);
  EXPECT_TRUE(q.appended.duplicate);
  EXPECT_EQ(q.appended.first, n + 1);
  // A gap, then the skipped number: both new.
  EXPECT_FALSE(send("p", n + 10, 1).appended.duplicate);
  EXPECT_FALSE(send("p", n + 5, 1).appended.duplicate);
  EXPECT_EQ(stream_->next_seq(), n + 5);
}

TEST_F(StreamProducers, TheLeastRecentlyUsedProducerIsForgottenBeyondTheBound) {
  for (size_t i = 0; i < Stream::kMaxProducers; ++i) ASSERT_TRUE(send("p" + std::to_string(i), 1, 1).status.ok());
  EXPECT_EQ(stream_->producer_count(), Stream::kMaxProducers);
  EXPECT_TRUE(send("p0", 1, 1).appended.duplicate);  // p0 is now the most recent; p1 the least
  ASSERT_TRUE(send("new", 1, 1).status.ok());
  EXPECT_EQ(stream_->producer_count(), Stream::kMaxProducers);
  EXPECT_FALSE(send("p1", 1, 1).appended.duplicate);  // forgotten: new again
  EXPECT_TRUE(send("p0", 1, 1).appended.duplicate);
  close();
  open();
  // p2 was forgotten when p1 came back; the store agrees with memory.
  EXPECT_FALSE(send("p2", 1, 1).appended.duplicate);
  EXPECT_TRUE(send("new", 1, 1).appended.duplicate);
}

// A follower's copy of the stream (docs/cluster.md, "Replicated stream
// logs") appends the leader's records with append_at_named: it remembers
// the named batches as the leader does (window and floor included), answers
// a retry as the leader would, and after a reopen reads the same from the
// store, under its own stream id.
TEST_F(StreamProducers, ACopyRemembersTheLeadersNamedBatchesAsTheLeaderDoes) {
  StreamMeta m;
  m.name = "@n1/feed";
  m.id.value = 8;
  m.schema = kSchema;
  m.producer = "import";
  auto copy = std::make_shared<Stream>(m, 1);
  // Appends to the copy what the leader stored as first..last, with the
  // names the leader gives for that range; waits until it is durable.
  auto mirror = [&](uint64_t first, uint64_t last) {
    std::vector<NamedRecord> named;
    stream_->named_batches(first, last, named);
    std::mutex mu;
    std::condition_variable cv;
    std::optional<Status> result;
    Status s =
        copy->append_at_named(first, rows(static_cast<int>(last - first + 1)), *gc_, store::Admission::reject,
                              store::WriteBatch(), std::move(named), [&](const Status& st, const RecordPtr&) {
                                std::lock_guard lock(mu);
                                result = st;
                                cv.notify_all();
                              });
    ASSERT_TRUE(s.ok()) << s.error().message;
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return result.has_value(); }));
    ASSERT_TRUE(result->ok()) << result->error().message;
  };
  const uint64_t n = Stream::kProducerWindow + 6;
  for (uint64_t seq = 1; seq <= n; ++seq) {
    Outcome& o = send("p", seq, 1);
    ASSERT_TRUE(o.status.ok());
    mirror(o.appended.first, o.appended.last);
  }
  Outcome& q = send("q", 1, 3);
  mirror(q.appended.first, q.appended.last);
  const uint64_t head = stream_->next_seq();
  ASSERT_EQ(copy->next_seq(), head);

  // The same memory: every remembered batch, its numbers and its floor.
  auto names = [](const StreamPtr& s, uint64_t head) {
    std::vector<NamedRecord> out;
    s->named_batches(1, head - 1, out);
    std::vector<std::tuple<std::string, uint64_t, uint64_t, uint64_t, uint64_t>> flat;
    for (const auto& r : out) flat.emplace_back(r.tag.id, r.tag.seq, r.first, r.last, r.floor);
    return flat;
  };
  const auto leader = names(stream_, head);
  ASSERT_EQ(leader.size(), Stream::kProducerWindow + 1);
  EXPECT_EQ(std::get<4>(leader.front()), 6u);  // p forgot 1..6
  EXPECT_EQ(names(copy, head), leader);
  EXPECT_EQ(copy->producer_count(), 2u);

  // The copy answers retries as the leader would.
  auto recall = [](const StreamPtr& s, const std::string& producer, uint64_t seq) {
    auto o = std::make_shared<Outcome>();
    auto done = o->done();
    const bool known = s->recall(ProducerTag{producer, seq}, done);
    if (known) {
      EXPECT_TRUE(o->wait());
    }
    return std::make_pair(known, o);
  };
  auto check = [&](const StreamPtr& s) {
    auto [seven, o7] = recall(s, "p", 7);
    ASSERT_TRUE(seven);
    EXPECT_TRUE(o7->appended.duplicate);
    EXPECT_EQ(o7->appended.first, 7u);
    auto [six, o6] = recall(s, "p", 6);  // out of the window: refused, not stored again
    ASSERT_TRUE(six);
    EXPECT_EQ(o6->status.error().code, Errc::conflict);
    auto [qq, oq] = recall(s, "q", 1);
    ASSERT_TRUE(qq);
    EXPECT_EQ(oq->appended.first, n + 1);
    EXPECT_EQ(oq->appended.last, n + 3);
    EXPECT_FALSE(recall(s, "p", n + 1).first);  // a new batch
  };
  check(copy);

  // Reopened: the store holds the copy's memory under its own id.
  copy.reset();
  close();
  open();
  std::vector<store::StreamLog::ProducerBatch> entries;
  ASSERT_TRUE(store::StreamLog::producer_batches(*store_, m.id, entries).ok());
  copy = std::make_shared<Stream>(m, head);
  copy->load_producers(std::move(entries));
  EXPECT_EQ(copy->producer_count(), 2u);
  EXPECT_EQ(names(copy, head), names(stream_, head));
  check(copy);
}

// Remembers the records a tap was given, and whether they came in order
// without a gap.
class SeenTap final : public Tap {
 public:
  void on_record(const RecordPtr& r) override {
    std::lock_guard lock(mu_);
    if (next_ != 0 && r->first != next_) gap_ = true;
    next_ = r->last + 1;
    records_.emplace_back(r->first, r->last);
  }
  void on_stream_closed() override {}
  std::vector<std::pair<uint64_t, uint64_t>> records() {
    std::lock_guard lock(mu_);
    return records_;
  }
  bool gap() {
    std::lock_guard lock(mu_);
    return gap_;
  }
  uint64_t next() {
    std::lock_guard lock(mu_);
    return next_;
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<uint64_t, uint64_t>> records_;
  uint64_t next_ = 0;
  bool gap_ = false;
};

class StreamVisibility : public StreamProducers {
 protected:
  // Appends n rows and waits until they are durable.
  void append(int n) {
    Outcome o;
    auto done = o.done();
    Status s = stream_->append(rows(n), *gc_, store::Admission::wait, store::WriteBatch(),
                               [done](const Status& st, const RecordPtr& r) {
                                 done(st, r ? Appended{r->first, r->last, false} : Appended{});
                               });
    ASSERT_TRUE(s.ok()) << s.error().message;
    ASSERT_TRUE(o.wait());
    ASSERT_TRUE(o.status.ok());
  }
  using Seen = std::vector<std::pair<uint64_t, uint64_t>>;
};

TEST_F(StreamVisibility, WithoutABoundARecordIsVisibleOnceDurable) {
  auto readers = std::make_shared<SeenTap>();
  auto copier = std::make_shared<SeenTap>();
  EXPECT_EQ(stream_->add_tap(readers), 1u);
  EXPECT_EQ(stream_->add_tap(copier, TapHead::durable), 1u);
  append(3);
  EXPECT_EQ(stream_->committed_next(), 4u);
  EXPECT_EQ(stream_->visible_next(), 4u);
  EXPECT_EQ(readers->records(), (Seen{{1, 3}}));
  EXPECT_EQ(copier->records(), (Seen{{1, 3}}));
  EXPECT_FALSE(stream_->hidden_wait());
}

TEST_F(StreamVisibility, BoundedRecordsWaitAndAreReleasedInOrderAsTheBoundMoves) {
  auto readers = std::make_shared<SeenTap>();
  auto copier = std::make_shared<SeenTap>();
  stream_->add_tap(readers);
  stream_->add_tap(copier, TapHead::durable);
  // An in-sync follower holds nothing yet.
  ASSERT_TRUE(stream_->set_visible_bound(1));
  append(2);  // 1-2
  append(2);  // 3-4
  append(2);  // 5-6
  EXPECT_EQ(copier->records(), (Seen{{1, 2}, {3, 4}, {5, 6}})) << "the followers' copy must not wait";
  EXPECT_TRUE(readers->records().empty()) << "visible before the follower holds it";
  EXPECT_EQ(stream_->committed_next(), 7u);
  EXPECT_EQ(stream_->visible_next(), 1u);
  auto wait = stream_->hidden_wait();
  ASSERT_TRUE(wait);
  EXPECT_EQ(wait->through, 2u);
  // A reader starting now starts at what is visible.
  auto late = std::make_shared<SeenTap>();
  EXPECT_EQ(stream_->add_tap(late), 1u);

  // The follower holds 1..3: the first record only (3-4 is not whole).
  ASSERT_TRUE(stream_->set_visible_bound(4));
  EXPECT_EQ(readers->records(), (Seen{{1, 2}}));
  EXPECT_EQ(stream_->visible_next(), 3u);
  EXPECT_EQ(stream_->hidden_wait()->through, 4u);
  // A lower bound (a follower joins) hides nothing already visible.
  ASSERT_TRUE(stream_->set_visible_bound(2));
  EXPECT_EQ(stream_->visible_next(), 3u);
  append(1);  // 7: waits too
  EXPECT_EQ(readers->records().size(), 1u);
  // No follower in sync any more: everything durable, then each new record at once.
  ASSERT_TRUE(stream_->set_visible_bound(Stream::kNoBound));
  EXPECT_EQ(readers->records(), (Seen{{1, 2}, {3, 4}, {5, 6}, {7, 7}}));
  EXPECT_EQ(late->records(), readers->records());
  EXPECT_EQ(stream_->visible_next(), 8u);
  EXPECT_FALSE(stream_->hidden_wait());
  append(1);
  EXPECT_EQ(readers->records().back(), (std::pair<uint64_t, uint64_t>{8, 8}));
  EXPECT_EQ(stream_->visible_next(), 9u);
  EXPECT_FALSE(readers->gap());
  EXPECT_FALSE(copier->gap());
}

TEST_F(StreamVisibility, RecordsHiddenBeforeARestartAreReleasedFromTheLog) {
  append(2);  // 1-2
  append(2);  // 3-4
  append(2);  // 5-6
  close();
  open();
  // The followers had acknowledged 1..2 when the node stopped.
  stream_->hold_from(3);
  EXPECT_EQ(stream_->visible_next(), 3u);
  EXPECT_EQ(stream_->committed_next(), 7u);
  auto readers = std::make_shared<SeenTap>();
  EXPECT_EQ(stream_->add_tap(readers), 3u);
  ASSERT_TRUE(stream_->hidden_wait());
  EXPECT_EQ(stream_->hidden_wait()->through, 3u);
  append(1);  // 7, after the restart
  EXPECT_TRUE(readers->records().empty());
  // Without the store the log cannot be read: nothing moves yet.
  EXPECT_FALSE(stream_->set_visible_bound(6));
  EXPECT_EQ(stream_->visible_next(), 3u);
  EXPECT_TRUE(stream_->set_visible_bound(6, store_.get()));
  EXPECT_EQ(readers->records(), (Seen{{3, 4}}));
  EXPECT_EQ(stream_->visible_next(), 5u);
  EXPECT_TRUE(stream_->set_visible_bound(Stream::kNoBound, store_.get()));
  EXPECT_EQ(readers->records(), (Seen{{3, 4}, {5, 6}, {7, 7}}));
  EXPECT_EQ(stream_->visible_next(), 8u);
  EXPECT_FALSE(stream_->hidden_wait());
  EXPECT_FALSE(readers->gap());
}

// The committer appends while another thread moves the bound up step by
// step (acknowledgements), then drops it: every record reaches the reader
// once, in order, and never before the bound let it.
TEST_F(StreamVisibility, ConcurrentAppendsAndBoundsDeliverInOrderWithoutGaps) {
  constexpr int kRecords = 300;
  auto readers = std::make_shared<SeenTap>();
  stream_->add_tap(readers);
  ASSERT_TRUE(stream_->set_visible_bound(1));
  std::atomic<bool> done{false};
  std::atomic<bool> early{false};
  std::thread acker([&] {
    uint64_t bound = 1;
    while (!done.load()) {
      bound = std::max(bound, stream_->committed_next() - 1);  // a follower one tuple behind
      ASSERT_TRUE(stream_->set_visible_bound(bound));
      if (stream_->visible_next() > bound) early = true;
      std::this_thread::yield();
    }
  });
  for (int i = 0; i < kRecords; ++i) {
    append(1);
    if (HasFatalFailure()) break;
  }
  done = true;
  acker.join();
  EXPECT_FALSE(early.load());
  ASSERT_TRUE(stream_->set_visible_bound(Stream::kNoBound));
  EXPECT_EQ(readers->records().size(), static_cast<size_t>(kRecords));
  EXPECT_EQ(readers->next(), static_cast<uint64_t>(kRecords) + 1);
  EXPECT_FALSE(readers->gap());
}

}  // namespace
}  // namespace entente::broker::detail
