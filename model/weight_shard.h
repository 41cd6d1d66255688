// One rank's slices of a model's weights (tensor and expert parallel), cut from the full host
// weights that load_weights or make_dummy_weights give, by the layout's RankShard
// (parallel/layout.h says who holds what). weight_footprint (model/weight_footprint.h) is what
// the result weighs, computed from the config alone.
#pragma once
#include "model/config.h"
#include "model/weights.h"
#include "parallel/layout.h"

namespace m3 {

// The weights `shard` holds, in their stored formats:
//  - attention: q rows and o columns of its query heads, k and v rows of its KV heads, index_q
//    rows of its index heads; q/k norms, index_k (the one key head every index head shares) and
//    the index norms whole;
//  - dense MLP and shared expert: gate/up rows and down columns of its intermediate slice;
//    router and bias whole (every rank routes its own tokens);
//  - routed experts: with expert parallel only the experts it holds, whole (mlp.experts[j] is
//    expert shard.experts.begin + j); without, every expert cut by its intermediate slice;
//  - embed and lm_head: its rows of the padded vocabulary, the rows past vocab_size zero;
//  - layer and final norms whole.
// Row slices are views (an mmap'd checkpoint is not read for them) unless padding adds rows;
// column slices and padded rows are owning copies. The result keeps `full`'s keep_alive, so its
// views stay valid after `full` goes; a one-rank shard gives back views of the full weights.
// Weights whose sizes disagree with the config, or a slice that cuts a scale block, are an
// m3::Error naming the tensor and the dimension.
ModelWeights shard_weights(const ModelWeights& full, const ModelConfig& config, const RankShard& shard);

}  // namespace m3
