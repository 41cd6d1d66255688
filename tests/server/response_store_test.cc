// The /v1/responses store: least recently used out first, under a count and a byte bound.
#include "server/response_store.h"

#include <gtest/gtest.h>

namespace m3::server {
namespace {

StoredResponse entry(const std::string& id, size_t padding = 0) {
  StoredResponse e;
  e.id = id;
  e.conversation = Json::array({{{"role", "user"}, {"content", std::string(padding, 'x')}}});
  e.response = {{"id", id}, {"object", "response"}};
  return e;
}

TEST(ResponseStore, CountBoundEvictsTheLeastRecentlyUsed) {
  ResponseStore store({.max_entries = 2, .max_bytes = 1 << 20});
  EXPECT_TRUE(store.put(entry("a")));
  EXPECT_TRUE(store.put(entry("b")));
  ASSERT_NE(store.get("a"), nullptr);  // a is now more recent than b
  EXPECT_TRUE(store.put(entry("c")));
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(store.get("b"), nullptr);
  ASSERT_NE(store.get("a"), nullptr);
  ASSERT_NE(store.get("c"), nullptr);
  EXPECT_EQ(store.get("c")->response["id"], "c");
}

TEST(ResponseStore, ByteBoundEvictsUntilItFits) {
  const size_t one = [] {
    ResponseStore probe;
    probe.put(entry("a", 1000));
    return probe.bytes();
  }();
  ASSERT_GT(one, 1000u);
  ResponseStore store({.max_entries = 100, .max_bytes = 3 * one});
  for (const char* id : {"a", "b", "c"}) EXPECT_TRUE(store.put(entry(id, 1000)));
  EXPECT_EQ(store.bytes(), 3 * one);
  EXPECT_TRUE(store.put(entry("d", 1000)));
  EXPECT_EQ(store.size(), 3u);
  EXPECT_LE(store.bytes(), 3 * one);
  EXPECT_EQ(store.get("a"), nullptr);
  // One big entry pushes out as many as it needs.
  EXPECT_TRUE(store.put(entry("big", 2000)));
  EXPECT_LE(store.bytes(), 3 * one);
  EXPECT_EQ(store.get("b"), nullptr);
  EXPECT_EQ(store.get("c"), nullptr);
  EXPECT_NE(store.get("big"), nullptr);
  // One larger than the whole store is refused, and evicts nothing.
  EXPECT_FALSE(store.put(entry("huge", 4 * one)));
  EXPECT_EQ(store.get("huge"), nullptr);
  EXPECT_NE(store.get("big"), nullptr);
}

TEST(ResponseStore, EraseReplaceAndDisabled) {
  ResponseStore store;
  store.put(entry("a", 10));
  const size_t bytes = store.bytes();
  store.put(entry("a", 10));  // the same id again replaces it
  EXPECT_EQ(store.size(), 1u);
  EXPECT_EQ(store.bytes(), bytes);
  EXPECT_TRUE(store.erase("a"));
  EXPECT_FALSE(store.erase("a"));
  EXPECT_EQ(store.bytes(), 0u);
  EXPECT_EQ(store.get("a"), nullptr);

  ResponseStore none({.max_entries = 0, .max_bytes = 1 << 20});
  EXPECT_FALSE(none.put(entry("a")));
  EXPECT_EQ(none.size(), 0u);
}

}  // namespace
}  // namespace m3::server
