// The metrics an operator alerts on (docs/operations.md, "Metrics"):
// entente_build_info, entente_cert_expiry_days for each certificate the node
// presents or pins, and entente_import_state for each import.
#include <chrono>
#include <mutex>

#include "broker/detail/node_impl.h"
#include "certs/certs.h"
#include "entente_version.h"
#include "federation/peering.h"

namespace entente::broker::detail {

namespace {

// The states an import shows in GET /v1/imports (federation/imports.h).
constexpr const char* kImportStates[] = {"connecting", "active", "refused"};

}  // namespace

void NodeImpl::read_cert_expiry() {
  std::vector<CertExpiry> out;
  auto add = [&out](const std::string& which, const std::string& domain, const std::string& file) {
    auto info = certs::read_certificate(file);
    if (!info.ok()) {
      log_line(LogLevel::warn, "node", "certificate " + file + " (" + which + "): " + info.error().message);
      return;
    }
    out.push_back({which, domain, info->subject, info->not_after});
  };
  if (config_.tls) add("api", config_.domain, config_.tls_cert_file);
  if (config_.federation.enabled) {
    add("federation", config_.domain, config_.federation.cert_file);
    add("pinned_ca", config_.domain, config_.federation.ca_file);
    for (const auto& peer : config_.federation.peers)
      if (peer.domain != config_.domain) add("pinned_ca", peer.domain, peer.ca_file);
  }
  std::lock_guard lock(cert_expiry_mu_);
  cert_expiry_ = std::move(out);
}

void NodeImpl::register_ops_collectors() {
  read_cert_expiry();
  metrics_.add_collector([this](MetricsWriter& w) {
    w.gauge("entente_build_info", "1, with the build's version as a label", {{"version", kBuildVersion}}, 1);
    {
      std::lock_guard lock(cert_expiry_mu_);
      const auto now = certs::Clock::now();
      for (const auto& c : cert_expiry_) {
        const double days = std::chrono::duration<double>(c.not_after - now).count() / 86400.0;
        w.gauge("entente_cert_expiry_days",
                "Days until a certificate the node presents or pins expires (negative: expired), as read at "
                "start-up or the last reload",
                {{"which", c.which}, {"domain", c.domain}, {"subject", c.subject}}, days);
      }
    }
    std::lock_guard lock(import_states_mu_);
    for (const auto& [import, current] : import_states_) {
      for (const char* state : kImportStates) {
        w.gauge("entente_import_state", "1 for an import's current state, 0 for the others",
                {{"import", import}, {"state", state}}, current == state ? 1 : 0);
      }
    }
  });
}

// Not in the collector: Imports takes its lock, then the registry's (a new
// import's counter); a collector runs under the registry's lock.
void NodeImpl::read_import_states() {
  std::vector<std::pair<std::string, std::string>> out;
  if (peering_) {
    for (auto& i : peering_->imports())
      if (!hosted_hidden(i.stream)) out.emplace_back(std::move(i.stream), std::move(i.state));
  }
  std::lock_guard lock(import_states_mu_);
  import_states_ = std::move(out);
}

}  // namespace entente::broker::detail
