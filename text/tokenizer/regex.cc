#include "text/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace m3::text {

namespace {

// Oniguruma's Unicode classes, spelled with PCRE2 properties: `\s` is White_Space (PCRE2 adds
// U+180E), `\w` is Alphabetic + marks + Nd + Pc + the Latin-1 superscripts and fractions
// (PCRE2 leaves out marks and some letters), and `\h` is a hexadecimal digit (PCRE2: horizontal
// space). Checked against the reference character by character.
constexpr std::string_view kSpace = "\\p{White_Space}";
constexpr std::string_view kWord =
    "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";
constexpr std::string_view kHex = "0-9a-fA-F";

// Rewrites those escapes; a negated one inside a class (`[^\W]`, `[a\S]`) cannot be spelled as a
// PCRE2 class item except for \S, so \W and \H keep PCRE2's meaning there.
std::string translate_pattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c != '\\' || i + 1 == pattern.size()) {
      if (c == '[' && !in_class) {
        in_class = true;
        out.push_back(c);
        // A ']' right after '[' or '[^' is a literal member, not the end of the class.
        if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
        if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
        continue;
      }
      if (c == '[' && in_class && i + 1 < pattern.size() && pattern[i + 1] == ':') {
        const size_t end = pattern.find(":]", i + 2);  // a POSIX class such as [:alpha:]
        const size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.substr(i, stop - i));
        i = stop - 1;
        continue;
      }
      if (c == ']' && in_class) in_class = false;
      out.push_back(c);
      continue;
    }
    const char next = pattern[++i];
    auto emit_set = [&](std::string_view items, bool negated) {
      if (in_class) {
        out.append(items);
      } else {
        out.append(negated ? "[^" : "[");
        out.append(items);
        out.push_back(']');
      }
    };
    switch (next) {
      case 's': out.append(kSpace); break;
      case 'S': out.append("\\P{White_Space}"); break;
      case 'w': emit_set(kWord, false); break;
      case 'h': emit_set(kHex, false); break;
      case 'W':
      case 'H':
        if (in_class) {
          out.push_back('\\');
          out.push_back(next);
        } else {
          emit_set(next == 'W' ? kWord : kHex, true);
        }
        break;
      case 'Q': {  // a quoted run: copy up to \E verbatim
        const size_t end = pattern.find("\\E", i + 1);
        const size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.substr(i - 1, stop - (i - 1)));
        i = stop - 1;
        break;
      }
      default:
        out.push_back('\\');
        out.push_back(next);
    }
  }
  return out;
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};
using MatchData = std::unique_ptr<pcre2_match_data, MatchDataDeleter>;

}  // namespace

struct Regex::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }

  // First match at or after `start`. A JIT stack overflow (possible on pathological inputs) falls
  // back to the interpreter, whose backtracking memory lives on the heap.
  bool search(std::string_view text, size_t start, pcre2_match_data* md, bool* use_jit,
              size_t* begin, size_t* end) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    int rc = 0;
    if (*use_jit) {
      rc = pcre2_jit_match(code, subject, text.size(), start, 0, md, nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) *use_jit = false;
    }
    if (!*use_jit) {
      rc = pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      m3::fail("tokenizer regex match failed ({}) on a {}-byte input",
               reinterpret_cast<const char*>(message), text.size());
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(md);
    *begin = ovector[0];
    *end = ovector[1];
    return true;
  }

  // Calls on_match(begin, end) for each match Oniguruma's find_iter would report: after a match
  // ending at e, an empty match at e is refused and the search moves on by one character.
  template <class F>
  void for_each_match(std::string_view text, F&& on_match) const {
    MatchData md(pcre2_match_data_create_from_pattern(code, nullptr));
    bool use_jit = jit;
    size_t search_from = 0;
    bool have_last = false;
    size_t last_end = 0;
    while (search_from <= text.size()) {
      size_t begin = 0, end = 0;
      if (!search(text, search_from, md.get(), &use_jit, &begin, &end)) return;
      if (begin == end && have_last && last_end == end) {
        if (search_from >= text.size()) return;
        size_t step = 1;
        while (search_from + step < text.size() &&
               (static_cast<unsigned char>(text[search_from + step]) & 0xC0) == 0x80) {
          ++step;
        }
        search_from += step;
        continue;
      }
      on_match(begin, end);
      have_last = true;
      last_end = end;
      search_from = end;
    }
  }
};

Regex::Regex(std::string_view pattern, bool literal, std::string_view where)
    : compiled_(std::make_unique<Compiled>()) {
  const std::string source = literal ? std::string(pattern) : translate_pattern(pattern);
  uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE;
  if (literal) options = PCRE2_UTF | PCRE2_LITERAL;
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(),
                                  options, &error, &error_offset, nullptr);
  if (compiled_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    m3::fail("{}: regex {:?} does not compile: {} (at offset {})", where, std::string(pattern),
             reinterpret_cast<const char*>(message), error_offset);
  }
  compiled_->jit = pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

std::vector<MatchSpan> Regex::find_matches(std::string_view text) const {
  std::vector<MatchSpan> spans;
  if (text.empty()) {
    spans.push_back({0, 0, false});
    return spans;
  }
  size_t previous = 0;
  compiled_->for_each_match(text, [&](size_t begin, size_t end) {
    if (begin != previous) spans.push_back({previous, begin, false});
    spans.push_back({begin, end, true});
    previous = end;
  });
  if (previous != text.size()) spans.push_back({previous, text.size(), false});
  return spans;
}

std::string Regex::replace_all(std::string_view text, std::string_view replacement) const {
  if (text.empty()) return {};  // the reference finds no match in an empty text
  std::string out;
  out.reserve(text.size());
  size_t previous = 0;
  compiled_->for_each_match(text, [&](size_t begin, size_t end) {
    out.append(text.substr(previous, begin - previous));
    out.append(replacement);
    previous = end;
  });
  out.append(text.substr(previous));
  return out;
}

}  // namespace m3::text
