// The DSpark drafter's blocks (model/dspark.h DSparkBlock) for the engine's draft requests
// (engine/drafter.h), wherever the drafter runs: on this process's copy of the model
// (MiniMaxM3Runner) or on a data-parallel copy another host holds (RemoteCopyRunner), whose
// channel carries the blocks and the drafts as int32 words.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "engine/drafter.h"
#include "model/dspark.h"

namespace m3 {

// Blocks with the storage their spans and pointers point into (keep the set alive while the
// blocks are used; it moves, its vectors' storage stays put).
struct DSparkBlockSet {
  std::vector<DSparkBlock> blocks;
  std::vector<size_t> which;  // blocks[b] drafts for request which[b]
  std::vector<SampleRow> sampling;
  std::vector<std::vector<double>> uniforms;
  std::vector<std::vector<int32_t>> tables;  // decoded blocks' tables (encoded ones point at the requests')
};

// One block per request that may draft (at least one draft, at most block_size, a context of at
// least one token): the anchor is its last token. probabilistic: sampled requests' drafts are
// drawn (ops/rejection_sampling.h draft_uniform gives the draws). with_constraints: the
// requests' constraints go with their blocks (a drafter in this process: it drafts under their
// masks); else they stay behind (another host's drafter cannot read them).
DSparkBlockSet dspark_blocks(std::span<const DraftRequest> requests, int block_size, bool probabilistic,
                             bool with_constraints);
// drafts[i] for each request of the set (empty for those without a block), from out[b].
void take_dspark_drafts(const DSparkBlockSet& set, std::vector<DSparkDrafts>& out, size_t num_requests,
                        std::vector<Draft>& drafts);

// The blocks as words (constraints never travel) and back; decoding checks every size and
// throws m3::Error naming what is wrong, so a corrupt message never becomes a draft step.
std::vector<int32_t> encode_dspark_blocks(const DSparkBlockSet& set);
DSparkBlockSet decode_dspark_blocks(std::span<const int32_t> words);
// The drafts of each block (tokens, confidences and the distributions of probabilistic ones) as
// words and back.
std::vector<int32_t> encode_dspark_drafts(std::span<const DSparkDrafts> drafts);
std::vector<DSparkDrafts> decode_dspark_drafts(std::span<const int32_t> words, size_t num_blocks);

}  // namespace m3
