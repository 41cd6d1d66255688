// Requests run to completion through the engine, the path the server's requests take (the same
// scheduler, sampling on the backend, seeds and logprobs): generate, score and bench throughput.
#pragma once
#include <optional>
#include <vector>

#include "engine/engine_core.h"
#include "engine/request.h"

namespace m3::app {

// One request's outputs, gathered from its RequestOutputs.
struct CompletedRequest {
  std::vector<int32_t> output_ids;
  std::vector<PositionLogprobs> logprobs;  // when sampling.logprobs >= 0
  std::optional<std::vector<PositionLogprobs>> prompt_logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;  // kError only
  RequestTimings timings;
};

// Queues every request before the engine thread starts (so the first step sees them all, as
// vLLM's LLM.generate over a list), starts the engine and waits until each has finished. Results
// in request order. Throws m3::Error when the engine rejects a request (its message).
std::vector<CompletedRequest> run_to_completion(EngineCore& engine, std::vector<EngineRequest> requests);

}  // namespace m3::app
