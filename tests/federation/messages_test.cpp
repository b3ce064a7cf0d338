// Message payloads: exact byte layouts (docs/protocol.md §5), round trips
// at the edges of every field, and clean errors for truncated, trailing and
// invalid bytes.

#include "federation/messages.h"

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "federation/frame.h"

namespace entente::federation {
namespace {

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
constexpr uint32_t kU32Max = std::numeric_limits<uint32_t>::max();

std::string bytes(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

Hello valid_hello() {
  Hello h;
  h.domain = "acme";
  h.node = "n1";
  h.max_frame = kDefaultMaxFrame;
  h.heartbeat_ms = 250;
  return h;
}

template <class T>
Error error_of(const Result<T>& r) {
  EXPECT_FALSE(r.ok());
  if (r.ok()) return {};
  return r.error();
}

void expect_parse_error(const Error& e, const std::string& message) {
  EXPECT_EQ(e.code, Errc::parse_error);
  EXPECT_EQ(e.message, message);
}

// ---- layouts ----

TEST(MessageLayout, Hello) {
  Hello h;
  h.min_version = 1;
  h.max_version = 0x0203;
  h.domain = "ab";
  h.node = "c";
  h.max_frame = 0x00100000;
  h.heartbeat_ms = 250;
  EXPECT_EQ(encode(h), bytes({0, 1, 2, 3, 0, 2, 'a', 'b', 0, 1, 'c', 0x00, 0x10, 0x00, 0x00, 0, 0, 0, 250}));
}

TEST(MessageLayout, TheHelloFrameOfTheProtocolDocument) {
  // docs/protocol.md §5.10, byte for byte.
  std::string frame;
  append_frame(frame, FrameType::hello, 0, encode(valid_hello()));
  EXPECT_EQ(frame, bytes({0x00, 0x00, 0x00, 0x1b, 0x01, 0x00, 0x00, 0x00, 0x00,  //
                          0x00, 0x01, 0x00, 0x03,                                //
                          0x00, 0x04, 0x61, 0x63, 0x6d, 0x65,                    //
                          0x00, 0x02, 0x6e, 0x31,                                //
                          0x00, 0x10, 0x00, 0x00,                                //
                          0x00, 0x00, 0x00, 0xfa}));
}

TEST(MessageLayout, EveryOtherMessage) {
  EXPECT_EQ(encode(Heartbeat{0x0102030405060708, 9, 0x0a}),
            bytes({1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0x0a}));
  EXPECT_EQ(encode(GoAway{WireError::identity, "no"}), bytes({0, 4, 0, 2, 'n', 'o'}));
  EXPECT_EQ(encode(Open{"d/s", 0x0100, 0x10000}),
            bytes({0, 3, 'd', '/', 's', 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0}));
  EXPECT_EQ(encode(OpenOk{"{}", 1, 2}),
            bytes({0, 2, '{', '}', 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2}));
  EXPECT_EQ(encode(Reset{WireError::bad_position, ""}), bytes({0, 10, 0, 0}));
  EXPECT_EQ(encode(Data{5, 2, "xyz", {}}),
            bytes({0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 2, 0, 0, 0, 3, 'x', 'y', 'z'}));
  EXPECT_EQ(encode(Ack{kU64Max}), std::string(8, '\xff'));
  EXPECT_EQ(encode(Credit{0x01020304}), bytes({1, 2, 3, 4}));
}

// ---- round trips ----

TEST(MessageRoundTrip, HelloAtTheEdges) {
  const std::string longest(63, 'z');
  for (uint16_t lo : {uint16_t{1}, uint16_t{65535}}) {
    for (uint32_t max_frame : {kMinMaxFrame, kDefaultMaxFrame, kMaxMaxFrame}) {
      for (uint32_t hb : {1u, 250u, kMaxHeartbeatMs}) {
        Hello h;
        h.min_version = lo;
        h.max_version = 65535;
        h.domain = longest;
        h.node = "a";
        h.max_frame = max_frame;
        h.heartbeat_ms = hb;
        auto r = decode_hello(encode(h));
        ASSERT_TRUE(r.ok()) << r.error().message;
        EXPECT_EQ(r->min_version, lo);
        EXPECT_EQ(r->max_version, 65535);
        EXPECT_EQ(r->domain, longest);
        EXPECT_EQ(r->node, "a");
        EXPECT_EQ(r->max_frame, max_frame);
        EXPECT_EQ(r->heartbeat_ms, hb);
      }
    }
  }
  Hello h = valid_hello();
  h.domain = "a-0-b";
  h.node = "node-12";
  auto r = decode_hello(encode(h));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->domain, "a-0-b");
  EXPECT_EQ(r->node, "node-12");
  EXPECT_EQ(r->min_version, Hello::kMinVersion);
  EXPECT_EQ(r->max_version, Hello::kMaxVersion);
}

TEST(MessageRoundTrip, Heartbeat) {
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, kU64Max}) {
    auto r = decode_heartbeat(encode(Heartbeat{v, kU64Max - v, kU64Max - v == 0 ? 0 : v}));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->sent_ns, v);
    EXPECT_EQ(r->echo_ns, kU64Max - v);
    EXPECT_EQ(r->echo_delay_ns, kU64Max - v == 0 ? 0 : v);
  }
  // The first heartbeat of a link echoes nothing.
  auto first = decode_heartbeat(encode(Heartbeat{5, 0, 0}));
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(first->echo_ns, 0u);
}

TEST(MessageRoundTrip, GoAwayAndResetWithEveryCode) {
  const std::string longest(65535, 'r');
  for (uint16_t code = 0; code <= 10; ++code) {
    const auto e = static_cast<WireError>(code);
    for (const std::string& reason : {std::string(), std::string("bye \xe2\x9c\x93"), longest}) {
      auto g = decode_goaway(encode(GoAway{e, reason}));
      ASSERT_TRUE(g.ok()) << g.error().message;
      EXPECT_EQ(g->code, e);
      EXPECT_EQ(g->reason, reason);
      auto r = decode_reset(encode(Reset{e, reason}));
      ASSERT_TRUE(r.ok()) << r.error().message;
      EXPECT_EQ(r->code, e);
      EXPECT_EQ(r->reason, reason);
    }
  }
}

TEST(MessageRoundTrip, StringsOverTheLimitAreCutNotRefused) {
  auto r = decode_goaway(encode(GoAway{WireError::internal, std::string(70000, 'q')}));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->reason, std::string(65535, 'q'));
}

TEST(MessageRoundTrip, Open) {
  const std::string stream = std::string(63, 'd') + "/" + "s_" + std::string(61, '9');
  for (uint64_t from : {uint64_t{0}, uint64_t{1}, kU64Max}) {
    for (uint32_t credit : {uint32_t{0}, uint32_t{65536}, uint32_t{CreditWindow::kMaxCredit}}) {
      auto r = decode_open(encode(Open{stream, from, credit}));
      ASSERT_TRUE(r.ok()) << r.error().message;
      EXPECT_EQ(r->stream, stream);
      EXPECT_EQ(r->from_seq, from);
      EXPECT_EQ(r->credit, credit);
    }
  }
  auto r = decode_open(encode(Open{"p/s", 1, 1}));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->stream, "p/s");
}

TEST(MessageRoundTrip, OpenOk) {
  const std::string schema = R"({"fields":[{"name":"a","type":"int64"}]})";
  for (auto [first, next] : {std::pair<uint64_t, uint64_t>{1, 1}, {1, kU64Max}, {kU64Max, kU64Max}}) {
    auto r = decode_open_ok(encode(OpenOk{schema, first, next}));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->schema_json, schema);
    EXPECT_EQ(r->first_seq, first);
    EXPECT_EQ(r->next_seq, next);
  }
}

TEST(MessageRoundTrip, Data) {
  std::string big(kMaxMaxFrame - 16, '\0');
  for (std::size_t i = 0; i < big.size(); i += 4093) big[i] = static_cast<char>(i);
  const std::vector<Data> cases = {
      {1, 1, "x", {}},
      {1, kU32Max, "body", {}},
      {kU64Max, 1, std::string("\0", 1), {}},
      {kU64Max - kU32Max + 1, kU32Max, "edge", {}},
      {42, 1000, big, {}},
  };
  for (const auto& d : cases) {
    auto r = decode_data(encode(d));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->first_seq, d.first_seq);
    EXPECT_EQ(r->count, d.count);
    EXPECT_EQ(r->body, d.body);
  }
  EXPECT_EQ(encode(cases.back()).size(), kMaxMaxFrame);
}

TEST(MessageRoundTrip, AckAndCredit) {
  for (uint64_t v : {uint64_t{0}, uint64_t{7}, kU64Max}) {
    auto r = decode_ack(encode(Ack{v}));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->through, v);
  }
  for (uint32_t v : {uint32_t{1}, uint32_t{65536}, kU32Max}) {
    auto r = decode_credit(encode(Credit{v}));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->bytes, v);
  }
}

// ---- truncated and trailing bytes ----

struct Case {
  std::string name;
  std::string payload;  // a valid encoding
  std::function<Status(std::string_view)> decode;
};

template <class T>
std::function<Status(std::string_view)> status_of(Result<T> (*f)(std::string_view)) {
  return [f](std::string_view p) -> Status {
    auto r = f(p);
    if (!r.ok()) return r.error();
    return {};
  };
}

std::vector<Case> valid_cases() {
  return {
      {"hello", encode(valid_hello()), status_of(&decode_hello)},
      {"heartbeat", encode(Heartbeat{1, 2}), status_of(&decode_heartbeat)},
      {"goaway", encode(GoAway{WireError::shutdown, "stopping"}), status_of(&decode_goaway)},
      {"open", encode(Open{"p/s", 3, 4096}), status_of(&decode_open)},
      {"open_ok", encode(OpenOk{"{}", 1, 9}), status_of(&decode_open_ok)},
      {"reset", encode(Reset{WireError::not_exported, "no"}), status_of(&decode_reset)},
      {"data", encode(Data{1, 2, "ab", {}}), status_of(&decode_data)},
      {"ack", encode(Ack{5}), status_of(&decode_ack)},
      {"credit", encode(Credit{100}), status_of(&decode_credit)},
  };
}

TEST(MessageDecode, ValidCasesDecode) {
  for (const auto& c : valid_cases()) {
    Status s = c.decode(c.payload);
    EXPECT_TRUE(s.ok()) << c.name << ": " << s.error().message;
  }
}

TEST(MessageDecode, EveryTruncationFailsNamingTheMessage) {
  for (const auto& c : valid_cases()) {
    for (std::size_t n = 0; n < c.payload.size(); ++n) {
      Status s = c.decode(std::string_view(c.payload).substr(0, n));
      ASSERT_FALSE(s.ok()) << c.name << " truncated to " << n;
      EXPECT_EQ(s.error().code, Errc::parse_error);
      EXPECT_EQ(s.error().message.rfind(c.name + ".", 0), 0u)
          << c.name << " at " << n << ": " << s.error().message;
    }
  }
}

TEST(MessageDecode, TruncationNamesTheField) {
  const std::string hello = encode(valid_hello());
  expect_parse_error(error_of(decode_hello("")), "hello.min_version: truncated: needs 2 bytes, 0 left");
  expect_parse_error(error_of(decode_hello(hello.substr(0, 3))),
                     "hello.max_version: truncated: needs 2 bytes, 1 left");
  // Length prefix of "acme" read, its bytes cut.
  expect_parse_error(error_of(decode_hello(hello.substr(0, 8))),
                     "hello.domain: truncated: needs 4 bytes, 2 left");
  expect_parse_error(error_of(decode_hello(hello.substr(0, hello.size() - 1))),
                     "hello.heartbeat_ms: truncated: needs 4 bytes, 3 left");
  expect_parse_error(error_of(decode_data(std::string(11, '\1'))),
                     "data.count: truncated: needs 4 bytes, 3 left");
  expect_parse_error(error_of(decode_credit("")), "credit.bytes: truncated: needs 4 bytes, 0 left");
  expect_parse_error(error_of(decode_data(encode(Data{1, 2, "abc", {}}).substr(0, 18))),
                     "data.body: truncated: needs 3 bytes, 2 left");
  // A body length near 4 GiB in a small payload allocates nothing.
  expect_parse_error(
      error_of(decode_data(std::string(8, '\1') + bytes({0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 'x'}))),
      "data.body: truncated: needs 4294967295 bytes, 1 left");
  // A string length that claims more than the payload holds.
  expect_parse_error(error_of(decode_goaway(bytes({0, 1, 0xff, 0xff, 'a'}))),
                     "goaway.reason: truncated: needs 65535 bytes, 1 left");
}

TEST(MessageDecode, TrailingBytesFail) {
  for (const auto& c : valid_cases()) {
    Status s = c.decode(c.payload + "!");
    ASSERT_FALSE(s.ok()) << c.name;
    expect_parse_error(s.error(), c.name + ": 1 trailing bytes after the last field");
    s = c.decode(c.payload + std::string(1000, '\0'));
    ASSERT_FALSE(s.ok()) << c.name;
    expect_parse_error(s.error(), c.name + ": 1000 trailing bytes after the last field");
  }
}

// ---- invalid values ----

Error hello_error(const std::function<void(Hello&)>& change) {
  Hello h = valid_hello();
  change(h);
  return error_of(decode_hello(encode(h)));
}

TEST(MessageDecode, HelloInvalidValues) {
  expect_parse_error(hello_error([](Hello& h) { h.min_version = 0; }),
                     "hello.min_version: 0 is not a protocol version");
  expect_parse_error(hello_error([](Hello& h) {
                       h.min_version = 3;
                       h.max_version = 2;
                     }),
                     "hello.max_version: 2 is below min_version 3");
  expect_parse_error(hello_error([](Hello& h) { h.max_frame = 4095; }),
                     "hello.max_frame: 4095 is outside 4096..16777216");
  expect_parse_error(hello_error([](Hello& h) { h.max_frame = 0; }),
                     "hello.max_frame: 0 is outside 4096..16777216");
  expect_parse_error(hello_error([](Hello& h) { h.max_frame = kMaxMaxFrame + 1; }),
                     "hello.max_frame: 16777217 is outside 4096..16777216");
  expect_parse_error(hello_error([](Hello& h) { h.heartbeat_ms = 0; }),
                     "hello.heartbeat_ms: 0 is outside 1..60000");
  expect_parse_error(hello_error([](Hello& h) { h.heartbeat_ms = 60001; }),
                     "hello.heartbeat_ms: 60001 is outside 1..60000");
  expect_parse_error(hello_error([](Hello& h) { h.domain = ""; }),
                     "hello.domain: '' is not [a-z][a-z0-9-]* of at most 63");
  expect_parse_error(hello_error([](Hello& h) { h.domain = "Acme"; }),
                     "hello.domain: 'Acme' is not [a-z][a-z0-9-]* of at most 63");
  expect_parse_error(hello_error([](Hello& h) { h.domain = std::string(64, 'a'); }),
                     "hello.domain: '" + std::string(64, 'a') + "' is not [a-z][a-z0-9-]* of at most 63");
  expect_parse_error(hello_error([](Hello& h) { h.node = "1node"; }),
                     "hello.node: '1node' is not [a-z][a-z0-9-]* of at most 63");
  expect_parse_error(hello_error([](Hello& h) { h.node = "n_1"; }),
                     "hello.node: 'n_1' is not [a-z][a-z0-9-]* of at most 63");
  // Hostile bytes are escaped in the message, and long ones cut.
  expect_parse_error(hello_error([](Hello& h) { h.node = std::string("a\n\x1b[2J'", 7); }),
                     "hello.node: 'a\\x0a\\x1b[2J\\x27' is not [a-z][a-z0-9-]* of at most 63");
  const Error long_name = hello_error([](Hello& h) { h.domain = std::string(1000, 'x'); });
  EXPECT_EQ(long_name.message,
            "hello.domain: '" + std::string(80, 'x') + "'... is not [a-z][a-z0-9-]* of at most 63");
}

TEST(MessageDecode, UnknownWireErrorCodesFail) {
  expect_parse_error(error_of(decode_goaway(bytes({0, 12, 0, 0}))), "goaway.code: unknown code 12");
  expect_parse_error(error_of(decode_reset(bytes({0xff, 0xff, 0, 0}))), "reset.code: unknown code 65535");
}

// RESET moved (version 2): the reason is exactly NODE@HOST:PORT, since the
// receiver dials that address.
TEST(MessageRoundTrip, MovedNamesANodeAndAnAddress) {
  for (const Moved& m : std::vector<Moved>{{"n1", "10.0.0.7", 7443},
                                           {"node-3", "peer.acme.example", 1},
                                           {"n2", "::1", 65535},
                                           {std::string(63, 'n'), std::string(63, 'h') + "." + std::string(63, 'h'), 9},
                                           {"n1", "fe80::1:2:3:4", 443}}) {
    const std::string reason = moved_reason(m);
    auto r = decode_reset(encode(Reset{WireError::moved, reason}));
    ASSERT_TRUE(r.ok()) << reason << ": " << r.error().message;
    EXPECT_EQ(r->code, WireError::moved);
    EXPECT_EQ(r->reason, reason);
    auto back = parse_moved(r->reason);
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(back->node, m.node);
    EXPECT_EQ(back->host, m.host);
    EXPECT_EQ(back->port, m.port);
  }
  EXPECT_EQ(moved_reason({"n1", "::1", 7443}), "n1@[::1]:7443");
  EXPECT_EQ(moved_reason({"n1", "10.0.0.7", 7443}), "n1@10.0.0.7:7443");
  // The layout: code 11, then the reason as any string.
  EXPECT_EQ(encode(Reset{WireError::moved, "n@h:1"}), bytes({0, 11, 0, 5, 'n', '@', 'h', ':', '1'}));
}

TEST(MessageDecode, AMovedResetWhoseReasonIsNotNodeAtHostPortFails) {
  const std::string longest_host(253, 'h');
  for (const std::string& bad : std::vector<std::string>{
           "",                          // empty
           "n1",                        // no address
           "n1@host",                   // no port
           "@host:1",                   // no node
           "N1@host:1",                 // not a name
           "n1@:1",                     // no host
           "n1@host:0",                 // port 0
           "n1@host:65536",             // port too large
           "n1@host:07443",             // leading zero
           "n1@host:+1",                // not decimal
           "n1@host:1 ",                // trailing byte
           "n1@ho st:1",                // space in the host
           "n1@-host:1",                // label starting with '-'
           "n1@host-:1",                // label ending with '-'
           "n1@a..b:1",                 // empty label
           "n1@host.:1",                // trailing dot
           "n1@" + std::string(64, 'a') + ":1",  // label over 63
           "n1@[]:1",                   // empty brackets
           "n1@[::g]:1",                // not hex
           "n1@[1.2.3.4]:1",            // brackets without ':'
           "n1@::1:7443",               // IPv6 without brackets
           std::string("n1@h\0st:1", 9),  // a NUL byte
           "n1@" + longest_host + "x.y:1",  // over the length bound
           std::string(63, 'n') + "@" + std::string(300, 'h') + ":1",
       }) {
    auto r = decode_reset(encode(Reset{WireError::moved, bad}));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, Errc::parse_error);
    EXPECT_EQ(r.error().message.rfind("reset.reason: ", 0), 0u) << r.error().message;
    EXPECT_NE(r.error().message.find("is not NODE@HOST:PORT"), std::string::npos) << r.error().message;
  }
  // The same reason under another code is text for people, and is fine.
  EXPECT_TRUE(decode_reset(encode(Reset{WireError::not_found, "n1@host"})).ok());
  // Hostile bytes are escaped in the message, and it stays bounded.
  auto r = decode_reset(encode(Reset{WireError::moved, std::string("n1@\x1b[31m:1") + std::string(2000, 'x')}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message.find('\x1b'), std::string::npos);
  EXPECT_LT(r.error().message.size(), 300u);
}

TEST(MessageDecode, OpenInvalidValues) {
  auto open_error = [](const std::string& stream, uint32_t credit = 0) {
    return error_of(decode_open(encode(Open{stream, 1, credit})));
  };
  expect_parse_error(open_error(""), "open.stream: empty");
  for (const std::string& bad :
       std::vector<std::string>{"s", "/s", "p/", "p//s", "P/s", "p/S", "p/1s", "p_q/s", "p/s/t", "p/s.t",
                                "p/" + std::string(64, 's'), std::string(64, 'p') + "/s"}) {
    expect_parse_error(open_error(bad), "open.stream: '" + bad + "' is not DOMAIN/NAME");
  }
  expect_parse_error(open_error("p/s", uint32_t{CreditWindow::kMaxCredit} + 1),
                     "open.credit: 2147483649 exceeds the maximum of 2147483648");
}

TEST(MessageDecode, OpenOkInvalidValues) {
  expect_parse_error(error_of(decode_open_ok(encode(OpenOk{"", 1, 1}))), "open_ok.schema_json: empty");
  expect_parse_error(error_of(decode_open_ok(encode(OpenOk{"{}", 0, 1}))),
                     "open_ok.first_seq: 0 (sequence numbers start at 1)");
  expect_parse_error(error_of(decode_open_ok(encode(OpenOk{"{}", 5, 4}))),
                     "open_ok.next_seq: 4 is below first_seq 5");
}

TEST(MessageDecode, DataInvalidValues) {
  expect_parse_error(error_of(decode_data(encode(Data{1, 0, "x", {}}))), "data.count: 0 tuples");
  expect_parse_error(error_of(decode_data(encode(Data{0, 1, "x", {}}))),
                     "data.first_seq: 0 (sequence numbers start at 1)");
  expect_parse_error(error_of(decode_data(encode(Data{1, 3, "", {}}))), "data.body: empty for 3 tuples");
  expect_parse_error(error_of(decode_data(encode(Data{kU64Max, 2, "x", {}}))),
                     "data.count: 2 tuples from 18446744073709551615 run past the last sequence "
                     "number");
  expect_parse_error(error_of(decode_data(encode(Data{kU64Max - kU32Max + 2, kU32Max, "x", {}}))),
                     "data.count: 4294967295 tuples from " + std::to_string(kU64Max - kU32Max + 2) +
                         " run past the last sequence number");
}

// ---- DATA_NAMED (version 3) ----

Data named_data() {
  Data d;
  d.first_seq = 11;
  d.count = 10;
  d.body = "xyz";
  // A batch begun in an earlier DATA (first 8) and two whole ones.
  d.named = {{"loader-7", 42, 8, 12, 0}, {"loader-7", 43, 13, 15, 0}, {"b.2:x_Y", 9, 18, 20, 6}};
  return d;
}

TEST(MessageLayout, DataNamedIsDataThenItsNamedBatches) {
  Data d;
  d.first_seq = 5;
  d.count = 2;
  d.body = "xyz";
  d.named = {{"p", 7, 4, 6, 3}};
  EXPECT_EQ(d.frame_type(), FrameType::data_named);
  EXPECT_EQ(encode(d), bytes({0, 0, 0,   0, 0, 0, 0, 5, 0, 0, 0, 2, 0, 0, 0, 3, 'x', 'y', 'z',  // DATA
                              0, 0, 0,   1,                                                     // named_count
                              0, 1, 'p',                                                        // producer
                              0, 0, 0,   0, 0, 0, 0, 7,     // producer_seq
                              0, 0, 0,   0, 0, 0, 0, 4,     // first
                              0, 0, 0,   0, 0, 0, 0, 6,     // last
                              0, 0, 0,   0, 0, 0, 0, 3}));  // floor
  // Without names it is a plain DATA, byte for byte as in version 2.
  d.named.clear();
  EXPECT_EQ(d.frame_type(), FrameType::data);
  EXPECT_EQ(encode(d), bytes({0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 2, 0, 0, 0, 3, 'x', 'y', 'z'}));
}

TEST(MessageLayout, TheDataNamedFrameOfTheProtocolDocument) {
  // docs/protocol.md §5.12, byte for byte (the body's 3 bytes are "abc").
  Data d;
  d.first_seq = 11;
  d.count = 10;
  d.body = "abc";
  d.named = {{"p", 7, 9, 12, 3}};
  std::string frame;
  append_frame(frame, d.frame_type(), 5, encode(d));
  EXPECT_EQ(frame, bytes({0x00, 0x00, 0x00, 0x3f, 0x16, 0x00, 0x00, 0x00, 0x05,  //
                          0, 0, 0, 0, 0, 0, 0, 0x0b,                             //
                          0, 0, 0, 0x0a,                                         //
                          0, 0, 0, 3, 'a', 'b', 'c',                             //
                          0, 0, 0, 1,                                            //
                          0, 1, 0x70,                                            //
                          0, 0, 0, 0, 0, 0, 0, 7,                                //
                          0, 0, 0, 0, 0, 0, 0, 9,                                //
                          0, 0, 0, 0, 0, 0, 0, 0x0c,                             //
                          0, 0, 0, 0, 0, 0, 0, 3}));
}

TEST(MessageRoundTrip, DataNamed) {
  const Data d = named_data();
  auto r = decode_data_named(encode(d));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->first_seq, 11u);
  EXPECT_EQ(r->count, 10u);
  EXPECT_EQ(r->body, "xyz");
  EXPECT_EQ(r->named, d.named);
  // The longest producer id and the largest numbers.
  Data edge;
  edge.first_seq = kU64Max;
  edge.count = 1;
  edge.body = "x";
  edge.named = {{std::string(64, 'z'), kU64Max, kU64Max, kU64Max, kU64Max}};
  r = decode_data_named(encode(edge));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->named, edge.named);
}

TEST(MessageDecode, DataAndDataNamedEachDecodeOnlyTheirOwnPayload) {
  // A DATA decoder stays strict: names after the body are trailing bytes.
  // (4 for the count, then 2 + id + 4 * 8 per batch.)
  expect_parse_error(error_of(decode_data(encode(named_data()))),
                     "data: 129 trailing bytes after the last field");
  // A DATA_NAMED without names is malformed: it ends before named_count.
  Data plain = named_data();
  plain.named.clear();
  expect_parse_error(error_of(decode_data_named(encode(plain))),
                     "data_named.named_count: truncated: needs 4 bytes, 0 left");
  // Every cut of a DATA_NAMED fails, naming the message.
  const std::string whole = encode(named_data());
  for (size_t n = 0; n < whole.size(); ++n) {
    auto r = decode_data_named(std::string_view(whole).substr(0, n));
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.error().code, Errc::parse_error);
    EXPECT_EQ(r.error().message.rfind("data_named.", 0), 0u) << r.error().message;
  }
  expect_parse_error(error_of(decode_data_named(whole + "x")),
                     "data_named: 1 trailing bytes after the last field");
}

TEST(MessageDecode, DataNamedInvalidValues) {
  auto with = [](auto change) {
    Data d = named_data();
    change(d);
    return encode(d);
  };
  auto error = [](const std::string& payload) { return error_of(decode_data_named(payload)); };
  // named_count 0 (written by hand: encode writes a DATA without names).
  Data none = named_data();
  none.named.clear();
  expect_parse_error(error(encode(none) + std::string(4, '\0')),
                     "data_named.named_count: 0 (a DATA without names is a DATA)");
  expect_parse_error(error(with([](Data& d) {
                       d.count = 2;
                       d.first_seq = 19;
                     })),
                     "data_named.named_count: 3 batches end in a range of 2 tuples");
  expect_parse_error(error(with([](Data& d) { d.named[1].producer = "has space"; })),
                     "data_named.producer: 'has space' is not 1..64 of A-Z a-z 0-9 . _ : - (batch 1)");
  expect_parse_error(
      error(with([](Data& d) { d.named[0].producer = std::string(65, 'a'); })),
      "data_named.producer: '" + std::string(65, 'a') + "' is not 1..64 of A-Z a-z 0-9 . _ : - (batch 0)");
  expect_parse_error(error(with([](Data& d) { d.named[0].producer.clear(); })),
                     "data_named.producer: '' is not 1..64 of A-Z a-z 0-9 . _ : - (batch 0)");
  expect_parse_error(error(with([](Data& d) { d.named[2].producer_seq = 0; })),
                     "data_named.producer_seq: 0 (batch numbers start at 1) (batch 2)");
  expect_parse_error(error(with([](Data& d) { d.named[0].first = 0; })),
                     "data_named.first: 0..12 is not a range (batch 0)");
  expect_parse_error(error(with([](Data& d) { d.named[1].first = 16; })),
                     "data_named.first: 16..15 is not a range (batch 1)");
  // A batch must end in the covered range 11..20.
  expect_parse_error(error(with([](Data& d) {
                       d.named[0].last = 10;
                       d.named[0].first = 9;
                     })),
                     "data_named.last: 10 is outside the covered 11..20 (batch 0)");
  expect_parse_error(error(with([](Data& d) { d.named[2].last = 21; })),
                     "data_named.last: 21 is outside the covered 11..20 (batch 2)");
  // Batches are records: in order, without overlap.
  expect_parse_error(error(with([](Data& d) { d.named[1].first = 12; })),
                     "data_named.first: 12 is not above the previous batch's last 12 (batch 1)");
  expect_parse_error(error(with([](Data& d) { std::swap(d.named[0], d.named[2]); })),
                     "data_named.first: 13 is not above the previous batch's last 20 (batch 1)");
  // A count announcing more batches than the payload could hold is refused
  // before anything is reserved for them.
  Data wide = none;
  wide.count = 100000;
  const std::string huge = encode(wide) + bytes({0, 0, 0x10, 0});  // 4096 batches in 27 bytes
  expect_parse_error(error(huge), "data_named.named_count: 4096 batches cannot fit in " +
                                      std::to_string(huge.size()) + " bytes");
}

TEST(MessageDecode, HeartbeatDelayWithoutEchoFails) {
  expect_parse_error(error_of(decode_heartbeat(encode(Heartbeat{5, 0, 7}))),
                     "heartbeat.echo_delay_ns: 7 without an echo");
}

TEST(MessageDecode, CreditOfZeroFails) {
  expect_parse_error(error_of(decode_credit(encode(Credit{0}))),
                     "credit.bytes: 0 (a grant adds at least one byte)");
}

// ---- names, negotiation, credit ----

TEST(WireErrorName, NamesEveryCode) {
  const std::vector<std::string_view> names = {"none",     "protocol",  "version",      "frame_too_large",
                                               "identity", "not_found", "not_exported", "flow_control",
                                               "shutdown", "internal",  "bad_position", "moved"};
  for (std::size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(wire_error_name(static_cast<WireError>(i)), names[i]);
  }
  EXPECT_EQ(wire_error_name(static_cast<WireError>(12)), "unknown");
  EXPECT_EQ(wire_error_name(static_cast<WireError>(65535)), "unknown");
}

TEST(Negotiation, PicksTheHighestCommonVersion) {
  Hello mine = valid_hello();
  Hello theirs = valid_hello();
  auto v = negotiate_version(mine, theirs);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, kProtocolVersion);

  mine.min_version = 1;
  mine.max_version = 4;
  theirs.min_version = 3;
  theirs.max_version = 7;
  v = negotiate_version(mine, theirs);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 4);
  v = negotiate_version(theirs, mine);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 4);

  theirs.min_version = 4;
  theirs.max_version = 4;
  v = negotiate_version(mine, theirs);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 4);
}

TEST(Negotiation, DisjointRangesFailNamingBoth) {
  Hello mine = valid_hello();
  Hello theirs = valid_hello();
  theirs.min_version = 4;
  theirs.max_version = 5;
  auto v = negotiate_version(mine, theirs);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.error().code, Errc::unsupported);
  EXPECT_EQ(v.error().message, "no common protocol version: this node speaks 1..3, the peer 4..5");
}

TEST(Negotiation, ANodeOfVersionThreeSpeaksTheVersionOfAnOlderPeer) {
  // This node speaks 1..3 (DATA_NAMED is version 3); a node built before
  // it announces 1..2 or 1..1, and the link takes that.
  const Hello mine = valid_hello();
  EXPECT_EQ(mine.min_version, 1);
  EXPECT_EQ(mine.max_version, 3);
  EXPECT_EQ(kProtocolVersion, 3);
  for (uint16_t older : {1, 2}) {
    Hello theirs = valid_hello();
    theirs.max_version = older;
    auto v = negotiate_version(mine, theirs);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(*v, older);
    v = negotiate_version(theirs, mine);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(*v, older);
  }
}

TEST(Negotiation, MaxFrameIsTheSmallerLimit) {
  Hello mine = valid_hello();
  Hello theirs = valid_hello();
  mine.max_frame = kMaxMaxFrame;
  theirs.max_frame = kMinMaxFrame;
  EXPECT_EQ(negotiated_max_frame(mine, theirs), kMinMaxFrame);
  EXPECT_EQ(negotiated_max_frame(theirs, mine), kMinMaxFrame);
}

TEST(CreditWindowTest, SendsWithinCreditOnly) {
  CreditWindow w(100);
  EXPECT_EQ(w.available(), 100u);
  EXPECT_TRUE(w.can_send(100));
  EXPECT_FALSE(w.can_send(101));
  w.consume(60);
  EXPECT_EQ(w.available(), 40u);
  EXPECT_FALSE(w.can_send(41));
  ASSERT_TRUE(w.grant(10).ok());
  EXPECT_TRUE(w.can_send(50));
  w.consume(50);
  EXPECT_EQ(w.available(), 0u);
  EXPECT_TRUE(w.can_send(0));
  EXPECT_FALSE(w.can_send(1));
  EXPECT_EQ(CreditWindow().available(), 0u);
}

TEST(CreditWindowTest, GrantBeyondTheMaximumFailsAndChangesNothing) {
  CreditWindow w;
  ASSERT_TRUE(w.grant(CreditWindow::kMaxCredit - 1).ok());
  ASSERT_TRUE(w.grant(1).ok());
  EXPECT_EQ(w.available(), CreditWindow::kMaxCredit);
  Status s = w.grant(1);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::limit_exceeded);
  EXPECT_EQ(s.error().message,
            "credit grant of 1 bytes on top of 2147483648 exceeds the maximum window of "
            "2147483648");
  EXPECT_EQ(w.available(), CreditWindow::kMaxCredit);
  w.consume(10);
  s = w.grant(11);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(w.grant(10).ok());
}

TEST(CreditWindowTest, HugeGrantsDoNotOverflow) {
  CreditWindow w(5);
  Status s = w.grant(std::numeric_limits<uint64_t>::max());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::limit_exceeded);
  EXPECT_EQ(w.available(), 5u);
  CreditWindow empty;
  EXPECT_FALSE(empty.grant(CreditWindow::kMaxCredit + 1).ok());
  EXPECT_TRUE(empty.grant(CreditWindow::kMaxCredit).ok());
}

}  // namespace
}  // namespace entente::federation
