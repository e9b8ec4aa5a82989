// parse_json_strict (see json.h).
#include "base/json.h"

#include <fstream>
#include <sstream>
#include <unordered_set>
#include <vector>

#include "base/check.h"

namespace tt {

namespace {

// The strict checks as a SAX pass (no values built): nesting depth and keys named twice. A DOM
// parse with a callback does the same checks, but nlohmann 3.11.2's callback parser scans a
// parent's elements each time a child object closes: quadratic in the siblings (an array of 200k
// objects took 16 s), so the checks run here and the value is then parsed without a callback.
struct StrictChecks {
  using json = nlohmann::json;
  std::vector<std::unordered_set<std::string>> keys;  // the keys of every object still open
  std::string duplicate;  // the first key named twice
  int depth = 0;          // arrays and objects open
  bool open() {
    // Thrown through the parser: nothing deeper is read.
    if (++depth > kMaxJsonDepth) throw Error(str("arrays and objects nested deeper than ", kMaxJsonDepth, " levels"));
    return true;
  }
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) {
    keys.emplace_back();
    return open();
  }
  bool key(std::string& k) {
    if (duplicate.empty() && !keys.back().insert(k).second) duplicate = k;
    return true;
  }
  bool end_object() {
    keys.pop_back();
    --depth;
    return true;
  }
  bool start_array(std::size_t) { return open(); }
  bool end_array() {
    --depth;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }
};

}  // namespace

nlohmann::json parse_json_strict(const std::string& text) {
  using json = nlohmann::json;
  // nlohmann's lexer takes a NUL byte for the end of the input: what follows it would be dropped.
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    throw Error(str("a NUL byte at offset ", nul, " (JSON text has none)"));
  StrictChecks checks;
  // Invalid JSON: the parse below throws nlohmann's own error for it.
  if (json::sax_parse(text, &checks) && !checks.duplicate.empty())
    throw Error(str("duplicate key \"", checks.duplicate, "\": a JSON object names each key once (a second value "
                                                          "would silently replace the first)"));
  return json::parse(text);
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(str(path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return parse_json_strict(text.str());
  } catch (const std::exception& e) {  // invalid JSON, a key named twice, nested too deep
    throw Error(str(path, ": invalid JSON: ", e.what()));
  }
}

nlohmann::json parse_json_or_discarded(const std::string& text) {
  try {
    return parse_json_strict(text);
  } catch (const std::exception&) {
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
}

}  // namespace tt
