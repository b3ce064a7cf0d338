#pragma once
// A store in a fresh temporary directory (mkdtemp), removed after the test;
// reopen() closes and opens it again, as a restart would.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "store/store.h"
#include "tests/support/temp_dir.h"

namespace entente::store::testing {

using entente::testing::make_temp_dir;

class TempStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir("store-test");
    ASSERT_FALSE(dir_.empty());
    reopen();
  }
  void TearDown() override {
    store_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  void reopen() {
    store_.reset();
    StoreOptions o;
    o.path = dir_ + "/db";
    o.write_buffer_bytes = 4u << 20;
    o.block_cache_bytes = 8u << 20;
    auto s = Store::open(o);
    ASSERT_TRUE(s.ok()) << s.error().message;
    store_ = std::move(s.value());
  }

  std::string dir_;
  std::unique_ptr<Store> store_;
};

}  // namespace entente::store::testing
