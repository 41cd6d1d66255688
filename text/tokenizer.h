// The tokenizer of m3serve: a Hugging Face tokenizer.json (byte-level BPE and its pipeline)
// that encodes and decodes exactly as the Rust `tokenizers` library does, plus the special tokens
// of tokenizer_config.json. Immutable after loading; copies share the loaded data and every method
// may be called from several threads at once.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace m3::text {

class Tokenizer {
 public:
  // Token strings named by tokenizer_config.json (absent fields stay empty).
  struct SpecialTokens {
    std::optional<std::string> bos;
    std::optional<std::string> eos;
    std::optional<std::string> pad;
    std::optional<std::string> unk;
  };

  // Reads <model_dir>/tokenizer.json and, when present, <model_dir>/tokenizer_config.json.
  // Unsupported components and malformed fields throw m3::Error naming the file and the field.
  static Tokenizer load(const std::filesystem::path& model_dir);
  // The same from file contents; `source` names them in errors. An empty config means none.
  static Tokenizer from_json_text(std::string_view tokenizer_json,
                                  std::string_view tokenizer_config_json,
                                  std::string_view source);

  // Bytes that are not valid UTF-8 are first replaced by U+FFFD, one per maximal invalid
  // subsequence (what Python's bytes.decode("utf-8", "replace") gives the reference).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // Ids that name no token are skipped, as the reference does.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  // The exact bytes token `id` adds to the output: an added token's text, or a byte-level BPE
  // token's bytes (which may be part of a UTF-8 character). nullopt for unknown ids, and for every
  // model token when the decoder is not a lone ByteLevel (the grammar engine needs fixed bytes).
  std::optional<std::string> token_bytes(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  // One more than the largest id of the vocabulary and the added tokens.
  int32_t vocab_size() const;
  // The token is an added token marked "special" (skipped by skip_special_tokens).
  bool is_special(int32_t id) const;

  const SpecialTokens& special_tokens() const;
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> pad_token_id() const;
  // model_max_length of tokenizer_config.json, when it is a real limit.
  std::optional<int64_t> model_max_length() const;
  // The whole tokenizer_config.json (an empty object when there is none).
  const nlohmann::json& tokenizer_config() const;

 private:
  friend class IncrementalDetokenizer;
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl);

  // Decodes ids that continue an already decoded text (see text/tokenizer/decoders.h).
  std::string decode_continuation(std::span<const int32_t> ids, bool skip_special_tokens,
                                  bool continuation) const;
  // Whether decoding leaves this id out (unknown, or special while skipping those).
  bool decode_drops(int32_t id, bool skip_special_tokens) const;
  // Whether the decoder may still merge this token with the next ones (a byte-fallback run).
  bool decoder_may_join_next(int32_t id) const;
  // Empty when decoding in pieces is exact; otherwise why it is not.
  const std::string& streaming_obstacle() const;

  std::shared_ptr<const Impl> impl_;
};

}  // namespace m3::text
