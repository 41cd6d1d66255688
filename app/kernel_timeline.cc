#include "app/kernel_timeline.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "core/error.h"

#if M3SERVE_WITH_CUPTI
#include <cupti.h>
#include <cxxabi.h>
#endif

namespace m3::app {

#if M3SERVE_WITH_CUPTI
namespace {

// CUPTI hands finished buffers to a plain function with no user pointer, so the records gather
// in this one process-wide sink; KernelTimeline lets one instance own it at a time.
struct Sink {
  std::mutex mu;
  std::vector<KernelSpan> spans;
  bool owned = false;
  bool callbacks_registered = false;
};
Sink& sink() {
  static Sink s;
  return s;
}

constexpr size_t kBufferBytes = size_t(4) << 20;

std::string short_name(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && d != nullptr ? d : mangled;
  std::free(d);
  // "void ns::(anonymous namespace)::kernel<...>(args)": drop the return type and the trailing
  // parameter list (matched from the end: the namespace has parentheses too), keep templates.
  if (name.rfind("void ", 0) == 0) name = name.substr(5);
  if (!name.empty() && name.back() == ')') {
    int depth = 0;
    for (size_t i = name.size(); i-- > 0;) {
      if (name[i] == ')') ++depth;
      if (name[i] == '(' && --depth == 0) return name.substr(0, i);
    }
  }
  return name;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::vector<KernelSpan> got;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    got.push_back({short_name(k->name), k->start, k->end, k->streamId, k->graphNodeId});
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(sink().mu);
  sink().spans.insert(sink().spans.end(), got.begin(), got.end());
}

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(r, &text);
  fail("kernel timeline: {} failed: {}", what, text != nullptr ? text : "unknown CUPTI error");
}

}  // namespace

KernelTimeline::KernelTimeline() {
  Sink& s = sink();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    M3_CHECK(!s.owned, "kernel timeline: one is already recording in this process");
    s.owned = true;
    s.spans.clear();
  }
  try {
    if (!s.callbacks_registered) {
      check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
      s.callbacks_registered = true;
    }
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)");
  } catch (...) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.owned = false;
    throw;
  }
}

KernelTimeline::~KernelTimeline() {
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(sink().mu);
  sink().spans.clear();
  sink().owned = false;
}

uint64_t KernelTimeline::now() const {
  uint64_t t = 0;
  check(cuptiGetTimestamp(&t), "cuptiGetTimestamp");
  return t;
}

std::vector<KernelSpan> KernelTimeline::spans(uint64_t begin, uint64_t end) {
  check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  std::vector<KernelSpan> out;
  std::lock_guard<std::mutex> lock(sink().mu);
  std::vector<KernelSpan>& all = sink().spans;
  // Keep what is still to come; drop what is older than this window (the bench asks in order).
  std::vector<KernelSpan> later;
  for (KernelSpan& k : all) {
    if (k.start_ns >= end) later.push_back(std::move(k));
    else if (k.start_ns >= begin) out.push_back(std::move(k));
  }
  all = std::move(later);
  std::sort(out.begin(), out.end(), [](const KernelSpan& a, const KernelSpan& b) { return a.start_ns < b.start_ns; });
  return out;
}

#else

KernelTimeline::KernelTimeline() { fail("kernel timeline: this build has no CUPTI (a CUDA build with CUDA::cupti has)"); }
KernelTimeline::~KernelTimeline() = default;
uint64_t KernelTimeline::now() const { return 0; }
std::vector<KernelSpan> KernelTimeline::spans(uint64_t, uint64_t) { return {}; }

#endif

}  // namespace m3::app
