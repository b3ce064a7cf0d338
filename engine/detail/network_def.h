// The validated, resolved form of a query network: what QueryNetwork::parse
// produces and what the Executor and the Scheduler run. Private to engine/.
//
// Immutable once built and shared by shared_ptr between QueryNetwork copies
// and the runtimes built from it, so it may be read from any thread.
#pragma once
#if !defined(ENTENTE_IN_ENGINE)
#error "engine/detail/ is private to engine/ (docs/architecture.md)"
#endif

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/box.h"
#include "engine/network.h"
#include "rapidjson/document.h"

namespace entente::engine::detail {

// Bounds on a network definition (docs/query-networks.md, "Limits").
inline constexpr size_t kMaxDocumentBytes = 4u << 20;
inline constexpr size_t kMaxNesting = 64;
inline constexpr size_t kMaxBoxes = 1000;
inline constexpr size_t kMaxInputs = 256;
inline constexpr size_t kMaxOutputs = 256;
inline constexpr size_t kMaxArcs = 10000;
inline constexpr size_t kMaxPorts = 256;
inline constexpr size_t kMaxNameLength = 64;
inline constexpr size_t kMaxSchemaFields = 1024;

// Where a box output port or a network input sends its data.
struct Target {
  enum class Kind : uint8_t { box, output };
  Kind kind = Kind::box;
  uint32_t index = 0;  // box index (topological) or network output index
  uint32_t port = 0;   // input port of the box; unused for outputs
};

// The producer feeding one input port of a box.
struct Source {
  enum class Kind : uint8_t { input, box };
  Kind kind = Kind::input;
  uint32_t index = 0;  // network input index or box index (topological)
  uint32_t port = 0;   // output port of the box; unused for inputs
};

struct BoxDef {
  std::string id;
  std::string type;
  size_t json_index = 0;                 // position in the "boxes" array
  const rapidjson::Value* options = nullptr;  // into NetworkDef::doc; never null
  BoxFactory factory = nullptr;
  std::vector<Source> sources;           // one per input port, in port order
  std::vector<SchemaPtr> input_schemas;  // one per input port
  std::vector<SchemaPtr> output_schemas;
  std::vector<std::vector<Target>> targets;  // per output port (empty: dropped)

  std::string path() const { return "$.boxes[" + std::to_string(json_index) + "]"; }
};

struct NetworkDef {
  std::string name;
  std::vector<NetworkInput> inputs;
  std::vector<std::vector<Target>> input_targets;  // per network input
  std::vector<NetworkOutput> outputs;
  std::vector<BoxDef> boxes;  // in topological order: sources before targets
  // The parsed document, kept because BoxDef::options point into it and
  // runtimes build their boxes from those options again.
  std::unique_ptr<rapidjson::Document> doc;
  rapidjson::Value empty_options{rapidjson::kObjectType};
};

// Parses and validates `json` completely (docs/query-networks.md). On
// failure every problem is in `diag`; the Error summarises them.
Result<std::shared_ptr<const NetworkDef>> build_network_def(std::string_view json, Diagnostics& diag);

}  // namespace entente::engine::detail
