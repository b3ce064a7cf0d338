#include "cluster/catalog.h"

#include <chrono>
#include <cstdio>

#include "base/log.h"

namespace entente::cluster {
namespace {

// Backoff between attempts to read or watch while etcd cannot be reached.
constexpr int64_t kMinBackoffMs = 100;
constexpr int64_t kMaxBackoffMs = 2'000;

Compare mod_revision_is(const std::string& key, int64_t revision) {
  Compare c;
  c.key = key;
  c.target = Compare::Target::mod_revision;
  c.op = Compare::Op::equal;
  c.number = revision;
  return c;
}

Compare absent(const std::string& key) {
  Compare c;
  c.key = key;
  c.target = Compare::Target::version;
  c.op = Compare::Op::equal;
  c.number = 0;
  return c;
}

}  // namespace

Catalog::Catalog(Etcd& etcd, std::string prefix, OnChange on_change)
    : etcd_(etcd), root_(std::move(prefix) + "catalog/"), on_change_(std::move(on_change)) {}

Catalog::~Catalog() { stop(); }

void Catalog::start() {
  if (thread_.joinable()) return;
  stopping_.store(false);
  {
    std::lock_guard lock(mu_);
    stop_requested_ = false;
  }
  thread_ = std::thread([this] { run(); });
}

void Catalog::stop() {
  stopping_.store(true);
  {
    std::lock_guard lock(mu_);
    stop_requested_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  synced_.store(false);
}

void Catalog::run() {
  int64_t backoff = kMinBackoffMs;
  while (!stopping_.load()) {
    auto read = reload();
    if (read.ok()) {
      backoff = kMinBackoffMs;
      auto on_events = [this](const std::vector<WatchEvent>& events, int64_t revision) {
        apply(events, revision);
        return true;
      };
      Status s = etcd_.watch(root_, true, *read + 1, on_events, stopping_);
      if (s.ok()) break;  // stopped
      set_problem("the catalog watch ended: " + s.error().message);
    } else {
      set_problem(read.error().message);
    }
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(backoff), [this] { return stop_requested_; });
    backoff = std::min(backoff * 2, kMaxBackoffMs);
  }
}

Result<int64_t> Catalog::reload() {
  ENTENTE_ASSIGN_OR_RETURN(RangeResult all, etcd_.get_prefix(root_));
  std::vector<std::string> keys;
  {
    std::lock_guard lock(mu_);
    for (const auto& [k, _] : entries_) keys.push_back(k);
    entries_.clear();
    for (auto& kv : all.kvs) {
      CatalogEntry e;
      e.key = kv.key.substr(root_.size());
      e.value = std::move(kv.value);
      e.mod_revision = kv.mod_revision;
      keys.push_back(e.key);
      entries_.emplace(e.key, std::move(e));
    }
    revision_ = all.revision;
    if (!problem_.empty() && problem_ != "not read yet") {
      base::logf(base::LogLevel::info, "cluster", "the catalog is current again (revision %lld)\n",
                   static_cast<long long>(all.revision));
    }
    problem_.clear();
    synced_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  if (on_change_) on_change_(keys);
  return all.revision;
}

void Catalog::apply(const std::vector<WatchEvent>& events, int64_t revision) {
  std::vector<std::string> keys;
  {
    std::lock_guard lock(mu_);
    for (const auto& ev : events) {
      if (!ev.kv.key.starts_with(root_)) continue;
      std::string key = ev.kv.key.substr(root_.size());
      if (ev.type == WatchEvent::Type::erase) {
        entries_.erase(key);
      } else {
        CatalogEntry e;
        e.key = key;
        e.value = ev.kv.value;
        e.mod_revision = ev.kv.mod_revision;
        entries_.insert_or_assign(key, std::move(e));
      }
      keys.push_back(std::move(key));
    }
    revision_ = std::max(revision_, revision);
  }
  cv_.notify_all();
  if (on_change_ && !keys.empty()) on_change_(keys);
}

void Catalog::set_problem(std::string problem) {
  {
    std::lock_guard lock(mu_);
    if (synced_.load() || problem_ != problem) {
      base::logf(base::LogLevel::warn, "cluster", "the catalog may be stale: %s\n", problem.c_str());
    }
    problem_ = std::move(problem);
    synced_.store(false, std::memory_order_release);
  }
  cv_.notify_all();
}

std::optional<CatalogEntry> Catalog::get(std::string_view key) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

std::vector<CatalogEntry> Catalog::list(std::string_view sub) const {
  std::vector<CatalogEntry> out;
  std::lock_guard lock(mu_);
  for (auto it = entries_.lower_bound(sub); it != entries_.end() && it->first.starts_with(sub); ++it) {
    out.push_back(it->second);
  }
  return out;
}

int64_t Catalog::revision() const {
  std::lock_guard lock(mu_);
  return revision_;
}

std::string Catalog::problem() const {
  std::lock_guard lock(mu_);
  return problem_;
}

Result<std::optional<CatalogEntry>> Catalog::read(std::string_view key) {
  ENTENTE_ASSIGN_OR_RETURN(RangeResult r, etcd_.get(root_ + std::string(key)));
  if (r.kvs.empty()) return std::optional<CatalogEntry>();
  CatalogEntry e;
  e.key = std::string(key);
  e.value = std::move(r.kvs[0].value);
  e.mod_revision = r.kvs[0].mod_revision;
  return std::optional<CatalogEntry>(std::move(e));
}

Result<int64_t> Catalog::create(std::string_view key, std::string_view value) {
  const std::string full = root_ + std::string(key);
  TxnOp put;
  put.kind = TxnOp::Kind::put;
  put.key = full;
  put.value = std::string(value);
  ENTENTE_ASSIGN_OR_RETURN(TxnResult r, etcd_.txn({absent(full)}, {put}));
  if (!r.succeeded) return make_error(Errc::already_exists, std::string(key) + " exists in the domain's catalog");
  return r.revision;
}

Result<int64_t> Catalog::update(std::string_view key, std::string_view value, int64_t expected) {
  const std::string full = root_ + std::string(key);
  TxnOp put;
  put.kind = TxnOp::Kind::put;
  put.key = full;
  put.value = std::string(value);
  ENTENTE_ASSIGN_OR_RETURN(TxnResult r, etcd_.txn({mod_revision_is(full, expected)}, {put}));
  if (!r.succeeded) {
    return make_error(Errc::conflict, std::string(key) + " changed in the domain's catalog since revision " +
                                          std::to_string(expected));
  }
  return r.revision;
}

Result<int64_t> Catalog::update_all(const std::vector<Update>& updates) {
  // etcd's default limit of operations per transaction is 128.
  if (updates.empty() || updates.size() > 64)
    return make_error(Errc::invalid_argument, "an update of " + std::to_string(updates.size()) +
                                                  " catalog keys (1 to 64 at once)");
  std::vector<Compare> compares;
  std::vector<TxnOp> puts;
  for (const auto& u : updates) {
    const std::string full = root_ + u.key;
    compares.push_back(mod_revision_is(full, u.expected));
    TxnOp put;
    put.kind = TxnOp::Kind::put;
    put.key = full;
    put.value = u.value;
    puts.push_back(std::move(put));
  }
  ENTENTE_ASSIGN_OR_RETURN(TxnResult r, etcd_.txn(compares, puts));
  if (!r.succeeded) {
    std::string keys;
    for (const auto& u : updates) keys += (keys.empty() ? "" : ", ") + u.key;
    return make_error(Errc::conflict, "one of " + keys + " changed in the domain's catalog since it was read");
  }
  return r.revision;
}

Result<int64_t> Catalog::erase(std::string_view key, int64_t expected) {
  const std::string full = root_ + std::string(key);
  TxnOp del;
  del.kind = TxnOp::Kind::erase;
  del.key = full;
  Compare exists;
  exists.key = full;
  exists.target = Compare::Target::version;
  exists.op = Compare::Op::greater;
  exists.number = 0;
  std::vector<Compare> compares = {exists};
  if (expected != 0) compares.push_back(mod_revision_is(full, expected));
  TxnOp read;
  read.kind = TxnOp::Kind::get;
  read.key = full;
  ENTENTE_ASSIGN_OR_RETURN(TxnResult r, etcd_.txn(compares, {del}, {read}));
  if (r.succeeded) return r.revision;
  if (r.gets.empty() || r.gets[0].kvs.empty()) {
    return make_error(Errc::not_found, std::string(key) + " is not in the domain's catalog");
  }
  return make_error(Errc::conflict, std::string(key) + " changed in the domain's catalog since revision " +
                                        std::to_string(expected));
}

bool Catalog::wait_for(int64_t revision, int64_t timeout_ms) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                      [&] { return revision_ >= revision || stop_requested_; }) &&
         revision_ >= revision;
}

}  // namespace entente::cluster
