// GroupCommit against a real RocksDB: ordering, bounds, draining on stop and
// failure propagation. Also run under ThreadSanitizer.

#include "tests/store/temp_store.h"
#include "store/group_commit.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace entente::store {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class GroupCommitTest : public testing::TempStoreTest {
 protected:

  static WriteBatch batch_of(std::string_view key, size_t value_bytes) {
    WriteBatch b;
    b.put(Cf::meta, key, std::string(value_bytes, 'v'));
    return b;
  }

};

// Many threads submit concurrently; each thread's callbacks arrive in its
// submission order and everything is there after a reopen.
TEST_F(GroupCommitTest, ConcurrentSubmittersSeeTheirOrderAndDataIsDurable) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 200;
  GroupCommitOptions opts;
  opts.max_pending_bytes = 64 * 1024;  // small: submitters wait, groups form
  GroupCommit gc(*store_, opts);
  gc.start();

  // Written only by the committer thread; read after stop() joined it.
  std::vector<std::vector<int>> acked(kThreads);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        WriteBatch b;
        const std::string key = "t" + std::to_string(t) + "/" + std::to_string(i);
        b.put(Cf::log, key, std::string(100 + i, 'x'));
        b.put(Cf::meta, "last/" + std::to_string(t), std::to_string(i));
        const Status s = gc.submit(
            std::move(b),
            [&acked, &failures, t, i](const Status& st) {
              if (!st.ok()) failures.fetch_add(1);
              acked[t].push_back(i);
            },
            Admission::wait);
        if (!s.ok()) failures.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  gc.stop();

  EXPECT_EQ(failures.load(), 0);
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(acked[t].size(), static_cast<size_t>(kPerThread));
    for (int i = 0; i < kPerThread; ++i) ASSERT_EQ(acked[t][i], i) << "thread " << t;
  }
  const GroupCommitStats st = gc.stats();
  EXPECT_EQ(st.batches, static_cast<uint64_t>(kThreads * kPerThread));
  EXPECT_EQ(st.pending_bytes, 0u);
  EXPECT_GE(st.groups, 1u);
  EXPECT_LE(st.groups, st.batches);
  EXPECT_GT(st.bytes, static_cast<uint64_t>(kThreads * kPerThread * 100));
  EXPECT_GE(st.total_write_ns, st.last_group_ns);
  EXPECT_EQ(store_->stats().wal_syncs, st.groups);  // one fsync per group

  reopen();
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      const auto v = store_->get(Cf::log, "t" + std::to_string(t) + "/" + std::to_string(i));
      ASSERT_TRUE(v.ok() && v->has_value()) << t << "/" << i;
      EXPECT_EQ((*v)->size(), static_cast<size_t>(100 + i));
    }
    // Batches applied in submission order: the last one wins.
    EXPECT_EQ(store_->get(Cf::meta, "last/" + std::to_string(t)).value(),
              std::to_string(kPerThread - 1));
  }
}

// A batch may ask for another durability than the group commit's: alone it
// is written as it asked, and a group holding one synced batch is synced.
TEST_F(GroupCommitTest, ABatchChoosesItsDurabilityAndOneSyncedBatchSyncsItsGroup) {
  GroupCommitOptions opts;
  opts.durability = Durability::synced;
  GroupCommit gc(*store_, opts);
  gc.start();
  auto write = [&](std::string_view key, std::optional<Durability> d) {
    std::promise<Status> done;
    auto f = done.get_future();
    EXPECT_TRUE(gc.submit(batch_of(key, 10), [&done](const Status& st) { done.set_value(st); },
                          Admission::wait, d)
                    .ok());
    EXPECT_TRUE(f.get().ok());
  };
  write("a", Durability::buffered);
  write("b", Durability::buffered);
  EXPECT_EQ(gc.stats().groups, 2u);
  EXPECT_EQ(gc.stats().synced_groups, 0u);
  write("c", std::nullopt);  // the options': synced
  EXPECT_EQ(gc.stats().synced_groups, 1u);
  gc.stop();

  // Submitted together before the committer runs: one group, synced.
  GroupCommitOptions buffered;
  buffered.durability = Durability::buffered;
  GroupCommit mixed(*store_, buffered);
  std::atomic<int> ok{0};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(mixed
                    .submit(batch_of("m" + std::to_string(i), 10), [&ok](const Status& st) { ok += st.ok(); },
                            Admission::wait, i == 1 ? std::optional(Durability::synced) : std::nullopt)
                    .ok());
  }
  mixed.start();
  mixed.stop();
  EXPECT_EQ(ok.load(), 3);
  EXPECT_EQ(mixed.stats().groups, 1u);
  EXPECT_EQ(mixed.stats().synced_groups, 1u);
}

TEST_F(GroupCommitTest, RejectsWhenTheQueueIsFull) {
  GroupCommitOptions opts;
  opts.max_pending_bytes = 1000;
  GroupCommit gc(*store_, opts);
  // Not started yet: what is submitted stays queued, so the bound is reached
  // deterministically.
  std::vector<int> done;
  ASSERT_TRUE(gc.submit(batch_of("a", 600), [&](const Status& s) {
                  EXPECT_TRUE(s.ok());
                  done.push_back(1);
                }).ok());
  const size_t queued = gc.stats().pending_bytes;
  EXPECT_GE(queued, 600u);
  const Status full = gc.submit(batch_of("b", 600), [&](const Status&) { done.push_back(2); });
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().code, Errc::unavailable);
  EXPECT_EQ(full.error().message, "ingest queue full (" + std::to_string(queued) +
                                      " bytes queued, limit 1000)");
  EXPECT_EQ(gc.stats().rejected, 1u);
  // A small one still fits.
  ASSERT_TRUE(gc.submit(batch_of("c", 10), [&](const Status&) { done.push_back(3); }).ok());

  gc.start();
  gc.stop();
  EXPECT_EQ(done, (std::vector<int>{1, 3}));  // the rejected callback never runs
  EXPECT_TRUE(store_->get(Cf::meta, "a").value().has_value());
  EXPECT_FALSE(store_->get(Cf::meta, "b").value().has_value());
  EXPECT_TRUE(store_->get(Cf::meta, "c").value().has_value());
  EXPECT_EQ(gc.stats().pending_bytes, 0u);
}

TEST_F(GroupCommitTest, BatchLargerThanTheBoundIsAdmittedWhenTheQueueIsEmpty) {
  GroupCommitOptions opts;
  opts.max_pending_bytes = 100;
  opts.max_group_bytes = 100;
  GroupCommit gc(*store_, opts);
  std::promise<Status> acked;
  ASSERT_TRUE(gc.submit(batch_of("huge", 10'000), [&](const Status& s) { acked.set_value(s); }).ok());
  gc.start();
  EXPECT_TRUE(acked.get_future().get().ok());
  EXPECT_EQ(store_->get(Cf::meta, "huge").value()->size(), 10'000u);
}

TEST_F(GroupCommitTest, WaitAdmissionBlocksUntilThereIsRoom) {
  GroupCommitOptions opts;
  opts.max_pending_bytes = 1000;
  GroupCommit gc(*store_, opts);
  ASSERT_TRUE(gc.submit(batch_of("first", 800), nullptr).ok());

  std::atomic<bool> returned{false};
  std::atomic<bool> second_acked{false};
  std::thread waiter([&] {
    const Status s = gc.submit(
        batch_of("second", 800), [&](const Status& st) { second_acked = st.ok(); },
        Admission::wait);
    EXPECT_TRUE(s.ok());
    returned = true;
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(returned.load()) << "submit(wait) returned while the queue was full";
  gc.start();  // the committer writes "first", which makes room
  waiter.join();
  EXPECT_TRUE(returned.load());
  gc.stop();
  EXPECT_TRUE(second_acked.load());
  EXPECT_TRUE(store_->get(Cf::meta, "second").value().has_value());
  EXPECT_EQ(gc.stats().rejected, 0u);
}

TEST_F(GroupCommitTest, StopWakesWaitersWithUnavailable) {
  GroupCommitOptions opts;
  opts.max_pending_bytes = 100;
  GroupCommit gc(*store_, opts);
  ASSERT_TRUE(gc.submit(batch_of("queued", 200), nullptr).ok());
  std::promise<Status> result;
  std::thread waiter([&] {
    result.set_value(gc.submit(batch_of("late", 200), nullptr, Admission::wait));
  });
  std::this_thread::sleep_for(50ms);
  gc.stop();  // never started: drains on this thread
  waiter.join();
  const Status s = result.get_future().get();
  // Either it got in before stop (then it was written) or it was refused.
  if (s.ok()) {
    EXPECT_TRUE(store_->get(Cf::meta, "late").value().has_value());
  } else {
    EXPECT_EQ(s.error().code, Errc::unavailable);
    EXPECT_FALSE(store_->get(Cf::meta, "late").value().has_value());
  }
  EXPECT_TRUE(store_->get(Cf::meta, "queued").value().has_value());
}

TEST_F(GroupCommitTest, StopDrainsEverythingQueuedAndRefusesMore) {
  GroupCommit gc(*store_, GroupCommitOptions{});
  gc.start();
  std::atomic<int> acked{0};
  for (int i = 0; i < 500; ++i) {
    ASSERT_TRUE(gc.submit(batch_of("k" + std::to_string(i), 50), [&](const Status& s) {
                    if (s.ok()) acked.fetch_add(1);
                  }).ok());
  }
  gc.stop();
  EXPECT_EQ(acked.load(), 500);
  EXPECT_EQ(gc.stats().pending_bytes, 0u);
  for (int i = 0; i < 500; ++i) {
    ASSERT_TRUE(store_->get(Cf::meta, "k" + std::to_string(i)).value().has_value()) << i;
  }

  bool called = false;
  const Status s = gc.submit(batch_of("after", 1), [&](const Status&) { called = true; });
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::unavailable);
  gc.stop();  // idempotent
  EXPECT_FALSE(called);
  EXPECT_FALSE(store_->get(Cf::meta, "after").value().has_value());
}

TEST_F(GroupCommitTest, DestructorDrainsWhatIsQueued) {
  std::atomic<int> acked{0};
  {
    GroupCommit gc(*store_, GroupCommitOptions{});
    gc.start();
    for (int i = 0; i < 50; ++i) {
      ASSERT_TRUE(gc.submit(batch_of("d" + std::to_string(i), 10),
                            [&](const Status& s) { acked += s.ok(); }).ok());
    }
  }
  EXPECT_EQ(acked.load(), 50);
}

TEST_F(GroupCommitTest, AFailedWriteFailsEveryCallbackOfItsGroup) {
  GroupCommitOptions opts;
  opts.durability = Durability::buffered;
  GroupCommit gc(*store_, opts);
  // Queued before start, so the three form one group.
  std::vector<Status> results;
  ASSERT_TRUE(gc.submit(batch_of("good1", 10), [&](const Status& s) { results.push_back(s); }).ok());
  WriteBatch bad;
  bad.erase_range(Cf::log, "z", "a");
  ASSERT_TRUE(gc.submit(std::move(bad), [&](const Status& s) { results.push_back(s); }).ok());
  ASSERT_TRUE(gc.submit(batch_of("good2", 10), [&](const Status& s) { results.push_back(s); }).ok());
  gc.start();
  gc.stop();
  ASSERT_EQ(results.size(), 3u);
  for (const Status& s : results) {
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code, Errc::invalid_argument);
  }
  EXPECT_FALSE(store_->get(Cf::meta, "good1").value().has_value());
  const GroupCommitStats st = gc.stats();
  EXPECT_EQ(st.groups, 1u);
  EXPECT_EQ(st.batches, 0u);
  EXPECT_EQ(store_->stats().wal_syncs, 0u);
}

TEST_F(GroupCommitTest, GroupsRespectMaxGroupBytes) {
  GroupCommitOptions opts;
  opts.max_group_bytes = 2500;
  GroupCommit gc(*store_, opts);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(gc.submit(batch_of("g" + std::to_string(i), 1000), nullptr).ok());
  }
  gc.start();
  gc.stop();
  // ~1010 bytes each, at most two per group: five groups.
  const GroupCommitStats st = gc.stats();
  EXPECT_EQ(st.groups, 5u);
  EXPECT_EQ(st.batches, 10u);
  EXPECT_EQ(store_->stats().wal_syncs, 5u);
}

TEST_F(GroupCommitTest, CallbackMaySubmitWithReject) {
  GroupCommit gc(*store_, GroupCommitOptions{});
  gc.start();
  std::promise<Status> chained;
  ASSERT_TRUE(gc.submit(batch_of("one", 10), [&](const Status&) {
                  const Status s = gc.submit(batch_of("two", 10), [&](const Status& st) {
                    chained.set_value(st);
                  });
                  EXPECT_TRUE(s.ok());
                }).ok());
  EXPECT_TRUE(chained.get_future().get().ok());
  gc.stop();
  EXPECT_TRUE(store_->get(Cf::meta, "two").value().has_value());
}

}  // namespace
}  // namespace entente::store
