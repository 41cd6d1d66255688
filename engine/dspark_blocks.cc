#include "engine/dspark_blocks.h"

#include <algorithm>
#include <bit>

#include "core/error.h"
#include "ops/rejection_sampling.h"

namespace m3 {

DSparkBlockSet dspark_blocks(std::span<const DraftRequest> requests, int block_size, bool probabilistic,
                             bool with_constraints) {
  DSparkBlockSet set;
  set.sampling.resize(requests.size());
  set.uniforms.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    DSparkBlock block;
    if (r.tokens.size() < 2) continue;  // no context to draft from
    block.anchor = r.tokens.back();
    block.anchor_pos = static_cast<int32_t>(r.tokens.size() - 1);
    block.block_table = r.block_table;
    block.num_drafts = std::min(r.max_drafts, block_size);
    if (block.num_drafts < 1) continue;
    if (probabilistic && r.params && !r.params->greedy()) {
      SampleRow& row = set.sampling[i];
      row.temperature = r.params->temperature;
      row.top_k = r.params->top_k;
      row.top_p = r.params->top_p;
      row.min_p = r.params->min_p;
      block.sampling = &row;
      for (int j = 0; j < block.num_drafts; ++j) set.uniforms[i].push_back(draft_uniform(r.seed, r.output_index + j));
      block.draw_uniforms = set.uniforms[i];
    }
    if (with_constraints) {
      block.constraint = r.constraint;
      block.remaining_tokens = r.remaining_tokens;
    }
    set.blocks.push_back(block);
    set.which.push_back(i);
  }
  return set;
}

void take_dspark_drafts(const DSparkBlockSet& set, std::vector<DSparkDrafts>& out, size_t num_requests,
                        std::vector<Draft>& drafts) {
  M3_CHECK(out.size() == set.blocks.size(), "DSpark drafts: {} blocks drafted, {} asked", out.size(),
           set.blocks.size());
  drafts.assign(num_requests, Draft());
  for (size_t b = 0; b < set.blocks.size(); ++b) {
    drafts[set.which[b]].tokens = std::move(out[b].tokens);
    drafts[set.which[b]].rows = std::move(out[b].rows);
    drafts[set.which[b]].confidence = std::move(out[b].confidence);
  }
}

namespace {

void put_double(std::vector<int32_t>& w, double x) {
  const auto bits = std::bit_cast<uint64_t>(x);
  w.push_back(static_cast<int32_t>(static_cast<uint32_t>(bits)));
  w.push_back(static_cast<int32_t>(static_cast<uint32_t>(bits >> 32)));
}

void put_float(std::vector<int32_t>& w, float x) { w.push_back(std::bit_cast<int32_t>(x)); }

// Reads words in order; every read is checked against the end.
class WordReader {
 public:
  WordReader(std::span<const int32_t> words, const char* what) : words_(words), what_(what) {}
  int32_t next() {
    M3_CHECK(at_ < words_.size(), "{}: the message ends early ({} words)", what_, words_.size());
    return words_[at_++];
  }
  // A count in [0, limit].
  int32_t count(int64_t limit, const char* of) {
    const int32_t n = next();
    M3_CHECK(n >= 0 && n <= limit, "{}: {} {} (at most {})", what_, n, of, limit);
    return n;
  }
  float next_float() { return std::bit_cast<float>(next()); }
  double next_double() {
    const auto lo = static_cast<uint32_t>(next()), hi = static_cast<uint32_t>(next());
    return std::bit_cast<double>(static_cast<uint64_t>(hi) << 32 | lo);
  }
  void expect_end() const {
    M3_CHECK(at_ == words_.size(), "{}: {} words left over", what_, words_.size() - at_);
  }

 private:
  std::span<const int32_t> words_;
  size_t at_ = 0;
  const char* what_;
};

constexpr int64_t kMaxBlocks = 1 << 20, kMaxDrafts = 64, kMaxTable = 1 << 26;

}  // namespace

std::vector<int32_t> encode_dspark_blocks(const DSparkBlockSet& set) {
  std::vector<int32_t> w;
  w.push_back(static_cast<int32_t>(set.blocks.size()));
  for (const DSparkBlock& b : set.blocks) {
    w.push_back(b.anchor);
    w.push_back(b.anchor_pos);
    w.push_back(b.num_drafts);
    w.push_back(b.sampling ? 1 : 0);
    if (b.sampling) {
      put_float(w, b.sampling->temperature);
      w.push_back(b.sampling->top_k);
      put_float(w, b.sampling->top_p);
      put_float(w, b.sampling->min_p);
      w.push_back(static_cast<int32_t>(b.draw_uniforms.size()));
      for (double u : b.draw_uniforms) put_double(w, u);
    }
    w.push_back(static_cast<int32_t>(b.block_table.size()));
    w.insert(w.end(), b.block_table.begin(), b.block_table.end());
  }
  return w;
}

DSparkBlockSet decode_dspark_blocks(std::span<const int32_t> words) {
  WordReader in(words, "remote draft blocks");
  DSparkBlockSet set;
  const int32_t n = in.count(kMaxBlocks, "blocks");
  set.blocks.resize(n);
  set.which.resize(n);
  set.sampling.resize(n);
  set.uniforms.resize(n);
  set.tables.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    DSparkBlock& b = set.blocks[i];
    set.which[i] = static_cast<size_t>(i);
    b.anchor = in.next();
    b.anchor_pos = in.next();
    b.num_drafts = in.count(kMaxDrafts, "drafts in a block");
    const int32_t sampled = in.next();
    M3_CHECK(sampled == 0 || sampled == 1, "remote draft blocks: block {} has sampling flag {}", i, sampled);
    if (sampled) {
      SampleRow& row = set.sampling[i];
      row.temperature = in.next_float();
      row.top_k = in.next();
      row.top_p = in.next_float();
      row.min_p = in.next_float();
      const int32_t draws = in.count(kMaxDrafts, "draws in a block");
      for (int32_t j = 0; j < draws; ++j) set.uniforms[i].push_back(in.next_double());
      b.sampling = &row;
      b.draw_uniforms = set.uniforms[i];
    }
    const int32_t pages = in.count(kMaxTable, "blocks in a table");
    for (int32_t p = 0; p < pages; ++p) set.tables[i].push_back(in.next());
    b.block_table = set.tables[i];
  }
  in.expect_end();
  return set;
}

std::vector<int32_t> encode_dspark_drafts(std::span<const DSparkDrafts> drafts) {
  std::vector<int32_t> w;
  w.push_back(static_cast<int32_t>(drafts.size()));
  for (const DSparkDrafts& d : drafts) {
    w.push_back(static_cast<int32_t>(d.tokens.size()));
    w.insert(w.end(), d.tokens.begin(), d.tokens.end());
    w.push_back(static_cast<int32_t>(d.confidence.size()));
    for (float c : d.confidence) put_float(w, c);
    w.push_back(static_cast<int32_t>(d.rows.size()));
    for (const TokenDistribution& row : d.rows) {
      w.push_back(static_cast<int32_t>(row.ids.size()));
      w.insert(w.end(), row.ids.begin(), row.ids.end());
      for (double m : row.mass) put_double(w, m);
      put_double(w, row.total);
    }
  }
  return w;
}

std::vector<DSparkDrafts> decode_dspark_drafts(std::span<const int32_t> words, size_t num_blocks) {
  WordReader in(words, "remote drafts");
  const int32_t n = in.count(kMaxBlocks, "blocks");
  M3_CHECK(static_cast<size_t>(n) == num_blocks, "remote drafts: {} blocks drafted, {} asked", n, num_blocks);
  std::vector<DSparkDrafts> out(n);
  for (DSparkDrafts& d : out) {
    const int32_t tokens = in.count(kMaxDrafts, "drafts in a block");
    for (int32_t j = 0; j < tokens; ++j) d.tokens.push_back(in.next());
    const int32_t confidences = in.count(tokens, "confidences in a block");
    for (int32_t j = 0; j < confidences; ++j) d.confidence.push_back(in.next_float());
    const int32_t rows = in.count(tokens, "distributions in a block");
    d.rows.resize(rows);
    for (TokenDistribution& row : d.rows) {
      const int32_t ids = in.count(int64_t{1} << 28, "tokens in a distribution");
      for (int32_t k = 0; k < ids; ++k) row.ids.push_back(in.next());
      for (int32_t k = 0; k < ids; ++k) row.mass.push_back(in.next_double());
      row.total = in.next_double();
    }
  }
  in.expect_end();
  return out;
}

}  // namespace m3
