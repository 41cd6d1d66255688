// Which data-parallel lane (DEP copy) takes a new request: the one that most recently took a
// request sharing the longest prefix of full KV blocks with it, so the turns of a conversation
// (each one's prompt starts with the last one's prompt and answer) find their prefix in that
// lane's cache; unless that lane has more requests in flight than the least busy one by more than
// a slack (2 plus a quarter of the least busy lane's count), or nothing matches: then the lane with
// the fewest in flight (the lowest index among equals).
//
// The router keeps its own table of block hashes (a chain over the prompt's full blocks, as the
// prefix cache's) -> the lane that last took them, least recently used out first; it never asks a
// lane, whose cache lives on the lane's thread. A lane may have evicted a prefix the table still
// names: the request then recomputes it there, as it would have on any other lane.
#pragma once
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace m3 {

class LaneRouter {
 public:
  // `capacity`: block hashes remembered at most (the lanes' cache blocks together is the useful
  // size: more names prefixes no lane still holds).
  LaneRouter(int num_lanes, int block_size, int64_t capacity);

  // The chain of the prompt's full blocks (no lock needed: callers hash before they take theirs).
  std::vector<uint64_t> block_hashes(std::span<const int32_t> prompt) const;
  // The lane for a prompt's block chain, given each lane's requests in flight; records the
  // blocks as that lane's.
  int choose(std::span<const uint64_t> hashes, std::span<const int> live);
  int choose(std::span<const int32_t> prompt, std::span<const int> live) {
    const std::vector<uint64_t> hashes = block_hashes(prompt);
    return choose(std::span<const uint64_t>(hashes), live);
  }

  int64_t size() const { return static_cast<int64_t>(lru_.size()); }

 private:
  struct Entry {
    int lane;
    std::list<uint64_t>::iterator age;
  };
  int num_lanes_;
  int block_size_;
  int64_t capacity_;
  std::unordered_map<uint64_t, Entry> lanes_;  // block hash -> lane
  std::list<uint64_t> lru_;                    // most recently used first
};

}  // namespace m3
