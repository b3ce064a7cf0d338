// Runs one NEXMark query on the engine and on its reference over the same
// pre-generated events, times both, and compares their outputs row by row.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bench/nexmark/generator.h"
#include "bench/nexmark/reference.h"

namespace entente::nexmark {

struct RunOptions {
  // Where qN.json live. The build defines ENTENTE_NEXMARK_QUERY_DIR as the
  // source tree's bench/nexmark/queries.
#ifdef ENTENTE_NEXMARK_QUERY_DIR
  std::string query_dir = ENTENTE_NEXMARK_QUERY_DIR;
#else
  std::string query_dir = "bench/nexmark/queries";
#endif
  // Keep the engine's output batches in QueryRun::output (for --dump).
  bool keep_output = false;
  // Runs of the engine and of the reference; each reports its fastest run
  // (these machines are noisy, and the fastest run is the one least
  // disturbed). Every engine run must give the same output.
  int repeat = 3;
};

struct QueryRun {
  std::string query;
  uint64_t events = 0;           // input events (all three streams)
  double seconds = 0;            // engine: pushing every batch + finish(), fastest run
  double reference_seconds = 0;  // reference over the same events, fastest run
  uint64_t output_rows = 0;
  uint64_t reference_rows = 0;
  bool results_match = false;
  std::string mismatch;       // the first difference, when !results_match
  std::vector<Batch> output;  // engine output, if RunOptions::keep_output
};

// Reads `dir`/`query`.json.
Result<std::string> load_query_text(std::string_view query, const std::string& dir);

// Parses and runs query `query` ("q0".."q8") with engine::Executor on the
// calling thread: for each chunk of `events`, in event-time order, the
// persons, auctions and bids batches go to the network inputs of those
// names; then finish(). Times the engine (excluding parsing and generation)
// and the reference. An Error only for a query that cannot run (missing
// file, invalid network, unknown input name); a result that differs is
// reported in QueryRun::mismatch.
Result<QueryRun> run_query(std::string_view query, const Events& events, const RunOptions& options);

// Compares engine output batches with a reference output: schema (names and
// types), row count, every value, event times, and sequence numbers (the
// engine's must be 0, 1, 2, ...). Returns an empty string if equal, else a
// description of the first difference.
std::string compare_outputs(const std::vector<Batch>& engine_output, const RefOutput& reference);

}  // namespace entente::nexmark
