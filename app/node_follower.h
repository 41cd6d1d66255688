// The work of a process on node R > 0 of a deployment on several hosts (--nnodes): whatever the
// command (serve, generate, score, bench throughput / serve / http), it loads its ranks and then
// runs the steps node 0 announces over the control group until node 0 says stop. It prints
// nothing on stdout: the command's output is node 0's.
#pragma once

#include "app/model_loader.h"

namespace m3::app {

// Returns when node 0 said stop. Throws m3::Error naming node 0 when it was lost (nothing within
// --node-timeout, a broken connection) or a step failed on this node's ranks. The options are the
// command's (the same on every node): under DEP with --speculative-config method dspark each copy
// here gets its drafter, which drafts for node 0's requests on it.
void follow_node_zero(LoadedModel& loaded, const ModelOptions& options, const EngineOptions& engine);

}  // namespace m3::app
