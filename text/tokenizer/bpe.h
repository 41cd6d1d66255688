// The BPE model of tokenizer.json: vocab + ranked merges, applied to one pre-token at a time
// (lowest rank first, leftmost first on ties), with the unk / fuse_unk / byte_fallback /
// ignore_merges / continuing_subword_prefix / end_of_word_suffix options of the Rust library.
#pragma once
#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace m3::text {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// Open-addressing map from a token-id pair to (rank, merged id): the hot lookup of BPE.
class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    int32_t merged_id = 0;
  };
  void build(const std::vector<std::pair<uint64_t, Entry>>& merges);
  const Entry* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = pair_key(left, right);
    for (size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      const Entry& e = slots_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static size_t mix(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return static_cast<size_t>(key);
  }
  std::vector<Entry> slots_;
  size_t mask_ = 0;
};

// The ids of pre-tokens already seen in this call: open addressing over one key buffer and one
// id buffer (a long prompt repeats the same few thousand words many times).
class WordCache {
 public:
  static uint64_t hash(std::string_view word);
  // The cached ids of `word`; false when it is not cached.
  bool find(std::string_view word, uint64_t hash, std::vector<int32_t>& out) const;
  void insert(std::string_view word, uint64_t hash, std::span<const int32_t> ids);

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_offset = 0;
    uint32_t key_length = 0;  // 0: empty slot (pre-tokens are never empty)
    uint32_t ids_offset = 0;
    uint32_t ids_count = 0;
  };
  void grow();
  std::vector<Slot> slots_;
  size_t used_ = 0;
  std::string keys_;
  std::vector<int32_t> ids_;
};

// Per-call working memory of the BPE model (results of earlier pre-tokens, merge buffers), so a
// shared Tokenizer stays immutable and thread-safe.
struct BpeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    uint32_t byte_len;  // 0 once merged into its left neighbour
  };
  struct Merge {
    uint32_t rank;
    int32_t pos;
    int32_t merged_id;
  };
  std::vector<Symbol> symbols;
  std::vector<Merge> heap;
  std::string piece;
  WordCache cache;
};

class BpeModel {
 public:
  BpeModel() = default;
  BpeModel(BpeModel&&) = default;
  BpeModel& operator=(BpeModel&&) = default;
  BpeModel(const BpeModel&) = delete;  // vocab_r_ points into vocab_
  BpeModel& operator=(const BpeModel&) = delete;

  // Throws m3::Error naming `where` for unsupported options (dropout) and malformed fields.
  static BpeModel from_json(const nlohmann::json& spec, const std::string& where);

  // Appends the ids of one pre-token (valid UTF-8) to `out`.
  void tokenize(std::string_view word, BpeScratch& scratch, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;
  size_t vocab_count() const { return vocab_.size(); }
  // One more than the largest vocab id.
  size_t id_limit() const { return vocab_r_.size(); }
  bool byte_fallback() const { return byte_fallback_; }

 private:
  void merge_word(std::string_view word, BpeScratch& scratch) const;
  int32_t symbol_id(std::string_view piece) const;

  StringMap<int32_t> vocab_;
  std::vector<const std::string*> vocab_r_;  // id -> key in vocab_, nullptr for unused ids
  MergeTable merges_;
  std::vector<int32_t> small_char_ids_;  // code point < 0x800 -> id of the 1-char token, or -1
  std::array<int32_t, 256> byte_ids_{};  // "<0xXX>" ids for byte_fallback, or -1
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
};

}  // namespace m3::text
