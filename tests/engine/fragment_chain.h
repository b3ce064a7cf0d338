// Test support: runs the fragments of a cut query (engine/fragments.h)
// chained in one process, each by its own Executor, as the broker runs them
// across nodes: a batch a fragment writes to an internal stream is pushed
// into every fragment that reads it, and the producer's output watermark
// (Executor::output_watermark) is carried to the consumers' "manual"
// inputs before each batch and after each call. Everything is synchronous,
// so the boxes of every fragment see their batches and watermarks in the
// order the whole network would give them. run_staged runs them one after
// the other instead, as if the streams between them were delayed.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/codec.h"
#include "engine/fragments.h"
#include "engine/network.h"

namespace entente::engine::fragment_test {

class FragmentChain {
 public:
  explicit FragmentChain(const QueryCut& cut) : cut_(cut) {
    stages_.resize(cut_.fragments.size());
    for (size_t f = 0; f < cut_.fragments.size(); ++f) {
      auto ex = Executor::create(cut_.fragments[f].network,
                                 [this, f](size_t output, const Batch& b) { on_output(f, output, b); });
      EXPECT_TRUE(ex.ok());
      stages_[f].executor = std::move(ex).value();
    }
    // Where each fragment's internal outputs go.
    for (size_t f = 0; f < cut_.fragments.size(); ++f) {
      const QueryNetwork& net = cut_.fragments[f].network;
      stages_[f].consumers.resize(net.outputs().size());
      for (size_t o = 0; o < net.outputs().size(); ++o) {
        for (size_t c = 0; c < cut_.fragments.size(); ++c) {
          if (auto in = cut_.fragments[c].network.input_index(net.outputs()[o].name);
              in && c != f && is_read(c, net.outputs()[o].name))
            stages_[f].consumers[o].push_back({c, *in});
        }
      }
    }
  }

  // Pushes `b` into query input `input` of every fragment that reads it,
  // in pipeline order.
  void push(const std::string& input, const Batch& b) {
    for (size_t f : cut_.pipeline_order) {
      if (auto in = cut_.fragments[f].network.input_index(input); in && !is_read(f, input)) {
        stages_[f].executor->push(*in, b);
        sync(f);
      }
    }
  }

  // Ends the query inputs one by one, in the order `names` gives (the whole
  // network's finish() ends its inputs in network order), then every
  // fragment.
  void finish(const std::vector<std::string>& names) {
    for (const auto& input : names) {
      for (size_t f : cut_.pipeline_order) {
        if (auto in = cut_.fragments[f].network.input_index(input); in && !is_read(f, input)) {
          stages_[f].executor->advance_watermark(*in, kMaxWatermark);
          sync(f);
        }
      }
    }
    for (size_t f : cut_.pipeline_order) {
      stages_[f].executor->finish();
      sync(f);
    }
  }

  // The batches of each query output, by name, in the order produced.
  const std::map<std::string, std::vector<Batch>>& outputs() const { return outputs_; }

 private:
  struct Consumer {
    size_t fragment;
    size_t input;
  };
  struct Stage {
    std::unique_ptr<Executor> executor;
    std::vector<std::vector<Consumer>> consumers;  // per output; empty for query outputs
  };

  bool is_read(size_t f, const std::string& stream) const {
    const auto& r = cut_.fragments[f].reads;
    return std::find(r.begin(), r.end(), stream) != r.end();
  }

  void on_output(size_t f, size_t output, const Batch& b) {
    const auto& consumers = stages_[f].consumers[output];
    if (consumers.empty()) {
      outputs_[cut_.fragments[f].network.outputs()[output].name].push_back(b);
      return;
    }
    // First every watermark the producer forwarded before this batch (in
    // the whole network, its targets had them already), then the batch.
    sync(f);
    for (const Consumer& c : consumers) {
      stages_[c.fragment].executor->push(c.input, b);
      sync(c.fragment);
    }
  }

  // Carries fragment f's output watermarks to its consumers, and theirs on.
  void sync(size_t f) {
    for (size_t o = 0; o < stages_[f].consumers.size(); ++o) {
      for (const Consumer& c : stages_[f].consumers[o]) {
        stages_[c.fragment].executor->advance_watermark(c.input, stages_[f].executor->output_watermark(o));
        sync(c.fragment);
      }
    }
  }

  const QueryCut& cut_;
  std::vector<Stage> stages_;
  std::map<std::string, std::vector<Batch>> outputs_;
};

// Every row of `batches` as NDJSON with its event time and sequence number,
// for comparisons whose failure shows the first different row.
inline std::vector<std::string> rows_of(const std::vector<Batch>& batches) {
  std::vector<std::string> rows;
  for (const Batch& b : batches) {
    for (size_t r = 0; r < b.rows(); ++r) {
      std::string line;
      row_to_json(b, r, line);
      rows.push_back(std::move(line));
    }
  }
  return rows;
}

// A feed: which input each batch goes to, in order.
struct Feed {
  std::vector<std::pair<std::string, Batch>> pushes;
};

// What a run produced: the batches of each output, and how many rows each
// output had after each push (so that rows coming out at other times, from
// watermarks carried late or early, would show).
struct Run {
  std::map<std::string, std::vector<Batch>> outputs;
  std::vector<std::map<std::string, size_t>> rows_after_push;

  void step() {
    auto& counts = rows_after_push.emplace_back();
    for (const auto& [name, batches] : outputs)
      for (const Batch& b : batches) counts[name] += b.rows();
  }
};

inline Run run_whole(const QueryNetwork& net, const Feed& feed) {
  Run run;
  auto ex = Executor::create(net, [&](size_t o, const Batch& b) { run.outputs[net.outputs()[o].name].push_back(b); });
  EXPECT_TRUE(ex.ok());
  for (const auto& [input, b] : feed.pushes) {
    if (auto i = net.input_index(input)) (*ex)->push(*i, b);
    run.step();
  }
  (*ex)->finish();
  return run;
}

inline Run run_cut(const QueryNetwork& net, const QueryCut& cut, const Feed& feed) {
  Run run;
  FragmentChain chain(cut);
  for (const auto& [input, b] : feed.pushes) {
    if (net.input_index(input)) chain.push(input, b);
    run.outputs = chain.outputs();
    run.step();
  }
  std::vector<std::string> inputs;
  for (const auto& in : net.inputs()) inputs.push_back(in.name);
  chain.finish(inputs);
  run.outputs = chain.outputs();
  return run;
}

// The fragments one after the other, in pipeline order, as if every
// internal stream were delayed as long as can be, and through the encoding
// the broker logs an internal stream in (internal_stream_schema): each
// producer's rows are written after the watermark it had sent before them,
// with a mark after each call that moved its output watermark; records of
// three writes each are concatenated, as a runner's flush does; each
// consumer reads them back with push_internal. A fragment first gets
// everything its internal streams carried (one stream after the other),
// then all of its query inputs' batches, then finish(). Only the final rows
// can be compared with the whole network's.
inline Run run_staged(const QueryNetwork& net, const QueryCut& cut, const Feed& feed) {
  struct Stream {
    SchemaPtr schema;
    EventTime last = kMinTime;  // the watermark of the last row or mark written
    std::vector<Batch> writes;
  };
  std::map<std::string, Stream> streams;  // by internal stream
  Run run;
  for (size_t f : cut.pipeline_order) {
    const FragmentPlan& plan = cut.fragments[f];
    const QueryNetwork& fnet = plan.network;
    std::unique_ptr<Executor> ex;
    auto is_internal = [&](const std::string& name) {
      return std::find(plan.writes.begin(), plan.writes.end(), name) != plan.writes.end();
    };
    auto stream_of = [&](size_t o) -> Stream& {
      Stream& s = streams[fnet.outputs()[o].name];
      if (!s.schema) s.schema = internal_stream_schema(*fnet.outputs()[o].schema);
      return s;
    };
    auto record_watermarks = [&] {
      for (size_t o = 0; o < fnet.outputs().size(); ++o) {
        if (!is_internal(fnet.outputs()[o].name)) continue;
        Stream& s = stream_of(o);
        if (const EventTime wm = ex->output_watermark(o); wm > s.last) {
          s.writes.push_back(internal_mark(s.schema, wm));
          s.last = wm;
        }
      }
    };
    auto made = Executor::create(fnet, [&](size_t o, const Batch& b) {
      const std::string& name = fnet.outputs()[o].name;
      if (!is_internal(name)) {
        run.outputs[name].push_back(b);
        return;
      }
      Stream& s = stream_of(o);
      s.last = ex->output_watermark(o);
      s.writes.push_back(internal_rows(s.schema, b, s.last));
    });
    EXPECT_TRUE(made.ok());
    ex = std::move(made).value();
    for (const std::string& stream : plan.reads) {
      const size_t in = *fnet.input_index(stream);
      const Stream& s = streams[stream];
      for (size_t i = 0; i < s.writes.size(); i += 3) {
        const size_t end = std::min(i + 3, s.writes.size());
        const Batch record = concat(s.schema, std::span<const Batch>(s.writes.data() + i, end - i));
        push_internal(*ex, in, fnet.inputs()[in].schema, record);
        record_watermarks();
      }
    }
    for (const auto& [input, b] : feed.pushes) {
      if (std::find(plan.inputs.begin(), plan.inputs.end(), input) == plan.inputs.end()) continue;
      ex->push(*fnet.input_index(input), b);
      record_watermarks();
    }
    std::vector<std::string> order;
    for (const auto& in : net.inputs()) order.push_back(in.name);
    for (const auto& name : order)
      if (auto in = fnet.input_index(name)) {
        ex->advance_watermark(*in, kMaxWatermark);
        record_watermarks();
      }
    ex->finish();
    record_watermarks();
  }
  return run;
}

// The same rows (values, event times, sequence numbers) in every output.
inline void expect_same_rows(const QueryNetwork& net, const Run& whole, const Run& parts, const char* how) {
  for (const auto& out : net.outputs()) {
    const auto w = whole.outputs.count(out.name) ? rows_of(whole.outputs.at(out.name)) : std::vector<std::string>{};
    const auto c = parts.outputs.count(out.name) ? rows_of(parts.outputs.at(out.name)) : std::vector<std::string>{};
    ASSERT_EQ(w.size(), c.size()) << how << ", output " << out.name;
    for (size_t r = 0; r < w.size(); ++r) ASSERT_EQ(w[r], c[r]) << how << ", output " << out.name << " row " << r;
  }
}

// The cut gives every output of the whole network, row for row (values,
// event times, sequence numbers): chained, with as many rows after each
// push, and something at all before finish(); and run one fragment after
// the other (run_staged).
inline void expect_same_output(const QueryNetwork& net, const QueryCut& cut, const Feed& feed) {
  const Run whole = run_whole(net, feed);
  expect_same_rows(net, whole, run_staged(net, cut, feed), "staged");
  const Run parts = run_cut(net, cut, feed);
  size_t total = 0;
  for (const auto& out : net.outputs()) {
    const auto w = whole.outputs.count(out.name) ? rows_of(whole.outputs.at(out.name)) : std::vector<std::string>{};
    const auto c = parts.outputs.count(out.name) ? rows_of(parts.outputs.at(out.name)) : std::vector<std::string>{};
    ASSERT_EQ(w.size(), c.size()) << "output " << out.name;
    for (size_t r = 0; r < w.size(); ++r) ASSERT_EQ(w[r], c[r]) << "output " << out.name << " row " << r;
    total += w.size();
  }
  EXPECT_GT(total, 0u);
  ASSERT_EQ(whole.rows_after_push.size(), parts.rows_after_push.size());
  for (size_t i = 0; i < whole.rows_after_push.size(); ++i)
    ASSERT_EQ(whole.rows_after_push[i], parts.rows_after_push[i]) << "after push " << i;
  EXPECT_FALSE(whole.rows_after_push.back().empty()) << "nothing came out before finish()";
}

}  // namespace entente::engine::fragment_test
