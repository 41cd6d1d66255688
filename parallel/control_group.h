// The control group of a deployment on several hosts (--nnodes): one Gloo rank per process (node
// R is rank R), over which node 0, which runs the command and its engine, tells the other nodes'
// processes (the followers) every step before it runs it, so their ranks join the step's
// collectives; and `stop` at the end. A follower never samples (global rank 0, on node 0, does):
// it runs each step's forward on its ranks and waits for the next message. With the prefix
// cache's host tier, node 0 also sends each step's KV block copies before the step, so every
// node's ranks copy their shares of the same blocks.
//
// Liveness: while node 0 is idle (a server without requests) it sends a heartbeat every quarter
// of the timeout, so a follower's wait for the next message is bounded by the timeout whatever
// node 0 does, and a follower that hears nothing for that long reports node 0 as lost. Node 0
// sends stop from the destructor (and stop()), so every exit of node 0 that unwinds ends the
// followers cleanly; one that does not (a kill, a crash) ends them through the timeout or the
// closed connection, with the message naming node 0.
#pragma once
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "ops/step_batch.h"
#include "parallel/communicator.h"
#include "parallel/step_message.h"

namespace m3 {

// What node 0 asks of the followers next: a step (kForward, kForwardSample, kIdleStep), the KV
// block copies queued before one (kCopyKvBlocks), or on a copy's channel a step to sample
// (kRemoteSample, with its sampling and the logits rows wanted back; answer with reply()) or
// blocks to draft (kRemoteDraft).
struct NodeCommand {
  StepKind kind = StepKind::kForward;
  StepBatch step;
  KvBlockCopies copies;
  SampleBatch sampling;
  std::vector<int32_t> host_rows;
  std::vector<int32_t> words;  // kRemoteDraft: the blocks to draft (answer with reply())
};

class ControlGroup {
 public:
  // `comm`: the control group's communicator (host tensors; node 0 is rank 0); `timeout`: what it
  // was connected with (a follower's wait for the next message).
  ControlGroup(std::unique_ptr<Communicator> comm, std::chrono::milliseconds timeout);
  ~ControlGroup();  // node 0: stop()
  ControlGroup(const ControlGroup&) = delete;
  ControlGroup& operator=(const ControlGroup&) = delete;

  bool leader() const { return comm_->rank() == 0; }
  int node_rank() const { return comm_->rank(); }
  int num_nodes() const { return comm_->size(); }

  // At load time, every node together (before start_heartbeat): the smallest of the nodes' values
  // (a KV pool every rank can hold), and a barrier.
  int64_t min_over_nodes(int64_t value);
  void barrier();

  // Node 0, once every node has loaded (after the last barrier): heartbeats while idle from now on.
  void start_heartbeat();
  // Node 0: the step it is about to run (kForward or kForwardSample). Throws m3::Error when a
  // follower is gone.
  void announce(StepKind kind, const StepBatch& batch);
  // Node 0: the KV block copies it is about to make (before the step that needs them).
  void announce_kv_copies(const KvBlockCopies& copies);
  // Node 0, on the channel of a DEP copy another node holds (a group of two): that node runs
  // the step and samples; returns its reply (whose error, when set, says why the step failed
  // there). The masks of `sampling` are waited for first. Throws m3::Error when the node is gone.
  RemoteReply run_remote_sample(const StepBatch& batch, const SampleBatch& sampling,
                                const std::vector<int32_t>& host_rows);
  // Node 0, on a copy's channel: the copy's drafter drafts the blocks of `words`
  // (engine/remote_drafts.h); returns its reply (the drafts' words in ids). Throws m3::Error when
  // the node is gone.
  RemoteReply run_remote_draft(std::vector<int32_t> words);
  // Node 0: ends the followers' loop (when start_heartbeat has put them in it); once, later calls
  // do nothing. Never throws (a follower that is gone is logged).
  void stop() noexcept;

  // Node 0: why a message to the other nodes failed (a node lost, or its connection broken), once
  // one did; nullopt while none has. The ranks' groups of a lost node cannot be mended, so the
  // deployment is broken from then on (serve stops on it).
  std::optional<std::string> lost() const;

  // A follower: the next step or copies node 0 runs, or nullopt once node 0 said stop. Throws
  // m3::Error naming node 0 and the control group when nothing came within the timeout or the
  // connection broke (node 0 lost).
  std::optional<NodeCommand> next_command();
  // A follower, after a kRemoteSample or kRemoteDraft command: its answer.
  void reply(const RemoteReply& reply);

 private:
  void send_locked(const StepMessage& message);  // mutex_ held
  void send_message_locked(const StepMessage& message);  // send_locked without the bookkeeping
  RemoteReply exchange_locked(const StepMessage& step, SampleMessage* sample);  // the remote calls
  void mark_lost(const std::string& what);
  void receive_sampling(NodeCommand& command);    // a follower, after a kRemoteSample step
  void heartbeat_loop();

  std::unique_ptr<Communicator> comm_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;  // one message at a time: the engine's thread and the heartbeat's
  std::condition_variable wake_;
  std::chrono::steady_clock::time_point last_sent_;
  bool stopped_ = false;
  std::thread heartbeat_;
  mutable std::mutex lost_mutex_;  // not mutex_: a remote step holds that while it waits
  std::optional<std::string> lost_;
};

}  // namespace m3
