// The model's vocabulary as the grammar engine sees it: each token's bytes (the text it adds to
// the output) in a trie, and the end-of-sequence ids. Tokens without bytes (special tokens whose
// text the client will not see, unknown ids, empty tokens) are never allowed by a grammar; the
// eos ids are allowed exactly where the grammar's text is complete.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace m3::grammar {

class Vocabulary {
 public:
  // tokens[i]: the bytes of token i, or nullopt. eos_ids: the ids that end the sequence.
  Vocabulary(const std::vector<std::optional<std::string>>& tokens, std::vector<int32_t> eos_ids);

  int32_t size() const { return size_; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  const std::optional<std::string>& bytes(int32_t token) const { return tokens_[static_cast<size_t>(token)]; }

  // The trie: node 0 is the root; a node's children are edges [first_edge, first_edge + num_edges)
  // in ascending byte order, and the tokens whose bytes end there are [first_token, + num_tokens).
  struct TrieNode {
    int32_t first_edge = 0, num_edges = 0;
    int32_t first_token = 0, num_tokens = 0;
  };
  struct TrieEdge {
    uint8_t byte = 0;
    int32_t child = 0;
  };
  const std::vector<TrieNode>& nodes() const { return nodes_; }
  const std::vector<TrieEdge>& edges() const { return edges_; }
  const std::vector<int32_t>& node_tokens() const { return node_tokens_; }
  // Nodes are numbered in preorder: the subtree of node n is [n, subtree_end(n)), and the tokens
  // ending in it are node_tokens()[first_token(n), first_token(subtree_end(n))).
  int32_t subtree_end(int32_t node) const { return subtree_end_[static_cast<size_t>(node)]; }
  int32_t tokens_before(int32_t node) const {
    return node < static_cast<int32_t>(nodes_.size()) ? nodes_[static_cast<size_t>(node)].first_token
                                                       : static_cast<int32_t>(node_tokens_.size());
  }
  // The bytes on the edges of the subtree below node n (a 256-bit set).
  using ByteSet = std::array<uint64_t, 4>;
  const ByteSet& subtree_bytes(int32_t node) const { return subtree_bytes_[static_cast<size_t>(node)]; }

 private:
  int32_t size_ = 0;
  std::vector<std::optional<std::string>> tokens_;
  std::vector<int32_t> eos_ids_;
  std::vector<TrieNode> nodes_;
  std::vector<TrieEdge> edges_;
  std::vector<int32_t> node_tokens_;
  std::vector<int32_t> subtree_end_;
  std::vector<ByteSet> subtree_bytes_;
};

}  // namespace m3::grammar
