#include "text/tokenizer/decoders.h"

#include "core/error.h"
#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/regex.h"
#include "text/tokenizer/unicode.h"

namespace m3::text {

namespace {

using json_fields::Json;

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "<0xXX>" -> the byte, as the Rust ByteFallback decoder parses it (u8::from_str_radix, which
// also takes a leading '+'); -1 otherwise.
int byte_fallback_value(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  if (token[3] == '+') return hex_digit(token[4]);
  const int high = hex_digit(token[3]);
  const int low = hex_digit(token[4]);
  return high < 0 || low < 0 ? -1 : high * 16 + low;
}

// The bytes a byte-level token stands for; a token with any other character is kept as is.
void append_byte_level(std::string_view token, std::string& bytes) {
  const ByteLevelTable& table = ByteLevelTable::get();
  const size_t start = bytes.size();
  size_t pos = 0;
  while (pos < token.size()) {
    char32_t c = 0;
    const size_t len = unicode::decode_utf8(token, pos, &c);
    const int byte = len == 0 ? -1 : table.byte_of(c);
    if (byte < 0) {
      bytes.resize(start);
      bytes.append(token);
      return;
    }
    bytes.push_back(static_cast<char>(byte));
    pos += len;
  }
}

std::vector<std::string> byte_fallback(std::vector<std::string> tokens) {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  std::string pending;  // bytes of the current run of byte tokens
  size_t pending_count = 0;
  auto flush = [&] {
    if (pending_count == 0) return;
    if (unicode::is_valid_utf8(pending)) {
      out.push_back(pending);
    } else {
      for (size_t i = 0; i < pending_count; ++i) out.emplace_back("\xEF\xBF\xBD");
    }
    pending.clear();
    pending_count = 0;
  };
  for (auto& token : tokens) {
    const int byte = byte_fallback_value(token);
    if (byte >= 0) {
      pending.push_back(static_cast<char>(byte));
      ++pending_count;
      continue;
    }
    flush();
    out.push_back(std::move(token));
  }
  flush();
  return out;
}

std::string strip(std::string_view token, char32_t strip_char, size_t start, size_t stop) {
  std::vector<std::pair<size_t, size_t>> chars;  // (offset, length) of each character
  for (size_t pos = 0; pos < token.size();) {
    char32_t c = 0;
    size_t len = unicode::decode_utf8(token, pos, &c);
    if (len == 0) len = 1;
    chars.push_back({pos, len});
    pos += len;
  }
  auto char_is = [&](size_t i) {
    char32_t c = 0;
    return unicode::decode_utf8(token, chars[i].first, &c) != 0 && c == strip_char;
  };
  size_t first = 0;
  while (first < chars.size() && first < start && char_is(first)) ++first;
  size_t last = chars.size();
  for (size_t i = 0; i < stop && last > first && char_is(last - 1); ++i) --last;
  if (first >= last) return {};
  const size_t begin = chars[first].first;
  const size_t end = chars[last - 1].first + chars[last - 1].second;
  return std::string(token.substr(begin, end - begin));
}

std::string join(const std::vector<std::string>& tokens, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) out.append(separator);
    out.append(tokens[i]);
  }
  return out;
}

}  // namespace

void Decoder::add_steps(const Json& spec, const std::string& where, std::vector<Step>& steps) {
  const std::string type = json_fields::type_of(spec, where);
  Step step{};
  if (type == "Sequence") {
    const Json& list = json_fields::require(spec, "decoders", where);
    M3_CHECK(list.is_array(), "{}: field 'decoders' must be an array", where);
    for (size_t i = 0; i < list.size(); ++i) {
      add_steps(list[i], fmt::format("{}.decoders[{}]", where, i), steps);
    }
    return;
  } else if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
  } else if (type == "Fuse") {
    step.kind = Kind::kFuse;
  } else if (type == "ByteFallback") {
    step.kind = Kind::kByteFallback;
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    bool is_regex = false;
    const std::string pattern = json_fields::get_pattern(spec, "pattern", where, &is_regex);
    step.pattern = std::make_shared<const Regex>(pattern, !is_regex, where);
    step.content = json_fields::get_string(spec, "content", where);
    char32_t c = 0;
    step.multi_char_pattern =
        is_regex || pattern.empty() || unicode::decode_utf8(pattern, 0, &c) != pattern.size();
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    const std::string content = json_fields::get_string(spec, "content", where);
    char32_t c = 0;
    M3_CHECK(!content.empty() && unicode::decode_utf8(content, 0, &c) == content.size(),
             "{}: field 'content' must be a single character", where);
    step.strip_char = c;
    const int64_t start = json_fields::get_int(spec, "start", where, 0);
    const int64_t stop = json_fields::get_int(spec, "stop", where, 0);
    M3_CHECK(start >= 0 && stop >= 0, "{}: 'start' and 'stop' must not be negative", where);
    step.strip_start = static_cast<size_t>(start);
    step.strip_stop = static_cast<size_t>(stop);
  } else {
    m3::fail("{}: unsupported decoder type '{}' (supported: ByteLevel, Replace, ByteFallback, "
             "Fuse, Strip, Sequence)",
             where, type);
  }
  steps.push_back(std::move(step));
}

Decoder Decoder::from_json(const Json& spec, const std::string& where) {
  Decoder decoder;
  if (spec.is_null()) return decoder;
  decoder.present_ = true;
  add_steps(spec, where, decoder.steps_);
  bool joined = false;
  for (auto& step : decoder.steps_) {
    step.acts_on_whole_text = joined;
    if (step.kind == Kind::kByteFallback) decoder.has_byte_fallback_ = true;
    if (joined && decoder.streaming_obstacle_.empty()) {
      if (step.kind == Kind::kStrip && step.strip_stop > 0) {
        decoder.streaming_obstacle_ =
            fmt::format("{}: a Strip with stop > 0 after the tokens are joined", where);
      } else if (step.kind == Kind::kReplace && step.multi_char_pattern) {
        decoder.streaming_obstacle_ = fmt::format(
            "{}: a Replace of more than one character after the tokens are joined", where);
      } else if (step.kind == Kind::kByteLevel || step.kind == Kind::kByteFallback) {
        decoder.streaming_obstacle_ =
            fmt::format("{}: a ByteLevel or ByteFallback after the tokens are joined", where);
      }
    }
    if (step.kind == Kind::kByteLevel || step.kind == Kind::kFuse) joined = true;
  }
  return decoder;
}

std::optional<std::string> Decoder::token_bytes(std::string_view token) const {
  if (!present_ || steps_.size() != 1 || steps_[0].kind != Kind::kByteLevel) return std::nullopt;
  std::string bytes;
  append_byte_level(std::string(token), bytes);
  return bytes;
}

bool Decoder::is_byte_fallback_token(std::string_view token) const {
  return has_byte_fallback_ && byte_fallback_value(token) >= 0;
}

std::string Decoder::decode(std::vector<std::string> tokens, bool continuation) const {
  if (!present_) {
    std::string text = join(tokens, " ");
    if (continuation && !tokens.empty()) text.insert(0, 1, ' ');
    return text;
  }
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kByteLevel: {
        std::string bytes;
        for (const auto& token : tokens) append_byte_level(token, bytes);
        tokens.assign(1, unicode::to_valid_utf8(bytes));
        break;
      }
      case Kind::kFuse:
        tokens.assign(1, join(tokens, ""));
        break;
      case Kind::kByteFallback:
        tokens = byte_fallback(std::move(tokens));
        break;
      case Kind::kReplace:
        for (auto& token : tokens) token = step.pattern->replace_all(token, step.content);
        break;
      case Kind::kStrip: {
        const size_t start = continuation && step.acts_on_whole_text ? 0 : step.strip_start;
        for (auto& token : tokens) token = strip(token, step.strip_char, start, step.strip_stop);
        break;
      }
    }
  }
  return join(tokens, "");
}

}  // namespace m3::text
