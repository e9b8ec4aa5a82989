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
// Also the first explicit tag ("!!str 2", "!foo 2"): yaml-cpp reports it and the readers would
// ignore it, so "max_steps: !!str 2" would silently be the number 2.
struct DocumentStarts : YAML::EventHandler {
  std::vector<YAML::Mark> starts;
  std::string tag;  // the first explicit tag, as written
  YAML::Mark tag_mark;
  void OnDocumentStart(const YAML::Mark& m) override { starts.push_back(m); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark& m, const std::string& t, YAML::anchor_t, const std::string&) override {
    seen(m, t);
    if (t == "!" && open_quote.pos < 0 && !closes_on_its_line(m)) open_quote = m;
  }
  // A quoted scalar whose closing quote is not on the line it starts on: YAML folds such a string
  // over the lines that follow (to the end of the file when the quote is never closed), so a
  // forgotten quote would swallow the rest of the config. No config value spans lines.
  const std::string* text = nullptr;
  YAML::Mark open_quote = YAML::Mark::null_mark();
  bool closes_on_its_line(const YAML::Mark& m) const {
    if (!text || m.pos < 0 || (size_t)m.pos >= text->size()) return true;
    const char q = (*text)[(size_t)m.pos];
    if (q != '"' && q != '\'') return true;  // not where the mark says: nothing to check
    for (size_t k = (size_t)m.pos + 1; k < text->size() && (*text)[k] != '\n' && (*text)[k] != '\r'; ++k) {
      const char c = (*text)[k];
      if (q == '"' && c == '\\') {
        ++k;  // an escape: the next character is its
      } else if (c == q) {
        if (q == '\'' && k + 1 < text->size() && (*text)[k + 1] == '\'') ++k;  // '' inside '...'
        else return true;
      }
    }
    return false;
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string& t, YAML::anchor_t, YAML::EmitterStyle::value) override {
    seen(m, t);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& m, const std::string& t, YAML::anchor_t, YAML::EmitterStyle::value) override {
    seen(m, t);
  }
  void OnMapEnd() override {}
  // "?": no tag; "!": a quoted scalar (yaml-cpp's non-specific tag).
  void seen(const YAML::Mark& m, const std::string& t) {
    if (!tag.empty() || t.empty() || t == "?" || t == "!") return;
    const std::string core = "tag:yaml.org,2002:";
    tag = t.rfind(core, 0) == 0 ? "!!" + t.substr(core.size()) : t;
    tag_mark = m;
  }
};

}  // namespace

YAML::Node load_one_document(const std::string& with_bom, const std::string& file, const std::string& ctx) {
  // A UTF-8 byte order mark (editors on Windows write one) is not part of the text (yaml-cpp's
  // marks do not count it).
  const std::string kBom = "\xEF\xBB\xBF";
  const std::string text = with_bom.rfind(kBom, 0) == 0 ? with_bom.substr(kBom.size()) : with_bom;
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts docs;
  docs.text = &text;
  for (int d = 0; d < 2 && parser.HandleNextDocument(docs); ++d) {
  }
  if (docs.open_quote.pos >= 0) {
    const std::string what = "a quoted string that is not closed on its line (a missing closing quote?): "
                             "a config value is one line";
    if (!ctx.empty()) throw Error(str(ctx, ": ", what));
    throw Error(str(file, ":", docs.open_quote.line + 1, ":", docs.open_quote.column + 1, ": ", what));
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
  if (!docs.tag.empty()) {
    const std::string what = str("a YAML tag (", docs.tag, ") is not read here; write the value without it (numbers ",
                                 "and booleans plain, strings plain or in quotes)");
    if (!ctx.empty()) throw Error(str(ctx, ": ", what));
    throw Error(str(file, ":", docs.tag_mark.line + 1, ": ", what));
  }
  return YAML::Load(text);
}

}  // namespace tt::trainer
