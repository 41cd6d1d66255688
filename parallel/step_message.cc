#include "parallel/step_message.h"

#include <bit>
#include <cstring>
#include <type_traits>

#include "core/error.h"

namespace m3 {
namespace {

// StepBatch's vectors, in the order they travel.
constexpr std::array<std::vector<int32_t> StepBatch::*, 8> kVectors = {
    &StepBatch::token_ids,   &StepBatch::positions,    &StepBatch::token_seq,  &StepBatch::query_start,
    &StepBatch::seq_lens,    &StepBatch::page_table,   &StepBatch::slot_mapping, &StepBatch::logits_rows};
static_assert(kStepHeaderWords == 2 + kVectors.size() + 1);

// A copies message's header: kind, batch, wait_for_batch, the three lists' lengths (pairs), the
// unused words zero, payload size (two words a copy).
constexpr std::array<std::vector<KvBlockCopy> KvBlockCopies::*, 3> kCopyLists = {
    &KvBlockCopies::to_host, &KvBlockCopies::to_device, &KvBlockCopies::to_host_ahead};
constexpr int kFirstListWord = 3;
constexpr const char* kCopyListNames[] = {"to_host", "to_device", "to_host_ahead"};

int32_t narrow_id(int64_t value, const char* what, int list) {
  M3_CHECK(value >= 0 && value <= INT32_MAX, "step message: KV copy {} {} of {} does not fit in int32", what, value,
           kCopyListNames[list]);
  return static_cast<int32_t>(value);
}

void check_copies_header(const std::array<int64_t, kStepHeaderWords>& header) {
  M3_CHECK(header[1] >= 0 && header[2] >= 0 && header[2] <= header[1],
           "step message: KV copies of batch {} waiting for batch {}", header[1], header[2]);
  int64_t total = 0;
  for (size_t i = 0; i < kCopyLists.size(); ++i) {
    const int64_t n = header[kFirstListWord + i];
    M3_CHECK(n >= 0 && n < (int64_t{1} << 30), "step message: {} KV copies {}", n, kCopyListNames[i]);
    total += 2 * n;
  }
  for (int w = kFirstListWord + static_cast<int>(kCopyLists.size()); w < kStepHeaderWords - 1; ++w)
    M3_CHECK(header[w] == 0, "step message: word {} of a KV copies header is {}, not 0", w, header[w]);
  M3_CHECK(total == header[kStepHeaderWords - 1], "step message: {} KV copies need {} payload words, the header says {}",
           total / 2, total, header[kStepHeaderWords - 1]);
}

}  // namespace

StepMessage encode_step(StepKind kind, const StepBatch& batch) {
  StepMessage m;
  m.header[0] = static_cast<int64_t>(kind);
  m.header[1] = batch.pages_per_seq;
  int64_t total = 0;
  for (size_t i = 0; i < kVectors.size(); ++i) {
    const auto& v = batch.*kVectors[i];
    m.header[2 + i] = static_cast<int64_t>(v.size());
    total += static_cast<int64_t>(v.size());
  }
  m.header[kStepHeaderWords - 1] = total;
  m.payload.reserve(total);
  for (const auto member : kVectors) {
    const auto& v = batch.*member;
    m.payload.insert(m.payload.end(), v.begin(), v.end());
  }
  return m;
}

StepMessage encode_kv_copies(const KvBlockCopies& copies) {
  StepMessage m;
  m.header[0] = static_cast<int64_t>(StepKind::kCopyKvBlocks);
  M3_CHECK(copies.batch <= static_cast<uint64_t>(INT64_MAX) && copies.wait_for_batch <= copies.batch,
           "step message: KV copies of batch {} waiting for batch {}", copies.batch, copies.wait_for_batch);
  m.header[1] = static_cast<int64_t>(copies.batch);
  m.header[2] = static_cast<int64_t>(copies.wait_for_batch);
  int64_t total = 0;
  for (size_t i = 0; i < kCopyLists.size(); ++i) {
    const auto& list = copies.*kCopyLists[i];
    m.header[kFirstListWord + i] = static_cast<int64_t>(list.size());
    total += 2 * static_cast<int64_t>(list.size());
  }
  m.header[kStepHeaderWords - 1] = total;
  m.payload.reserve(total);
  for (size_t i = 0; i < kCopyLists.size(); ++i) {
    for (const KvBlockCopy& c : copies.*kCopyLists[i]) {
      m.payload.push_back(narrow_id(c.block, "block", static_cast<int>(i)));
      m.payload.push_back(narrow_id(c.host_slot, "host slot", static_cast<int>(i)));
    }
  }
  return m;
}

StepMessage encode_remote_draft(std::vector<int32_t> words) {
  StepMessage m;
  m.header[0] = static_cast<int64_t>(StepKind::kRemoteDraft);
  m.header[kStepHeaderWords - 1] = static_cast<int64_t>(words.size());
  m.payload = std::move(words);
  return m;
}

void check_step_header(const std::array<int64_t, kStepHeaderWords>& header) {
  M3_CHECK(header[0] >= 0 && header[0] <= static_cast<int64_t>(StepKind::kRemoteDraft),
           "step message: unknown kind {} (node 0 and this process run different m3serve builds?)", header[0]);
  if (header[0] == static_cast<int64_t>(StepKind::kCopyKvBlocks)) return check_copies_header(header);
  if (header[0] == static_cast<int64_t>(StepKind::kRemoteDraft)) {
    for (int w = 1; w < kStepHeaderWords - 1; ++w)
      M3_CHECK(header[w] == 0, "step message: word {} of a remote draft's header is {}, not 0", w, header[w]);
    M3_CHECK(header[kStepHeaderWords - 1] >= 0 && header[kStepHeaderWords - 1] < (int64_t{1} << 31),
             "step message: a remote draft of {} words", header[kStepHeaderWords - 1]);
    return;
  }
  M3_CHECK(header[1] >= 0, "step message: pages_per_seq {}", header[1]);
  int64_t total = 0;
  for (size_t i = 0; i < kVectors.size(); ++i) {
    M3_CHECK(header[2 + i] >= 0 && header[2 + i] < (int64_t{1} << 31), "step message: vector {} has size {}", i,
             header[2 + i]);
    total += header[2 + i];
  }
  M3_CHECK(total == header[kStepHeaderWords - 1], "step message: vector sizes add up to {}, the payload holds {}",
           total, header[kStepHeaderWords - 1]);
}

StepBatch decode_step(const StepMessage& m) {
  check_step_header(m.header);
  M3_CHECK(m.kind() != StepKind::kCopyKvBlocks && m.kind() != StepKind::kRemoteDraft,
           "step message: KV copies and remote drafts are not a step");
  M3_CHECK(static_cast<int64_t>(m.payload.size()) == m.payload_size(),
           "step message: {} payload words, the header says {}", m.payload.size(), m.payload_size());
  StepBatch batch;
  batch.pages_per_seq = static_cast<int32_t>(m.header[1]);
  auto at = m.payload.begin();
  for (size_t i = 0; i < kVectors.size(); ++i) {
    const auto n = static_cast<std::ptrdiff_t>(m.header[2 + i]);
    (batch.*kVectors[i]).assign(at, at + n);
    at += n;
  }
  return batch;
}

KvBlockCopies decode_kv_copies(const StepMessage& m) {
  check_step_header(m.header);
  M3_CHECK(m.kind() == StepKind::kCopyKvBlocks, "step message: kind {} holds no KV copies",
           static_cast<int64_t>(m.kind()));
  M3_CHECK(static_cast<int64_t>(m.payload.size()) == m.payload_size(),
           "step message: {} payload words, the header says {}", m.payload.size(), m.payload_size());
  KvBlockCopies copies;
  copies.batch = static_cast<uint64_t>(m.header[1]);
  copies.wait_for_batch = static_cast<uint64_t>(m.header[2]);
  size_t at = 0;
  for (size_t i = 0; i < kCopyLists.size(); ++i) {
    auto& list = copies.*kCopyLists[i];
    list.resize(static_cast<size_t>(m.header[kFirstListWord + i]));
    for (KvBlockCopy& c : list) {
      M3_CHECK(m.payload[at] >= 0 && m.payload[at + 1] >= 0, "step message: KV copy ({}, {}) of {} is negative",
               m.payload[at], m.payload[at + 1], kCopyListNames[i]);
      c.block = m.payload[at];
      c.host_slot = m.payload[at + 1];
      at += 2;
    }
  }
  return copies;
}

namespace {

static_assert(std::is_trivially_copyable_v<SampleRow> && sizeof(SampleRow) % sizeof(int32_t) == 0,
              "SampleRow travels as its bytes");
constexpr int64_t kRowWords = sizeof(SampleRow) / sizeof(int32_t);
static_assert(std::is_trivially_copyable_v<LogprobRow> && sizeof(LogprobRow) % sizeof(int32_t) == 0,
              "LogprobRow travels as its bytes");
constexpr int64_t kLogprobRowWords = sizeof(LogprobRow) / sizeof(int32_t);

}  // namespace

SampleMessage encode_sampling(const SampleBatch& sampling, const std::vector<int32_t>& host_rows) {
  SampleMessage m;
  const int64_t rows = static_cast<int64_t>(sampling.rows.size());
  m.header = {rows,
              static_cast<int64_t>(sampling.ids.size()),
              static_cast<int64_t>(sampling.counts.size()),
              static_cast<int64_t>(sampling.biases.size()),
              static_cast<int64_t>(sampling.allowed.size()),
              sampling.allowed_words,
              static_cast<int64_t>(host_rows.size()),
              static_cast<int64_t>(sampling.logprobs.size()),
              0};
  const int64_t total = rows * kRowWords + m.header[1] + m.header[2] + m.header[3] + m.header[4] + m.header[6] +
                        m.header[7] * kLogprobRowWords;
  m.header[kSampleHeaderWords - 1] = total;
  m.payload.resize(total);
  int32_t* at = m.payload.data();
  if (rows > 0) std::memcpy(at, sampling.rows.data(), rows * sizeof(SampleRow));
  at += rows * kRowWords;
  at = std::copy(sampling.ids.begin(), sampling.ids.end(), at);
  at = std::copy(sampling.counts.begin(), sampling.counts.end(), at);
  for (float b : sampling.biases) *at++ = std::bit_cast<int32_t>(b);
  for (uint32_t w : sampling.allowed) *at++ = static_cast<int32_t>(w);
  at = std::copy(host_rows.begin(), host_rows.end(), at);
  if (!sampling.logprobs.empty()) std::memcpy(at, sampling.logprobs.data(), sampling.logprobs.size() * sizeof(LogprobRow));
  return m;
}

void check_sample_header(const std::array<int64_t, kSampleHeaderWords>& h) {
  for (int i = 0; i < kSampleHeaderWords; ++i)
    M3_CHECK(h[i] >= 0 && h[i] < (int64_t{1} << 31), "sample message: word {} is {}", i, h[i]);
  M3_CHECK(h[1] == h[2], "sample message: {} list ids but {} counts", h[1], h[2]);
  M3_CHECK(h[3] == 0 || h[3] == h[1], "sample message: {} list ids but {} biases", h[1], h[3]);
  M3_CHECK(h[5] == 0 ? h[4] == 0 : h[4] % h[5] == 0, "sample message: {} bitmask words in rows of {}", h[4], h[5]);
  const int64_t total = h[0] * kRowWords + h[1] + h[2] + h[3] + h[4] + h[6] + h[7] * kLogprobRowWords;
  M3_CHECK(total == h[kSampleHeaderWords - 1], "sample message: the parts add up to {} words, the header says {}",
           total, h[kSampleHeaderWords - 1]);
}

void decode_sampling(const SampleMessage& m, SampleBatch& sampling, std::vector<int32_t>& host_rows) {
  check_sample_header(m.header);
  M3_CHECK(static_cast<int64_t>(m.payload.size()) == m.payload_size(),
           "sample message: {} payload words, the header says {}", m.payload.size(), m.payload_size());
  sampling.clear();
  const int32_t* at = m.payload.data();
  sampling.rows.resize(m.header[0]);
  if (m.header[0] > 0) std::memcpy(sampling.rows.data(), at, m.header[0] * sizeof(SampleRow));
  at += m.header[0] * kRowWords;
  sampling.ids.assign(at, at + m.header[1]);
  at += m.header[1];
  sampling.counts.assign(at, at + m.header[2]);
  at += m.header[2];
  sampling.biases.resize(m.header[3]);
  for (float& b : sampling.biases) b = std::bit_cast<float>(*at++);
  sampling.allowed.resize(m.header[4]);
  for (uint32_t& w : sampling.allowed) w = static_cast<uint32_t>(*at++);
  sampling.allowed_words = static_cast<int32_t>(m.header[5]);
  host_rows.assign(at, at + m.header[6]);
  at += m.header[6];
  sampling.logprobs.resize(m.header[7]);
  if (m.header[7] > 0) std::memcpy(static_cast<void*>(sampling.logprobs.data()), at, m.header[7] * sizeof(LogprobRow));
  // The rows index the lists and bitmasks that came with them: a corrupt row must not read past them.
  const int64_t mask_rows = m.header[5] == 0 ? 0 : m.header[4] / m.header[5];
  for (const SampleRow& r : sampling.rows) {
    const auto within = [&](int64_t begin, int64_t n) { return begin >= 0 && n >= 0 && begin + n <= m.header[1]; };
    M3_CHECK(within(r.prompt_begin, r.num_prompt) && within(r.output_begin, r.num_output) &&
                 within(r.masked_begin, r.num_masked) && within(r.bias_begin, r.num_bias) &&
                 (r.num_bias == 0 || m.header[3] == m.header[1]) && r.allowed_row >= -1 && r.allowed_row < mask_rows,
             "sample message: a row's lists or bitmask lie outside the message");
  }
}

}  // namespace m3
