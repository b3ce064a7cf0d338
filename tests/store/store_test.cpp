// Store against a real RocksDB in a temporary directory.

#include "store/store.h"
#include "tests/store/temp_store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace entente::store {
namespace {

namespace fs = std::filesystem;

using testing::make_temp_dir;

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir("store-test"); }
  void TearDown() override {
    store_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  StoreOptions options() const {
    StoreOptions o;
    o.path = dir_ + "/db";
    o.write_buffer_bytes = 4u << 20;
    o.block_cache_bytes = 8u << 20;
    return o;
  }

  Store& open() {
    store_.reset();
    auto s = Store::open(options());
    EXPECT_TRUE(s.ok()) << s.error().message;
    store_ = std::move(s.value());
    return *store_;
  }

  std::optional<std::string> get(Cf cf, std::string_view key) {
    auto r = store_->get(cf, key);
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r.ok() ? *r : std::nullopt;
  }

  std::vector<std::pair<std::string, std::string>> scan(Cf cf, std::string_view prefix,
                                                        std::string_view start = {},
                                                        size_t limit = 1000) {
    std::vector<std::pair<std::string, std::string>> out;
    const Status s = store_->scan(
        cf, prefix,
        [&](std::string_view k, std::string_view v) {
          out.emplace_back(std::string(k), std::string(v));
          return out.size() < limit;
        },
        start);
    EXPECT_TRUE(s.ok()) << s.error().message;
    return out;
  }

  std::string dir_;
  std::unique_ptr<Store> store_;
};

using Kv = std::pair<std::string, std::string>;
using Kvs = std::vector<Kv>;

constexpr Cf kAll[] = {Cf::catalog, Cf::contracts, Cf::checkpoints, Cf::log, Cf::meta};

TEST_F(StoreTest, FamilyNamesAreTheEnumeratorNames) {
  EXPECT_EQ(cf_name(Cf::catalog), "catalog");
  EXPECT_EQ(cf_name(Cf::contracts), "contracts");
  EXPECT_EQ(cf_name(Cf::checkpoints), "checkpoints");
  EXPECT_EQ(cf_name(Cf::log), "log");
  EXPECT_EQ(cf_name(Cf::meta), "meta");
}

TEST_F(StoreTest, PutGetEraseAreIsolatedPerFamily) {
  Store& store = open();
  for (Cf cf : kAll) {
    const std::string value = "value of " + std::string(cf_name(cf));
    ASSERT_TRUE(store.put(cf, "key", value, Durability::buffered).ok());
  }
  for (Cf cf : kAll) EXPECT_EQ(get(cf, "key"), "value of " + std::string(cf_name(cf)));
  EXPECT_EQ(get(Cf::catalog, "other"), std::nullopt);

  ASSERT_TRUE(store.erase(Cf::log, "key", Durability::synced).ok());
  EXPECT_EQ(get(Cf::log, "key"), std::nullopt);
  EXPECT_EQ(get(Cf::meta, "key"), "value of meta");
  // Erasing what does not exist is not an error.
  EXPECT_TRUE(store.erase(Cf::log, "never", Durability::buffered).ok());

  // Binary keys and values, including NUL bytes, round-trip.
  const std::string bin_key("\0k\xff", 3);
  const std::string bin_value("\0\1\2\xff", 4);
  ASSERT_TRUE(store.put(Cf::meta, bin_key, bin_value, Durability::buffered).ok());
  EXPECT_EQ(get(Cf::meta, bin_key), bin_value);
  ASSERT_TRUE(store.put(Cf::meta, "empty", "", Durability::buffered).ok());
  EXPECT_EQ(get(Cf::meta, "empty"), std::string());
}

TEST_F(StoreTest, ScanVisitsThePrefixFromStartInOrder) {
  Store& store = open();
  for (const char* k : {"a3", "a1", "b1", "a2", "ab", "0"}) {
    ASSERT_TRUE(store.put(Cf::catalog, k, std::string("v") + k, Durability::buffered).ok());
  }
  EXPECT_EQ(scan(Cf::catalog, "a"), (Kvs{{"a1", "va1"}, {"a2", "va2"}, {"a3", "va3"}, {"ab", "vab"}}));
  EXPECT_EQ(scan(Cf::catalog, "a", "a2"), (Kvs{{"a2", "va2"}, {"a3", "va3"}, {"ab", "vab"}}));
  // A start before the prefix means the prefix; one after it visits nothing.
  EXPECT_EQ(scan(Cf::catalog, "a", "0").size(), 4u);
  EXPECT_TRUE(scan(Cf::catalog, "a", "b").empty());
  // The visitor stops the scan.
  EXPECT_EQ(scan(Cf::catalog, "a", {}, 2), (Kvs{{"a1", "va1"}, {"a2", "va2"}}));
  // Empty prefix: everything.
  EXPECT_EQ(scan(Cf::catalog, "").size(), 6u);
  EXPECT_TRUE(scan(Cf::catalog, "c").empty());
  EXPECT_TRUE(scan(Cf::contracts, "a").empty());
}

TEST_F(StoreTest, ScanHandlesAllOnesPrefix) {
  Store& store = open();
  const std::string ff("\xff\xff", 2);
  ASSERT_TRUE(store.put(Cf::meta, ff + "x", "1", Durability::buffered).ok());
  ASSERT_TRUE(store.put(Cf::meta, ff + "\xff", "2", Durability::buffered).ok());
  ASSERT_TRUE(store.put(Cf::meta, "\xfe", "3", Durability::buffered).ok());
  EXPECT_EQ(scan(Cf::meta, ff), (Kvs{{ff + "x", "1"}, {ff + "\xff", "2"}}));
  auto last = store.seek_for_prev(Cf::meta, ff, ff + "\xff\xff");
  ASSERT_TRUE(last.ok());
  ASSERT_TRUE(last->has_value());
  EXPECT_EQ((*last)->second, "2");
}

TEST_F(StoreTest, SeekForPrevFindsTheLastKeyAtOrBeforeWithinThePrefix) {
  Store& store = open();
  auto key = [](char p, uint64_t n) {
    std::string k(1, p);
    put_key_u64(k, n);
    return k;
  };
  ASSERT_TRUE(store.put(Cf::log, key('p', 1), "p1", Durability::buffered).ok());
  ASSERT_TRUE(store.put(Cf::log, key('p', 5), "p5", Durability::buffered).ok());
  ASSERT_TRUE(store.put(Cf::log, key('q', 0), "q0", Durability::buffered).ok());
  ASSERT_TRUE(store.put(Cf::log, key('o', 9), "o9", Durability::buffered).ok());

  auto at = [&](char p, std::string_view k) -> std::optional<std::string> {
    auto r = store.seek_for_prev(Cf::log, std::string(1, p), k);
    EXPECT_TRUE(r.ok());
    if (!r.ok() || !r->has_value()) return std::nullopt;
    return (*r)->second;
  };
  EXPECT_EQ(at('p', key('p', 3)), "p1");
  EXPECT_EQ(at('p', key('p', 5)), "p5");
  EXPECT_EQ(at('p', key('p', 1000)), "p5");
  EXPECT_EQ(at('p', key('p', 0)), std::nullopt);  // before the first: not o9
  EXPECT_EQ(at('p', "z"), "p5");                  // beyond the prefix: its last key
  EXPECT_EQ(at('p', "a"), std::nullopt);
  EXPECT_EQ(at('r', key('r', 7)), std::nullopt);  // not q0

  auto with_key = store.seek_for_prev(Cf::log, "p", key('p', 4));
  ASSERT_TRUE(with_key.ok() && with_key->has_value());
  EXPECT_EQ((*with_key)->first, key('p', 1));
}

TEST_F(StoreTest, KeyIntegersSortNumerically) {
  std::vector<uint64_t> values = {0, 1, 255, 256, 65535, 1ull << 40, ~0ull};
  std::string prev;
  for (uint64_t v : values) {
    std::string k;
    put_key_u64(k, v);
    ASSERT_EQ(k.size(), 8u);
    EXPECT_EQ(get_key_u64(k), v);
    EXPECT_LT(prev, k);
    prev = k;
  }
}

TEST_F(StoreTest, DataSurvivesCloseAndReopen) {
  {
    Store& store = open();
    ASSERT_TRUE(store.put(Cf::catalog, "stream/bids", "schema", Durability::synced).ok());
    ASSERT_TRUE(store.put(Cf::meta, "node", "n1", Durability::buffered).ok());
    WriteBatch b;
    b.put(Cf::contracts, "c1", "signed");
    b.put(Cf::checkpoints, "box", "state");
    ASSERT_TRUE(store.write(b, Durability::buffered).ok());
    const StoreStats st = store.stats();
    EXPECT_EQ(st.writes, 3u);
    EXPECT_EQ(st.wal_syncs, 1u);
  }
  store_.reset();
  Store& store = open();
  EXPECT_EQ(get(Cf::catalog, "stream/bids"), "schema");
  EXPECT_EQ(get(Cf::meta, "node"), "n1");
  EXPECT_EQ(get(Cf::contracts, "c1"), "signed");
  EXPECT_EQ(store.path(), options().path);
  // Counters are per open.
  EXPECT_EQ(store.stats().writes, 0u);
}

// The child writes synced and dies by SIGKILL without closing the store;
// the parent must find the write. The death test re-executes this binary
// ("threadsafe" style), so the child starts with no RocksDB threads and
// finds the directory through the environment.
TEST(StoreCrashTest, SyncedWriteSurvivesSigkill) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  constexpr const char* kEnv = "ENTENTE_STORE_CRASH_DIR";
  const bool child = getenv(kEnv) != nullptr;
  const std::string dir = child ? std::string(getenv(kEnv)) : make_temp_dir("store-test");
  if (!child) setenv(kEnv, dir.c_str(), 1);
  StoreOptions o;
  o.path = dir + "/db";

  EXPECT_EXIT(
      {
        auto s = Store::open(o);
        if (!s.ok()) _exit(3);
        WriteBatch b;
        b.put(Cf::log, "acked", "tuple");
        b.put(Cf::catalog, "stream", "bids");
        if (!(*s)->write(b, Durability::synced).ok()) _exit(4);
        if (!(*s)->put(Cf::meta, "seq", "42", Durability::synced).ok()) _exit(5);
        raise(SIGKILL);
        _exit(6);
      },
      ::testing::KilledBySignal(SIGKILL), "");

  unsetenv(kEnv);
  {
    auto s = Store::open(o);
    ASSERT_TRUE(s.ok()) << s.error().message;
    EXPECT_EQ((*s)->get(Cf::log, "acked").value(), "tuple");
    EXPECT_EQ((*s)->get(Cf::catalog, "stream").value(), "bids");
    EXPECT_EQ((*s)->get(Cf::meta, "seq").value(), "42");
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST_F(StoreTest, WriteBatchIsAtomicAcrossFamilies) {
  Store& store = open();
  ASSERT_TRUE(store.put(Cf::meta, "old", "x", Durability::buffered).ok());
  WriteBatch b;
  EXPECT_TRUE(b.empty());
  b.put(Cf::catalog, "k", "catalog");
  b.put(Cf::log, "k", "log");
  b.erase(Cf::meta, "old");
  EXPECT_EQ(b.count(), 3u);
  EXPECT_GE(b.bytes(), 3u * 2 + 7 + 3 + 3);
  ASSERT_TRUE(store.write(b, Durability::synced).ok());
  EXPECT_EQ(get(Cf::catalog, "k"), "catalog");
  EXPECT_EQ(get(Cf::log, "k"), "log");
  EXPECT_EQ(get(Cf::meta, "old"), std::nullopt);

  // A batch with one invalid operation applies none of them.
  WriteBatch bad;
  bad.put(Cf::catalog, "k", "changed");
  bad.erase_range(Cf::log, "z", "a");
  const Status s = store.write(bad, Durability::synced);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::invalid_argument);
  EXPECT_NE(s.error().message.find("begin key sorts after the end key"), std::string::npos)
      << s.error().message;
  EXPECT_EQ(get(Cf::catalog, "k"), "catalog");
}

TEST_F(StoreTest, WriteBatchPutInTwoPiecesStoresTheJoinedValue) {
  Store& store = open();
  WriteBatch b;
  const std::string big(300000, 'p');  // larger than a first growth step
  b.put(Cf::log, "joined", "head:", big);
  b.put(Cf::log, "empty-tail", "only", "");
  b.put(Cf::log, "after", "x");
  EXPECT_EQ(b.count(), 3u);
  ASSERT_TRUE(store.write(b, Durability::buffered).ok());
  EXPECT_EQ(get(Cf::log, "joined"), "head:" + big);
  EXPECT_EQ(get(Cf::log, "empty-tail"), "only");
  EXPECT_EQ(get(Cf::log, "after"), "x");
}

TEST_F(StoreTest, WriteBatchAppendMoveAndEraseRange) {
  Store& store = open();
  WriteBatch a;
  for (int i = 0; i < 10; ++i) a.put(Cf::log, "r" + std::to_string(i), std::to_string(i));
  WriteBatch b;
  b.erase_range(Cf::log, "r2", "r5");  // r2, r3, r4
  b.erase_range(Cf::log, "r7", "r7");  // empty range: nothing
  b.put(Cf::meta, "appended", "yes");
  const size_t a_bytes = a.bytes();
  a.append(b);
  EXPECT_EQ(a.count(), 13u);
  EXPECT_EQ(a.bytes(), a_bytes + b.bytes());
  a.append(a);  // appending itself doubles it; harmless for puts and ranges
  EXPECT_EQ(a.count(), 26u);

  WriteBatch moved = std::move(a);
  EXPECT_EQ(moved.count(), 26u);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): documented state
  EXPECT_EQ(a.bytes(), 0u);
  a.put(Cf::meta, "reused", "1");  // a moved-from batch is usable again
  EXPECT_EQ(a.count(), 1u);
  ASSERT_TRUE(store.write(a, Durability::buffered).ok());
  ASSERT_TRUE(store.write(moved, Durability::buffered).ok());

  std::vector<std::string> keys;
  for (const auto& [k, v] : scan(Cf::log, "r")) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"r0", "r1", "r5", "r6", "r7", "r8", "r9"}));
  EXPECT_EQ(get(Cf::meta, "appended"), "yes");
  EXPECT_EQ(get(Cf::meta, "reused"), "1");

  // Writing an empty batch succeeds and changes nothing.
  EXPECT_TRUE(store.write(WriteBatch(), Durability::synced).ok());
}

TEST_F(StoreTest, ApproximateSizeAndStatsGrowWithData) {
  Store& store = open();
  const std::string big(64 * 1024, 'x');
  for (int i = 0; i < 64; ++i) {
    std::string k = "s";
    put_key_u64(k, static_cast<uint64_t>(i));
    ASSERT_TRUE(store.put(Cf::log, k, big + std::to_string(i), Durability::buffered).ok());
  }
  const uint64_t size = store.approximate_size(Cf::log, "s", "t");
  EXPECT_GT(size, 1u << 20);
  EXPECT_EQ(store.approximate_size(Cf::log, "x", "y"), 0u);
  EXPECT_GT(store.stats().live_bytes, 1u << 20);
  EXPECT_EQ(store.stats().writes, 64u);
  EXPECT_EQ(store.stats().wal_syncs, 0u);
}

TEST_F(StoreTest, OpenCreatesMissingParents) {
  StoreOptions o = options();
  o.path = dir_ + "/a/b/c";
  auto s = Store::open(o);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_TRUE(fs::is_directory(o.path));
}

TEST_F(StoreTest, OpenOnARegularFileIsAnIoErrorNamingThePath) {
  const std::string file = dir_ + "/not-a-dir";
  std::ofstream(file) << "hello";
  StoreOptions o = options();
  o.path = file;
  auto s = Store::open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::io_error);
  EXPECT_NE(s.error().message.find(file), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("not a directory"), std::string::npos) << s.error().message;

  o.path = file + "/sub";  // a parent that is a file
  s = Store::open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::io_error);
  EXPECT_NE(s.error().message.find(o.path), std::string::npos) << s.error().message;

  o.path.clear();
  s = Store::open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::invalid_argument);
}

TEST_F(StoreTest, SecondOpenOfAnOpenStoreSaysItIsInUseAndNamesTheLockFile) {
  open();
  auto second = Store::open(options());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code, Errc::unavailable);
  EXPECT_NE(second.error().message.find("store '" + options().path + "' is open already in this process"),
            std::string::npos)
      << second.error().message;
  EXPECT_NE(second.error().message.find("'" + options().path + "/LOCK'"), std::string::npos)
      << second.error().message;
}

// Another process holds the lock file the way RocksDB does (a POSIX write
// lock on LOCK): the error names that process and the file. The child of
// this multi-threaded test makes raw system calls only (no allocation, no
// sanitizer interceptor), then blocks reading a pipe until it is killed.
TEST_F(StoreTest, AStoreLockedByAnotherProcessNamesItsPidAndTheLockFile) {
  open();
  store_.reset();
  const std::string lock_file = options().path + "/LOCK";
  int ready[2], hold[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(hold), 0);
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const long fd = syscall(SYS_openat, AT_FDCWD, lock_file.c_str(), O_RDWR);
    const char ok = fd >= 0 && syscall(SYS_fcntl, fd, F_SETLK, &l) == 0 ? 'y' : 'n';
    (void)syscall(SYS_write, ready[1], &ok, 1);
    char byte;
    (void)syscall(SYS_read, hold[0], &byte, 1);
    syscall(SYS_exit_group, 0);
  }
  close(ready[1]);
  close(hold[0]);
  char ok = 'n';
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  close(ready[0]);
  auto locked = Store::open(options());
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(hold[1]);
  ASSERT_EQ(ok, 'y');
  ASSERT_FALSE(locked.ok());
  EXPECT_EQ(locked.error().code, Errc::unavailable);
  const std::string& m = locked.error().message;
  EXPECT_NE(m.find("is in use by another process (pid " + std::to_string(child) + ")"), std::string::npos) << m;
  EXPECT_NE(m.find("'" + lock_file + "'"), std::string::npos) << m;
  // Once that process is gone, the store opens.
  auto reopened = Store::open(options());
  EXPECT_TRUE(reopened.ok()) << reopened.error().message;
}

TEST_F(StoreTest, BackupOfAStoreInUseHoldsEverythingWrittenBeforeIt) {
  Store& store = open();
  // Buffered writes: still in the memtable and the WAL, not in table files.
  ASSERT_TRUE(store.put(Cf::catalog, "stream/bids", "schema", Durability::buffered).ok());
  WriteBatch b;
  b.put(Cf::log, "bids/1", "tuples");
  b.put(Cf::contracts, "v/c-1/1", "proposed");
  ASSERT_TRUE(store.write(b, Durability::buffered).ok());
  const std::string copy_dir = dir_ + "/copy";
  auto info = store.backup(copy_dir);
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_EQ(info->path, copy_dir);
  EXPECT_GT(info->sequence, 0u);
  EXPECT_GT(info->bytes, 0u);
  ASSERT_TRUE(store.put(Cf::meta, "after", "x", Durability::synced).ok());

  // The copy opens beside the store, which stays in use.
  StoreOptions o = options();
  o.path = copy_dir;
  auto copy = Store::open(o);
  ASSERT_TRUE(copy.ok()) << copy.error().message;
  EXPECT_EQ((*copy)->get(Cf::catalog, "stream/bids").value(), "schema");
  EXPECT_EQ((*copy)->get(Cf::log, "bids/1").value(), "tuples");
  EXPECT_EQ((*copy)->get(Cf::contracts, "v/c-1/1").value(), "proposed");
  EXPECT_EQ((*copy)->get(Cf::meta, "after").value(), std::nullopt);
  EXPECT_EQ(get(Cf::meta, "after"), "x");

  // Where it may not write.
  auto again = store.backup(copy_dir);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, Errc::already_exists);
  auto relative = store.backup("copy2");
  ASSERT_FALSE(relative.ok());
  EXPECT_EQ(relative.error().code, Errc::invalid_argument);
  auto orphan = store.backup(dir_ + "/missing/copy");
  ASSERT_FALSE(orphan.ok());
  EXPECT_EQ(orphan.error().code, Errc::not_found);
  EXPECT_NE(orphan.error().message.find(dir_ + "/missing"), std::string::npos) << orphan.error().message;
}

TEST_F(StoreTest, DamagedManifestPointerIsCorrupt) {
  open();
  store_.reset();
  // CURRENT names the manifest; RocksDB checks its format on open.
  std::ofstream(options().path + "/CURRENT", std::ios::trunc) << "garbage-without-newline";
  auto s = Store::open(options());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::corrupt) << s.error().message;
  EXPECT_NE(s.error().message.find(options().path), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace entente::store
