// Error types shared by every layer. The CLI maps them to exit statuses:
//   UsageError (a bad flag, override, value or file the user gave)  -> exit 2
//   Error      (anything else that stops a run)                      -> exit 1
#pragma once
#include <stdexcept>
#include <string>

namespace laoyao {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The user's input is wrong (or asks for something laoyao refuses): one clear message that names
// the thing and what would be accepted. Exit status 2, nothing written.
struct UsageError : Error {
  using Error::Error;
};

}  // namespace laoyao
