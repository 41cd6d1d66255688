// One rank's slices of the dummy weights, built without the rest of the model: for the whole
// M3.1 (250 GB) over several GPUs the host cannot hold make_dummy_weights' full model to cut it.
#pragma once
#include <cstdint>

#include "model/config.h"
#include "model/weights.h"
#include "parallel/layout.h"

namespace m3 {

// Bitwise what shard_weights(make_dummy_weights(config, seed), config, shard) gives (every weight,
// scale, scalar field and zero vocabulary padding row; a tied lm_head shares the embedding's
// buffer), while allocating and filling only the slices `shard` holds (parallel/layout.h): with
// expert parallel only its whole experts; routers, norms and index_k whole. A slice that cuts a
// scale block, or runs past the config's sizes, is an m3::Error naming the tensor, as
// shard_weights refuses it. threads: fill threads (0: the host's cores, at most 64); the bytes
// never depend on it.
ModelWeights make_dummy_shard(const ModelConfig& config, uint64_t seed, const RankShard& shard,
                              unsigned threads = 0);

}  // namespace m3
