// JSON text read strictly: nlohmann::json keeps the last of an object's duplicate keys silently,
// so a data record {"sequences": [...], "sequences": [...]} would lose its first list. Here a
// duplicate key is an error naming it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace tt {

// Parses `text` as one JSON value. Throws nlohmann::json::exception for invalid JSON and
// tt::Error "duplicate key \"<key>\" ..." for an object that names a key twice (at any depth).
nlohmann::json parse_json_strict(const std::string& text);

}  // namespace tt
