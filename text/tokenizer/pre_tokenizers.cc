#include "text/tokenizer/pre_tokenizers.h"

#include <algorithm>
#include <string_view>

#include "core/error.h"
#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/regex.h"
#include "text/tokenizer/unicode.h"

namespace m3::text {

namespace {

using json_fields::Json;

// GPT-2's pre-tokenization regex, used by ByteLevel when `use_regex` is set.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const Json& spec, const std::string& where) {
  const std::string name = json_fields::get_string(spec, "behavior", where);
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  m3::fail("{}: unsupported split behavior '{}' (supported: Removed, Isolated, "
           "MergedWithPrevious, MergedWithNext, Contiguous)",
           where, name);
}

struct Cut {
  size_t begin;
  size_t end;
  bool remove;
};

// NormalizedString::split of the Rust library: turns match spans into the pieces to keep.
std::vector<Cut> apply_behavior(const std::vector<MatchSpan>& spans, Behavior behavior) {
  std::vector<Cut> cuts;
  cuts.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      for (const auto& s : spans) cuts.push_back({s.begin, s.end, false});
      break;
    case Behavior::kRemoved:
      for (const auto& s : spans) cuts.push_back({s.begin, s.end, s.is_match});
      break;
    case Behavior::kContiguous:
      for (const auto& s : spans) {
        if (s.is_match == previous_match && !cuts.empty()) {
          cuts.back().end = s.end;
        } else {
          cuts.push_back({s.begin, s.end, false});
        }
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const auto& s : spans) {
        if (s.is_match && !previous_match && !cuts.empty()) {
          cuts.back().end = s.end;
        } else {
          cuts.push_back({s.begin, s.end, false});
        }
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (size_t i = spans.size(); i-- > 0;) {
        const auto& s = spans[i];
        if (s.is_match && !previous_match && !cuts.empty()) {
          cuts.back().begin = s.begin;
        } else {
          cuts.push_back({s.begin, s.end, false});
        }
        previous_match = s.is_match;
      }
      std::reverse(cuts.begin(), cuts.end());
      break;
  }
  return cuts;
}

void emit_cuts(std::string_view text, const std::vector<Cut>& cuts, Pieces& out) {
  for (const auto& cut : cuts) {
    if (!cut.remove) out.add(text.substr(cut.begin, cut.end - cut.begin));
  }
}

// Rebuilds `pieces` from split_one(piece, out) over each piece, using `scratch` as the new buffer.
template <class SplitOne>
void split_pieces(Pieces& pieces, Pieces& scratch, SplitOne&& split_one) {
  scratch.clear();
  for (size_t i = 0; i < pieces.size(); ++i) split_one(pieces[i], scratch);
  pieces.swap(scratch);
}

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, const std::string& where)
      : add_prefix_space_(add_prefix_space),
        regex_(use_regex ? std::make_unique<Regex>(kGpt2Pattern, false, where) : nullptr) {}

  void pre_tokenize(Pieces& pieces, Pieces& scratch) const override {
    const ByteLevelTable& table = ByteLevelTable::get();
    std::string prefixed;
    split_pieces(pieces, scratch, [&](std::string_view piece, Pieces& out) {
      if (add_prefix_space_ && !piece.empty() && piece.front() != ' ') {
        prefixed.assign(1, ' ');
        prefixed.append(piece);
        piece = prefixed;
      }
      auto emit = [&](std::string_view part) {
        std::string& buffer = out.begin_piece();
        const size_t start = buffer.size();
        table.encode(part, buffer);
        out.end_piece(start);
      };
      if (!regex_) {
        emit(piece);
        return;
      }
      for (const auto& span : regex_->find_matches(piece)) {
        emit(piece.substr(span.begin, span.end - span.begin));
      }
    });
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}

  void pre_tokenize(Pieces& pieces, Pieces& scratch) const override {
    split_pieces(pieces, scratch, [&](std::string_view piece, Pieces& out) {
      std::vector<MatchSpan> spans = pattern_.find_matches(piece);
      if (invert_) {
        for (auto& span : spans) span.is_match = !span.is_match;
      }
      emit_cuts(piece, apply_behavior(spans, behavior_), out);
    });
  }

 private:
  Regex pattern_;
  Behavior behavior_;
  bool invert_;
};

// Splits digits off (char::is_numeric): each digit alone, or runs of digits together.
class DigitsPreTokenizer final : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual_digits) : individual_digits_(individual_digits) {}

  void pre_tokenize(Pieces& pieces, Pieces& scratch) const override {
    split_pieces(pieces, scratch, [&](std::string_view piece, Pieces& out) {
      std::vector<MatchSpan> spans;
      size_t last = 0;
      size_t pos = 0;
      while (pos < piece.size()) {
        char32_t c = 0;
        size_t len = unicode::decode_utf8(piece, pos, &c);
        if (len == 0) len = 1;
        if (unicode::is_numeric(c)) {
          if (last < pos) spans.push_back({last, pos, false});
          spans.push_back({pos, pos + len, true});
          last = pos + len;
        }
        pos += len;
      }
      if (last < piece.size()) spans.push_back({last, piece.size(), false});
      emit_cuts(piece,
                apply_behavior(spans, individual_digits_ ? Behavior::kIsolated : Behavior::kContiguous),
                out);
    });
  }

 private:
  bool individual_digits_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void pre_tokenize(Pieces& pieces, Pieces& scratch) const override {
    for (const auto& step : steps_) step->pre_tokenize(pieces, scratch);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& spec, const std::string& where) {
  if (spec.is_null()) return nullptr;
  const std::string type = json_fields::type_of(spec, where);
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(
        json_fields::get_bool(spec, "add_prefix_space", where, true),
        json_fields::get_bool(spec, "use_regex", where, true), where);
  }
  if (type == "Split") {
    bool is_regex = false;
    std::string pattern = json_fields::get_pattern(spec, "pattern", where, &is_regex);
    return std::make_unique<SplitPreTokenizer>(Regex(pattern, !is_regex, where),
                                               parse_behavior(spec, where),
                                               json_fields::get_bool(spec, "invert", where, false));
  }
  if (type == "Digits") {
    return std::make_unique<DigitsPreTokenizer>(
        json_fields::get_bool(spec, "individual_digits", where, false));
  }
  if (type == "Sequence") {
    const Json& list = json_fields::require(spec, "pretokenizers", where);
    M3_CHECK(list.is_array(), "{}: field 'pretokenizers' must be an array", where);
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      auto step = make_pre_tokenizer(list[i], fmt::format("{}.pretokenizers[{}]", where, i));
      if (step) steps.push_back(std::move(step));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  m3::fail("{}: unsupported pre_tokenizer type '{}' (supported: ByteLevel, Split, Digits, "
           "Sequence)",
           where, type);
}

}  // namespace m3::text
