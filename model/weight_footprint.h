// What a model's weights weigh, whole or per rank of a parallel layout, from config.json and its
// quantization_config alone (no tensor is read or allocated): each tensor's shape and format as
// make_dummy_weights builds them (the formats a real checkpoint of the config has), cut to the
// rank's slices (parallel/layout.h). `m3serve plan` and the loader's start-up log use it.
#pragma once
#include <cstdint>

#include "model/config.h"
#include "ops/weights.h"
#include "parallel/layout.h"

namespace m3 {

// The config's sizes in the terms parallel/ splits by (0 for parts the model lacks).
ModelGeometry model_geometry(const ModelConfig& config);

// The format quantization_config declares for the linear `name` (release-layout module name, as
// ignore lists spell it): `declared`, or dense when the name is ignored.
WeightFormat declared_weight_format(const ModelConfig& config, const std::string& name, QuantScheme declared);

struct WeightFootprint {
  int64_t embedding = 0;       // embed_tokens + lm_head (vocab-parallel) + final norm
  int64_t attention = 0;       // q/k/v/o, norms, indexer of every layer
  int64_t dense_mlp = 0;       // the MLP of dense layers
  int64_t shared_expert = 0;   // shared expert + router (replicated: every rank routes its tokens)
  int64_t routed_experts = 0;  // the routed experts this rank holds
  int64_t total() const { return embedding + attention + dense_mlp + shared_expert + routed_experts; }
};

// Bytes of the weights `shard` holds. With a one-rank layout this is the whole model: what
// make_dummy_weights allocates (tests/model_loading check the two agree).
WeightFootprint weight_footprint(const ModelConfig& config, const RankShard& shard);

}  // namespace m3
