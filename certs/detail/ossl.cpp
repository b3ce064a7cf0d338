#include "certs/detail/ossl.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

namespace entente::certs::detail {

namespace {

std::string errno_text(int e) { return std::strerror(e); }

// Closes a file descriptor on every path.
class Fd final {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now, reporting the error close() may return.
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

std::string random_suffix() {
  unsigned char bytes[8];
  if (RAND_bytes(bytes, sizeof bytes) != 1) {
    // The temporary name only has to avoid collisions; the pid and the
    // clock are enough when the generator is unavailable.
    return std::to_string(::getpid()) + "-" + std::to_string(Clock::now().time_since_epoch().count());
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

void sync_directory(const std::filesystem::path& dir) {
  // Best effort: the file itself is already synced; a directory that cannot
  // be opened for reading only loses the durability of the name.
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace

Result<std::string> read_file(const std::filesystem::path& path, size_t max_bytes) {
  const int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw < 0) {
    const int e = errno;
    return make_error(e == ENOENT ? Errc::not_found : Errc::io_error,
                      "cannot read " + path.string() + ": " + errno_text(e));
  }
  Fd fd(raw);
  std::string data;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(Errc::io_error, "cannot read " + path.string() + ": " + errno_text(errno));
    }
    if (n == 0) break;
    if (data.size() + static_cast<size_t>(n) > max_bytes) {
      return make_error(Errc::limit_exceeded,
                        path.string() + " is larger than " + std::to_string(max_bytes) + " bytes");
    }
    data.append(buf, static_cast<size_t>(n));
  }
  return data;
}

Status write_file_atomic(const std::filesystem::path& path, std::string_view data, unsigned mode,
                         bool overwrite) {
  const std::filesystem::path dir = path.parent_path();
  const std::filesystem::path tmp = dir / ("." + path.filename().string() + ".tmp-" + random_suffix());
  const int raw = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (raw < 0) {
    return make_error(Errc::io_error, "cannot create " + tmp.string() + ": " + errno_text(errno));
  }
  Fd fd(raw);
  auto fail = [&](const std::string& what, int e) -> Status {
    ::unlink(tmp.c_str());
    return make_error(Errc::io_error, what + ": " + errno_text(e));
  };
  // The umask may have taken bits away; set exactly `mode` before the first
  // byte lands, so a private key is never readable by others, not even
  // briefly.
  if (::fchmod(fd.get(), mode) != 0) return fail("cannot set the mode of " + tmp.string(), errno);
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("cannot write " + tmp.string(), errno);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return fail("cannot sync " + tmp.string(), errno);
  if (fd.close() != 0) return fail("cannot close " + tmp.string(), errno);
  if (overwrite) {
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      return fail("cannot rename " + tmp.string() + " to " + path.string(), errno);
    }
  } else {
    // link() refuses an existing target atomically, unlike a check followed
    // by rename().
    if (::link(tmp.c_str(), path.c_str()) != 0) {
      const int e = errno;
      if (e == EPERM || e == EOPNOTSUPP || e == ENOSYS) {
        // A file system without hard links: check, then rename. The window
        // between the two only matters against a concurrent writer.
        struct stat st {};
        if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT && ::rename(tmp.c_str(), path.c_str()) == 0) {
          sync_directory(dir);
          return Status::Ok();
        }
      }
      ::unlink(tmp.c_str());
      struct stat existing {};
      if (e == EEXIST || ::lstat(path.c_str(), &existing) == 0) {
        return make_error(Errc::already_exists, path.string() + " exists already (use --force to overwrite)");
      }
      return make_error(Errc::io_error, "cannot create " + path.string() + ": " + errno_text(e));
    }
    ::unlink(tmp.c_str());
  }
  sync_directory(dir);
  return Status::Ok();
}

Result<std::vector<X509Ptr>> parse_certificates(std::string_view pem, const std::string& source, size_t max) {
  if (pem.size() > static_cast<size_t>(INT32_MAX)) {
    return make_error(Errc::limit_exceeded, source + " is too large");
  }
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!bio) return make_error(Errc::io_error, openssl_error("cannot read " + source));
  std::vector<X509Ptr> out;
  for (;;) {
    X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (!cert) break;
    if (out.size() == max) {
      return make_error(Errc::limit_exceeded,
                        source + " holds more than " + std::to_string(max) + " certificates");
    }
    out.push_back(std::move(cert));
  }
  // The loop ends on "no start line" at the end of the text; anything else
  // is a block that does not parse.
  const unsigned long last = ERR_peek_last_error();
  const bool clean_end =
      last == 0 || (ERR_GET_LIB(last) == ERR_LIB_PEM && ERR_GET_REASON(last) == PEM_R_NO_START_LINE);
  if (!clean_end) {
    return make_error(Errc::parse_error, openssl_error(source + ": a certificate does not parse"));
  }
  if (out.empty()) {
    return make_error(Errc::parse_error, source + " holds no PEM certificate");
  }
  return out;
}

Result<X509Ptr> parse_certificate(std::string_view pem, const std::string& source) {
  ENTENTE_ASSIGN_OR_RETURN(auto certs, parse_certificates(pem, source, 64));
  return std::move(certs.front());
}

std::string pem_of(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1) return {};
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return n > 0 ? std::string(data, static_cast<size_t>(n)) : std::string();
}

std::optional<Clock::time_point> to_time_point(const ASN1_TIME* t) {
  if (t == nullptr) return std::nullopt;
  std::tm tm{};
  if (ASN1_TIME_to_tm(t, &tm) != 1) return std::nullopt;
  const time_t secs = ::timegm(&tm);
  return Clock::from_time_t(secs);
}

std::string iso8601(Clock::time_point t) {
  const time_t secs = Clock::to_time_t(t);
  std::tm tm{};
  if (::gmtime_r(&secs, &tm) == nullptr) return "(time out of range)";
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string name_line(const X509_NAME* name) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || name == nullptr) return {};
  if (X509_NAME_print_ex(bio.get(), name, 0, XN_FLAG_RFC2253) < 0) return {};
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return n > 0 ? std::string(data, static_cast<size_t>(n)) : std::string();
}

SubjectAltNames scan_sans(X509* cert) {
  SubjectAltNames out;
  GeneralNamesPtr names(
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr)));
  if (!names) return out;
  constexpr std::string_view kScheme = "entente://";
  const int count = sk_GENERAL_NAME_num(names.get());
  for (int i = 0; i < count; ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names.get(), i);
    auto text = [](const ASN1_IA5STRING* s) {
      return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                         static_cast<size_t>(ASN1_STRING_length(s)));
    };
    if (name->type == GEN_URI) {
      std::string uri = text(name->d.uniformResourceIdentifier);
      if (uri.compare(0, kScheme.size(), kScheme) == 0) out.entente_uris.push_back(std::move(uri));
    } else if (name->type == GEN_DNS) {
      out.dns_names.push_back(text(name->d.dNSName));
    } else if (name->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* ip = name->d.iPAddress;
      const int len = ASN1_STRING_length(ip);
      char buf[INET6_ADDRSTRLEN] = {};
      const int family = len == 4 ? AF_INET : len == 16 ? AF_INET6 : 0;
      if (family != 0 && ::inet_ntop(family, ASN1_STRING_get0_data(ip), buf, sizeof buf) != nullptr) {
        out.ip_addresses.emplace_back(buf);
      } else {
        out.ip_addresses.push_back("(malformed address of " + std::to_string(len) + " bytes)");
      }
    }
  }
  return out;
}

bool is_ca_certificate(X509* cert) { return (X509_get_extension_flags(cert) & EXFLAG_CA) != 0; }

bool valid_dns_name(std::string_view value) {
  if (value.empty() || value.size() > 253) return false;
  size_t start = 0;
  std::string_view last_label;
  while (start <= value.size()) {
    size_t dot = value.find('.', start);
    if (dot == std::string_view::npos) dot = value.size();
    const std::string_view label = value.substr(start, dot - start);
    if (label.empty() || label.size() > 63) return false;
    if (label.front() == '-' || label.back() == '-') return false;
    for (char c : label) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
      if (!ok) return false;
    }
    last_label = label;
    start = dot + 1;
  }
  for (char c : last_label) {
    if (c < '0' || c > '9') return true;
  }
  return false;  // an all-digit last label reads as a mistyped address
}

std::optional<std::vector<unsigned char>> parse_ip(std::string_view value) {
  if (value.size() >= INET6_ADDRSTRLEN) return std::nullopt;
  const std::string text(value);
  unsigned char buf[16];
  if (::inet_pton(AF_INET, text.c_str(), buf) == 1) return std::vector<unsigned char>(buf, buf + 4);
  if (::inet_pton(AF_INET6, text.c_str(), buf) == 1) return std::vector<unsigned char>(buf, buf + 16);
  return std::nullopt;
}

}  // namespace entente::certs::detail
