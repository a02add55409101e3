#include <gtest/gtest.h>

#include "core/text.hpp"

using namespace laoyao;

TEST(Text, EditDistance) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("--num-layer", "--num-layers"), 1u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
}

TEST(Text, NearestSuggestsOnlyPlausibleTypos) {
  std::vector<std::string> flags = {"--num-layers", "--hidden-size", "--seq-length"};
  EXPECT_EQ(nearest("--num-layer", flags), "--num-layers");
  EXPECT_EQ(nearest("--hiden-size", flags), "--hidden-size");
  EXPECT_EQ(nearest("--completely-unrelated-thing", flags), "");
  EXPECT_EQ(did_you_mean("--num-layer", flags), " (did you mean --num-layers?)");
}

TEST(Text, SplitTrimJoin) {
  EXPECT_EQ(split("a,b,,c", ','), (std::vector<std::string>{"a", "b", "", "c"}));
  EXPECT_EQ(trim("  x y \n"), "x y");
  EXPECT_EQ(join({"a", "b"}, ", "), "a, b");
  EXPECT_TRUE(starts_with("model.num_layers", "model."));
  EXPECT_TRUE(ends_with("x.yaml", ".yaml"));
}
