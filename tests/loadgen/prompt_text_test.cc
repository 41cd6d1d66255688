// Prompt text from block ids: one word per token, equal ids equal text, a partial block a prefix
// of the full one; the message array grows append-only and is cut back when a request leaves it.
#include <gtest/gtest.h>

#include "loadgen/prompt_text.h"

namespace m3::loadgen {
namespace {

int words(const std::string& text) {
  int n = 0;
  for (char c : text) n += c == ' ';
  return n;
}

TEST(PromptText, BlocksAreWordsSharedById) {
  const WordPool pool = WordPool::builtin();
  const PromptBuilder a(pool, 1), b(pool, 2);
  EXPECT_EQ(words(a.block_text({7, 64})), 64);
  EXPECT_EQ(a.block_text({7, 64}), a.block_text({7, 64}));
  EXPECT_NE(a.block_text({7, 64}), a.block_text({8, 64}));
  EXPECT_NE(a.block_text({7, 64}), b.block_text({7, 64}));  // another session's scope
  const std::string full = a.block_text({7, 64});
  EXPECT_EQ(full.rfind(a.block_text({7, 10}), 0), 0u);
}

TEST(PromptText, RequestBlocksCoverTheInput) {
  TraceRequest q;
  q.in = 130;
  q.hash_ids = {4, 5, 6};
  const std::vector<Block> blocks = request_blocks(q, 64, 0);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[2], (Block{6, 2}));
  q.hash_ids.clear();  // no ids: blocks of their own, never shared
  EXPECT_LT(request_blocks(q, 64, 0)[0].id, 0);
  EXPECT_NE(request_blocks(q, 64, 0)[0].id, request_blocks(q, 64, 1 << 20)[0].id);
}

TEST(PromptText, MarkerTakesThePlaceOfItsTokens) {
  const WordPool pool = WordPool::builtin();
  const PromptBuilder text(pool, 3);
  ConversationState c;
  const std::vector<Message>& m = c.next({{1, 64}, {2, 20}}, 64, 0, 0, "[rid:y]", 5, text);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].text.rfind("[rid:y]", 0), 0u);
  EXPECT_EQ(words(m[0].text), 84 - 5);  // 5 words gave way to the marker
  EXPECT_EQ(m[0].text.substr(7), text.block_text({1, 64}).substr(text.block_text({1, 5}).size()) +
                                     text.block_text({2, 20}));
}

TEST(PromptText, ConversationGrowsAppendOnlyAndCutsBack) {
  const WordPool pool = WordPool::builtin();
  const PromptBuilder text(pool, 3);
  ConversationState c;
  const std::vector<Block> turn0 = {{1, 64}, {2, 64}, {3, 30}};
  std::vector<Message> m0 = c.next(turn0, 64, 100, 0, "[rid:x]", 0, text);
  ASSERT_EQ(m0.size(), 2u);
  EXPECT_EQ(m0[0].role, "system");
  EXPECT_EQ(m0[0].end, 100);
  EXPECT_EQ(m0[1].role, "user");
  EXPECT_EQ(m0[1].text.rfind("[rid:x]", 0), 0u);  // the marker opens the first user message
  EXPECT_EQ(words(m0[0].text) + words(m0[1].text), 64 + 64 + 30);
  EXPECT_EQ(m0[0].text + m0[1].text.substr(7), text.block_text({1, 64}) + text.block_text({2, 64}) +
                                                    text.block_text({3, 30}));

  // The partial block 3 filled up as block 7: its 30 words stay, then 20 answer words, then the rest.
  const std::vector<Block> turn1 = {{1, 64}, {2, 64}, {7, 64}, {5, 64}, {6, 10}};
  std::vector<Message> m1 = c.next(turn1, 64, 100, 20, "[rid:x]", 0, text);
  ASSERT_EQ(m1.size(), 4u);
  EXPECT_EQ(m1[0].text, m0[0].text);
  EXPECT_EQ(m1[1].text, m0[1].text);
  EXPECT_EQ(m1[2].role, "assistant");
  EXPECT_EQ(words(m1[2].text), 20);
  EXPECT_EQ(m1[2].text, text.block_text({7, 50}).substr(text.block_text({7, 30}).size()));
  EXPECT_EQ(m1[3].role, "user");
  EXPECT_EQ(m1[3].end, 64 * 4 + 10);
  EXPECT_EQ(c.resets(), 0);

  // A compaction: the context keeps the system blocks only.
  const std::vector<Block> turn2 = {{1, 64}, {2, 64}, {9, 40}};
  std::vector<Message> m2 = c.next(turn2, 64, 100, 5, "[rid:x]", 0, text);
  EXPECT_EQ(c.resets(), 1);
  ASSERT_EQ(m2.size(), 3u);
  EXPECT_EQ(m2[0].text, m0[0].text);
  EXPECT_EQ(m2[1].role, "assistant");
  EXPECT_EQ(m2[2].text.rfind("[rid:x]", 0), 0u);  // the marker comes back with the new user turn
  EXPECT_EQ(flatten(m2), m2[0].text + m2[1].text + m2[2].text);
  int total = 0;
  for (const Message& m : m2) total += words(m.text);
  EXPECT_EQ(total, 64 + 64 + 40);
}

}  // namespace
}  // namespace m3::loadgen
