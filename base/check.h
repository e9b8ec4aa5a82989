// Errors of treetrain. Library code throws tt::Error with context (what, where, what was expected);
// only main() decides to exit. TT_CHECK records the failed expression, file and line.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tt {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// An Error for memory the device or host could not give (a failed cudaMalloc, a CUDA call that
// ran out of memory), so that a caller can say what would make the work smaller.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

// An Error about one configuration key. what() is the whole message; key() names the key (as the
// thrower knows it, e.g. "vocab_size" inside a model config) and detail() is the message from the
// key on ("vocab_size must be ..."), so a caller that knows where the key was set (file:line, a
// --set override) can say so.
class KeyError : public Error {
 public:
  KeyError(std::string key, const std::string& context, std::string detail)
      : Error(context + detail), key_(std::move(key)), detail_(std::move(detail)) {}
  const std::string& key() const { return key_; }
  const std::string& detail() const { return detail_; }

 private:
  std::string key_, detail_;
};

namespace detail {
inline void stream_all(std::ostringstream&) {}
template <class A, class... Rest>
inline void stream_all(std::ostringstream& os, const A& a, const Rest&... rest) {
  os << a;
  stream_all(os, rest...);
}
}  // namespace detail

// Builds a message from streamable parts: tt::str("key ", k, " at line ", n).
template <class... Args>
inline std::string str(const Args&... args) {
  std::ostringstream os;
  detail::stream_all(os, args...);
  return os.str();
}

[[noreturn]] inline void fail_check(const char* expr, const char* file, int line, const std::string& msg) {
  throw Error(str(msg, msg.empty() ? "" : " ", "(check failed: ", expr, " at ", file, ":", line, ")"));
}

}  // namespace tt

// TT_CHECK(cond, parts...): throws tt::Error naming the condition, file and line when cond is false.
#define TT_CHECK(cond, ...)                                                \
  do {                                                                     \
    if (!(cond)) ::tt::fail_check(#cond, __FILE__, __LINE__, ::tt::str(__VA_ARGS__)); \
  } while (0)
