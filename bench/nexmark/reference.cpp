#include "bench/nexmark/reference.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <unordered_map>

#include "engine/hash.h"

namespace entente::nexmark {

using engine::Column;
using engine::Type;

size_t RefColumn::size() const noexcept {
  switch (type) {
    case Type::Double:
      return doubles.size();
    case Type::String:
      return strs.size();
    default:
      return ints.size();
  }
}

namespace {

RefOutput make_output(std::vector<engine::Field> fields) {
  RefOutput out;
  out.columns.reserve(fields.size());
  for (const auto& f : fields) {
    RefColumn c;
    c.type = f.type;
    out.columns.push_back(std::move(c));
  }
  out.schema = engine::make_schema(std::move(fields));
  return out;
}

// q0: every bid, unchanged.
RefOutput q0(const Events& ev) {
  RefOutput out = make_output(bid_schema()->fields());
  auto& c = out.columns;
  for (auto& col : c) {
    if (col.type == Type::String)
      col.strs.reserve(ev.bids);
    else
      col.ints.reserve(ev.bids);
  }
  out.event_time.reserve(ev.bids);
  for (const Chunk& ch : ev.chunks) {
    const Batch& b = ch.bids;
    const auto& auction = b.column(kBAuction).ints;
    const auto& bidder = b.column(kBBidder).ints;
    const auto& price = b.column(kBPrice).ints;
    const auto& dt = b.column(kBDateTime).ints;
    for (size_t i = 0; i < b.rows(); ++i) {
      c[kBAuction].ints.push_back(auction[i]);
      c[kBBidder].ints.push_back(bidder[i]);
      c[kBPrice].ints.push_back(price[i]);
      c[kBChannel].strs.push_back(b.column(kBChannel).str(i));
      c[kBUrl].strs.push_back(b.column(kBUrl).str(i));
      c[kBDateTime].ints.push_back(dt[i]);
      c[kBExtra].strs.push_back(b.column(kBExtra).str(i));
      out.event_time.push_back(b.event_time[i]);
    }
  }
  return out;
}

// q1: every bid with its price converted from dollars to euros, in integer
// cents as Beam does: price * 89 / 100.
RefOutput q1(const Events& ev) {
  RefOutput out = make_output(bid_schema()->fields());
  auto& c = out.columns;
  for (auto& col : c) {
    if (col.type == Type::String)
      col.strs.reserve(ev.bids);
    else
      col.ints.reserve(ev.bids);
  }
  out.event_time.reserve(ev.bids);
  for (const Chunk& ch : ev.chunks) {
    const Batch& b = ch.bids;
    const auto& auction = b.column(kBAuction).ints;
    const auto& bidder = b.column(kBBidder).ints;
    const auto& price = b.column(kBPrice).ints;
    const auto& dt = b.column(kBDateTime).ints;
    for (size_t i = 0; i < b.rows(); ++i) {
      c[kBAuction].ints.push_back(auction[i]);
      c[kBBidder].ints.push_back(bidder[i]);
      c[kBPrice].ints.push_back(price[i] * 89 / 100);
      c[kBChannel].strs.push_back(b.column(kBChannel).str(i));
      c[kBUrl].strs.push_back(b.column(kBUrl).str(i));
      c[kBDateTime].ints.push_back(dt[i]);
      c[kBExtra].strs.push_back(b.column(kBExtra).str(i));
      out.event_time.push_back(b.event_time[i]);
    }
  }
  return out;
}

// q2: (auction, price) of the bids on every 123rd auction.
RefOutput q2(const Events& ev) {
  RefOutput out = make_output({{"auction", Type::Int64}, {"price", Type::Int64}});
  auto& c = out.columns;
  for (const Chunk& ch : ev.chunks) {
    const Batch& b = ch.bids;
    const auto& auction = b.column(kBAuction).ints;
    const auto& price = b.column(kBPrice).ints;
    for (size_t i = 0; i < b.rows(); ++i) {
      if (auction[i] % 123 != 0) continue;
      c[0].ints.push_back(auction[i]);
      c[1].ints.push_back(price[i]);
      out.event_time.push_back(b.event_time[i]);
    }
  }
  return out;
}

// ---- joins -------------------------------------------------------------------
//
// The join box consumes its two inputs in one order: by event time, then
// input (left before right), then arrival. Each row is matched against the
// rows of the other side seen before it (oldest first), then remembered.
// A pair therefore comes out when its later row is processed, with event
// time max(left, right). The joins below walk their two streams in that
// order.

// Calls left(i) / right(j) for the rows of two time-ordered sequences in
// (time, left before right, position) order.
template <class L, class R, class FL, class FR>
void merge_in_join_order(const std::vector<L>& left, const std::vector<R>& right, FL&& on_left,
                         FR&& on_right) {
  size_t i = 0, j = 0;
  while (i < left.size() || j < right.size()) {
    if (j == right.size() || (i < left.size() && left[i].t <= right[j].t))
      on_left(i++);
    else
      on_right(j++);
  }
}

struct PersonRow {
  EventTime t;
  int64_t id;
  std::string_view name, city, state;
};
struct AuctionRow {
  EventTime t;
  int64_t id, seller, reserve;
};

// The join's order (docs/boxes-windowed.md, "Join"): the rows of one event
// time by the key group of their join key, else as emitted. `keys` holds
// each row's key.
void order_as_join(RefOutput& out, const std::vector<int64_t>& keys) {
  const size_t n = out.rows();
  std::vector<uint32_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0u);
  std::stable_sort(perm.begin(), perm.end(), [&](uint32_t a, uint32_t b) {
    if (out.event_time[a] != out.event_time[b]) return out.event_time[a] < out.event_time[b];
    return engine::key_group_of(engine::hash_int(keys[a])) < engine::key_group_of(engine::hash_int(keys[b]));
  });
  auto permuted = [&](auto& v) {
    std::remove_reference_t<decltype(v)> w;
    w.reserve(n);
    for (uint32_t k : perm) w.push_back(std::move(v[k]));
    v = std::move(w);
  };
  permuted(out.event_time);
  for (RefColumn& c : out.columns) {
    if (c.type == Type::Double) permuted(c.doubles);
    else if (c.type == Type::String) permuted(c.strs);
    else permuted(c.ints);
  }
}

// q3: local item suggestion. Persons in OR, ID or CA joined with auctions
// of category 10 on person.id = auction.seller, for auction.date_time -
// person.date_time in [-10 s, +10 s] (docs/nexmark.md explains why this
// interval equals Beam's unbounded join for this generator).
RefOutput q3(const Events& ev) {
  constexpr int64_t kLower = -10'000, kUpper = 10'000;
  std::vector<PersonRow> persons;
  std::vector<AuctionRow> auctions;
  for (const Chunk& ch : ev.chunks) {
    const Batch& p = ch.persons;
    const Column& state = p.column(kPState);
    for (size_t i = 0; i < p.rows(); ++i) {
      const std::string_view s = state.str(i);
      if (s == "OR" || s == "ID" || s == "CA")
        persons.push_back(
            {p.event_time[i], p.column(kPId).ints[i], p.column(kPName).str(i), p.column(kPCity).str(i), s});
    }
    const Batch& a = ch.auctions;
    const auto& category = a.column(kACategory).ints;
    for (size_t i = 0; i < a.rows(); ++i)
      if (category[i] == 10)
        auctions.push_back({a.event_time[i], a.column(kAId).ints[i], a.column(kASeller).ints[i], 0});
  }
  RefOutput out = make_output(
      {{"name", Type::String}, {"city", Type::String}, {"state", Type::String}, {"auction_id", Type::Int64}});
  std::vector<int64_t> keys;  // each row's person id, the join key
  auto& c = out.columns;
  auto emit = [&](const PersonRow& p, const AuctionRow& a, EventTime t) {
    c[0].strs.push_back(p.name);
    c[1].strs.push_back(p.city);
    c[2].strs.push_back(p.state);
    c[3].ints.push_back(a.id);
    out.event_time.push_back(t);
    keys.push_back(p.id);
  };
  std::unordered_map<int64_t, std::vector<uint32_t>> person_by_id, auctions_by_seller;
  merge_in_join_order(
      persons, auctions,
      [&](size_t i) {
        const PersonRow& p = persons[i];
        if (auto it = auctions_by_seller.find(p.id); it != auctions_by_seller.end())
          for (uint32_t j : it->second)
            if (auctions[j].t - p.t >= kLower) emit(p, auctions[j], p.t);
        person_by_id[p.id].push_back(static_cast<uint32_t>(i));
      },
      [&](size_t j) {
        const AuctionRow& a = auctions[j];
        if (auto it = person_by_id.find(a.seller); it != person_by_id.end())
          for (uint32_t i : it->second)
            if (a.t - persons[i].t <= kUpper) emit(persons[i], a, a.t);
        auctions_by_seller[a.seller].push_back(static_cast<uint32_t>(j));
      });
  order_as_join(out, keys);
  return out;
}

// q8: monitor new users. Persons joined with auctions on person.id =
// auction.seller when both fall in the same 10 s tumbling window; one row
// (id, name, reserve) per pair, as Beam.
RefOutput q8(const Events& ev) {
  constexpr int64_t kWindow = 10'000;
  std::vector<PersonRow> persons;
  std::vector<AuctionRow> auctions;
  persons.reserve(ev.persons);
  auctions.reserve(ev.auctions);
  for (const Chunk& ch : ev.chunks) {
    const Batch& p = ch.persons;
    for (size_t i = 0; i < p.rows(); ++i)
      persons.push_back({p.event_time[i], p.column(kPId).ints[i], p.column(kPName).str(i), {}, {}});
    const Batch& a = ch.auctions;
    for (size_t i = 0; i < a.rows(); ++i)
      auctions.push_back(
          {a.event_time[i], a.column(kAId).ints[i], a.column(kASeller).ints[i], a.column(kAReserve).ints[i]});
  }
  RefOutput out = make_output({{"id", Type::Int64}, {"name", Type::String}, {"reserve", Type::Int64}});
  std::vector<int64_t> keys;  // each row's person id, the join key
  auto& c = out.columns;
  auto emit = [&](const PersonRow& p, const AuctionRow& a, EventTime t) {
    c[0].ints.push_back(p.id);
    c[1].strs.push_back(p.name);
    c[2].ints.push_back(a.reserve);
    out.event_time.push_back(t);
    keys.push_back(p.id);
  };
  auto window = [](EventTime t) { return t / kWindow; };  // event times are positive
  // Only the current window's rows can match: forget the rest when it ends.
  int64_t current = INT64_MIN;
  std::unordered_map<int64_t, std::vector<uint32_t>> person_by_id, auctions_by_seller;
  auto enter = [&](EventTime t) {
    if (window(t) == current) return;
    current = window(t);
    person_by_id.clear();
    auctions_by_seller.clear();
  };
  merge_in_join_order(
      persons, auctions,
      [&](size_t i) {
        const PersonRow& p = persons[i];
        enter(p.t);
        if (auto it = auctions_by_seller.find(p.id); it != auctions_by_seller.end())
          for (uint32_t j : it->second) emit(p, auctions[j], p.t);
        person_by_id[p.id].push_back(static_cast<uint32_t>(i));
      },
      [&](size_t j) {
        const AuctionRow& a = auctions[j];
        enter(a.t);
        if (auto it = person_by_id.find(a.seller); it != person_by_id.end())
          for (uint32_t i : it->second) emit(persons[i], a, a.t);
        auctions_by_seller[a.seller].push_back(static_cast<uint32_t>(j));
      });
  order_as_join(out, keys);
  return out;
}

// ---- windows ----------------------------------------------------------------
//
// The aggregate box emits a window [start, end) once the watermark passes
// it, with event time end - 1: one row per group, ordered by the key group
// of the group's key hash (engine/hash.h), then by the group's first row in
// the window.

uint32_t key_group_int(int64_t v) { return engine::key_group_of(engine::hash_int(v)); }
uint32_t key_group_int2(int64_t a, int64_t b) {
  return engine::key_group_of(engine::hash_combine(engine::hash_int(a), engine::hash_int(b)));
}

// q7: highest bid. Per 10 s tumbling window, the bid with the highest
// price (the earliest on a tie: bids come in event-time order, so the first
// to reach the maximum): auction, price, bidder, date_time, at event time
// end - 1.
RefOutput q7(const Events& ev) {
  constexpr int64_t kWindow = 10'000;
  RefOutput out = make_output({{"auction", Type::Int64},
                               {"price", Type::Int64},
                               {"bidder", Type::Int64},
                               {"date_time", Type::Timestamp}});
  auto& c = out.columns;
  struct Best {
    int64_t auction, bidder, date_time;
  };
  Best best{};
  int64_t max_price = INT64_MIN;
  int64_t window = INT64_MIN;
  auto close = [&] {
    c[0].ints.push_back(best.auction);
    c[1].ints.push_back(max_price);
    c[2].ints.push_back(best.bidder);
    c[3].ints.push_back(best.date_time);
    out.event_time.push_back((window + 1) * kWindow - 1);
    max_price = INT64_MIN;
  };
  bool any = false;
  for (const Chunk& ch : ev.chunks) {
    const Batch& b = ch.bids;
    const auto& auction = b.column(kBAuction).ints;
    const auto& bidder = b.column(kBBidder).ints;
    const auto& price = b.column(kBPrice).ints;
    const auto& dt = b.column(kBDateTime).ints;
    for (size_t i = 0; i < b.rows(); ++i) {
      const int64_t w = b.event_time[i] / kWindow;
      if (w != window) {
        if (any) close();
        window = w;
        any = true;
      }
      if (price[i] <= max_price) continue;
      max_price = price[i];
      best = {auction[i], bidder[i], dt[i]};
    }
  }
  if (any) close();
  return out;
}

// q5: hot items. Per sliding window of 10 s every 2 s, the auctions with
// the most bids (all of them on a tie): auction, num, window_start,
// window_end, at event time window_end - 1.
RefOutput q5(const Events& ev) {
  constexpr int64_t kSlide = 2'000, kPanesPerWindow = 5;  // size 10 s
  RefOutput out = make_output({{"auction", Type::Int64},
                               {"num", Type::Int64},
                               {"window_start", Type::Timestamp},
                               {"window_end", Type::Timestamp}});
  auto& c = out.columns;
  struct Cell {
    int64_t count;
    uint64_t first;  // arrival index of the auction's first bid in the pane
  };
  using Pane = std::unordered_map<int64_t, Cell>;
  // The last kPanesPerWindow panes, pane p at panes[p % kPanesPerWindow].
  std::vector<Pane> panes(kPanesPerWindow);
  std::vector<int64_t> pane_id(kPanesPerWindow, INT64_MIN);
  int64_t newest = INT64_MIN;  // newest pane with data

  std::unordered_map<int64_t, Cell> window;
  struct Row {
    uint32_t key_group;
    uint64_t first;
    int64_t auction;
  };
  std::vector<Row> rows;
  // Emits the window ending with pane `last` (exclusive end (last+1)*slide).
  auto emit_window = [&](int64_t last) {
    window.clear();
    for (int64_t p = last - kPanesPerWindow + 1; p <= last; ++p) {
      const size_t k = static_cast<size_t>(((p % kPanesPerWindow) + kPanesPerWindow) % kPanesPerWindow);
      if (pane_id[k] != p) continue;
      for (const auto& [auction, cell] : panes[k]) {
        auto [it, fresh] = window.try_emplace(auction, cell);
        if (!fresh) {
          it->second.count += cell.count;
          it->second.first = std::min(it->second.first, cell.first);
        }
      }
    }
    if (window.empty()) return;
    int64_t max = 0;
    for (const auto& [auction, cell] : window) max = std::max(max, cell.count);
    rows.clear();
    for (const auto& [auction, cell] : window)
      if (cell.count == max) rows.push_back({key_group_int(auction), cell.first, auction});
    std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
      return a.key_group != b.key_group ? a.key_group < b.key_group : a.first < b.first;
    });
    const int64_t end = (last + 1) * kSlide;
    for (const Row& r : rows) {
      c[0].ints.push_back(r.auction);
      c[1].ints.push_back(max);
      c[2].ints.push_back(end - kSlide * kPanesPerWindow);
      c[3].ints.push_back(end);
      out.event_time.push_back(end - 1);
    }
  };
  uint64_t arrival = 0;
  for (const Chunk& ch : ev.chunks) {
    const Batch& b = ch.bids;
    const auto& auction = b.column(kBAuction).ints;
    for (size_t i = 0; i < b.rows(); ++i, ++arrival) {
      const int64_t p = b.event_time[i] / kSlide;
      if (p != newest) {
        // Windows ending with panes newest .. p-1 are complete.
        if (newest != INT64_MIN)
          for (int64_t q = newest; q < p && q < newest + kPanesPerWindow; ++q) emit_window(q);
        newest = p;
        const size_t k = static_cast<size_t>(p % kPanesPerWindow);
        panes[k].clear();
        pane_id[k] = p;
      }
      Pane& pane = panes[static_cast<size_t>(p % kPanesPerWindow)];
      auto [it, fresh] = pane.try_emplace(auction[i], Cell{0, arrival});
      ++it->second.count;
    }
  }
  if (newest != INT64_MIN)
    for (int64_t q = newest; q < newest + kPanesPerWindow; ++q) emit_window(q);
  return out;
}

// q4: average selling price per category. An auction's winning price is
// its highest bid among the bids with auction.date_time <= bid.date_time
// <= auction.expires (and at most 1 s after the auction started, a bound
// no generated auction reaches); the result is, per 10 s tumbling window of
// auction expiry and per category, the average winning price.
RefOutput q4(const Events& ev) {
  constexpr int64_t kUpper = 1'000, kWindow = 10'000;
  struct A {
    EventTime t;
    int64_t id, category, expires;
  };
  struct B {
    EventTime t;
    int64_t auction, price;
  };
  std::vector<A> auctions;
  std::vector<B> bids;
  auctions.reserve(ev.auctions);
  bids.reserve(ev.bids);
  for (const Chunk& ch : ev.chunks) {
    const Batch& a = ch.auctions;
    for (size_t i = 0; i < a.rows(); ++i)
      auctions.push_back({a.event_time[i], a.column(kAId).ints[i], a.column(kACategory).ints[i],
                          a.column(kAExpires).ints[i]});
    const Batch& b = ch.bids;
    for (size_t i = 0; i < b.rows(); ++i)
      bids.push_back({b.event_time[i], b.column(kBAuction).ints[i], b.column(kBPrice).ints[i]});
  }

  // The join: each bid finds its auction (ids are unique), if the auction
  // came first. Matches, in join output order.
  struct Match {
    int64_t window;  // of the auction's expiry
    int64_t id, category, price;
  };
  std::vector<Match> matches;
  std::unordered_map<int64_t, uint32_t> auction_by_id;
  merge_in_join_order(
      auctions, bids, [&](size_t i) { auction_by_id[auctions[i].id] = static_cast<uint32_t>(i); },
      [&](size_t j) {
        const B& b = bids[j];
        auto it = auction_by_id.find(b.auction);
        if (it == auction_by_id.end()) return;
        const A& a = auctions[it->second];
        if (b.t - a.t > kUpper || b.t > a.expires) return;
        matches.push_back({a.expires / kWindow, a.id, a.category, b.price});
      });

  // Group by expiry window, keeping each window's matches in join order.
  std::stable_sort(matches.begin(), matches.end(),
                   [](const Match& x, const Match& y) { return x.window < y.window; });

  RefOutput out = make_output({{"category", Type::Int64},
                               {"window_start", Type::Timestamp},
                               {"window_end", Type::Timestamp},
                               {"avg_price", Type::Double}});
  auto& c = out.columns;
  struct Winner {
    int64_t category, price;
    uint64_t first;
  };
  struct Group {
    uint32_t key_group;
    uint64_t first;
    int64_t category;
    int64_t sum;
    int64_t count;
  };
  std::unordered_map<int64_t, Winner> winners;  // auction id -> winner
  std::vector<std::pair<int64_t, const Winner*>> ordered;
  std::vector<Group> groups;
  for (size_t lo = 0; lo < matches.size();) {
    size_t hi = lo;
    winners.clear();
    for (; hi < matches.size() && matches[hi].window == matches[lo].window; ++hi) {
      const Match& m = matches[hi];
      auto [it, fresh] = winners.try_emplace(m.id, Winner{m.category, m.price, hi});
      if (!fresh) it->second.price = std::max(it->second.price, m.price);
    }
    // The first aggregate's rows (one per auction) in its output order...
    ordered.clear();
    for (const auto& [id, w] : winners) ordered.emplace_back(id, &w);
    std::sort(ordered.begin(), ordered.end(), [](const auto& x, const auto& y) {
      const uint32_t gx = key_group_int2(x.first, x.second->category);
      const uint32_t gy = key_group_int2(y.first, y.second->category);
      return gx != gy ? gx < gy : x.second->first < y.second->first;
    });
    // ...are the second aggregate's input, in the same window.
    groups.clear();
    for (size_t k = 0; k < ordered.size(); ++k) {
      const Winner& w = *ordered[k].second;
      auto g = std::find_if(groups.begin(), groups.end(),
                            [&](const Group& x) { return x.category == w.category; });
      if (g == groups.end()) {
        groups.push_back({key_group_int(w.category), k, w.category, 0, 0});
        g = groups.end() - 1;
      }
      g->sum += w.price;
      ++g->count;
    }
    std::sort(groups.begin(), groups.end(), [](const Group& x, const Group& y) {
      return x.key_group != y.key_group ? x.key_group < y.key_group : x.first < y.first;
    });
    const int64_t end = (matches[lo].window + 1) * kWindow;
    for (const Group& g : groups) {
      c[0].ints.push_back(g.category);
      c[1].ints.push_back(end - kWindow);
      c[2].ints.push_back(end);
      c[3].doubles.push_back(static_cast<double>(g.sum) / static_cast<double>(g.count));
      out.event_time.push_back(end - 1);
    }
    lo = hi;
  }
  return out;
}

struct Entry {
  std::string_view name;
  ReferenceFn fn;
};

constexpr Entry kReferences[] = {
    {"q0", &q0}, {"q1", &q1}, {"q2", &q2}, {"q3", &q3}, {"q4", &q4}, {"q5", &q5}, {"q7", &q7}, {"q8", &q8},
};

}  // namespace

ReferenceFn find_reference(std::string_view name) noexcept {
  for (const Entry& e : kReferences)
    if (e.name == name) return e.fn;
  return nullptr;
}

const std::vector<std::string_view>& query_names() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> v;
    for (const Entry& e : kReferences) v.push_back(e.name);
    return v;
  }();
  return names;
}

}  // namespace entente::nexmark
