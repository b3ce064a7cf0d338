// nexmark: generates NEXMark events, runs each query on the engine and on
// its hand-written reference over the same events, checks that the outputs
// are equal row by row, and reports the throughput of both.
//
//   nexmark [--events N] [--queries q0,q5] [--json] [--dump DIR] [--seed S]
//           [--chunk N] [--repeat N]
//
// Exit status: 0 if every query ran and matched its reference, 1 if one
// did not, 2 for bad arguments.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "bench/nexmark/generator.h"
#include "bench/nexmark/reference.h"
#include "bench/nexmark/runner.h"
#include "engine/codec.h"

namespace {

using namespace entente;
using namespace entente::nexmark;

// Runs all queries in well under a minute on one core of a small VM while
// keeping the events (about 200 bytes each) within a few GB.
constexpr uint64_t kDefaultEvents = 10'000'000;

struct Args {
  uint64_t events = kDefaultEvents;
  uint64_t seed = 1;
  uint32_t chunk = 8192;
  int repeat = 3;
  std::vector<std::string> queries;
  bool json = false;
  std::string dump_dir;
};

void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--events N] [--queries q0,q5,...] [--json] [--dump DIR] [--seed S] [--chunk N] [--repeat N]\n"
               "  --events N    events to generate (1 .. 2^34, default %llu)\n"
               "  --queries L   comma-separated queries (default: all of",
               argv0, static_cast<unsigned long long>(kDefaultEvents));
  for (auto q : query_names()) std::fprintf(stderr, " %.*s", static_cast<int>(q.size()), q.data());
  std::fprintf(
      stderr,
      ")\n"
      "  --json        one JSON line per query, and one for the generator\n"
      "  --dump DIR    write persons/auctions/bids.ndjson and each qN.ndjson (engine output) to DIR\n"
      "  --seed S      generator seed (default 1)\n"
      "  --chunk N     events per generated chunk, i.e. per batch triple (1 .. 1048576, default 8192)\n"
      "  --repeat N    runs of the engine and of the reference per query; the fastest counts (1 .. 100, default 3)\n");
}

bool parse_u64(const char* s, uint64_t lo, uint64_t hi, uint64_t& out) {
  if (s == nullptr || *s == '\0') return false;
  uint64_t v = 0;
  for (const char* p = s; *p; ++p) {
    if (*p == '_' || *p == ',') continue;  // 10_000_000 and 10,000,000 read as numbers
    if (*p < '0' || *p > '9') return false;
    const uint64_t d = static_cast<uint64_t>(*p - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  if (v < lo || v > hi) return false;
  out = v;
  return true;
}

bool parse_args(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const char* val = i + 1 < argc ? argv[i + 1] : nullptr;
    uint64_t v = 0;
    if (arg == "--json") {
      a.json = true;
    } else if (arg == "--events") {
      if (!parse_u64(val, 1, uint64_t{1} << 34, a.events)) return false;
      ++i;
    } else if (arg == "--seed") {
      if (!parse_u64(val, 0, UINT64_MAX, a.seed)) return false;
      ++i;
    } else if (arg == "--chunk") {
      if (!parse_u64(val, 1, 1u << 20, v)) return false;
      a.chunk = static_cast<uint32_t>(v);
      ++i;
    } else if (arg == "--repeat") {
      if (!parse_u64(val, 1, 100, v)) return false;
      a.repeat = static_cast<int>(v);
      ++i;
    } else if (arg == "--dump") {
      if (val == nullptr || *val == '\0') return false;
      a.dump_dir = val;
      ++i;
    } else if (arg == "--queries") {
      if (val == nullptr) return false;
      std::string_view list = val;
      while (!list.empty()) {
        const size_t comma = list.find(',');
        const std::string_view q = list.substr(0, comma);
        if (find_reference(q) == nullptr) {
          std::fprintf(stderr, "unknown query '%.*s'\n", static_cast<int>(q.size()), q.data());
          return false;
        }
        a.queries.emplace_back(q);
        if (comma == std::string_view::npos) break;
        list.remove_prefix(comma + 1);
      }
      if (a.queries.empty()) return false;
      ++i;
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n", argv[i]);
      return false;
    }
  }
  if (a.queries.empty())
    for (auto q : query_names()) a.queries.emplace_back(q);
  return true;
}

double peak_rss_mb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// Fresh memory costs one page fault per 4 KiB page, and on virtual machines
// such a fault can cost more than the work done on the page: the benchmark
// would measure the hypervisor, not the engine. glibc's own tunables make
// malloc back its heap with transparent huge pages (hugetlb=1), take every
// block from that heap rather than from fresh mmap()s (mmap_max=0) and
// never give freed memory back (trim_threshold): unless the user set
// GLIBC_TUNABLES (even to ""), set them and re-execute once. Engine and
// references run in the same process, so both get the same allocator.
void reexec_with_malloc_tunables(char** argv) {
  if (std::getenv("GLIBC_TUNABLES") != nullptr || std::getenv("ENTENTE_NEXMARK_REEXEC") != nullptr) return;
  setenv("ENTENTE_NEXMARK_REEXEC", "1", 1);
  setenv("GLIBC_TUNABLES",
         "glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=18446744073709551615",
         1);
  execv("/proc/self/exe", argv);
  // Still here: run with the default allocator settings.
  unsetenv("GLIBC_TUNABLES");
}

// Whatever runs first would otherwise pay for faulting in the memory that
// everything after it reuses (the generator for the events, the first query
// for its output copies and the boxes' buffers), and the order of queries
// would change their figures. Touching the heap once up front and freeing
// it (the tunables above keep freed memory) gives the generator, every
// query and every reference the same warm heap, much as a JVM benchmark
// pre-touches its heap.
void prefault_heap(size_t bytes) {
  constexpr size_t kBlock = size_t{1} << 20;
  std::vector<char*> blocks;
  blocks.reserve(bytes / kBlock);
  for (size_t done = 0; done < bytes; done += kBlock) {
    char* p = static_cast<char*>(std::malloc(kBlock));
    if (p == nullptr) break;
    std::memset(p, 0, kBlock);
    blocks.push_back(p);
  }
  // Newest first, so that the heap top coalesces as it shrinks.
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) std::free(*it);
}

Status write_file(const std::filesystem::path& path, const std::string& data, bool append) {
  std::ofstream f(path, std::ios::binary | (append ? std::ios::app : std::ios::trunc));
  if (!f) return make_error(Errc::invalid_argument, "cannot open " + path.string());
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!f) return make_error(Errc::invalid_argument, "cannot write " + path.string());
  return Status::Ok();
}

Status dump_events(const std::filesystem::path& dir, const Events& ev) {
  const char* names[3] = {"persons.ndjson", "auctions.ndjson", "bids.ndjson"};
  Batch Chunk::*members[3] = {&Chunk::persons, &Chunk::auctions, &Chunk::bids};
  for (int s = 0; s < 3; ++s) {
    ENTENTE_RETURN_IF_ERROR(write_file(dir / names[s], "", false));
    std::string buf;
    for (const Chunk& c : ev.chunks) {
      engine::batch_to_ndjson(c.*members[s], buf);
      if (buf.size() > (16u << 20)) {
        ENTENTE_RETURN_IF_ERROR(write_file(dir / names[s], buf, true));
        buf.clear();
      }
    }
    ENTENTE_RETURN_IF_ERROR(write_file(dir / names[s], buf, true));
  }
  return Status::Ok();
}

Status dump_output(const std::filesystem::path& dir, const QueryRun& run) {
  const auto path = dir / (run.query + ".ndjson");
  ENTENTE_RETURN_IF_ERROR(write_file(path, "", false));
  std::string buf;
  for (const Batch& b : run.output) {
    engine::batch_to_ndjson(b, buf);
    if (buf.size() > (16u << 20)) {
      ENTENTE_RETURN_IF_ERROR(write_file(path, buf, true));
      buf.clear();
    }
  }
  return write_file(path, buf, true);
}

double rate(uint64_t n, double s) { return s > 0 ? static_cast<double>(n) / s : 0.0; }

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!parse_args(argc, argv, args)) {
    usage(argv[0]);
    return 2;
  }
  reexec_with_malloc_tunables(argv);

  if (!args.dump_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(args.dump_dir, ec);
    if (ec) {
      std::fprintf(stderr, "cannot create %s: %s\n", args.dump_dir.c_str(), ec.message().c_str());
      return 2;
    }
  }

  GeneratorConfig config;
  config.events = args.events;
  config.seed = args.seed;
  config.chunk_events = args.chunk;
  // The events (about 220 bytes each, with their buffers' slack) plus the
  // largest transient working set: q0's reference output (80 bytes per bid)
  // and the engine's output copies (16 bytes per row), with room for heap
  // fragmentation; at most half of RAM. Only with our tunables: without
  // them freed blocks go back to the system and touching them is wasted.
  if (std::getenv("ENTENTE_NEXMARK_REEXEC") != nullptr && std::getenv("GLIBC_TUNABLES") != nullptr) {
    const double phys =
        static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    prefault_heap(static_cast<size_t>(std::min(static_cast<double>(args.events) * 400.0, phys / 2)));
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto events = generate(config);
  const double gen_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!events.ok()) {
    std::fprintf(stderr, "%s\n", events.error().message.c_str());
    return 2;
  }
  const uint64_t n = events->total();
  if (args.json) {
    std::printf("{\"generator\":true,\"events\":%llu,\"seconds\":%.6f,\"events_per_s\":%.0f}\n",
                static_cast<unsigned long long>(n), gen_seconds, rate(n, gen_seconds));
  } else {
    std::printf(
        "generated %llu events (%llu persons, %llu auctions, %llu bids) in %.3f s: %.2f M events/s\n\n",
        static_cast<unsigned long long>(n), static_cast<unsigned long long>(events->persons),
        static_cast<unsigned long long>(events->auctions), static_cast<unsigned long long>(events->bids),
        gen_seconds, rate(n, gen_seconds) / 1e6);
    std::printf("%-5s %12s %10s %14s %14s %7s %11s %-7s %9s\n", "query", "events", "seconds", "engine ev/s",
                "ref ev/s", "ratio", "rows", "match", "rss MB");
  }
  std::fflush(stdout);
  if (!args.dump_dir.empty()) {
    if (Status s = dump_events(args.dump_dir, *events); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.error().message.c_str());
      return 1;
    }
  }

  bool all_ok = true;
  RunOptions options;
  options.repeat = args.repeat;
  options.keep_output = !args.dump_dir.empty();
  for (const std::string& q : args.queries) {
    auto run = run_query(q, *events, options);
    if (!run.ok()) {
      std::fprintf(stderr, "%s: %s\n", q.c_str(), run.error().message.c_str());
      all_ok = false;
      continue;
    }
    const double x = rate(n, run->seconds);
    const double y = rate(n, run->reference_seconds);
    const double ratio = y > 0 ? x / y : 0.0;
    if (args.json) {
      std::printf(
          "{\"query\":\"%s\",\"events\":%llu,\"seconds\":%.6f,\"events_per_s\":%.0f,"
          "\"reference_events_per_s\":%.0f,\"ratio\":%.4f,\"results_match\":%s,\"peak_rss_mb\":%.1f}\n",
          q.c_str(), static_cast<unsigned long long>(n), run->seconds, x, y, ratio,
          run->results_match ? "true" : "false", peak_rss_mb());
    } else {
      std::printf("%-5s %12llu %10.4f %14.0f %14.0f %7.3f %11llu %-7s %9.1f\n", q.c_str(),
                  static_cast<unsigned long long>(n), run->seconds, x, y, ratio,
                  static_cast<unsigned long long>(run->output_rows), run->results_match ? "yes" : "NO",
                  peak_rss_mb());
    }
    std::fflush(stdout);
    if (!run->results_match) {
      std::fprintf(stderr, "%s: engine output differs from the reference: %s\n", q.c_str(),
                   run->mismatch.c_str());
      all_ok = false;
    }
    if (!args.dump_dir.empty()) {
      if (Status s = dump_output(args.dump_dir, *run); !s.ok()) {
        std::fprintf(stderr, "%s\n", s.error().message.c_str());
        all_ok = false;
      }
    }
  }
  return all_ok ? 0 : 1;
}
