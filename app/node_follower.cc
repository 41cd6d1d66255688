#include "app/node_follower.h"

#include "core/error.h"
#include "core/log.h"

namespace m3::app {

void follow_node_zero(LoadedModel& loaded) {
  M3_CHECK(loaded.follower(), "follow_node_zero: node 0 runs the command itself");
  ControlGroup& control = *loaded.control;
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
