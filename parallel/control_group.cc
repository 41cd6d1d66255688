#include "parallel/control_group.h"

#include <bit>
#include <cstring>
#include <exception>
#include <type_traits>

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

void ControlGroup::mark_lost(const std::string& what) {
  std::lock_guard lock(lost_mutex_);
  if (!lost_) lost_ = what;
}

std::optional<std::string> ControlGroup::lost() const {
  std::lock_guard lock(lost_mutex_);
  return lost_;
}

void ControlGroup::send_locked(const StepMessage& message) {
  try {
    send_message_locked(message);
  } catch (const Error& e) {
    if (leader()) mark_lost(e.what());
    throw;
  }
}

void ControlGroup::send_message_locked(const StepMessage& message) {
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
  M3_CHECK(kind == StepKind::kForward || kind == StepKind::kForwardSample || kind == StepKind::kIdleStep,
           "control group: {} is not a step", static_cast<int64_t>(kind));
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

namespace {

// A reply's header: error bytes, sampled ids, logits floats, the copy times' bits (2), logprob rows.
constexpr int kReplyHeaderWords = 6;
static_assert(std::is_trivially_copyable_v<RowLogprobs> && sizeof(RowLogprobs) % sizeof(int32_t) == 0,
              "RowLogprobs travels as its bytes");
constexpr int64_t kRowLogprobsWords = sizeof(RowLogprobs) / sizeof(int32_t);

// A receiver's side (v sized by the header that came first).
template <typename T>
void broadcast_vector(Communicator& comm, std::vector<T>& v, DType dtype, int root) {
  if (v.empty()) return;
  Tensor t = Tensor::wrap(v.data(), {static_cast<int64_t>(v.size())}, dtype, Device::kCpu);
  comm.broadcast(t, root);
}

// The root's side: its data is only read (as send_locked's header and payload).
template <typename T>
void send_vector(Communicator& comm, const std::vector<T>& v, DType dtype, int root) {
  if (v.empty()) return;
  Tensor t = Tensor::wrap(const_cast<T*>(v.data()), {static_cast<int64_t>(v.size())}, dtype, Device::kCpu);
  comm.broadcast(t, root);
}

}  // namespace

RemoteReply ControlGroup::run_remote_sample(const StepBatch& batch, const SampleBatch& sampling,
                                            const std::vector<int32_t>& host_rows) {
  M3_CHECK(leader() && num_nodes() == 2, "control group: a remote step goes from node 0 over a copy's channel");
  sampling.wait_masks();
  const StepMessage step = encode_step(StepKind::kRemoteSample, batch);
  SampleMessage sample = encode_sampling(sampling, host_rows);
  std::lock_guard lock(mutex_);  // the heartbeat must not come between the step and its reply
  M3_CHECK(!stopped_, "control group: a step after stop (the followers have left)");
  try {
    return exchange_locked(step, &sample);
  } catch (const Error& e) {
    mark_lost(e.what());
    throw;
  }
}

RemoteReply ControlGroup::run_remote_draft(std::vector<int32_t> words) {
  M3_CHECK(leader() && num_nodes() == 2, "control group: a remote draft goes from node 0 over a copy's channel");
  const StepMessage message = encode_remote_draft(std::move(words));
  std::lock_guard lock(mutex_);
  M3_CHECK(!stopped_, "control group: a draft after stop (the followers have left)");
  try {
    return exchange_locked(message, nullptr);
  } catch (const Error& e) {
    mark_lost(e.what());
    throw;
  }
}

RemoteReply ControlGroup::exchange_locked(const StepMessage& step, SampleMessage* sample) {
  send_message_locked(step);
  if (sample) {
    Tensor header = Tensor::wrap(sample->header.data(), {kSampleHeaderWords}, DType::kI64, Device::kCpu);
    comm_->broadcast(header, 0);
    send_vector(*comm_, sample->payload, DType::kI32, 0);
  }
  std::array<int64_t, kReplyHeaderWords> words{};
  Tensor reply_header = Tensor::wrap(words.data(), {kReplyHeaderWords}, DType::kI64, Device::kCpu);
  comm_->broadcast(reply_header, 1);
  M3_CHECK(words[0] >= 0 && words[0] < (1 << 20) && words[1] >= 0 && words[1] < (int64_t{1} << 31) && words[2] >= 0 &&
               words[2] < (int64_t{1} << 40) && words[5] >= 0 && words[5] < (int64_t{1} << 24),
           "control group: a corrupt reply header ({}, {}, {}, {})", words[0], words[1], words[2], words[5]);
  RemoteReply reply;
  std::vector<int32_t> error((words[0] + 3) / 4);
  std::vector<int32_t> logprobs(words[5] * kRowLogprobsWords);
  reply.ids.resize(words[1]);
  reply.host_logits.resize(words[2]);
  broadcast_vector(*comm_, reply.ids, DType::kI32, 1);
  broadcast_vector(*comm_, reply.host_logits, DType::kF32, 1);
  broadcast_vector(*comm_, error, DType::kI32, 1);
  broadcast_vector(*comm_, logprobs, DType::kI32, 1);
  reply.logprobs.resize(words[5]);
  if (!logprobs.empty()) std::memcpy(static_cast<void*>(reply.logprobs.data()), logprobs.data(), logprobs.size() * sizeof(int32_t));
  reply.error.assign(reinterpret_cast<const char*>(error.data()), words[0]);
  reply.kv_copy_times = {std::bit_cast<double>(words[3]), std::bit_cast<double>(words[4])};
  last_sent_ = std::chrono::steady_clock::now();
  return reply;
}

void ControlGroup::reply(const RemoteReply& reply) {
  M3_CHECK(!leader(), "control group: node 0 asks for replies, it sends none");
  std::array<int64_t, kReplyHeaderWords> words = {
      static_cast<int64_t>(reply.error.size()), static_cast<int64_t>(reply.ids.size()),
      static_cast<int64_t>(reply.host_logits.size()), std::bit_cast<int64_t>(reply.kv_copy_times.to_host_s),
      std::bit_cast<int64_t>(reply.kv_copy_times.to_device_s), static_cast<int64_t>(reply.logprobs.size())};
  std::vector<int32_t> error((reply.error.size() + 3) / 4, 0);
  if (!reply.error.empty()) std::memcpy(error.data(), reply.error.data(), reply.error.size());
  std::vector<int32_t> logprobs(reply.logprobs.size() * kRowLogprobsWords);
  if (!logprobs.empty()) std::memcpy(logprobs.data(), reply.logprobs.data(), logprobs.size() * sizeof(int32_t));
  std::lock_guard lock(mutex_);
  Tensor header = Tensor::wrap(words.data(), {kReplyHeaderWords}, DType::kI64, Device::kCpu);
  comm_->broadcast(header, 1);
  send_vector(*comm_, reply.ids, DType::kI32, 1);
  send_vector(*comm_, reply.host_logits, DType::kF32, 1);
  send_vector(*comm_, error, DType::kI32, 1);
  send_vector(*comm_, logprobs, DType::kI32, 1);
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

void ControlGroup::receive_sampling(NodeCommand& command) {
  SampleMessage m;
  try {
    Tensor header = Tensor::wrap(m.header.data(), {kSampleHeaderWords}, DType::kI64, Device::kCpu);
    comm_->broadcast(header, 0);
    check_sample_header(m.header);
    m.payload.resize(m.payload_size());
    broadcast_vector(*comm_, m.payload, DType::kI32, 0);
  } catch (const Error& e) {
    fail("node {}: lost node 0 while it sent a step's sampling: {}", node_rank(), e.what());
  }
  decode_sampling(m, command.sampling, command.host_rows);
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
      case StepKind::kCopyKvBlocks: {
        NodeCommand c;
        c.kind = StepKind::kCopyKvBlocks;
        c.copies = decode_kv_copies(message);
        return c;
      }
      case StepKind::kRemoteDraft: {
        NodeCommand c;
        c.kind = StepKind::kRemoteDraft;
        c.words = std::move(message.payload);
        return c;
      }
      default: {
        NodeCommand c;
        c.kind = message.kind();
        c.step = decode_step(message);
        if (c.kind == StepKind::kRemoteSample) receive_sampling(c);
        return c;
      }
    }
  }
}

}  // namespace m3
