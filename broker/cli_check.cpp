// `entente broker --check --config FILE`: what would stop the node from
// starting, found without starting it: the configuration (a problem of each
// top-level section, with its key, as the loader reports it), then, once it
// loads, every certificate and key
// (readable, PEM, the key matching the certificate, within its validity,
// chaining to the domain's CA) and every listen port (free to bind).
#include "broker/cli_check.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/json_read.h"
#include "broker/config.h"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace entente::broker {
namespace {

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct StoreFree {
  void operator()(X509_STORE* s) const { X509_STORE_free(s); }
};
struct StoreCtxFree {
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
};
struct StackFree {
  void operator()(STACK_OF(X509) * s) const { sk_X509_pop_free(s, X509_free); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyFree>;
using Chain = std::unique_ptr<STACK_OF(X509), StackFree>;

// The problems found, each "KEY: message".
using Problems = std::vector<std::string>;

std::string ossl_error() {
  char buf[256] = "unknown OpenSSL error";
  if (const unsigned long e = ERR_get_error()) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return buf;
}

// Every certificate of a PEM file, in order; empty (with a problem) when
// there is none or the file cannot be read.
Chain read_chain(const std::string& key, const std::string& path, Problems& out) {
  Chain chain(sk_X509_new_null());
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_file(path.c_str(), "r"), BIO_free);
  if (!bio) {
    out.push_back(key + ": cannot read " + path + ": " + std::strerror(errno));
    ERR_clear_error();
    return chain;
  }
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) sk_X509_push(chain.get(), x);
  ERR_clear_error();
  if (sk_X509_num(chain.get()) == 0) out.push_back(key + ": " + path + " holds no PEM certificate");
  return chain;
}

KeyPtr read_key(const std::string& key, const std::string& path, Problems& out) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_file(path.c_str(), "r"), BIO_free);
  if (!bio) {
    out.push_back(key + ": cannot read " + path + ": " + std::strerror(errno));
    ERR_clear_error();
    return nullptr;
  }
  KeyPtr k(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!k) out.push_back(key + ": " + path + " holds no PEM private key (" + ossl_error() + ")");
  return k;
}

// The first certificate of `chain` is within its validity now.
void check_validity(const std::string& key, const std::string& path, X509* cert, Problems& out) {
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0)
    out.push_back(key + ": the certificate in " + path + " has expired (renew it: entente certs renew)");
  if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0)
    out.push_back(key + ": the certificate in " + path + " is not valid yet");
}

// The first certificate of `chain` is signed, through the rest of `chain`,
// by the CA in `ca_path`.
void check_chains_to(const std::string& key, const std::string& path, const Chain& chain,
                     const std::string& ca_key, const std::string& ca_path, Problems& out) {
  Problems ignored;  // the CA's own problems are reported under its key
  Chain cas = read_chain(ca_key, ca_path, ignored);
  if (sk_X509_num(cas.get()) == 0) return;
  std::unique_ptr<X509_STORE, StoreFree> store(X509_STORE_new());
  for (int i = 0; i < sk_X509_num(cas.get()); ++i)
    X509_STORE_add_cert(store.get(), sk_X509_value(cas.get(), i));
  std::unique_ptr<X509_STORE_CTX, StoreCtxFree> ctx(X509_STORE_CTX_new());
  X509_STORE_CTX_init(ctx.get(), store.get(), sk_X509_value(chain.get(), 0), chain.get());
  if (X509_verify_cert(ctx.get()) != 1) {
    const int e = X509_STORE_CTX_get_error(ctx.get());
    out.push_back(key + ": the certificate in " + path + " does not chain to the CA in " + ca_path + " (" +
                  ca_key + "): " + X509_verify_cert_error_string(e));
  }
  ERR_clear_error();
}

// A certificate and its key: readable, matching, valid now, and (when
// `ca_path` is given) issued by that CA.
void check_pair(const std::string& cert_key, const std::string& cert_path, const std::string& key_key,
                const std::string& key_path, const std::string& ca_key, const std::string& ca_path,
                Problems& out) {
  Chain chain = read_chain(cert_key, cert_path, out);
  KeyPtr k = read_key(key_key, key_path, out);
  if (sk_X509_num(chain.get()) == 0) return;
  X509* leaf = sk_X509_value(chain.get(), 0);
  if (k && X509_check_private_key(leaf, k.get()) != 1) {
    out.push_back(key_key + ": the key in " + key_path + " is not the key of the certificate in " +
                  cert_path + " (" + cert_key + ")");
    ERR_clear_error();
  }
  check_validity(cert_key, cert_path, leaf, out);
  if (!ca_path.empty()) check_chains_to(cert_key, cert_path, chain, ca_key, ca_path, out);
}

// A CA file: readable, certificates within their validity.
void check_ca(const std::string& key, const std::string& path, Problems& out) {
  Chain cas = read_chain(key, path, out);
  for (int i = 0; i < sk_X509_num(cas.get()); ++i)
    check_validity(key, path, sk_X509_value(cas.get(), i), out);
}

// Whether `host:port` can be bound now (nothing else listens there).
void check_port(const std::string& key, const std::string& host, uint16_t port, Problems& out) {
  if (port == 0) return;  // chosen at start-up
  const bool v6 = host.find(':') != std::string::npos;
  const int fd = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc = -1;
  if (v6) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(port);
    if (::inet_pton(AF_INET6, host.c_str(), &a.sin6_addr) == 1)
      rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1)
      rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    else
      errno = EADDRNOTAVAIL;
  }
  const int e = errno;
  ::close(fd);
  if (rc != 0)
    out.push_back(key + ": cannot listen on " + host + ":" + std::to_string(port) + ": " + std::strerror(e) +
                  (e == EADDRINUSE ? " (another process listens there)" : ""));
}

// data_dir exists and is writable, or can be created.
void check_data_dir(const std::string& dir, Problems& out) {
  std::filesystem::path p(dir);
  while (!p.empty() && !std::filesystem::exists(p)) p = p.parent_path();
  if (p.empty()) return;
  if (!std::filesystem::is_directory(p)) {
    out.push_back("data_dir: " + p.string() + " is not a directory");
  } else if (::access(p.c_str(), W_OK | X_OK) != 0) {
    out.push_back("data_dir: " + p.string() + ": " + std::strerror(errno) +
                  (p.string() == dir ? "" : " (data_dir would be created under it)"));
  }
}

Problems check(const NodeConfig& c, CheckPorts ports) {
  Problems out;
  if (c.tls) check_pair("api.tls.cert", c.tls_cert_file, "api.tls.key", c.tls_key_file, "", "", out);
  if (ports == CheckPorts::yes) check_port("api.listen", c.listen_address, c.listen_port, out);
  check_data_dir(c.data_dir, out);
  const auto& f = c.federation;
  if (f.enabled) {
    check_ca("federation.ca_file", f.ca_file, out);
    check_pair("federation.cert_file", f.cert_file, "federation.key_file", f.key_file, "federation.ca_file",
               f.ca_file, out);
    if (ports == CheckPorts::yes) check_port("federation.listen", f.listen_host, f.listen_port, out);
    for (size_t i = 0; i < f.peers.size(); ++i)
      if (!f.peers[i].ca_file.empty())
        check_ca("federation.peers[" + std::to_string(i) + "].ca_file", f.peers[i].ca_file, out);
  }
  if (!c.cluster.etcd_ca_file.empty()) check_ca("cluster.etcd_ca_file", c.cluster.etcd_ca_file, out);
  if (!c.cluster.api_ca_file.empty()) check_ca("cluster.api_ca_file", c.cluster.api_ca_file, out);
  return out;
}

// ------------------------------------------------------------ the file

// The loader stops at its first problem. To report the problems of every
// top-level section, the section at fault is set aside and the file loaded
// again: an optional one removed, a required one replaced by a stand-in
// that loads. A later problem caused by a stand-in is possible but unlikely:
// the sections are read independently.
constexpr int kMaxRounds = 32;

const char* stand_in(std::string_view key) {
  if (key == "domain" || key == "node") return R"("x")";
  if (key == "api") return R"({"listen":"127.0.0.1:0","tls":false})";
  if (key == "data_dir") return R"("/nonexistent/entente-check")";
  if (key == "tokens")
    return R"([{"name":"x","role":"admin","sha256":"0000000000000000000000000000000000000000000000000000000000000000"}])";
  return nullptr;  // optional: removed
}

// "api" from "api.listen: ...", "tokens" from "tokens[0].sha256: ..."; ""
// when the message names no key of the top level.
std::string top_key(const rapidjson::Document& d, const std::string& message) {
  const size_t colon = message.find(": ");
  if (colon == std::string::npos) return "";
  const std::string path = message.substr(0, colon);
  const std::string key = path.substr(0, path.find_first_of(".["));
  return d.IsObject() && d.HasMember(key.c_str()) ? key : "";
}

std::string text_of(const rapidjson::Document& d) {
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  d.Accept(w);
  return std::string(sb.GetString(), sb.GetSize());
}

// Every problem the loader finds in `path`, one per top-level section.
std::vector<std::string> config_problems(const std::string& path, const Error& first) {
  std::vector<std::string> out{first.message};
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  rapidjson::Document d;
  if (base::read_json(ss.str(), d) || !d.IsObject()) return out;
  const std::string base_dir = std::filesystem::path(path).parent_path().string();
  std::set<std::string> set_aside;
  for (int round = 0; round < kMaxRounds; ++round) {
    const std::string key = top_key(d, out.back());
    if (key.empty() || !set_aside.insert(key).second) break;
    if (const char* json = stand_in(key)) {
      rapidjson::Document v(&d.GetAllocator());
      v.Parse(json);
      d[key.c_str()] = static_cast<rapidjson::Value&>(v).Move();
    } else {
      d.RemoveMember(key.c_str());
    }
    auto again = parse_config(text_of(d), base_dir);
    if (again.ok()) break;
    out.push_back(again.error().message);
  }
  return out;
}

int report_config_problems(const std::string& path, const Error& first) {
  const auto problems = config_problems(path, first);
  for (const auto& p : problems)
    std::fprintf(stderr, "entente broker --check: %s: %s\n", path.c_str(), p.c_str());
  std::fprintf(stderr,
               "entente broker --check: %s: %zu problem(s) in the configuration (one per section at most); "
               "certificates, keys and ports are checked once it loads\n",
               path.c_str(), problems.size());
  return 2;
}

}  // namespace

int check_config_file(const std::string& path, CheckPorts ports) {
  auto config = load_config(path);
  if (!config.ok()) return report_config_problems(path, config.error());
  const Problems problems = check(*config, ports);
  for (const auto& p : problems)
    std::fprintf(stderr, "entente broker --check: %s: %s\n", path.c_str(), p.c_str());
  if (!problems.empty()) {
    std::fprintf(stderr, "entente broker --check: %s: %zu problem(s)\n", path.c_str(), problems.size());
    return 1;
  }
  const auto& c = *config;
  std::printf(
      "ok: %s configures node %s/%s: API on %s://%s:%u, data in %s%s%s\n", path.c_str(), c.domain.c_str(),
      c.node.c_str(), c.tls ? "https" : "http", c.listen_address.c_str(),
      static_cast<unsigned>(c.listen_port), c.data_dir.c_str(),
      c.federation.enabled ? ", federation with " : "",
      c.federation.enabled ? (std::to_string(c.federation.peers.size()) + " peer domain(s)").c_str() : "");
  return 0;
}

}  // namespace entente::broker
