#include "certs/cli.h"

#include <charconv>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include "certs/certs.h"
#include "certs/detail/ossl.h"

namespace entente::certs {

namespace {

constexpr int kOk = 0;
constexpr int kFailed = 1;
constexpr int kUsage = 2;
constexpr size_t kMaxArgs = 256;

constexpr const char* kCertsUsage =
    "usage: entente certs <command> [options]\n"
    "\n"
    "commands:\n"
    "  init-domain NAME --out DIR        create the CA of a domain (ca.crt, ca.key)\n"
    "  issue-node DOMAIN NODE --ca DIR --out DIR [--san NAMES]\n"
    "                                    issue a node certificate (node.crt, node.key, ca.crt)\n"
    "  renew --ca DIR --dir DIR          a new node certificate (and key) with the same\n"
    "                                    identity and names, signed by the same CA\n"
    "  show FILE                         print a certificate's identity, issuer, validity\n"
    "\n"
    "`entente certs <command> --help` describes each command. See docs/certificates.md.\n";

constexpr const char* kInitUsage =
    "usage: entente certs init-domain NAME --out DIR [--key ec-p256|ed25519] [--days N] [--force]\n"
    "\n"
    "Creates the certificate authority of domain NAME in DIR (created if missing):\n"
    "ca.crt (mode 0644) and ca.key (mode 0600). NAME is [a-z][a-z0-9-]*, at most 63.\n"
    "  --key      key type (default ec-p256)\n"
    "  --days N   validity in days, 1..36500 (default 3650)\n"
    "  --force    overwrite existing files\n";

constexpr const char* kIssueUsage =
    "usage: entente certs issue-node DOMAIN NODE --ca DIR --out DIR [--san NAMES]\n"
    "                                [--key ec-p256|ed25519] [--days N] [--force]\n"
    "\n"
    "Issues the certificate of node NODE of domain DOMAIN, signed by the CA in\n"
    "--ca DIR, and writes node.crt (node certificate, then the CA), node.key\n"
    "(mode 0600) and ca.crt into --out DIR. The certificate names the node\n"
    "entente://DOMAIN/NODE.\n"
    "  --san NAMES  comma-separated DNS names and IP addresses of the node's\n"
    "               listeners, e.g. 127.0.0.1,::1,localhost (repeatable; at most 64)\n"
    "  --key        key type (default ec-p256)\n"
    "  --days N     validity in days, 1..3650 (default 397)\n"
    "  --force      overwrite existing files\n";

constexpr const char* kRenewUsage =
    "usage: entente certs renew --ca DIR --dir DIR [--days N]\n"
    "\n"
    "Renews the node certificate in --dir DIR (node.crt, node.key, ca.crt as\n"
    "issue-node wrote them): a new key of the same type and a certificate with the\n"
    "same identity (entente://DOMAIN/NODE) and the same DNS names and IP addresses,\n"
    "valid from now, signed by the CA in --ca DIR, which must be the CA that issued\n"
    "the old one. The files are replaced; a running node takes them on SIGHUP.\n"
    "  --days N   validity in days, 1..3650 (default 397)\n";

constexpr const char* kShowUsage =
    "usage: entente certs show FILE\n"
    "\n"
    "Prints the first certificate of the PEM file FILE: identity, subject, issuer,\n"
    "names, validity and status, key type and SHA-256 fingerprint.\n";

// The arguments of one subcommand: positionals, options with a value, flags.
struct Parsed {
  std::vector<std::string> positional;
  std::map<std::string, std::vector<std::string>, std::less<>> values;
  std::set<std::string, std::less<>> flags;
  bool help = false;

  std::optional<std::string> value(std::string_view name) const {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second.back();
  }
};

// Parses `args[1..]` against the options a subcommand accepts; on a problem
// returns the message for the usage error.
std::optional<std::string> parse(const std::vector<std::string>& args,
                                 const std::set<std::string_view>& with_value,
                                 const std::set<std::string_view>& flags, Parsed& out) {
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      out.help = true;
      continue;
    }
    if (a.size() < 2 || a.compare(0, 2, "--") != 0) {
      out.positional.push_back(a);
      continue;
    }
    std::string name = a;
    std::optional<std::string> inline_value;
    if (auto eq = a.find('='); eq != std::string::npos) {
      name = a.substr(0, eq);
      inline_value = a.substr(eq + 1);
    }
    if (with_value.count(name) != 0) {
      if (inline_value) {
        out.values[name].push_back(*inline_value);
      } else if (i + 1 < args.size()) {
        out.values[name].push_back(args[++i]);
      } else {
        return name + " needs a value";
      }
    } else if (flags.count(name) != 0 && !inline_value) {
      out.flags.insert(name);
    } else {
      return "unknown option '" + a + "'";
    }
  }
  return std::nullopt;
}

int usage_error(std::ostream& err, const std::string& command, const std::string& message,
                const char* usage) {
  err << "entente certs" << (command.empty() ? "" : " " + command) << ": " << message << "\n" << usage;
  return kUsage;
}

int failed(std::ostream& err, const std::string& command, const std::string& message) {
  err << "entente certs " << command << ": " << message << "\n";
  return kFailed;
}

// --key and --days, shared by both creating commands; a message on a problem.
std::optional<std::string> key_and_days(const Parsed& p, KeyType& key, int& days) {
  if (auto k = p.value("--key")) {
    if (*k == "ec-p256") {
      key = KeyType::ec_p256;
    } else if (*k == "ed25519") {
      key = KeyType::ed25519;
    } else {
      return "--key must be ec-p256 or ed25519, not '" + *k + "'";
    }
  }
  if (auto d = p.value("--days")) {
    int n = 0;
    const char* end = d->data() + d->size();
    auto [ptr, ec] = std::from_chars(d->data(), end, n);
    if (ec != std::errc() || ptr != end) return "--days must be a whole number of days, not '" + *d + "'";
    days = n;
  }
  return std::nullopt;
}

int init_domain_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Parsed p;
  if (auto problem = parse(args, {"--out", "--key", "--days"}, {"--force"}, p)) {
    return usage_error(err, "init-domain", *problem, kInitUsage);
  }
  if (p.help) {
    out << kInitUsage;
    return kOk;
  }
  if (p.positional.size() != 1) {
    return usage_error(err, "init-domain", p.positional.empty() ? "NAME is required" : "expected one NAME",
                       kInitUsage);
  }
  auto dir = p.value("--out");
  if (!dir || dir->empty()) return usage_error(err, "init-domain", "--out DIR is required", kInitUsage);
  CaOptions options;
  if (auto problem = key_and_days(p, options.key, options.days)) {
    return usage_error(err, "init-domain", *problem, kInitUsage);
  }
  options.force = p.flags.count("--force") != 0;
  const std::string& domain = p.positional[0];
  if (Status s = init_domain(domain, *dir, options); !s.ok()) {
    return failed(err, "init-domain", s.error().message);
  }
  const std::filesystem::path base(*dir);
  out << "created the CA of domain " << domain << "\n"
      << "  certificate: " << (base / "ca.crt").string() << "\n"
      << "  private key: " << (base / "ca.key").string() << " (mode 0600; keep it private)\n";
  return kOk;
}

int issue_node_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Parsed p;
  if (auto problem = parse(args, {"--ca", "--out", "--san", "--key", "--days"}, {"--force"}, p)) {
    return usage_error(err, "issue-node", *problem, kIssueUsage);
  }
  if (p.help) {
    out << kIssueUsage;
    return kOk;
  }
  if (p.positional.size() != 2) {
    return usage_error(err, "issue-node", "expected DOMAIN and NODE", kIssueUsage);
  }
  auto ca = p.value("--ca");
  auto dir = p.value("--out");
  if (!ca || ca->empty()) return usage_error(err, "issue-node", "--ca DIR is required", kIssueUsage);
  if (!dir || dir->empty()) return usage_error(err, "issue-node", "--out DIR is required", kIssueUsage);
  NodeOptions options;
  if (auto problem = key_and_days(p, options.key, options.days)) {
    return usage_error(err, "issue-node", *problem, kIssueUsage);
  }
  options.force = p.flags.count("--force") != 0;
  if (auto it = p.values.find("--san"); it != p.values.end()) {
    for (const std::string& list : it->second) {
      size_t start = 0;
      while (start <= list.size()) {
        size_t comma = list.find(',', start);
        if (comma == std::string::npos) comma = list.size();
        std::string item = list.substr(start, comma - start);
        if (item.empty()) {
          return usage_error(err, "issue-node", "--san '" + list + "' has an empty name", kIssueUsage);
        }
        options.sans.push_back(std::move(item));
        start = comma + 1;
      }
    }
  }
  const std::string& domain = p.positional[0];
  const std::string& node = p.positional[1];
  if (Status s = issue_node(domain, node, *ca, *dir, options); !s.ok()) {
    return failed(err, "issue-node", s.error().message);
  }
  const std::filesystem::path base(*dir);
  const Identity id{domain, node};
  out << "issued " << id.uri();
  if (auto info = read_certificate(base / "node.crt"); info.ok()) {
    out << " (valid until " << detail::iso8601(info->not_after) << ")";
  }
  out << "\n"
      << "  certificate: " << (base / "node.crt").string() << " (node certificate, then the CA)\n"
      << "  private key: " << (base / "node.key").string() << " (mode 0600)\n"
      << "  domain CA:   " << (base / "ca.crt").string() << "\n";
  return kOk;
}

// Whether the first certificate of `cert_file` carries a signature of the
// CA certificate in `ca_file` (the same name alone is not enough).
bool signed_by(const std::filesystem::path& cert_file, const std::filesystem::path& ca_file) {
  constexpr size_t kMaxPem = 1u << 20;
  auto cert_pem = detail::read_file(cert_file, kMaxPem);
  auto ca_pem = detail::read_file(ca_file, kMaxPem);
  if (!cert_pem.ok() || !ca_pem.ok()) return false;
  auto cert = detail::parse_certificate(*cert_pem, cert_file.string());
  auto authority = detail::parse_certificate(*ca_pem, ca_file.string());
  if (!cert.ok() || !authority.ok()) return false;
  EVP_PKEY* key = X509_get0_pubkey(authority->get());
  const bool ok = key != nullptr && X509_verify(cert->get(), key) == 1;
  ERR_clear_error();
  return ok;
}

// `certs renew`: the node certificate in --dir issued again by the CA in
// --ca with the same identity, names and key type.
int renew_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Parsed p;
  if (auto problem = parse(args, {"--ca", "--dir", "--days"}, {}, p))
    return usage_error(err, "renew", *problem, kRenewUsage);
  if (p.help) {
    out << kRenewUsage;
    return kOk;
  }
  if (!p.positional.empty()) return usage_error(err, "renew", "takes no FILE: give --dir DIR", kRenewUsage);
  auto ca = p.value("--ca");
  auto dir = p.value("--dir");
  if (!ca || ca->empty()) return usage_error(err, "renew", "--ca DIR is required", kRenewUsage);
  if (!dir || dir->empty()) return usage_error(err, "renew", "--dir DIR is required", kRenewUsage);
  const std::filesystem::path base(*dir);
  auto old = read_certificate(base / "node.crt");
  if (!old.ok()) return failed(err, "renew", old.error().message);
  if (!old->identity)
    return failed(err, "renew", (base / "node.crt").string() + " names no node (no entente:// URI SAN)");
  auto authority = read_certificate(std::filesystem::path(*ca) / "ca.crt");
  if (!authority.ok()) return failed(err, "renew", authority.error().message);
  if (!signed_by(base / "node.crt", std::filesystem::path(*ca) / "ca.crt"))
    return failed(err, "renew",
                  (base / "node.crt").string() + " (issued by " + old->issuer +
                      ") was not signed by the CA in " + *ca + " (" + authority->subject + ")");
  NodeOptions options;
  options.key = old->key_type == "Ed25519" ? KeyType::ed25519 : KeyType::ec_p256;
  if (auto problem = key_and_days(p, options.key, options.days))
    return usage_error(err, "renew", *problem, kRenewUsage);
  options.sans = old->dns_names;
  options.sans.insert(options.sans.end(), old->ip_addresses.begin(), old->ip_addresses.end());
  options.force = true;
  const Identity& id = *old->identity;
  if (Status s = issue_node(id.domain, id.node, *ca, *dir, options); !s.ok())
    return failed(err, "renew", s.error().message);
  auto renewed = read_certificate(base / "node.crt");
  if (!renewed.ok()) return failed(err, "renew", renewed.error().message);
  out << "renewed " << id.uri() << ": valid until " << detail::iso8601(renewed->not_after) << " (was "
      << detail::iso8601(old->not_after) << ")\n"
      << "  names:       ";
  std::string names;
  for (const auto& n : options.sans) names += (names.empty() ? "" : ", ") + n;
  out << (names.empty() ? "-" : names) << "\n"
      << "  certificate: " << (base / "node.crt").string() << "\n"
      << "  private key: " << (base / "node.key").string() << " (a new key, mode 0600)\n";
  return kOk;
}

int show_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Parsed p;
  if (auto problem = parse(args, {}, {}, p)) return usage_error(err, "show", *problem, kShowUsage);
  if (p.help) {
    out << kShowUsage;
    return kOk;
  }
  if (p.positional.size() != 1) return usage_error(err, "show", "expected one FILE", kShowUsage);
  auto info = read_certificate(p.positional[0]);
  if (!info.ok()) return failed(err, "show", info.error().message);
  out << describe(*info);
  return kOk;
}

}  // namespace

int run_certs(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (args.empty()) return usage_error(err, "", "a command is required", kCertsUsage);
  if (args.size() > kMaxArgs) {
    return usage_error(err, "", "more than " + std::to_string(kMaxArgs) + " arguments", kCertsUsage);
  }
  const std::string& command = args[0];
  if (command == "-h" || command == "--help" || command == "help") {
    out << kCertsUsage;
    return kOk;
  }
  if (command == "init-domain") return init_domain_command(args, out, err);
  if (command == "issue-node") return issue_node_command(args, out, err);
  if (command == "show") return show_command(args, out, err);
  if (command == "renew") return renew_command(args, out, err);
  return usage_error(err, "", "unknown command '" + command + "'", kCertsUsage);
}

}  // namespace entente::certs
