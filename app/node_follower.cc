#include "app/node_follower.h"

#include <omp.h>

#include <exception>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "engine/minimax_m3_runner.h"
#include "engine/remote_copy_runner.h"
#include "model/dspark.h"

namespace m3::app {
namespace {

// DEP over several hosts: a thread per copy this node holds, each bound as an engine lane is.
void follow_copies(LoadedModel& loaded, const ModelOptions& options, const EngineOptions& engine) {
  std::vector<std::unique_ptr<ModelRunner>> runners = loaded.make_copy_runners();
  std::vector<RemoteDraftFn> drafters(runners.size());
  const std::optional<SpeculativeConfig> spec = speculative_config(engine);
  if (spec && spec->method == "dspark") {
    std::vector<MiniMaxM3Runner*> copies;
    for (auto& r : runners) copies.push_back(static_cast<MiniMaxM3Runner*>(r.get()));
    attach_dspark(copies, loaded, options, *spec);
    for (size_t c = 0; c < copies.size(); ++c)
      drafters[c] = [runner = copies[c]](std::span<const DSparkBlock> blocks) { return runner->propose_dspark(blocks); };
  }
  const int tp = loaded.layout.config.tensor_parallel_size;
  const int threads_per_copy = std::max(1, omp_get_max_threads() / static_cast<int>(runners.size()));
  const bool gpu = loaded.device == "cuda";
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(runners.size());
  for (size_t c = 0; c < runners.size(); ++c) {
    const int copy = loaded.first_copy() + static_cast<int>(c);
    M3_CHECK(copy < static_cast<int>(loaded.copy_channels.size()) && loaded.copy_channels[copy],
             "node {}: no channel from node 0 for copy {}", loaded.control->node_rank(), copy);
    threads.emplace_back([&, c, copy] {
      try {
        if (gpu) use_device(static_cast<int>(c) * tp);
        else omp_set_num_threads(threads_per_copy);
        const RemoteCopyCounts n = serve_remote_copy(*loaded.copy_channels[copy], *runners[c], copy, drafters[c]);
        M3_LOG_INFO("copy {}: node 0 said stop after {} steps, {} of them with requests here, {} draft steps", copy,
                    n.steps, n.sampled, n.drafts);
      } catch (...) {
        errors[c] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

void follow_node_zero(LoadedModel& loaded, const ModelOptions& options, const EngineOptions& engine) {
  M3_CHECK(loaded.follower(), "follow_node_zero: node 0 runs the command itself");
  ControlGroup& control = *loaded.control;
  if (loaded.layout.attention_data_parallel()) {
    follow_copies(loaded, options, engine);
    M3_LOG_INFO("node {}: node 0 said stop to every copy here", control.node_rank());
    return;
  }
  const std::unique_ptr<ModelRunner> runner = loaded.make_runner();  // this node's ranks only
  int64_t steps = 0;
  while (std::optional<NodeCommand> command = control.next_command()) {
    try {
      if (command->kind == StepKind::kCopyKvBlocks) {
        runner->copy_kv_blocks(command->copies);
        continue;
      }
      // The logits stay where they are: global rank 0, on node 0, samples.
      runner->forward(command->step, nullptr);
    } catch (const Error& e) {
      fail("node {}: {} {} from node 0 failed on ranks {}..{} (node 0 or another node lost, or a rank failed): {}",
           control.node_rank(), command->kind == StepKind::kCopyKvBlocks ? "the KV copies before step" : "step",
           steps, loaded.first_rank, loaded.first_rank + loaded.ranks.size() - 1, e.what());
    }
    ++steps;
  }
  M3_LOG_INFO("node {}: node 0 said stop after {} steps", control.node_rank(), steps);
}

}  // namespace m3::app
