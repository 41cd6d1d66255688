// A byte trie over some of a vocabulary's tokens, laid out flat for walks: nodes in preorder,
// each node's child edges in ascending byte order, and the tokens ending at a node contiguous, so
// a whole subtree is a range of nodes and a range of tokens.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace m3::grammar {

class TokenTrie {
 public:
  TokenTrie() = default;
  // The trie of `ids`, each of which names a token of `tokens` with at least one byte.
  TokenTrie(const std::vector<std::optional<std::string>>& tokens, std::vector<int32_t> ids);

  // Node 0 is the root; a node's children are edges [first_edge, first_edge + num_edges) and
  // the tokens whose bytes end there are node_tokens()[first_token, + num_tokens).
  struct Node {
    int32_t first_edge = 0, num_edges = 0;
    int32_t first_token = 0, num_tokens = 0;
  };
  struct Edge {
    uint8_t byte = 0;
    int32_t child = 0;
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Edge>& edges() const { return edges_; }
  const std::vector<int32_t>& node_tokens() const { return node_tokens_; }
  // The subtree of node n is [n, subtree_end(n)); the tokens ending in it are
  // node_tokens()[first_token(n), tokens_before(subtree_end(n))).
  int32_t subtree_end(int32_t node) const { return subtree_end_[static_cast<size_t>(node)]; }
  int32_t tokens_before(int32_t node) const {
    return node < static_cast<int32_t>(nodes_.size()) ? nodes_[static_cast<size_t>(node)].first_token
                                                       : static_cast<int32_t>(node_tokens_.size());
  }
  // The bytes on the edges of the subtree below node n (a 256-bit set).
  using ByteSet = std::array<uint64_t, 4>;
  const ByteSet& subtree_bytes(int32_t node) const { return subtree_bytes_[static_cast<size_t>(node)]; }
  // How many bytes the longest token below node n has past n (0 at a leaf; at most 255).
  int32_t subtree_height(int32_t node) const { return subtree_height_[static_cast<size_t>(node)]; }

 private:
  std::vector<Node> nodes_{Node{}};
  std::vector<Edge> edges_;
  std::vector<int32_t> node_tokens_;
  std::vector<int32_t> subtree_end_{1};
  std::vector<ByteSet> subtree_bytes_{ByteSet{}};
  std::vector<uint8_t> subtree_height_{0};
};

}  // namespace m3::grammar
