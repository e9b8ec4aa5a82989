// JSON text read strictly: nlohmann::json keeps the last of an object's duplicate keys silently,
// so a data record {"sequences": [...], "sequences": [...]} would lose its first list. Here a
// duplicate key is an error naming it. Nesting is bounded too: a value nested 100k levels deep
// parses (iteratively), but writing it back out (an error message quoting it, dump()) recurses
// once a level and overflows the stack.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace tt {

// Arrays and objects nested deeper than this are an error (every format of ours nests < 10).
constexpr int kMaxJsonDepth = 256;

// Parses `text` as one JSON value. Throws nlohmann::json::exception for invalid JSON and
// tt::Error "duplicate key \"<key>\" ..." for an object that names a key twice (at any depth),
// "... nested deeper than ..." past kMaxJsonDepth (parsing stops there), or "a NUL byte ..." (the
// parser would end the text there and drop the rest silently).
nlohmann::json parse_json_strict(const std::string& text);

// The file at `path` through parse_json_strict. Throws tt::Error
// "<path>: cannot open" or "<path>: invalid JSON: <why>".
nlohmann::json read_json_file(const std::string& path);

// parse_json_strict, but a value is_discarded() instead of an exception, for files whose callers fall
// back on their own message (a checkpoint's state, metrics lines).
nlohmann::json parse_json_or_discarded(const std::string& text);

}  // namespace tt
