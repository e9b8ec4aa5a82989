// Reading exactly one YAML document: the config and sweep files, and --set values.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

namespace tt::trainer {

// The one YAML document of text (a null node when it holds none; a leading UTF-8 byte order mark
// dropped). A second document, or text after the first one's end ("{a: 1}, b"), is a tt::Error
// naming its line in `file`, or its column in a --set value when ctx (the override, "--set k=v")
// is given; yaml-cpp's own errors (YAML::ParserException) pass through. Not YAML::LoadAll: yaml-cpp 0.7's loops forever on text
// after a flow collection, and YAML::Load drops it silently.
YAML::Node load_one_document(const std::string& text, const std::string& file, const std::string& ctx = "");

// Whether n is a scalar written in quotes (yaml-cpp's tag "!"): a string in YAML, even where it
// reads like a number or a boolean, so a number key refuses it.
inline bool is_quoted_scalar(const YAML::Node& n) { return n.IsScalar() && n.Tag() == "!"; }

}  // namespace tt::trainer
