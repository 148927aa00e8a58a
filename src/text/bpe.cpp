#include "gclab/text/bpe.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/unistr.h>

#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "gclab/io/json_file.h"

namespace gclab::text {

namespace {

// GPT-2's bytes_to_unicode: the printable Latin-1 bytes stand for themselves, the others for 256 + n.
std::vector<std::string> byte_symbols() {
  std::vector<int> code(256, -1);
  for (int b = '!'; b <= '~'; ++b) code[static_cast<size_t>(b)] = b;
  for (int b = 0xA1; b <= 0xAC; ++b) code[static_cast<size_t>(b)] = b;
  for (int b = 0xAE; b <= 0xFF; ++b) code[static_cast<size_t>(b)] = b;
  int n = 0;
  for (int b = 0; b < 256; ++b)
    if (code[static_cast<size_t>(b)] < 0) code[static_cast<size_t>(b)] = 256 + n++;
  std::vector<std::string> out;
  for (int c : code) {
    std::string s;
    icu::UnicodeString(static_cast<UChar32>(c)).toUTF8String(s);
    out.push_back(s);
  }
  return out;
}

void check(UErrorCode status, const char* what) {
  if (U_FAILURE(status)) throw std::runtime_error(std::string("ICU: ") + what + ": " + u_errorName(status));
}

// A compiled pattern shared by every call (ICU patterns are thread-safe; matchers are per call).
std::unique_ptr<icu::RegexPattern> compile(const char* pattern) {
  UErrorCode status = U_ZERO_ERROR;
  UParseError parse{};
  std::unique_ptr<icu::RegexPattern> p(
      icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern), 0, parse, status));
  check(status, pattern);
  return p;
}

// Every match of `pattern` in `text`, in order (the text between them dropped).
std::vector<std::string> matches(const icu::RegexPattern& pattern, const icu::UnicodeString& text) {
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> m(pattern.matcher(text, status));
  check(status, "matcher");
  std::vector<std::string> out;
  while (m->find(status)) {
    std::string s;
    m->group(status).toUTF8String(s);
    out.push_back(std::move(s));
  }
  check(status, "find");
  return out;
}

// A special token's text from tokenizer_config.json / special_tokens_map.json (a string or {"content": ...}).
void read_token(const nlohmann::json& j, const char* key, std::string& out) {
  if (!j.contains(key) || j[key].is_null()) return;
  if (j[key].is_string())
    out = j[key].get<std::string>();
  else if (j[key].is_object() && j[key].contains("content"))
    out = j[key]["content"].get<std::string>();
}

}  // namespace

ByteLevelBpe::ByteLevelBpe(const std::filesystem::path& vocab_json, const std::filesystem::path& merges_txt,
                           std::string end_of_word_suffix, const std::string& unk_token)
    : suffix_(std::move(end_of_word_suffix)), byte_symbol_(byte_symbols()) {
  vocab_ = io::parse_json_file(vocab_json, [](const nlohmann::json& j) {
    if (!j.is_object()) throw std::runtime_error("not a token -> id object");
    std::unordered_map<std::string, int64_t> v;
    for (const auto& [token, id] : j.items()) v.emplace(token, id.get<int64_t>());
    return v;
  });
  std::ifstream in(merges_txt);
  if (!in) throw std::runtime_error(merges_txt.string() + ": cannot be read");
  std::string line;
  int64_t rank = 0;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
      throw std::runtime_error(merges_txt.string() + ": line '" + line + "' is not a pair of tokens");
    ranks_.emplace(std::make_pair(line.substr(0, space), line.substr(space + 1)), rank++);
  }
  unk_ = id(unk_token);
}

ByteLevelBpe::ByteLevelBpe(std::unordered_map<std::string, int64_t> vocab,
                           const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
                           const std::string& unk_token)
    : vocab_(std::move(vocab)), ignore_merges_(ignore_merges), byte_symbol_(byte_symbols()) {
  int64_t rank = 0;
  for (const auto& pair : merges) ranks_.emplace(pair, rank++);
  unk_ = id(unk_token);
}

int64_t ByteLevelBpe::id(const std::string& token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

void ByteLevelBpe::encode_piece(const std::string& piece, std::vector<int64_t>& out) const {
  if (piece.empty()) return;
  std::vector<std::string> word;
  for (unsigned char b : piece) word.push_back(byte_symbol_[b]);
  word.back() += suffix_;
  if (ignore_merges_) {
    std::string whole;
    for (const auto& symbol : word) whole += symbol;
    if (const int64_t i = id(whole); i >= 0) return out.push_back(i);
  }
  // The merges lowest rank first, each applied to every occurrence left to right.
  while (word.size() > 1) {
    int64_t best = std::numeric_limits<int64_t>::max();
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const auto it = ranks_.find({word[i], word[i + 1]});
      if (it != ranks_.end() && it->second < best) best = it->second;
    }
    if (best == std::numeric_limits<int64_t>::max()) break;
    std::vector<std::string> merged;
    for (size_t i = 0; i < word.size(); ++i) {
      if (i + 1 < word.size()) {
        const auto it = ranks_.find({word[i], word[i + 1]});
        if (it != ranks_.end() && it->second == best) {
          merged.push_back(word[i] + word[i + 1]);
          ++i;
          continue;
        }
      }
      merged.push_back(word[i]);
    }
    word = std::move(merged);
  }
  for (const auto& symbol : word) {
    const int64_t i = id(symbol);
    if (i >= 0)
      out.push_back(i);
    else if (unk_ >= 0)
      out.push_back(unk_);
  }
}

bool has_bpe_files(const std::filesystem::path& folder) {
  std::error_code ec;
  return !folder.empty() && std::filesystem::is_regular_file(folder / "vocab.json", ec) &&
         std::filesystem::is_regular_file(folder / "merges.txt", ec);
}

namespace {

struct ClipSpecials {
  std::string bos = "<|startoftext|>", eos = "<|endoftext|>", pad = "<|endoftext|>", unk = "<|endoftext|>";
};

ClipSpecials clip_specials(const std::filesystem::path& folder) {
  ClipSpecials s;
  for (const char* file : {"tokenizer_config.json", "special_tokens_map.json"}) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(folder / file, ec)) continue;
    io::parse_json_file(folder / file, [&](const nlohmann::json& j) {
      read_token(j, "bos_token", s.bos);
      read_token(j, "eos_token", s.eos);
      read_token(j, "pad_token", s.pad);
      read_token(j, "unk_token", s.unk);
      return 0;
    });
  }
  return s;
}

}  // namespace

ClipTokenizer::ClipTokenizer(const std::filesystem::path& folder)
    : bpe_(folder / "vocab.json", folder / "merges.txt", "</w>", clip_specials(folder).unk) {
  const ClipSpecials s = clip_specials(folder);
  bos_ = bpe_.id(s.bos), eos_ = bpe_.id(s.eos), pad_ = bpe_.id(s.pad);
  if (bos_ < 0 || eos_ < 0 || pad_ < 0)
    throw std::runtime_error(folder.string() + ": vocab.json lacks " + (bos_ < 0 ? s.bos : eos_ < 0 ? s.eos : s.pad));
  for (const std::string& t : {s.bos, s.eos, s.pad, s.unk})
    if (bpe_.id(t) >= 0) specials_.emplace_back(t, bpe_.id(t));
}

namespace {

using AddedTokens = std::vector<std::pair<std::string, int64_t>>;

// Added tokens written in the text are matched first, anywhere (the longest at a position), before the
// normalizer runs, as the tokenizers library does; `chunk` encodes the text between them.
template <class Chunk>
void split_on_added_tokens(const std::string& text, const AddedTokens& added, std::vector<int64_t>& ids,
                           Chunk&& chunk) {
  size_t at = 0;
  while (at <= text.size()) {
    size_t next = std::string::npos, length = 0;
    int64_t id = -1;
    for (const auto& [token, token_id] : added) {
      const size_t p = text.find(token, at);
      if (p != std::string::npos && (p < next || (p == next && token.size() > length)))
        next = p, length = token.size(), id = token_id;
    }
    chunk(text.substr(at, next == std::string::npos ? std::string::npos : next - at));
    if (next == std::string::npos) break;
    ids.push_back(id);
    at = next + length;
  }
}

icu::UnicodeString nfc(const std::string& text) {
  UErrorCode status = U_ZERO_ERROR;
  icu::UnicodeString u =
      icu::Normalizer2::getNFCInstance(status)->normalize(icu::UnicodeString::fromUTF8(text), status);
  check(status, "NFC");
  return u;
}

}  // namespace

std::vector<int64_t> ClipTokenizer::encode(const std::string& text, int64_t max_length) const {
  static const auto whitespace = compile("\\p{White_Space}+");
  static const auto split = compile(
      "<\\|startoftext\\|>|<\\|endoftext\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|[^\\p{White_Space}\\p{L}\\p{N}]"
      "+");
  std::vector<int64_t> ids{bos_};
  // The special tokens (bos, eos, pad, unk) are CLIPTokenizer's added tokens — so SD3's bigG tokenizer,
  // whose pad token is "!", gives every "!" its id rather than the BPE's "!</w>".
  split_on_added_tokens(text, specials_, ids, [&](const std::string& chunk) {
    UErrorCode status = U_ZERO_ERROR;
    icu::UnicodeString u = nfc(chunk);
    std::unique_ptr<icu::RegexMatcher> ws(whitespace->matcher(u, status));
    check(status, "whitespace");
    u = ws->replaceAll(icu::UnicodeString(" "), status);
    check(status, "whitespace");
    // Each code point lower-cased on its own (full mappings: İ -> i̇), as the tokenizers library does it:
    // no context rules, so a word-final Σ becomes σ, not ς.
    icu::UnicodeString lower;
    for (int32_t i = 0; i < u.length(); i = u.moveIndex32(i, 1))
      lower.append(icu::UnicodeString(u.char32At(i)).toLower(icu::Locale::getRoot()));
    for (const auto& piece : matches(*split, lower)) bpe_.encode_piece(piece, ids);
  });
  if (max_length > 0 && static_cast<int64_t>(ids.size()) > max_length - 1)
    ids.resize(static_cast<size_t>(std::max<int64_t>(max_length - 1, 1)));
  ids.push_back(eos_);
  return ids;
}

namespace {

// Qwen's added tokens (<|endoftext|>, <|im_start|>, <|im_end|>, the vision tokens, ...) with their ids:
// tokenizer_config.json's added_tokens_decoder, else tokenizer.json's added_tokens.
AddedTokens qwen_added_tokens(const std::filesystem::path& folder) {
  AddedTokens out;
  std::error_code ec;
  if (std::filesystem::is_regular_file(folder / "tokenizer_config.json", ec))
    io::parse_json_file(folder / "tokenizer_config.json", [&](const nlohmann::json& j) {
      if (j.contains("added_tokens_decoder"))
        for (const auto& [id, t] : j["added_tokens_decoder"].items())
          out.emplace_back(t.at("content").get<std::string>(), std::stoll(id));
      return 0;
    });
  if (out.empty() && std::filesystem::is_regular_file(folder / "tokenizer.json", ec))
    io::parse_json_file(folder / "tokenizer.json", [&](const nlohmann::json& j) {
      for (const auto& t : j.value("added_tokens", nlohmann::json::array()))
        out.emplace_back(t.at("content").get<std::string>(), t.at("id").get<int64_t>());
      return 0;
    });
  return out;
}

}  // namespace

QwenTokenizer::QwenTokenizer(const std::filesystem::path& folder)
    : bpe_(folder / "vocab.json", folder / "merges.txt", "", ""), added_(qwen_added_tokens(folder)) {
  std::string pad = "<|endoftext|>";
  std::error_code ec;
  if (std::filesystem::is_regular_file(folder / "tokenizer_config.json", ec))
    io::parse_json_file(folder / "tokenizer_config.json", [&](const nlohmann::json& j) {
      read_token(j, "pad_token", pad);
      return 0;
    });
  pad_ = bpe_.id(pad);
  for (const auto& [token, id] : added_)
    if (token == pad) pad_ = id;
  if (pad_ < 0) throw std::runtime_error(folder.string() + ": no id for the pad token " + pad);
}

namespace {

// The tokenizers library's Split with behavior "isolated": every match a piece, and the text between matches
// (and after the last) a piece too.
void isolated_pieces(const icu::RegexPattern& pattern, const icu::UnicodeString& u,
                     const std::function<void(const std::string&)>& piece) {
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> m(pattern.matcher(u, status));
  check(status, "matcher");
  int32_t last = 0;
  auto emit = [&](int32_t from, int32_t to) {
    std::string s;
    u.tempSubStringBetween(from, to).toUTF8String(s);
    piece(s);
  };
  while (m->find(status)) {
    const int32_t start = m->start(status), end = m->end(status);
    if (start > last) emit(last, start);
    emit(start, end);
    last = end;
  }
  check(status, "find");
  if (last < u.length()) emit(last, u.length());
}

}  // namespace

std::vector<int64_t> QwenTokenizer::encode(const std::string& text, int64_t max_length) const {
  // Qwen2Tokenizer's pre-tokenizer (transformers' PRETOKENIZE_REGEX), \s spelled as Unicode's White_Space
  // as the tokenizers library's Oniguruma reads it; the text between matches is kept too ("isolated").
  static const auto split = compile(
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\p{White_Space}\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\p{White_Space}*[\\r\\n]+|\\p{White_Space}+(?!\\P{White_Space})|\\p{White_Space}+");
  std::vector<int64_t> ids;
  split_on_added_tokens(text, added_, ids, [&](const std::string& chunk) {
    isolated_pieces(*split, nfc(chunk), [&](const std::string& piece) { bpe_.encode_piece(piece, ids); });
  });
  if (max_length > 0 && static_cast<int64_t>(ids.size()) > max_length) ids.resize(static_cast<size_t>(max_length));
  return ids;
}

bool has_tokenizer_json_only(const std::filesystem::path& folder) {
  std::error_code ec;
  return !folder.empty() && std::filesystem::is_regular_file(folder / "tokenizer.json", ec) && !has_bpe_files(folder);
}

struct TokenizerJsonBpe::Rules {
  std::unique_ptr<icu::RegexPattern> split;  // the Split step's regex, or GPT-2's (ByteLevel's own)
  bool nfc = false;
};

TokenizerJsonBpe::~TokenizerJsonBpe() = default;

namespace {

// A regex as the tokenizers library's Oniguruma reads it, in ICU's terms: \s and \S are Unicode's White_Space.
std::string icu_regex(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size() && (pattern[i + 1] == 's' || pattern[i + 1] == 'S')) {
      out += pattern[i + 1] == 's' ? "\\p{White_Space}" : "\\P{White_Space}";
      ++i;
    } else if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      out += pattern.substr(i, 2);
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

// GPT-2's pre-tokenizer regex, which ByteLevel applies when its use_regex is on.
constexpr const char* kGpt2Split = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

}  // namespace

TokenizerJsonBpe::TokenizerJsonBpe(const std::filesystem::path& folder) : rules_(std::make_unique<Rules>()) {
  const std::filesystem::path file = folder / "tokenizer.json";
  io::parse_json_file(file, [&](const nlohmann::json& j) {
    const nlohmann::json& model = j.at("model");
    if (model.value("type", std::string()) != "BPE") throw std::runtime_error("the model is not a BPE");
    std::unordered_map<std::string, int64_t> vocab;
    for (const auto& [token, id] : model.at("vocab").items()) vocab.emplace(token, id.get<int64_t>());
    std::vector<std::pair<std::string, std::string>> merges;
    for (const auto& m : model.at("merges")) {
      if (m.is_array() && m.size() == 2) {
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        const std::string line = m.get<std::string>();
        const size_t space = line.find(' ');
        if (space == std::string::npos) throw std::runtime_error("merge '" + line + "' is not a pair of tokens");
        merges.emplace_back(line.substr(0, space), line.substr(space + 1));
      }
    }
    if (!model.value("continuing_subword_prefix", nlohmann::json()).is_null() ||
        !model.value("end_of_word_suffix", nlohmann::json()).is_null())
      throw std::runtime_error("a BPE with a subword prefix or word suffix is not byte-level");
    if (model.value("byte_fallback", false) || !model.value("dropout", nlohmann::json()).is_null())
      throw std::runtime_error("the BPE's byte_fallback or dropout is not followed");
    const nlohmann::json unk = model.value("unk_token", nlohmann::json());
    bpe_ = std::make_unique<ByteLevelBpe>(std::move(vocab), merges, model.value("ignore_merges", false),
                                          unk.is_string() ? unk.get<std::string>() : std::string());
    const nlohmann::json normalizer = j.value("normalizer", nlohmann::json());
    if (!normalizer.is_null()) {
      if (normalizer.value("type", std::string()) != "NFC")
        throw std::runtime_error("normalizer " + normalizer.value("type", std::string("?")) + " is not followed");
      rules_->nfc = true;
    }
    // Sequence [Split(regex, isolated), ByteLevel(use_regex false)], or ByteLevel(use_regex true) alone.
    const nlohmann::json pre = j.value("pre_tokenizer", nlohmann::json());
    std::vector<nlohmann::json> steps;
    if (pre.is_object() && pre.value("type", std::string()) == "Sequence")
      for (const auto& step : pre.at("pretokenizers")) steps.push_back(step);
    else if (pre.is_object())
      steps.push_back(pre);
    std::string pattern;
    bool byte_level = false;
    for (const auto& step : steps) {
      const std::string type = step.value("type", std::string());
      if (type == "Split" && pattern.empty() && !byte_level && step.contains("pattern") &&
          step["pattern"].contains("Regex") && step.value("behavior", std::string()) == "Isolated" &&
          !step.value("invert", false)) {
        pattern = step["pattern"]["Regex"].get<std::string>();
      } else if (type == "ByteLevel" && !byte_level && !step.value("add_prefix_space", false)) {
        byte_level = true;
        if (step.value("use_regex", true)) {
          if (!pattern.empty()) throw std::runtime_error("two pre-tokenizer regexes");
          pattern = kGpt2Split;
        }
      } else {
        throw std::runtime_error("pre-tokenizer step " + step.dump() + " is not followed");
      }
    }
    if (!byte_level || pattern.empty())
      throw std::runtime_error("the pre-tokenizer is not a regex split then ByteLevel");
    rules_->split = compile(icu_regex(pattern).c_str());
    for (const auto& t : j.value("added_tokens", nlohmann::json::array())) {
      for (const char* flag : {"lstrip", "rstrip", "single_word"})
        if (t.value(flag, false))
          throw std::runtime_error("added token " + t.at("content").get<std::string>() + "'s " + flag +
                                   " is not followed");
      added_.emplace_back(t.at("content").get<std::string>(), t.at("id").get<int64_t>());
    }
    return 0;
  });
  std::string pad = "<pad>";
  std::error_code ec;
  if (std::filesystem::is_regular_file(folder / "tokenizer_config.json", ec))
    io::parse_json_file(folder / "tokenizer_config.json", [&](const nlohmann::json& j) {
      read_token(j, "pad_token", pad);
      return 0;
    });
  pad_ = bpe_->id(pad);
  for (const auto& [token, id] : added_)
    if (token == pad) pad_ = id;
  if (pad_ < 0) throw std::runtime_error(file.string() + ": no id for the pad token " + pad);
}

std::vector<int64_t> TokenizerJsonBpe::encode(const std::string& text, int64_t max_length) const {
  std::vector<int64_t> ids;
  split_on_added_tokens(text, added_, ids, [&](const std::string& chunk) {
    isolated_pieces(*rules_->split, rules_->nfc ? nfc(chunk) : icu::UnicodeString::fromUTF8(chunk),
                    [&](const std::string& piece) { bpe_->encode_piece(piece, ids); });
  });
  if (max_length > 0 && static_cast<int64_t>(ids.size()) > max_length) ids.resize(static_cast<size_t>(max_length));
  return ids;
}

}  // namespace gclab::text
