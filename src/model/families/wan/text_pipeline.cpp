// WanPipeline's prompt encoding (diffusers pipeline_wan.py _get_t5_prompt_embeds, which AI Toolkit's Wan21
// calls with max_sequence_length 512: wan21.py get_prompt_embeds): the prompt cleaned (prompt_clean), UMT5's
// tokens padded to 512 with the mask passed and its end-of-sequence token, then the real tokens' rows kept
// and zeros after them up to 512 — every prompt the same length, no mask handed to the transformer.
#include <cctype>
#include <cstdint>
#include <string>

#include "gclab/text/pipeline.h"

namespace gclab::model::wan {
namespace {

// One HTML character reference at `text[i]` ('&'): the character's UTF-8 and the reference's length, or
// {"", 0} where it is none html.unescape would read — the XML five and numeric references (decimal, hex).
std::pair<std::string, size_t> character_reference(const std::string& text, size_t i) {
  static const std::pair<const char*, const char*> named[] = {{"&amp;", "&"},   {"&lt;", "<"},  {"&gt;", ">"},
                                                              {"&quot;", "\""}, {"&#39;", "'"}, {"&apos;", "'"}};
  for (const auto& [name, c] : named)
    if (text.compare(i, std::char_traits<char>::length(name), name) == 0)
      return {c, std::char_traits<char>::length(name)};
  if (text.compare(i, 2, "&#") != 0) return {"", 0};
  const bool hex = i + 2 < text.size() && (text[i + 2] == 'x' || text[i + 2] == 'X');
  size_t j = i + (hex ? 3 : 2);
  uint32_t code = 0;
  const size_t digits = j;
  for (; j < text.size() && std::isxdigit(static_cast<unsigned char>(text[j])); ++j) {
    if (!hex && !std::isdigit(static_cast<unsigned char>(text[j]))) break;
    code = code * (hex ? 16 : 10) + static_cast<uint32_t>(std::stoi(std::string(1, text[j]), nullptr, 16));
    if (code > 0x10FFFF) return {"", 0};
  }
  if (j == digits || j >= text.size() || text[j] != ';' || code == 0) return {"", 0};
  std::string utf8;
  if (code < 0x80) {
    utf8 += static_cast<char>(code);
  } else if (code < 0x800) {
    utf8 += static_cast<char>(0xC0 | (code >> 6)), utf8 += static_cast<char>(0x80 | (code & 0x3F));
  } else if (code < 0x10000) {
    utf8 += static_cast<char>(0xE0 | (code >> 12)), utf8 += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    utf8 += static_cast<char>(0x80 | (code & 0x3F));
  } else {
    utf8 += static_cast<char>(0xF0 | (code >> 18)), utf8 += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
    utf8 += static_cast<char>(0x80 | ((code >> 6) & 0x3F)), utf8 += static_cast<char>(0x80 | (code & 0x3F));
  }
  return {utf8, j + 1 - i};
}

std::string unescape(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const auto [c, n] = text[i] == '&' ? character_reference(text, i) : std::pair<std::string, size_t>{"", 0};
    if (n > 0) {
      out += c, i += n;
    } else {
      out += text[i++];
    }
  }
  return out;
}

class WanText final : public text::ZeroPaddedPipeline {
 public:
  WanText() : ZeroPaddedPipeline(config::TextEncoderKind::umt5_xxl) {}
  // prompt_clean: basic_clean (ftfy.fix_text where ftfy is installed — AI Toolkit's requirements bring it,
  // through open_clip_torch; gclab does not do it yet: curly quotes, ligatures and full-width forms stay as
  // written; html.unescape twice; strip), then whitespace_clean (runs of whitespace to one space, stripped).
  std::string clean(const std::string& prompt) const override {
    const std::string text = unescape(unescape(prompt));
    std::string out;
    bool space = false;
    for (const char c : text) {
      if (std::isspace(static_cast<unsigned char>(c))) {
        space = !out.empty();
        continue;
      }
      if (space) out += ' ', space = false;
      out += c;
    }
    return out;
  }
};

}  // namespace

std::shared_ptr<const text::TextPipeline> text_pipeline() { return std::make_shared<WanText>(); }

}  // namespace gclab::model::wan
