// tokenizer.json "decoder": ByteLevel, Replace, ByteFallback, Fuse, Strip and Sequence, applied
// as the Rust library's decode_chain; without a decoder, tokens are joined with single spaces.
//
// Streaming (IncrementalDetokenizer) decodes the ids since its last cut as a "continuation": a
// Strip that acts on the whole text (after ByteLevel or Fuse joined the tokens) then leaves the
// start alone, and the space separator of the no-decoder case is put in front. Decoding a text in
// pieces cut where the UTF-8 is complete, and not inside a run of byte-fallback tokens, then
// gives exactly the one-shot result.
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace m3::text {

class Regex;

class Decoder {
 public:
  // Null gives the no-decoder behaviour. Throws m3::Error naming `where`.
  static Decoder from_json(const nlohmann::json& spec, const std::string& where);

  std::string decode(std::vector<std::string> tokens, bool continuation) const;

  // The exact bytes one vocabulary token adds to the output, when the chain is a lone ByteLevel
  // (byte-level BPE: a token's bytes are fixed, even when they are part of a UTF-8 character);
  // nullopt for other chains, whose output depends on the neighbouring tokens.
  std::optional<std::string> token_bytes(std::string_view token) const;
  // True when the chain merges runs of "<0xXX>" tokens and `token` is one of them.
  bool is_byte_fallback_token(std::string_view token) const;
  // Empty when the chain decodes correctly in pieces; otherwise the reason it cannot.
  const std::string& streaming_obstacle() const { return streaming_obstacle_; }

 private:
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip };
  struct Step {
    Kind kind;
    std::shared_ptr<const Regex> pattern;  // Replace
    std::string content;                   // Replace: the replacement
    bool multi_char_pattern = false;       // Replace: a match could span two streamed pieces
    char32_t strip_char = 0;               // Strip
    size_t strip_start = 0;
    size_t strip_stop = 0;
    bool acts_on_whole_text = false;  // a ByteLevel or Fuse step came before
  };
  static void add_steps(const nlohmann::json& spec, const std::string& where,
                        std::vector<Step>& steps);

  bool present_ = false;
  bool has_byte_fallback_ = false;
  std::vector<Step> steps_;
  std::string streaming_obstacle_;
};

}  // namespace m3::text
