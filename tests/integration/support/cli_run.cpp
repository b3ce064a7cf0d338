#include "tests/integration/support/cli_run.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/integration/support/broker_process.h"

namespace entente::testing {

bool has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

CliRun entente(const std::string& home, const std::string& args, const std::string& env) {
  CliRun r;
  const std::string err_file = home + "/stderr.txt";
  r.code = run_command(
      "env -u ENTENTE_URL -u ENTENTE_TOKEN -u ENTENTE_CA -u ENTENTE_PROFILE -u XDG_CONFIG_HOME "
      "HOME=" +
          quote(home) + " " + env + " " + ENTENTE_BIN + " " + args + " 2>" + quote(err_file),
      r.out);
  std::ifstream f(err_file);
  std::stringstream ss;
  ss << f.rdbuf();
  r.err = ss.str();
  return r;
}

std::string what(const CliRun& r) {
  return "exit " + std::to_string(r.code) + "\nstdout:\n" + r.out + "stderr:\n" + r.err;
}

std::string value_of(const std::string& out, const std::string& key) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) != 0) continue;
    const size_t from = line.find_first_not_of(' ', key.size() + 1);
    return from == std::string::npos ? "" : line.substr(from);
  }
  return "<absent>";
}

Cells cells(const std::string& line) {
  std::istringstream in(line);
  Cells out;
  for (std::string c; in >> c;) out.push_back(c);
  return out;
}

Cells row_of(const std::string& out, const std::string& first) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    auto c = cells(line);
    if (!c.empty() && c[0] == first) return c;
  }
  return {};
}

void write_file(const std::string& path, const std::string& text, mode_t mode) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
  ::chmod(path.c_str(), mode);
}

}  // namespace entente::testing
