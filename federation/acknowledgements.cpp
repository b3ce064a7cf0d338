#include "federation/acknowledgements.h"

#include <string_view>

namespace entente::federation {
namespace {

constexpr const char* kAckPrefix = "export-ack/";

std::string ack_key(const std::string& stream, const std::string& domain) {
  return std::string(kAckPrefix) + stream + "/" + domain;
}

}  // namespace

Status Acknowledgements::load() {
  std::lock_guard lock(mu_);
  return store_.scan(store::Cf::meta, kAckPrefix, [this](std::string_view key, std::string_view value) {
    if (value.size() < 8) return true;
    const std::string_view rest = key.substr(std::char_traits<char>::length(kAckPrefix));
    const auto slash = rest.rfind('/');
    if (slash == std::string_view::npos) return true;
    acks_[std::string(rest.substr(0, slash))][std::string(rest.substr(slash + 1))] = store::get_key_u64(value);
    return true;
  });
}

void Acknowledgements::record(const std::string& stream, const std::string& domain, uint64_t through) {
  {
    std::lock_guard lock(mu_);
    uint64_t& a = acks_[stream][domain];
    if (through <= a) return;
    a = through;
  }
  // Buffered: losing the newest value in a crash only keeps more of the log.
  std::string v;
  store::put_key_u64(v, through);
  (void)store_.put(store::Cf::meta, ack_key(stream, domain), v, store::Durability::buffered);
  if (listener_) listener_(stream, domain, through);
}

std::optional<uint64_t> Acknowledgements::acked(const std::string& stream, const std::string& domain) const {
  std::lock_guard lock(mu_);
  auto it = acks_.find(stream);
  if (it == acks_.end()) return std::nullopt;
  auto a = it->second.find(domain);
  if (a == it->second.end()) return std::nullopt;
  return a->second;
}

std::map<std::string, uint64_t> Acknowledgements::of(const std::string& stream) const {
  std::lock_guard lock(mu_);
  auto it = acks_.find(stream);
  return it == acks_.end() ? std::map<std::string, uint64_t>{} : it->second;
}

Status Acknowledgements::forget(const std::string& stream, const std::string& party) {
  {
    std::lock_guard lock(mu_);
    auto it = acks_.find(stream);
    if (it != acks_.end()) {
      it->second.erase(party);
      if (it->second.empty()) acks_.erase(it);
    }
  }
  return store_.erase(store::Cf::meta, ack_key(stream, party), store::Durability::synced);
}

}  // namespace entente::federation
