#include "app/offline_requests.h"

#include <condition_variable>
#include <mutex>

namespace m3::app {

std::vector<CompletedRequest> run_to_completion(EngineCore& engine, std::vector<EngineRequest> requests) {
  std::vector<CompletedRequest> results(requests.size());
  std::mutex mutex;
  std::condition_variable done;
  size_t left = requests.size();
  for (size_t i = 0; i < requests.size(); ++i) {
    // The sink runs on the engine thread; each request writes only its own slot.
    engine.add_request(std::move(requests[i]), [&, i](const RequestOutput& out) {
      CompletedRequest& r = results[i];
      r.output_ids.insert(r.output_ids.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      r.logprobs.insert(r.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
      if (out.prompt_logprobs) r.prompt_logprobs = out.prompt_logprobs;
      if (!out.finished) return;
      r.finish_reason = out.finish_reason;
      r.error = out.error;
      if (out.timings) r.timings = *out.timings;
      std::lock_guard lock(mutex);
      if (--left == 0) done.notify_all();
    });
  }
  engine.start();
  std::unique_lock lock(mutex);
  done.wait(lock, [&] { return left == 0; });
  return results;
}

}  // namespace m3::app
