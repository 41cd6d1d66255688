// tokenizer.json "post_processor" for single sequences: TemplateProcessing, BertProcessing,
// RobertaProcessing, ByteLevel (offsets only: no effect on ids) and Sequence. They only act when
// the caller asks for special tokens.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace m3::text {

class PostProcessor {
 public:
  // One element of the single-sequence template: either the sequence itself or fixed ids.
  struct Piece {
    bool is_sequence = false;
    std::vector<int32_t> ids;
  };

  // Null gives a processor that adds nothing. Throws m3::Error naming `where`.
  static PostProcessor from_json(const nlohmann::json& spec, const std::string& where);

  // The ids of the encoded sequence with the template's special tokens around it.
  std::vector<int32_t> apply(std::vector<int32_t> ids) const;

 private:
  // Each stage wraps the result of the previous one (a Sequence of processors).
  std::vector<std::vector<Piece>> stages_;
};

}  // namespace m3::text
