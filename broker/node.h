#pragma once
// One node of a domain: the store, the streams, the deployed queries, and the
// API listener, wired together. `entente broker` is a thin main around this.
//
// Lifecycle: open() loads the catalog and the queries' checkpoints (and
// replays what came after them) → start() starts the engine workers,
// periodic checkpoints and retention, then the API listener → stop() stops
// accepting, drains what was accepted, checkpoints every query and joins
// every thread it started. The destructor calls stop().
// Threading: all members may be called from any thread; stop() at most once
// concurrently with nothing else.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "broker/config.h"
#include "base/result.h"

namespace entente::broker {

namespace detail {
class NodeImpl;
}

class Node final {
 public:
  static Result<std::unique_ptr<Node>> open(NodeConfig config);
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  Status start();
  // Applies a new configuration as far as a running node can (SIGHUP; see
  // NodeImpl::reload and docs/operations.md): `changes` gets what changed,
  // `kept` the settings that differ but need a restart. An error changes
  // nothing (or says what it did change).
  Status reload(NodeConfig config, std::vector<std::string>& changes, std::vector<std::string>& kept);
  // The API's bound port (after start()).
  uint16_t api_port() const;
  void stop();

 private:
  explicit Node(std::unique_ptr<detail::NodeImpl> impl);
  std::unique_ptr<detail::NodeImpl> impl_;
};

}  // namespace entente::broker
