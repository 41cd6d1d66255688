#include "engine/lane_router.h"

#include <xxhash.h>

#include <algorithm>

#include "core/error.h"

namespace m3 {

LaneRouter::LaneRouter(int num_lanes, int block_size, int64_t capacity)
    : num_lanes_(num_lanes), block_size_(block_size), capacity_(std::max<int64_t>(capacity, 1)) {
  M3_CHECK(num_lanes >= 1 && block_size >= 1, "lane router: {} lanes of blocks of {} tokens", num_lanes, block_size);
}

std::vector<uint64_t> LaneRouter::block_hashes(std::span<const int32_t> prompt) const {
  std::vector<uint64_t> hashes;
  hashes.reserve(prompt.size() / block_size_);
  uint64_t parent = 0;
  for (size_t begin = 0; begin + block_size_ <= prompt.size(); begin += block_size_) {
    parent = XXH3_64bits_withSeed(prompt.data() + begin, sizeof(int32_t) * block_size_, parent);
    hashes.push_back(parent);
  }
  return hashes;
}

int LaneRouter::choose(std::span<const uint64_t> hashes, std::span<const int> live) {
  M3_CHECK(static_cast<int>(live.size()) == num_lanes_, "lane router: {} in-flight counts for {} lanes", live.size(),
           num_lanes_);
  int least = 0;
  for (int i = 1; i < num_lanes_; ++i)
    if (live[i] < live[least]) least = i;

  // The deepest block a lane took last (the chain makes a match there a match of the whole prefix).
  int matched = -1;
  for (size_t i = hashes.size(); i-- > 0;) {
    if (auto it = lanes_.find(hashes[i]); it != lanes_.end()) {
      matched = it->second.lane;
      break;
    }
  }
  const int slack = 2 + live[least] / 4;
  const int lane = matched >= 0 && live[matched] <= live[least] + slack ? matched : least;

  for (uint64_t h : hashes) {
    auto it = lanes_.find(h);
    if (it != lanes_.end()) {
      it->second.lane = lane;
      lru_.splice(lru_.begin(), lru_, it->second.age);
      continue;
    }
    lru_.push_front(h);
    lanes_.emplace(h, Entry{lane, lru_.begin()});
    if (static_cast<int64_t>(lru_.size()) > capacity_) {
      lanes_.erase(lru_.back());
      lru_.pop_back();
    }
  }
  return lane;
}

}  // namespace m3
