#include <gtest/gtest.h>

#include <cmath>

#include "config/value.hpp"
#include "core/error.hpp"

using namespace laoyao;
using namespace laoyao::config;

TEST(Value, ScalarsAreTypedAsHydraTypesThem) {
  EXPECT_EQ(parse_scalar("10").kind, Value::Kind::Int);
  EXPECT_EQ(parse_scalar("-3").i, -3);
  EXPECT_EQ(parse_scalar("3e-4").kind, Value::Kind::Float);
  EXPECT_DOUBLE_EQ(parse_scalar("3e-4").f, 3e-4);
  EXPECT_DOUBLE_EQ(parse_scalar("0.1").f, 0.1);
  EXPECT_EQ(parse_scalar("True").kind, Value::Kind::Bool);
  EXPECT_FALSE(parse_scalar("false").b);
  EXPECT_TRUE(parse_scalar("null").is_null());
  EXPECT_TRUE(std::isinf(parse_scalar("inf").f));
  EXPECT_EQ(parse_scalar("969,30,1").kind, Value::Kind::String);
  EXPECT_EQ(parse_scalar("/data/x_text_document").s, "/data/x_text_document");
  EXPECT_EQ(parse_scalar("1e").kind, Value::Kind::String);
}

TEST(Value, OverrideValuesParseListsDictsAndQuotes) {
  Value l = parse_override_value("[1, 2.5, 'a b', [3]]", "x");
  ASSERT_EQ(l.kind, Value::Kind::List);
  ASSERT_EQ(l.list.size(), 4u);
  EXPECT_EQ(l.list[0].i, 1);
  EXPECT_DOUBLE_EQ(l.list[1].f, 2.5);
  EXPECT_EQ(l.list[2].s, "a b");
  EXPECT_EQ(l.list[3].list[0].i, 3);
  Value d = parse_override_value("{A: 1, B: x}", "x");
  ASSERT_EQ(d.kind, Value::Kind::Map);
  EXPECT_EQ(d.map[0].first, "A");
  EXPECT_EQ(d.map[1].second.s, "x");
  EXPECT_EQ(parse_override_value("'10'", "x").kind, Value::Kind::String);
  EXPECT_TRUE(parse_override_value("[]", "x").list.empty());
}

TEST(Value, MalformedOverrideValuesNameTheKey) {
  try {
    parse_override_value("[1, 2", "model.moe_layer_freq");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("model.moe_layer_freq"), std::string::npos);
  }
  EXPECT_THROW(parse_override_value("'abc", "k"), UsageError);
  EXPECT_THROW(parse_override_value("[1] x", "k"), UsageError);
}

TEST(Value, OverrideTextRoundTrips) {
  for (const char* t : {"3e-4", "1e-08", "0.1", "1.0", "12345678901", "true", "null", "[1,2]", "'1,1,1'", "'a b'",
                        "{A:'0',B:x}", "0.033", "-0.5"}) {
    Value v = parse_override_value(t, "x");
    EXPECT_EQ(parse_override_value(to_override_text(v), "x"), v) << t << " -> " << to_override_text(v);
  }
  EXPECT_EQ(format_double(3e-4), "0.0003");
  EXPECT_EQ(format_double(1.0), "1.0");
  EXPECT_EQ(format_double(500000), "500000.0");
}

// The parser recurses once per list or dict: `a.b=[[[[...` 100k deep once could run off the stack.
TEST(Value, OverrideValuesNestingDeeperThan64LevelsAreRefused) {
  for (const std::string& text : {std::string(100000, '['), std::string(65, '[') + "1" + std::string(65, ']')}) {
    try {
      parse_override_value(text, "model.x");
      FAIL() << text.size();
    } catch (const UsageError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("cannot parse the value of model.x: lists and dicts nest deeper than 64 levels"),
                std::string::npos)
          << m;
      EXPECT_LT(m.size(), 300u) << "the message quotes the value's start only";
    }
  }
  std::string dicts;
  for (int k = 0; k < 100000; ++k) dicts += "{a:";
  EXPECT_THROW(parse_override_value(dicts, "model.x"), UsageError);
  // 64 levels still parse.
  Value v = parse_override_value(std::string(64, '[') + "1" + std::string(64, ']'), "model.x");
  EXPECT_EQ(v.kind, Value::Kind::List);
}
