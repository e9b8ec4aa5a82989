// parse_json_strict (see json.h).
#include "base/json.h"

#include <fstream>
#include <sstream>
#include <unordered_set>
#include <vector>

#include "base/check.h"

namespace tt {

nlohmann::json parse_json_strict(const std::string& text) {
  using json = nlohmann::json;
  // nlohmann's lexer takes a NUL byte for the end of the input: what follows it would be dropped.
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    throw Error(str("a NUL byte at offset ", nul, " (JSON text has none)"));
  std::vector<std::unordered_set<std::string>> keys;  // the keys of every object still open
  std::string duplicate;
  int depth = 0;  // arrays and objects open
  const json::parser_callback_t seen = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) {
      // Thrown through the parser: nothing deeper is built (the partial value is freed iteratively).
      if (++depth > kMaxJsonDepth)
        throw Error(str("arrays and objects nested deeper than ", kMaxJsonDepth, " levels"));
      if (event == json::parse_event_t::object_start) keys.emplace_back();
    } else if (event == json::parse_event_t::object_end || event == json::parse_event_t::array_end) {
      --depth;
      if (event == json::parse_event_t::object_end) keys.pop_back();
    } else if (event == json::parse_event_t::key && duplicate.empty() && !keys.empty() &&
               !keys.back().insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json j = json::parse(text, seen);
  if (!duplicate.empty())
    throw Error(str("duplicate key \"", duplicate, "\": a JSON object names each key once (a second value would "
                                                   "silently replace the first)"));
  return j;
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
