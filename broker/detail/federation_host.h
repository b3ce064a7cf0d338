#pragma once
#if !defined(ENTENTE_IN_BROKER)
#error "broker/detail/ is private to broker/ (docs/architecture.md)"
#endif
// The broker's side of federation/host.h: the federation layer reaches
// this node's streams, group commit, store, metrics and log through it,
// and nothing else of the broker. A thin adapter; the federation logic is
// in federation/.

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "federation/host.h"

namespace entente::broker::detail {

class NodeImpl;

class FederationHost final : public federation::Host {
 public:
  explicit FederationHost(NodeImpl& node) : node_(node) {}

  store::Store& store() override;
  base::Registry& metrics() override;
  void log(const std::string& line) override;
  federation::HostStreamPtr find_stream(const std::string& name) override;
  // Up to the durable head when `node` is one of the stream's followers.
  federation::HostStreamPtr find_stream_to_copy(const std::string& name, const std::string& node) override;
  std::vector<federation::HostStreamPtr> mirrors() override;
  Result<federation::HostStreamPtr> create_mirror(const std::string& name, engine::SchemaPtr schema) override;
  Status submit(store::WriteBatch batch, std::function<void(const Status&)> done) override;
  // The catalog's leader of `name` and its peer address from the membership
  // view, when it is another node of this domain.
  std::optional<federation::StreamLocation> locate_stream(std::string_view name) const override;
  void on_internal_ack(const std::string& stream, const std::string& node, uint64_t through) override;
  // Hosted runs (cluster_hosted.cpp).
  void on_domain_ack(const std::string& stream, const std::string& domain, uint64_t through) override;
  bool may_read_hosted(const std::string& stream, const std::string& domain) override;
  void on_hosting(const certs::Identity& peer, const std::string& type, const std::string& message,
                  HostingAnswer answer) override;

 private:
  NodeImpl& node_;
};

}  // namespace entente::broker::detail
