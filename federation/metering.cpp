#include "federation/metering.h"

#include <iterator>
#include <string_view>

#include "contracts/ledger.h"

namespace entente::federation {
namespace {

constexpr const char* kUnbilledPrefix = "unbilled/";

std::string unbilled_key(const std::string& stream, const std::string& domain, uint64_t first) {
  std::string key = std::string(kUnbilledPrefix) + domain + "/" + stream + "/";
  store::put_key_u64(key, first);
  return key;
}

}  // namespace

Metering::Metering(store::Store& store, std::function<void(const std::string&)> log)
    : store_(store), log_(std::move(log)) {}

Status Metering::load() {
  std::lock_guard lock(mu_);
  // Ranges sent under a contract before the restart and not charged yet:
  // an acknowledgement or an OPEN from the consumer charges them now.
  return store_.scan(store::Cf::meta, kUnbilledPrefix, [this](std::string_view key, std::string_view value) {
    const std::string_view rest = key.substr(std::char_traits<char>::length(kUnbilledPrefix));
    const size_t slash = rest.find('/');
    if (slash == std::string_view::npos || rest.size() < slash + 1 + 1 + 9 || rest[rest.size() - 9] != '/' ||
        value.size() <= 16) {
      log_("federation: ignoring a malformed unbilled range in the store");
      return true;
    }
    const std::string domain(rest.substr(0, slash));
    const std::string stream(rest.substr(slash + 1, rest.size() - 9 - slash - 1));
    unbilled_[{stream, domain}][store::get_key_u64(rest.substr(rest.size() - 8))] =
        Unbilled{store::get_key_u64(value), store::get_key_u64(value.substr(8)), std::string(value.substr(16))};
    return true;
  });
}

void Metering::note_sent(const std::string& stream, const std::string& domain, const std::string& contract,
                         uint64_t first, uint64_t last, uint64_t rows) {
  std::lock_guard lock(mu_);
  auto& ranges = unbilled_[{stream, domain}];
  store::WriteBatch batch;
  // A range sent again (a second channel while a duplicate link lives, or
  // a frame split after the link refused it) replaces what it overlaps: a
  // position is charged at most once.
  auto it = ranges.upper_bound(last);
  while (it != ranges.begin()) {
    auto prev = std::prev(it);
    if (prev->second.last < first) break;
    if (prev->first != first) batch.erase(store::Cf::meta, unbilled_key(stream, domain, prev->first));
    it = ranges.erase(prev);
  }
  ranges[first] = Unbilled{last, rows, contract};
  std::string value;
  store::put_key_u64(value, last);
  store::put_key_u64(value, rows);
  value += contract;
  batch.put(store::Cf::meta, unbilled_key(stream, domain, first), value);
  // Durable before the DATA leaves, so that a restart of this node charges
  // it all the same. A failed write is logged; the range is still charged
  // while this node runs.
  if (Status s = store_.write(batch, store::Durability::buffered); !s.ok()) {
    log_("federation: noting tuples " + std::to_string(first) + ".." + std::to_string(last) + " of " + stream +
         " sent under contract " + contract + " failed: " + s.error().message);
  }
}

void Metering::charge_through(const std::string& stream, const std::string& domain, uint64_t through,
                              bool forget_after) {
  std::lock_guard lock(mu_);
  auto found = unbilled_.find({stream, domain});
  if (found == unbilled_.end()) return;
  auto& ranges = found->second;
  std::map<std::string, uint64_t> charge;  // contract -> rows
  store::WriteBatch batch;
  auto it = ranges.begin();
  for (; it != ranges.end() && it->second.last <= through; ++it) {
    charge[it->second.contract] += it->second.rows;
    batch.erase(store::Cf::meta, unbilled_key(stream, domain, it->first));
  }
  const auto charged_end = it;
  if (forget_after) {
    for (; it != ranges.end(); ++it) batch.erase(store::Cf::meta, unbilled_key(stream, domain, it->first));
  }
  if (batch.empty()) return;
  // The ranges go in the same atomic write that adds them to the usage:
  // each is charged once, whatever stops when.
  Status written = ledger_ != nullptr ? ledger_->add_usage_with(charge, std::move(batch))
                                      : store_.write(batch, store::Durability::buffered);
  if (!written.ok()) {
    // Kept, in memory and in the store: the next acknowledgement tries again.
    log_("federation: charging tuples through " + std::to_string(through) + " of " + stream + " to " + domain +
         " failed: " + written.error().message);
    return;
  }
  ranges.erase(ranges.begin(), forget_after ? ranges.end() : charged_end);
  if (ranges.empty()) unbilled_.erase(found);
}

std::map<uint64_t, std::pair<uint64_t, uint64_t>> Metering::unbilled(const std::string& stream,
                                                                     const std::string& domain) {
  std::lock_guard lock(mu_);
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> out;
  if (auto it = unbilled_.find({stream, domain}); it != unbilled_.end()) {
    for (const auto& [first, u] : it->second) out[first] = {u.last, u.rows};
  }
  return out;
}

}  // namespace entente::federation
