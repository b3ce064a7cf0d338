#pragma once
// A store in a fresh temporary directory (mkdtemp), removed after the test;
// reopen() closes and opens it again, as a restart would.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "store/store.h"

namespace entente::store::testing {

// A fresh directory "entente-<what>-<unique suffix>" under the system's
// temporary directory (mkdtemp); empty, with a test failure, when it cannot
// be made.
inline std::string make_temp_dir(const std::string& what = "store-test") {
  std::string path = (std::filesystem::temp_directory_path() / ("entente-" + what + "-XXXXXX")).string();
  if (mkdtemp(path.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << path << " failed";
    return {};
  }
  return path;
}

class TempStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir();
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
