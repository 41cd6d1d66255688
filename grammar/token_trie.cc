#include "grammar/token_trie.h"

#include <algorithm>

namespace m3::grammar {

TokenTrie::TokenTrie(const std::vector<std::optional<std::string>>& tokens, std::vector<int32_t> ids) {
  // Sorted by their bytes, the tokens insert as a preorder walk: each node's children arrive in
  // ascending byte order and the tree can be laid out depth first as it is built.
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return *tokens[static_cast<size_t>(a)] < *tokens[static_cast<size_t>(b)]; });
  struct Tmp {
    std::vector<std::pair<uint8_t, int32_t>> kids;
    std::vector<int32_t> ids;
  };
  std::vector<Tmp> tmp(1);
  for (int32_t id : ids) {
    int32_t node = 0;
    for (char ch : *tokens[static_cast<size_t>(id)]) {
      const auto b = static_cast<uint8_t>(ch);
      auto& kids = tmp[static_cast<size_t>(node)].kids;
      if (!kids.empty() && kids.back().first == b) {
        node = kids.back().second;
      } else {
        const auto child = static_cast<int32_t>(tmp.size());
        kids.emplace_back(b, child);
        tmp.emplace_back();
        node = child;
      }
    }
    tmp[static_cast<size_t>(node)].ids.push_back(id);
  }
  nodes_.assign(tmp.size(), Node{});
  for (size_t n = 0; n < tmp.size(); ++n) {
    Node& out = nodes_[n];
    out.first_edge = static_cast<int32_t>(edges_.size());
    out.num_edges = static_cast<int32_t>(tmp[n].kids.size());
    for (auto [b, child] : tmp[n].kids) edges_.push_back({b, child});
    out.first_token = static_cast<int32_t>(node_tokens_.size());
    out.num_tokens = static_cast<int32_t>(tmp[n].ids.size());
    node_tokens_.insert(node_tokens_.end(), tmp[n].ids.begin(), tmp[n].ids.end());
  }
  // Children are numbered after their parent, so one pass from the last node up gives every
  // subtree's end and byte set.
  subtree_end_.assign(nodes_.size(), 0);
  subtree_bytes_.assign(nodes_.size(), ByteSet{});
  subtree_height_.assign(nodes_.size(), 0);
  for (size_t n = nodes_.size(); n-- > 0;) {
    int32_t end = static_cast<int32_t>(n) + 1;
    int32_t height = 0;
    ByteSet& bytes = subtree_bytes_[n];
    for (int32_t e = nodes_[n].first_edge; e < nodes_[n].first_edge + nodes_[n].num_edges; ++e) {
      const Edge& edge = edges_[static_cast<size_t>(e)];
      bytes[edge.byte >> 6] |= uint64_t(1) << (edge.byte & 63);
      for (int k = 0; k < 4; ++k) bytes[k] |= subtree_bytes_[static_cast<size_t>(edge.child)][k];
      end = std::max(end, subtree_end_[static_cast<size_t>(edge.child)]);
      height = std::max(height, 1 + subtree_height_[static_cast<size_t>(edge.child)]);
    }
    subtree_end_[n] = end;
    subtree_height_[n] = static_cast<uint8_t>(std::min(height, 255));
  }
}

}  // namespace m3::grammar
