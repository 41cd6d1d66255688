#include "server/generation_job.h"

#include "core/error.h"

namespace m3::server {

GenerationJob::GenerationJob(EngineCore& engine, ServerMetrics& metrics, Clock::time_point arrival)
    : engine_(engine),
      metrics_(metrics),
      arrival_(arrival),
      channel_(std::make_shared<Channel>()) {}

GenerationJob::~GenerationJob() {
  abort_all();
  std::lock_guard lock(channel_->mutex);
  channel_->notify = nullptr;
}

void GenerationJob::set_notify(std::function<void()> notify) {
  std::lock_guard lock(channel_->mutex);
  channel_->notify = std::move(notify);
}

void GenerationJob::submit(std::vector<EngineRequest> requests) {
  choices_.reserve(choices_.size() + requests.size());
  for (EngineRequest& request : requests) {
    int index = static_cast<int>(choices_.size());
    std::string id = request.id;
    // The sink runs on the engine thread: it only queues, and holds the channel (not the job)
    // so a late output after the job is gone is harmless.
    auto sink = [channel = channel_, index](const RequestOutput& output) {
      std::function<void()> notify;
      {
        std::lock_guard lock(channel->mutex);
        if (channel->events.empty()) notify = channel->notify;
        channel->events.push_back({index, output, Clock::now()});
      }
      // Outside the lock: the consumer may be taking meanwhile. notify holds no strong
      // reference to the job, so a late call after the job is gone does nothing.
      if (notify) notify();
    };
    try {
      engine_.add_request(std::move(request), std::move(sink));
    } catch (...) {
      abort_all();
      throw;
    }
    choices_.push_back({std::move(id), false, false, false, {}});
  }
}

std::vector<ChoiceEvent> GenerationJob::take(size_t max) {
  std::vector<ChoiceEvent> events;
  {
    std::lock_guard lock(channel_->mutex);
    while (!channel_->events.empty() && events.size() < max) {
      events.push_back(std::move(channel_->events.front()));
      channel_->events.pop_front();
    }
  }
  for (ChoiceEvent& event : events) {
    Choice& choice = choices_.at(event.choice);
    observe(choice, event.output);
    if (event.output.finished && !choice.finished) {
      choice.finished = true;
      ++num_finished_;
    }
  }
  return events;
}

void GenerationJob::observe(Choice& choice, const RequestOutput& output) {
  Clock::time_point now = Clock::now();
  choice.generated_tokens += static_cast<int>(output.new_token_ids.size());
  if (!output.new_token_ids.empty()) {
    if (!choice.first_token_seen) {
      choice.first_token_seen = true;
      metrics_.observe_time_to_first_token(std::chrono::duration<double>(now - arrival_).count());
    } else {
      metrics_.observe_inter_token_latency(
          std::chrono::duration<double>(now - choice.last_token_time).count());
    }
    choice.last_token_time = now;
  }
  if (output.finished) {
    metrics_.observe_e2e_latency(std::chrono::duration<double>(now - arrival_).count());
    if (output.timings) {
      metrics_.observe_queue_time(output.timings->queue_s);
      metrics_.observe_request_phases(*output.timings, choice.generated_tokens);
    }
  }
}

bool GenerationJob::done() const { return num_finished_ == static_cast<int>(choices_.size()); }

void GenerationJob::abort(int choice) {
  Choice& c = choices_.at(choice);
  if (c.finished || c.aborted) return;
  c.aborted = true;
  engine_.abort(c.engine_id);
}

void GenerationJob::abort_all() {
  for (int i = 0; i < static_cast<int>(choices_.size()); ++i) abort(i);
}

}  // namespace m3::server
