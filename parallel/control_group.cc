#include "parallel/control_group.h"

#include <exception>

#include "core/error.h"
#include "core/log.h"

namespace m3 {

ControlGroup::ControlGroup(std::unique_ptr<Communicator> comm, std::chrono::milliseconds timeout)
    : comm_(std::move(comm)), timeout_(timeout), last_sent_(std::chrono::steady_clock::now()) {
  M3_CHECK(comm_ != nullptr, "control group: no communicator");
}

ControlGroup::~ControlGroup() {
  if (leader()) stop();
  if (heartbeat_.joinable()) heartbeat_.join();  // stop() has ended it; a follower never has one
}

int64_t ControlGroup::min_over_nodes(int64_t value) {
  // The communicator reduces by sum and max only: min(x) = -max(-x).
  Tensor t = Tensor::zeros({1}, DType::kI64);
  t.data_as<int64_t>()[0] = -value;
  std::lock_guard lock(mutex_);
  comm_->all_reduce(t, ReduceOp::kMax);
  return -t.data_as<int64_t>()[0];
}

void ControlGroup::barrier() {
  std::lock_guard lock(mutex_);
  comm_->barrier();
}

void ControlGroup::start_heartbeat() {
  M3_CHECK(leader() && !heartbeat_.joinable(), "control group: only node 0 sends heartbeats, once");
  std::lock_guard lock(mutex_);
  last_sent_ = std::chrono::steady_clock::now();
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

void ControlGroup::send_locked(const StepMessage& message) {
  Tensor header = Tensor::wrap(const_cast<int64_t*>(message.header.data()), {kStepHeaderWords}, DType::kI64,
                               Device::kCpu);
  comm_->broadcast(header, 0);
  if (message.payload_size() > 0) {
    Tensor payload = Tensor::wrap(const_cast<int32_t*>(message.payload.data()), {message.payload_size()},
                                  DType::kI32, Device::kCpu);
    comm_->broadcast(payload, 0);
  }
  last_sent_ = std::chrono::steady_clock::now();
}

void ControlGroup::announce(StepKind kind, const StepBatch& batch) {
  M3_CHECK(leader(), "control group: only node 0 announces steps");
  M3_CHECK(kind == StepKind::kForward || kind == StepKind::kForwardSample, "control group: {} is not a step",
           static_cast<int64_t>(kind));
  const StepMessage message = encode_step(kind, batch);
  std::lock_guard lock(mutex_);
  M3_CHECK(!stopped_, "control group: a step after stop (the followers have left)");
  send_locked(message);
}

void ControlGroup::announce_kv_copies(const KvBlockCopies& copies) {
  M3_CHECK(leader(), "control group: only node 0 announces KV copies");
  const StepMessage message = encode_kv_copies(copies);
  std::lock_guard lock(mutex_);
  M3_CHECK(!stopped_, "control group: KV copies after stop (the followers have left)");
  send_locked(message);
}

void ControlGroup::heartbeat_loop() {
  const auto interval = std::max(timeout_ / 4, std::chrono::milliseconds(10));
  std::unique_lock lock(mutex_);
  while (!stopped_) {
    const auto due = last_sent_ + interval;
    if (std::chrono::steady_clock::now() < due) {
      wake_.wait_until(lock, due);
      continue;
    }
    try {
      send_locked(encode_step(StepKind::kHeartbeat));
    } catch (const std::exception& e) {
      M3_LOG_WARN("control group: heartbeat to the other nodes failed, no more heartbeats: {}", e.what());
      return;
    }
  }
}

void ControlGroup::stop() noexcept {
  if (!leader()) return;
  {
    std::lock_guard lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
    // Before start_heartbeat the followers are still loading, inside other collectives of this
    // group: a stop message would not match theirs; they fail on their own timeout instead.
    if (!heartbeat_.joinable()) return;
    try {
      send_locked(encode_step(StepKind::kStop));
    } catch (const std::exception& e) {
      M3_LOG_WARN("control group: could not tell the other nodes to stop (gone already?): {}", e.what());
    }
  }
  wake_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

std::optional<NodeCommand> ControlGroup::next_command() {
  M3_CHECK(!leader(), "control group: node 0 sends the steps, it does not wait for them");
  for (;;) {
    StepMessage message;
    try {
      Tensor header = Tensor::wrap(message.header.data(), {kStepHeaderWords}, DType::kI64, Device::kCpu);
      comm_->broadcast(header, 0);
      check_step_header(message.header);
      if (message.payload_size() > 0) {
        message.payload.resize(message.payload_size());
        Tensor payload = Tensor::wrap(message.payload.data(), {message.payload_size()}, DType::kI32, Device::kCpu);
        comm_->broadcast(payload, 0);
      }
    } catch (const Error& e) {
      fail("node {}: lost node 0: no step, heartbeat or stop from it over the control group within {} ms "
           "(--node-timeout), or its connection broke: {}",
           node_rank(), timeout_.count(), e.what());
    }
    switch (message.kind()) {
      case StepKind::kStop:
        return std::nullopt;
      case StepKind::kHeartbeat:
        continue;
      case StepKind::kCopyKvBlocks:
        return NodeCommand{StepKind::kCopyKvBlocks, {}, decode_kv_copies(message)};
      default:
        return NodeCommand{message.kind(), decode_step(message), {}};
    }
  }
}

}  // namespace m3
