// The message of the tt::Error a call throws, for tests that assert exact errors.
#pragma once

#include <string>

#include "base/check.h"

namespace tt::testing {

// The message of the tt::Error f throws ("" when it throws none).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace tt::testing
