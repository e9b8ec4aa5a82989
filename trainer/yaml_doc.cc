// Reading exactly one YAML document (see yaml_doc.h).
#include "trainer/yaml_doc.h"

#include <yaml-cpp/eventhandler.h>

#include <sstream>
#include <vector>

#include "base/check.h"

namespace tt::trainer {
namespace {

// The start of each YAML document of a text, read by yaml-cpp's parser: two at most, because
// yaml-cpp 0.7's LoadAll never ends on text after a flow collection ("{a: 1}, b" yields empty
// documents forever) and YAML::Load silently drops such text.
struct DocumentStarts : YAML::EventHandler {
  std::vector<YAML::Mark> starts;
  void OnDocumentStart(const YAML::Mark& m) override { starts.push_back(m); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

}  // namespace

YAML::Node load_one_document(const std::string& text, const std::string& file, const std::string& ctx) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts docs;
  for (int d = 0; d < 2 && parser.HandleNextDocument(docs); ++d) {
  }
  if (docs.starts.size() > 1) {
    const YAML::Mark m = docs.starts[1];
    const bool marker = m.pos >= 0 && text.compare((size_t)m.pos, 3, "---") == 0;
    const char c = m.pos >= 0 && (size_t)m.pos < text.size() ? text[(size_t)m.pos] : '?';
    if (!ctx.empty())
      throw Error(str(ctx, ": value is not valid YAML: '", std::string(1, c), "' at column ", m.column + 1,
                      " after the end of the value"));
    if (marker) throw Error(str(file, ":", m.line + 1, ": a second YAML document, expected one config per file"));
    throw Error(str(file, ":", m.line + 1, ":", m.column + 1, ": invalid YAML: '", std::string(1, c),
                    "' after the end of the document, expected one config per file"));
  }
  if (docs.starts.empty()) return YAML::Node();
  return YAML::Load(text);
}

}  // namespace tt::trainer
