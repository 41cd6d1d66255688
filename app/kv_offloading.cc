#include "app/kv_offloading.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace m3::app {
namespace {
constexpr double kGiB = double(int64_t{1} << 30);
}

int64_t parse_kv_offloading_size(const std::string& text) {
  std::size_t used = 0;
  double gib = 0;
  try {
    gib = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  M3_CHECK(used > 0 && used == text.size() && std::isfinite(gib),
           "--kv-offloading-size '{}' is not a number (the host tier's size in GiB, e.g. 8 or 0.5)", text);
  M3_CHECK(gib > 0, "--kv-offloading-size {} must be positive (GiB of host memory for the KV host tier)", text);
  M3_CHECK(gib * kGiB < 9.0e18, "--kv-offloading-size {} GiB is more bytes than this host can address", text);
  return static_cast<int64_t>(gib * kGiB);
}

void check_kv_offloading_backend(const std::string& name) {
  M3_CHECK(name == "native",
           "--kv-offloading-backend '{}': m3serve has only vLLM's 'native' backend (the host tier of its own prefix "
           "cache); lmcache is not implemented",
           name);
}

int64_t host_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream in(line);
    std::string key;
    int64_t kib = 0;
    if (in >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

int64_t kv_offload_slots(const std::string& size_text, int64_t block_bytes, int ranks, int local_ranks) {
  M3_CHECK(local_ranks >= 1 && local_ranks <= ranks, "kv_offload_slots: {} of {} ranks on this host", local_ranks,
           ranks);
  const int64_t bytes = parse_kv_offloading_size(size_text);
  const int64_t per_slot = block_bytes * ranks;
  const int64_t slots = bytes / per_slot;
  M3_CHECK(slots > 0,
           "--kv-offloading-size {} GiB holds no KV block: one block is {} bytes on each of {} rank(s), {:.3f} GiB",
           size_text, block_bytes, ranks, per_slot / kGiB);
  const int64_t available = host_available_bytes();
  const int64_t here = slots * block_bytes * local_ranks;
  M3_CHECK(available < 0 || here <= available,
           "--kv-offloading-size {} GiB is more than this host has available ({:.2f} GiB of it on this host's {} "
           "rank(s), {:.2f} GiB free of host memory); lower it",
           size_text, here / kGiB, local_ranks, available / kGiB);
  return slots;
}

}  // namespace m3::app
