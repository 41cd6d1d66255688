#include "text/tokenizer/bpe.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/unicode.h"

namespace m3::text {

namespace {

using json_fields::Json;

// Pre-tokens longer than this are not remembered (the Rust library's MAX_LENGTH).
constexpr size_t kMaxCachedWordBytes = 256;
constexpr char32_t kSmallCharLimit = 0x800;

// Heap order: lowest rank on top, then the leftmost position.
struct MergeAfter {
  bool operator()(const BpeScratch::Merge& a, const BpeScratch::Merge& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

std::pair<std::string, std::string> parse_merge(const Json& entry, size_t rank,
                                                const std::string& where) {
  if (entry.is_array()) {
    M3_CHECK(entry.size() == 2 && entry[0].is_string() && entry[1].is_string(),
             "{}: merges[{}] must be a pair of strings", where, rank);
    return {entry[0].get<std::string>(), entry[1].get<std::string>()};
  }
  M3_CHECK(entry.is_string(), "{}: merges[{}] must be \"a b\" or [\"a\", \"b\"]", where, rank);
  const std::string line = entry.get<std::string>();
  const size_t space = line.find(' ');
  M3_CHECK(space != std::string::npos && line.find(' ', space + 1) == std::string::npos,
           "{}: merges[{}] = {:?} must hold exactly two tokens separated by one space", where,
           rank, line);
  return {line.substr(0, space), line.substr(space + 1)};
}

}  // namespace

uint64_t WordCache::hash(std::string_view word) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ word.size();
  size_t i = 0;
  for (; i + 8 <= word.size(); i += 8) {
    uint64_t v = 0;
    std::memcpy(&v, word.data() + i, 8);
    h = (h ^ v) * 0xff51afd7ed558ccdULL;
    h ^= h >> 32;
  }
  uint64_t v = 0;
  std::memcpy(&v, word.data() + i, word.size() - i);
  h = (h ^ v) * 0xc4ceb9fe1a85ec53ULL;
  return h ^ (h >> 29);
}

bool WordCache::find(std::string_view word, uint64_t hash, std::vector<int32_t>& out) const {
  if (slots_.empty()) return false;
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& slot = slots_[i];
    if (slot.key_length == 0) return false;
    if (slot.hash == hash && slot.key_length == word.size() &&
        std::memcmp(keys_.data() + slot.key_offset, word.data(), word.size()) == 0) {
      out.insert(out.end(), ids_.begin() + slot.ids_offset,
                 ids_.begin() + slot.ids_offset + slot.ids_count);
      return true;
    }
  }
}

void WordCache::insert(std::string_view word, uint64_t hash, std::span<const int32_t> ids) {
  if ((used_ + 1) * 2 > slots_.size()) grow();
  const size_t mask = slots_.size() - 1;
  size_t i = hash & mask;
  while (slots_[i].key_length != 0) i = (i + 1) & mask;
  slots_[i] = Slot{hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(word.size()),
                   static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(ids.size())};
  keys_.append(word);
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  ++used_;
}

void WordCache::grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(old.empty() ? 1024 : old.size() * 2, Slot{});
  const size_t mask = slots_.size() - 1;
  for (const Slot& slot : old) {
    if (slot.key_length == 0) continue;
    size_t i = slot.hash & mask;
    while (slots_[i].key_length != 0) i = (i + 1) & mask;
    slots_[i] = slot;
  }
}

void MergeTable::build(const std::vector<std::pair<uint64_t, Entry>>& merges) {
  size_t capacity = 16;
  while (capacity < merges.size() * 2) capacity *= 2;
  slots_.assign(capacity, Entry{});
  mask_ = capacity - 1;
  for (const auto& [key, entry] : merges) {
    size_t i = mix(key) & mask_;
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
    slots_[i] = entry;  // a repeated pair keeps its last rank, as a Rust HashMap collect does
    slots_[i].key = key;
  }
}

BpeModel BpeModel::from_json(const Json& spec, const std::string& where) {
  BpeModel model;
  if (spec.contains("dropout") && !spec["dropout"].is_null()) {
    const Json& dropout = spec["dropout"];
    M3_CHECK(dropout.is_number() && dropout.get<double>() == 0.0,
             "{}: BPE dropout is not supported (sampling makes encodings non-deterministic)",
             where);
  }
  model.fuse_unk_ = json_fields::get_bool(spec, "fuse_unk", where, false);
  model.byte_fallback_ = json_fields::get_bool(spec, "byte_fallback", where, false);
  model.ignore_merges_ = json_fields::get_bool(spec, "ignore_merges", where, false);
  model.continuing_subword_prefix_ =
      json_fields::get_optional_string(spec, "continuing_subword_prefix", where).value_or("");
  model.end_of_word_suffix_ =
      json_fields::get_optional_string(spec, "end_of_word_suffix", where).value_or("");

  const Json& vocab = json_fields::require(spec, "vocab", where);
  M3_CHECK(vocab.is_object(), "{}: field 'vocab' must be an object of token -> id", where);
  int64_t max_id = -1;
  model.vocab_.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    M3_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (1LL << 31),
             "{}: vocab entry {:?} has an invalid id {}", where, token, id.dump());
    model.vocab_[token] = static_cast<int32_t>(id.get<int64_t>());
    max_id = std::max(max_id, id.get<int64_t>());
  }
  model.vocab_r_.assign(static_cast<size_t>(max_id + 1), nullptr);
  for (const auto& [token, id] : model.vocab_) model.vocab_r_[static_cast<size_t>(id)] = &token;

  model.small_char_ids_.assign(kSmallCharLimit, -1);
  for (const auto& [token, id] : model.vocab_) {
    char32_t c = 0;
    if (!token.empty() && unicode::decode_utf8(token, 0, &c) == token.size() &&
        c < kSmallCharLimit) {
      model.small_char_ids_[c] = id;
    }
  }
  model.byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    const auto it = model.vocab_.find(fmt::format("<0x{:02X}>", b));
    if (it != model.vocab_.end()) model.byte_ids_[b] = it->second;
  }

  if (auto unk = json_fields::get_optional_string(spec, "unk_token", where)) {
    const auto it = model.vocab_.find(*unk);
    if (it != model.vocab_.end()) {
      model.unk_id_ = it->second;
    } else {
      M3_LOG_WARN("{}: unk_token {:?} is not in the vocab; unknown characters will be dropped",
                  where, *unk);
    }
  }

  const Json& merges = json_fields::require(spec, "merges", where);
  M3_CHECK(merges.is_array(), "{}: field 'merges' must be an array", where);
  const size_t prefix_len = model.continuing_subword_prefix_.size();
  std::vector<std::pair<uint64_t, MergeTable::Entry>> table;
  table.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto [left, right] = parse_merge(merges[rank], rank, where);
    const auto left_id = model.token_to_id(left);
    const auto right_id = model.token_to_id(right);
    M3_CHECK(left_id.has_value(), "{}: merges[{}] uses {:?}, which is not in the vocab", where,
             rank, left);
    M3_CHECK(right_id.has_value(), "{}: merges[{}] uses {:?}, which is not in the vocab", where,
             rank, right);
    M3_CHECK(right.size() >= prefix_len, "{}: merges[{}] right part {:?} lacks the prefix {:?}",
             where, rank, right, model.continuing_subword_prefix_);
    const std::string merged = left + right.substr(prefix_len);
    const auto merged_id = model.token_to_id(merged);
    M3_CHECK(merged_id.has_value(), "{}: merges[{}] makes {:?}, which is not in the vocab", where,
             rank, merged);
    const uint64_t key = MergeTable::pair_key(*left_id, *right_id);
    table.push_back({key, MergeTable::Entry{key, static_cast<uint32_t>(rank), *merged_id}});
  }
  model.merges_.build(table);
  return model;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= vocab_r_.size()) return nullptr;
  return vocab_r_[static_cast<size_t>(id)];
}

int32_t BpeModel::symbol_id(std::string_view piece) const {
  const auto it = vocab_.find(piece);
  return it == vocab_.end() ? -1 : it->second;
}

void BpeModel::tokenize(std::string_view word, BpeScratch& scratch,
                        std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto id = token_to_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() < kMaxCachedWordBytes;
  const uint64_t hash = cacheable ? WordCache::hash(word) : 0;
  if (cacheable && scratch.cache.find(word, hash, out)) return;
  merge_word(word, scratch);
  const size_t first = out.size();
  for (const auto& symbol : scratch.symbols) {
    if (symbol.byte_len != 0) out.push_back(symbol.id);
  }
  if (cacheable) {
    scratch.cache.insert(word, hash, std::span<const int32_t>(out).subspan(first));
  }
}

void BpeModel::merge_word(std::string_view word, BpeScratch& scratch) const {
  auto& symbols = scratch.symbols;
  symbols.clear();
  auto add = [&](int32_t id, size_t byte_len) {
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, static_cast<uint32_t>(byte_len)});
  };
  const bool affixes = !continuing_subword_prefix_.empty() || !end_of_word_suffix_.empty();
  // An unk symbol not yet added (fuse_unk grows it): its byte length, 0 when there is none.
  size_t pending_unk_len = 0;
  auto flush_unk = [&] {
    if (pending_unk_len > 0) add(*unk_id_, pending_unk_len);
    pending_unk_len = 0;
  };

  size_t pos = 0;
  while (pos < word.size()) {
    char32_t c = 0;
    size_t len = unicode::decode_utf8(word, pos, &c);
    if (len == 0) {  // callers pass valid UTF-8; treat a stray byte as its own character
      len = 1;
      c = 0xFFFFFFFF;
    }
    const bool is_first = pos == 0;
    const bool is_last = pos + len == word.size();
    std::string_view piece = word.substr(pos, len);
    int32_t id = -1;
    if (!affixes) {
      id = c < kSmallCharLimit ? small_char_ids_[c] : symbol_id(piece);
    } else {
      scratch.piece.clear();
      if (!is_first) scratch.piece.append(continuing_subword_prefix_);
      scratch.piece.append(piece);
      if (is_last) scratch.piece.append(end_of_word_suffix_);
      piece = scratch.piece;
      id = symbol_id(piece);
    }
    pos += len;

    if (id >= 0) {
      flush_unk();
      add(id, len);
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes = true;
      for (char b : piece) all_bytes = all_bytes && byte_ids_[static_cast<uint8_t>(b)] >= 0;
      if (all_bytes) {
        for (char b : piece) add(byte_ids_[static_cast<uint8_t>(b)], 1);
        continue;
      }
    }
    if (!unk_id_) continue;  // no unk token: the Rust library drops the character
    if (pending_unk_len > 0 && fuse_unk_) {
      pending_unk_len += len;
    } else {
      flush_unk();
      pending_unk_len = len;
    }
  }
  flush_unk();
  if (symbols.empty()) return;
  symbols.back().next = -1;

  auto& heap = scratch.heap;
  heap.clear();
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const auto* m = merges_.find(symbols[i].id, symbols[i + 1].id)) {
      heap.push_back({m->rank, static_cast<int32_t>(i), m->merged_id});
    }
  }
  std::make_heap(heap.begin(), heap.end(), MergeAfter{});
  auto push = [&](uint32_t rank, int32_t pos_of_left, int32_t merged_id) {
    heap.push_back({rank, pos_of_left, merged_id});
    std::push_heap(heap.begin(), heap.end(), MergeAfter{});
  };
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), MergeAfter{});
    const BpeScratch::Merge top = heap.back();
    heap.pop_back();
    BpeScratch::Symbol& left = symbols[top.pos];
    if (left.byte_len == 0 || left.next < 0) continue;
    const BpeScratch::Symbol right = symbols[left.next];
    // A stale entry: the pair at this position changed since it was queued.
    const auto* current = merges_.find(left.id, right.id);
    if (current == nullptr || current->merged_id != top.merged_id) continue;

    symbols[left.next].byte_len = 0;
    left.id = top.merged_id;
    left.byte_len += right.byte_len;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;

    if (left.prev >= 0) {
      if (const auto* m = merges_.find(symbols[left.prev].id, left.id)) {
        push(m->rank, left.prev, m->merged_id);
      }
    }
    if (left.next >= 0) {
      if (const auto* m = merges_.find(left.id, symbols[left.next].id)) {
        push(m->rank, top.pos, m->merged_id);
      }
    }
  }
}

}  // namespace m3::text
