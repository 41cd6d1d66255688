// The patterns of tokenizer.json (Split pre-tokenizer, Replace normalizer/decoder, the ByteLevel
// regex) run on PCRE2 with Unicode semantics, made to agree with the Oniguruma engine the Rust
// `tokenizers` library uses: `\s`, `\w` and `\h` get Oniguruma's meaning (regex.cc), `^` and `$`
// match at line boundaries, and a `{"String": s}` pattern is the literal s (an empty one matches
// the empty string everywhere, as the reference's escaped empty regex does).
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace m3::text {

struct MatchSpan {
  size_t begin = 0;
  size_t end = 0;
  bool is_match = false;
};

class Regex {
 public:
  // `literal` compiles the pattern as a plain string (`{"String": ...}` patterns).
  // Throws m3::Error naming `where` and the PCRE2 message when the pattern does not compile.
  Regex(std::string_view pattern, bool literal, std::string_view where);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Cuts valid UTF-8 `text` into consecutive spans that cover it, each flagged as a match or as
  // the text between matches, with the empty-match rules of Oniguruma's find_iter. An empty text
  // yields one empty non-match span (as tokenizers' Pattern::find_matches does).
  std::vector<MatchSpan> find_matches(std::string_view text) const;
  // Replaces every match by `replacement` (the Replace normalizer and decoder).
  std::string replace_all(std::string_view text, std::string_view replacement) const;

 private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace m3::text
