#include "bench/nexmark/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include "engine/network.h"

namespace entente::nexmark {

using engine::Column;
using engine::Type;

namespace {

constexpr size_t kMaxQueryFileBytes = 1 << 20;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool valid_query_name(std::string_view q) {
  if (q.size() < 2 || q.size() > 8 || q[0] != 'q') return false;
  for (size_t i = 1; i < q.size(); ++i)
    if (q[i] < '0' || q[i] > '9') return false;
  return true;
}

std::string engine_cell(const Column& c, size_t row) {
  switch (c.type) {
    case Type::Int64:
    case Type::Timestamp:
      return std::to_string(c.ints[row]);
    case Type::Double: {
      std::ostringstream s;
      s.precision(17);
      s << c.doubles[row];
      return s.str();
    }
    case Type::Bool:
      return c.bools[row] ? "true" : "false";
    case Type::String:
      return "'" + std::string(c.str(row)) + "'";
  }
  return "?";
}

std::string ref_cell(const RefColumn& c, size_t row) {
  switch (c.type) {
    case Type::Int64:
    case Type::Timestamp:
      return std::to_string(c.ints[row]);
    case Type::Double: {
      std::ostringstream s;
      s.precision(17);
      s << c.doubles[row];
      return s.str();
    }
    case Type::Bool:
      return c.ints[row] ? "true" : "false";
    case Type::String:
      return "'" + std::string(c.strs[row]) + "'";
  }
  return "?";
}

// Doubles come from averages, where the engine and the reference may add
// in a different association; 1e-9 relative is far below any real
// difference between two averages of integer prices.
bool doubles_equal(double a, double b) {
  if (a == b) return true;
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b));
}

bool cell_equal(const Column& e, size_t i, const RefColumn& r, size_t j) {
  switch (e.type) {
    case Type::Int64:
    case Type::Timestamp:
      return e.ints[i] == r.ints[j];
    case Type::Double:
      return doubles_equal(e.doubles[i], r.doubles[j]);
    case Type::Bool:
      return static_cast<int64_t>(e.bools[i]) == r.ints[j];
    case Type::String:
      return e.str(i) == r.strs[j];
  }
  return false;
}

}  // namespace

Result<std::string> load_query_text(std::string_view query, const std::string& dir) {
  if (!valid_query_name(query))
    return make_error(Errc::invalid_argument, "bad query name '" + std::string(query) + "': expected q<N>");
  const std::string path = dir + "/" + std::string(query) + ".json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(Errc::not_found, "cannot open " + path);
  std::string text;
  char buf[8192];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxQueryFileBytes)
      return make_error(Errc::limit_exceeded, path + " is larger than 1 MiB");
  }
  if (in.bad()) return make_error(Errc::invalid_argument, "cannot read " + path);
  return text;
}

std::string compare_outputs(const std::vector<Batch>& engine_output, const RefOutput& ref) {
  const engine::Schema& rs = *ref.schema;
  uint64_t engine_rows = 0;
  for (const Batch& b : engine_output) engine_rows += b.rows();
  if (engine_rows != ref.rows())
    return "engine produced " + std::to_string(engine_rows) + " rows, reference " +
           std::to_string(ref.rows());
  size_t j = 0;  // reference row
  for (const Batch& b : engine_output) {
    const engine::Schema& es = *b.schema;
    if (!(es == rs))
      return "engine output schema (" + es.to_string() + ") != reference (" + rs.to_string() + ")";
    for (size_t i = 0; i < b.rows(); ++i, ++j) {
      for (size_t c = 0; c < rs.size(); ++c) {
        if (!cell_equal(b.column(c), i, ref.columns[c], j))
          return "row " + std::to_string(j) + " field '" + rs.field(c).name + "': engine " +
                 engine_cell(b.column(c), i) + ", reference " + ref_cell(ref.columns[c], j);
      }
      if (b.event_time[i] != ref.event_time[j])
        return "row " + std::to_string(j) + " event time: engine " + std::to_string(b.event_time[i]) +
               ", reference " + std::to_string(ref.event_time[j]);
      if (b.seq[i] != j)
        return "row " + std::to_string(j) + " has sequence number " + std::to_string(b.seq[i]);
    }
  }
  return {};
}

Result<QueryRun> run_query(std::string_view query, const Events& events, const RunOptions& options) {
  const ReferenceFn reference = find_reference(query);
  if (reference == nullptr) return make_error(Errc::not_found, "unknown query '" + std::string(query) + "'");
  ENTENTE_ASSIGN_OR_RETURN(std::string text, load_query_text(query, options.query_dir));
  Diagnostics diag;
  auto net = engine::QueryNetwork::parse(text, diag);
  if (!net.ok())
    return make_error(Errc::invalid_argument,
                      std::string(query) + ".json is not a valid query network:\n" + diag.to_string());
  if (net->outputs().size() != 1)
    return make_error(Errc::invalid_argument, std::string(query) + ".json must have exactly one output");

  // Which chunk batch feeds each network input.
  std::vector<Batch Chunk::*> feeds;
  for (const auto& in : net->inputs()) {
    if (in.name == "persons")
      feeds.push_back(&Chunk::persons);
    else if (in.name == "auctions")
      feeds.push_back(&Chunk::auctions);
    else if (in.name == "bids")
      feeds.push_back(&Chunk::bids);
    else
      return make_error(Errc::invalid_argument, std::string(query) + ".json: input '" + in.name +
                                                    "' is not one of persons, auctions, bids");
  }
  // Push persons, then auctions, then bids of a chunk, whatever order the
  // network lists its inputs in.
  std::vector<size_t> order(feeds.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto rank = [&](size_t i) {
    return feeds[i] == &Chunk::persons ? 0 : feeds[i] == &Chunk::auctions ? 1 : 2;
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rank(a) < rank(b); });

  QueryRun run;
  run.query = std::string(query);
  run.events = events.total();
  // One engine run: a fresh executor (fresh state), every chunk, finish().
  auto run_engine = [&](std::vector<Batch>& out) -> Result<double> {
    out.clear();
    out.reserve(events.chunks.size() + 16);
    auto exec = engine::Executor::create(*net, [&out](size_t, const Batch& b) { out.push_back(b); });
    if (!exec.ok()) return exec.error();
    const auto t0 = std::chrono::steady_clock::now();
    for (const Chunk& chunk : events.chunks) {
      for (size_t i : order) {
        const Batch& b = chunk.*feeds[i];
        if (!b.empty()) (*exec)->push(i, b);
      }
    }
    (*exec)->finish();
    return seconds_since(t0);
  };

  const int repeat = std::max(1, options.repeat);
  std::vector<Batch> out;
  std::vector<Batch> again;
  for (int r = 0; r < repeat; ++r) {
    ENTENTE_ASSIGN_OR_RETURN(double secs, run_engine(r == 0 ? out : again));
    run.seconds = r == 0 ? secs : std::min(run.seconds, secs);
    if (r > 0 && again != out) {
      run.mismatch = "run " + std::to_string(r + 1) + " of the engine gave other output than run 1";
      return run;
    }
  }

  RefOutput ref;
  for (int r = 0; r < repeat; ++r) {
    const auto t1 = std::chrono::steady_clock::now();
    ref = reference(events);
    const double secs = seconds_since(t1);
    run.reference_seconds = r == 0 ? secs : std::min(run.reference_seconds, secs);
  }

  for (const Batch& b : out) run.output_rows += b.rows();
  run.reference_rows = ref.rows();
  run.mismatch = compare_outputs(out, ref);
  run.results_match = run.mismatch.empty();
  if (options.keep_output) run.output = std::move(out);
  return run;
}

}  // namespace entente::nexmark
