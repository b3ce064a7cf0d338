#pragma once
// Shared by the contracts tests: two domains (acme, beta) with CAs and node
// certificates in a temporary directory, their signers, a trust store that
// pins both (what each broker holds), stores that can be reopened, and
// terms builders.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "certs/certs.h"
#include "certs/signing.h"
#include "certs/trust.h"
#include "contracts/canonical.h"
#include "contracts/contract.h"
#include "contracts/ledger.h"
#include "contracts/terms.h"
#include "store/store.h"
#include "tests/store/temp_store.h"

namespace entente::contracts::testing {

namespace fs = std::filesystem;

using store::testing::make_temp_dir;

// 2027-01-01T00:00:00Z and 2028-01-01T00:00:00Z.
inline constexpr int64_t kJan2027 = 1798761600000;
inline constexpr int64_t kJan2028 = 1830297600000;

inline Terms stream_terms(std::string provider = "acme", std::string consumer = "beta",
                          std::vector<std::string> streams = {"asks", "bids"}) {
  Terms t;
  t.kind = Kind::stream;
  t.valid_from_ms = kJan2027;
  t.valid_until_ms = kJan2028;
  t.stream.provider = std::move(provider);
  t.stream.consumer = std::move(consumer);
  t.stream.streams = std::move(streams);
  t.stream.fields = {"price", "item"};
  t.stream.predicate = "price > 10";
  t.stream.rate_cap = 5000;
  t.stream.price_per_million = 250;
  return t;
}

inline Terms hosting_terms(std::string host = "beta", std::string owner = "acme") {
  Terms t;
  t.kind = Kind::hosting;
  t.valid_from_ms = kJan2027;
  t.valid_until_ms = kJan2028;
  t.hosting.host = std::move(host);
  t.hosting.owner = std::move(owner);
  t.hosting.box_kinds = {"aggregate", "filter", "map"};
  t.hosting.max_load = 1000;
  t.hosting.price_min = 10;
  t.hosting.price_max = 20;
  t.hosting.notice_seconds = 600;
  return t;
}

// Certificates are made once per test binary: key generation is the slow part.
class Domains {
 public:
  static Domains& get() {
    static Domains d;  // removed at exit
    return d;
  }
  ~Domains() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const fs::path& dir() const { return dir_; }
  const certs::Signer& acme() const { return *acme_; }
  const certs::Signer& beta() const { return *beta_; }
  const certs::Signer& gamma() const { return *gamma_; }  // a third domain, pinned
  const certs::Signer& evil_beta() const { return *evil_beta_; }  // claims beta, unpinned CA
  // acme, beta and gamma pinned.
  const certs::TrustStore& trust() const { return trust_; }

 private:
  Domains() {
    dir_ = make_temp_dir("contracts-certs");
    for (const char* d : {"acme", "beta", "gamma"}) {
      EXPECT_TRUE(certs::init_domain(d, dir_ / (std::string(d) + "-ca")).ok());
      certs::NodeOptions o;
      if (std::string(d) == "beta") o.key = certs::KeyType::ed25519;  // both algorithms in play
      EXPECT_TRUE(certs::issue_node(d, "n1", dir_ / (std::string(d) + "-ca"), dir_ / (std::string(d) + "-n1"), o).ok());
      EXPECT_TRUE(trust_.pin(d, dir_ / (std::string(d) + "-ca") / "ca.crt").ok());
    }
    EXPECT_TRUE(certs::init_domain("beta", dir_ / "evil-ca").ok());
    EXPECT_TRUE(certs::issue_node("beta", "n1", dir_ / "evil-ca", dir_ / "evil-n1").ok());
    acme_ = load("acme-n1");
    beta_ = load("beta-n1");
    gamma_ = load("gamma-n1");
    evil_beta_ = load("evil-n1");
  }
  std::unique_ptr<certs::Signer> load(const std::string& node) {
    auto s = certs::Signer::load(dir_ / node / "node.key", dir_ / node / "node.crt");
    EXPECT_TRUE(s.ok()) << s.error().message;
    return std::make_unique<certs::Signer>(std::move(s).value());
  }
  fs::path dir_;
  certs::TrustStore trust_;
  std::unique_ptr<certs::Signer> acme_, beta_, gamma_, evil_beta_;
};

// One domain's node state: a store that can be reopened and its ledger.
class Node {
 public:
  Node() : dir_(make_temp_dir("contracts-store")) { reopen(); }
  ~Node() {
    ledger_.reset();
    store_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Closes the ledger and the store and opens both again, as a restart would.
  void reopen() {
    ledger_.reset();
    store_.reset();
    store::StoreOptions o;
    o.path = dir_ + "/db";
    o.write_buffer_bytes = 4u << 20;
    o.block_cache_bytes = 8u << 20;
    auto s = store::Store::open(o);
    ASSERT_TRUE(s.ok()) << s.error().message;
    store_ = std::move(s.value());
    auto l = Ledger::open(*store_);
    ASSERT_TRUE(l.ok()) << l.error().message;
    ledger_ = std::move(l.value());
  }
  Ledger& ledger() { return *ledger_; }
  store::Store& store() { return *store_; }

  // A copy of the store as it is now (Store::backup), for restore().
  std::string backup() {
    const std::string copy = dir_ + "/copy-" + std::to_string(++copies_);
    auto b = store_->backup(copy);
    EXPECT_TRUE(b.ok()) << b.error().message;
    return copy;
  }
  // Closes the ledger and the store, puts `copy` in the store's place and
  // opens it again: a data directory restored from an older copy.
  void restore(const std::string& copy) {
    ledger_.reset();
    store_.reset();
    std::error_code ec;
    fs::remove_all(dir_ + "/db", ec);
    fs::copy(copy, dir_ + "/db", fs::copy_options::recursive, ec);
    ASSERT_FALSE(ec) << ec.message();
    reopen();
  }

 private:
  std::string dir_;
  int copies_ = 0;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<Ledger> ledger_;
};

// A contract run through the whole negotiation by one side's pure functions
// (acme proposes stream terms, beta accepts, acme countersigns); in force
// from kJan2027 to kJan2028.
inline Contract active_contract(const Terms& terms, const certs::Signer& offerer, const certs::Signer& acceptor) {
  const auto& d = Domains::get();
  Contract c{new_contract_id(), {}};
  auto v1 = propose(offerer.identity().domain, terms, 1000);
  EXPECT_TRUE(v1.ok()) << v1.error().message;
  EXPECT_TRUE(apply(c, *v1, offerer.identity().domain, d.trust()).ok());
  auto v2 = accept(c, acceptor, 1, 2000);
  EXPECT_TRUE(v2.ok()) << v2.error().message;
  EXPECT_TRUE(apply(c, *v2, acceptor.identity().domain, d.trust()).ok());
  auto v3 = countersign(c, offerer, 2, 3000);
  EXPECT_TRUE(v3.ok()) << v3.error().message;
  EXPECT_TRUE(apply(c, *v3, offerer.identity().domain, d.trust()).ok());
  return c;
}

// Records every version of `c` in `ledger`.
inline void record(Ledger& ledger, const Contract& c) {
  for (const auto& v : c.history) {
    Status s = ledger.append(c.id, v);
    ASSERT_TRUE(s.ok()) << s.error().message;
  }
}

}  // namespace entente::contracts::testing
