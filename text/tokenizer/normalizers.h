// tokenizer.json "normalizer": NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip and
// Sequence. Offsets are not tracked: m3serve needs ids, not alignments.
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>

namespace m3::text {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Input and output are valid UTF-8.
  virtual std::string normalize(std::string_view text) const = 0;
};

// Builds the normalizer described by `spec` (null gives nullptr). Unknown types and malformed
// fields throw m3::Error naming `where`.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec, const std::string& where);

}  // namespace m3::text
