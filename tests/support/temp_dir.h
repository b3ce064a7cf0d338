#pragma once
// Temporary directories for tests, unit and integration alike.

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace entente::testing {

// A fresh, empty directory "entente-<what>-<unique suffix>" under the
// system's temporary directory (mkdtemp). Throws when it cannot be made:
// GoogleTest reports the exception as the test's failure, which beats a
// later error about a path that is not there.
inline std::string make_temp_dir(const std::string& what) {
  std::string path = (std::filesystem::temp_directory_path() / ("entente-" + what + "-XXXXXX")).string();
  if (mkdtemp(path.data()) == nullptr) throw std::runtime_error("mkdtemp " + path + " failed");
  return path;
}

}  // namespace entente::testing
