#include "text/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/normalizers.h"
#include "text/tokenizer/unicode.h"

namespace m3::text {

namespace {

using json_fields::Json;

bool same_token(const AddedToken& a, const AddedToken& b) {
  return a.content == b.content && a.single_word == b.single_word && a.lstrip == b.lstrip &&
         a.rstrip == b.rstrip && a.normalized == b.normalized && a.special == b.special;
}

// The last character before `end` is a word character.
bool ends_with_word(std::string_view text, size_t end) {
  if (end == 0) return false;
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  char32_t c = 0;
  return unicode::decode_utf8(text, start, &c) != 0 && unicode::is_word_char(c);
}

bool starts_with_word(std::string_view text, size_t begin) {
  char32_t c = 0;
  return begin < text.size() && unicode::decode_utf8(text, begin, &c) != 0 &&
         unicode::is_word_char(c);
}

// Start of the run of whitespace that ends at `end`.
size_t whitespace_run_start(std::string_view text, size_t end) {
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    char32_t c = 0;
    if (unicode::decode_utf8(text, start, &c) == 0 || !unicode::is_white_space(c)) break;
    end = start;
  }
  return end;
}

// End of the run of whitespace that starts at `begin`.
size_t whitespace_run_end(std::string_view text, size_t begin) {
  while (begin < text.size()) {
    char32_t c = 0;
    const size_t len = unicode::decode_utf8(text, begin, &c);
    if (len == 0 || !unicode::is_white_space(c)) break;
    begin += len;
  }
  return begin;
}

AddedToken parse_token(const Json& entry, const std::string& where) {
  AddedToken token;
  token.content = json_fields::get_string(entry, "content", where);
  token.special = json_fields::get_bool(entry, "special", where, false);
  token.single_word = json_fields::get_bool(entry, "single_word", where, false);
  token.lstrip = json_fields::get_bool(entry, "lstrip", where, false);
  token.rstrip = json_fields::get_bool(entry, "rstrip", where, false);
  token.normalized = json_fields::get_bool(entry, "normalized", where, !token.special);
  token.id = static_cast<int32_t>(json_fields::get_int(entry, "id", where, -1));
  return token;
}

}  // namespace

void AddedVocabulary::Matcher::build() {
  for (auto& list : by_first_byte) list.clear();
  for (uint32_t i = 0; i < patterns.size(); ++i) {
    if (patterns[i].empty()) continue;
    by_first_byte[static_cast<uint8_t>(patterns[i][0])].push_back(i);
  }
  for (auto& list : by_first_byte) {
    std::stable_sort(list.begin(), list.end(), [&](uint32_t a, uint32_t b) {
      return patterns[a].size() > patterns[b].size();
    });
  }
}

bool AddedVocabulary::Matcher::find(std::string_view text, size_t from, size_t* begin,
                                    size_t* end, size_t* token) const {
  for (size_t pos = from; pos < text.size(); ++pos) {
    const auto& candidates = by_first_byte[static_cast<uint8_t>(text[pos])];
    for (uint32_t index : candidates) {
      const std::string& pattern = patterns[index];
      if (text.compare(pos, pattern.size(), pattern) == 0) {
        *begin = pos;
        *end = pos + pattern.size();
        *token = token_index[index];
        return true;
      }
    }
  }
  return false;
}

AddedVocabulary AddedVocabulary::from_json(const Json& added_tokens, const BpeModel& model,
                                           const Normalizer* normalizer,
                                           const std::string& where) {
  AddedVocabulary vocab;
  if (added_tokens.is_null()) return vocab;
  M3_CHECK(added_tokens.is_array(), "{}: must be an array", where);
  const auto model_size = static_cast<int64_t>(model.vocab_count());
  int64_t max_added_id = -1;
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const std::string entry_where = fmt::format("{}[{}]", where, i);
    AddedToken token = parse_token(added_tokens[i], entry_where);
    if (token.content.empty()) continue;
    if (token.special) vocab.special_contents_.insert(token.content);
    const auto existing = vocab.index_of_content_.find(token.content);
    if (existing != vocab.index_of_content_.end() &&
        same_token(vocab.tokens_[existing->second], token)) {
      continue;
    }
    // The Rust library ignores the ids written in the file: a token keeps its model id when the
    // vocab has it, otherwise it takes the next id after the vocab and earlier added tokens.
    int64_t id = 0;
    if (existing != vocab.index_of_content_.end()) {
      id = vocab.tokens_[existing->second].id;
    } else if (const auto model_id = model.token_to_id(token.content)) {
      id = *model_id;
    } else if (max_added_id < 0) {
      id = model_size;
    } else {
      id = (max_added_id >= model_size || model_size == 0) ? max_added_id + 1 : model_size;
    }
    if (token.id >= 0 && token.id != id) {
      M3_LOG_WARN("{}: token {:?} is listed with id {} but gets id {} (the Rust tokenizers rule)",
                  entry_where, token.content, token.id, id);
    }
    token.id = static_cast<int32_t>(id);
    max_added_id = std::max(max_added_id, id);
    if (existing != vocab.index_of_content_.end()) {
      vocab.tokens_[existing->second] = token;
    } else {
      vocab.index_of_content_[token.content] = vocab.tokens_.size();
      vocab.tokens_.push_back(token);
    }
  }

  vocab.index_of_id_.assign(static_cast<size_t>(max_added_id + 1), -1);
  for (size_t i = 0; i < vocab.tokens_.size(); ++i) {
    AddedToken& token = vocab.tokens_[i];
    vocab.index_of_id_[static_cast<size_t>(token.id)] = static_cast<int32_t>(i);
    token.text = token.normalized && normalizer != nullptr ? normalizer->normalize(token.content)
                                                           : token.content;
    Matcher& matcher = token.normalized ? vocab.normalized_matcher_ : vocab.raw_matcher_;
    matcher.patterns.push_back(token.text);
    matcher.token_index.push_back(i);
  }
  vocab.raw_matcher_.build();
  vocab.normalized_matcher_.build();
  return vocab;
}

void AddedVocabulary::split(std::string_view text, bool normalized_patterns,
                            std::vector<TextSegment>& out) const {
  find_matches(text, normalized_patterns ? normalized_matcher_ : raw_matcher_, out);
}

void AddedVocabulary::find_matches(std::string_view text, const Matcher& matcher,
                                   std::vector<TextSegment>& out) const {
  if (matcher.patterns.empty()) {
    out.push_back({0, text.size(), -1});
    return;
  }
  size_t start_offset = 0;
  size_t from = 0;
  size_t match_begin = 0, match_end = 0, index = 0;
  while (matcher.find(text, from, &match_begin, &match_end, &index)) {
    from = match_end;  // the search resumes after the raw match, even when it is discarded
    const AddedToken& token = tokens_[index];
    size_t start = match_begin;
    size_t stop = match_end;
    if (token.single_word) {
      const bool start_space = start == 0 || !ends_with_word(text, start);
      const bool stop_space = stop == text.size() || !starts_with_word(text, stop);
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) start = std::max(whitespace_run_start(text, start), start_offset);
    if (token.rstrip) stop = whitespace_run_end(text, stop);
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, token.id});
    start_offset = stop;
  }
  if (start_offset != text.size()) out.push_back({start_offset, text.size(), -1});
}

std::optional<int32_t> AddedVocabulary::token_to_id(std::string_view content) const {
  const auto it = index_of_content_.find(content);
  if (it == index_of_content_.end()) return std::nullopt;
  return tokens_[it->second].id;
}

const AddedToken* AddedVocabulary::find_id(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= index_of_id_.size()) return nullptr;
  const int32_t index = index_of_id_[static_cast<size_t>(id)];
  return index < 0 ? nullptr : &tokens_[static_cast<size_t>(index)];
}

bool AddedVocabulary::is_special_content(std::string_view content) const {
  return special_contents_.find(content) != special_contents_.end();
}

}  // namespace m3::text
