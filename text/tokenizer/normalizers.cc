#include "text/tokenizer/normalizers.h"

#include <vector>

#include "core/error.h"
#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/regex.h"
#include "text/tokenizer/unicode.h"

namespace m3::text {

namespace {

using json_fields::Json;

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(unicode::NormalForm form) : form_(form) {}
  std::string normalize(std::string_view text) const override {
    return unicode::normalize(text, form_);
  }

 private:
  unicode::NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  std::string normalize(std::string_view text) const override {
    return unicode::to_lowercase(text);
  }
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string normalize(std::string_view text) const override {
    return pattern_.replace_all(text, content_);
  }

 private:
  Regex pattern_;
  std::string content_;
};

// Prepends a fixed string to every non-empty input (Llama-style "▁" prefix).
class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string_view text) const override {
    if (text.empty()) return {};
    std::string out = prefix_;
    out.append(text);
    return out;
  }

 private:
  std::string prefix_;
};

// Removes leading and/or trailing Unicode White_Space.
class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string_view text) const override {
    size_t begin = 0;
    size_t end = text.size();
    if (left_) {
      while (begin < end) {
        char32_t c = 0;
        const size_t len = unicode::decode_utf8(text, begin, &c);
        if (len == 0 || !unicode::is_white_space(c)) break;
        begin += len;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        char32_t c = 0;
        if (unicode::decode_utf8(text, start, &c) == 0 || !unicode::is_white_space(c)) break;
        end = start;
      }
    }
    return std::string(text.substr(begin, end - begin));
  }

 private:
  bool left_;
  bool right_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  std::string normalize(std::string_view text) const override {
    std::string current(text);
    for (const auto& step : steps_) current = step->normalize(current);
    return current;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const Json& spec, const std::string& where) {
  if (spec.is_null()) return nullptr;
  const std::string type = json_fields::type_of(spec, where);
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::kNfc);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::kNfd);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::kNfkc);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::kNfkd);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Replace") {
    bool is_regex = false;
    std::string pattern = json_fields::get_pattern(spec, "pattern", where, &is_regex);
    return std::make_unique<ReplaceNormalizer>(Regex(pattern, !is_regex, where),
                                               json_fields::get_string(spec, "content", where));
  }
  if (type == "Prepend") {
    return std::make_unique<PrependNormalizer>(json_fields::get_string(spec, "prepend", where));
  }
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(json_fields::get_bool(spec, "strip_left", where, true),
                                             json_fields::get_bool(spec, "strip_right", where, true));
  }
  if (type == "Sequence") {
    const Json& list = json_fields::require(spec, "normalizers", where);
    M3_CHECK(list.is_array(), "{}: field 'normalizers' must be an array", where);
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      auto step = make_normalizer(list[i], fmt::format("{}.normalizers[{}]", where, i));
      if (step) steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  m3::fail("{}: unsupported normalizer type '{}' (supported: NFC, NFD, NFKC, NFKD, Lowercase, "
           "Replace, Prepend, Strip, Sequence)",
           where, type);
}

}  // namespace m3::text
