#include "server/graph/sym_expr.h"

#include <gtest/gtest.h>

#include <limits>

namespace kiln::graph {
namespace {

SymExpr C(int64_t v) { return SymExpr::Const(v); }
SymExpr S(int32_t i) { return SymExpr::Symbol(i); }

TEST(SymExprTest, CanonicalSumsAndProducts) {
  EXPECT_EQ(S(0) + S(1), S(1) + S(0));
  EXPECT_EQ(S(0) * S(1) * C(2), C(2) * (S(1) * S(0)));
  EXPECT_EQ((S(0) + C(1)) + (S(0) + C(2)), C(2) * S(0) + C(3));
  EXPECT_EQ((S(0) + C(1)) * C(2), C(2) * S(0) + C(2));
  EXPECT_EQ(S(0) - S(0), C(0));
  EXPECT_EQ(S(0) * C(1), S(0));
  EXPECT_EQ(S(0) * C(0), C(0));
  EXPECT_EQ((C(3) + C(4)).value(), 7);
  EXPECT_EQ((C(2) * S(0) + S(1) - C(1)).ToString(), "s1 + 2*s0 - 1");
  EXPECT_EQ((S(0) - S(1)).ToString(), "s0 - s1");
}

TEST(SymExprTest, Division) {
  EXPECT_EQ(SymExpr::FloorDiv(C(-7), C(2)), C(-4));
  EXPECT_EQ(SymExpr::Mod(C(-7), C(2)), C(1));
  EXPECT_EQ(SymExpr::CeilDiv(C(7), C(2)), C(4));
  EXPECT_EQ(SymExpr::FloorDiv(C(4) * S(0) + C(2), C(2)), C(2) * S(0) + C(1));
  EXPECT_EQ(SymExpr::FloorDiv(C(4) * S(0) + C(3), C(2)), C(2) * S(0) + C(1));
  EXPECT_EQ(SymExpr::Mod(C(4) * S(0) + C(3), C(2)), C(1));
  EXPECT_EQ(SymExpr::FloorDiv(S(0) * S(1), S(1)), S(0));
  EXPECT_EQ(SymExpr::FloorDiv(S(0), S(0)), C(1));
  EXPECT_EQ(SymExpr::FloorDiv(S(0), C(2)).ToString(), "(s0 // 2)");
  // Division by a constant zero stays unevaluated and fails on evaluation.
  SymExpr bad = SymExpr::FloorDiv(S(0), C(0));
  EXPECT_FALSE(bad.Evaluate({{5}}).ok());
}

TEST(SymExprTest, MaxMin) {
  EXPECT_EQ(SymExpr::Max({S(0), C(1), C(4), S(0)}), SymExpr::Max({C(4), S(0)}));
  EXPECT_EQ(SymExpr::Max({C(1), C(4)}), C(4));
  EXPECT_EQ(SymExpr::Min({S(1), SymExpr::Min({S(0), C(3)})}).ToString(), "min(3, s0, s1)");
}

TEST(SymExprTest, Evaluate) {
  const std::vector<int64_t> v = {3, 5};
  EXPECT_EQ(*(C(2) * S(0) * S(1) + C(1)).Evaluate(v), 31);
  EXPECT_EQ(*SymExpr::FloorDiv(S(0) - C(10), S(1)).Evaluate(v), -2);
  EXPECT_EQ(*SymExpr::CeilDiv(S(1), C(2)).Evaluate(v), 3);
  EXPECT_FALSE(S(2).Evaluate(v).ok());
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_FALSE((C(big) * S(0)).Evaluate(v).ok());
  EXPECT_FALSE((C(big) + S(0)).Evaluate(v).ok());
}

TEST(SymExprTest, OverflowingFoldsStayExact) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  SymExpr sum = C(big) + C(big);  // not folded
  EXPECT_FALSE(sum.is_const());
  EXPECT_FALSE(sum.Evaluate({}).ok()) << sum.ToString() << " = " << *sum.Evaluate({});
  SymExpr prod = C(big) * C(3);
  EXPECT_FALSE(prod.is_const());
  EXPECT_FALSE(SymExpr::FloorDiv(C(std::numeric_limits<int64_t>::min()), C(-1)).is_const());
}

TEST(SymExprTest, NothingChangesForCanonicalInput) {
  SymExpr e = C(2) * S(0) + S(1);
  EXPECT_EQ(SymExpr::Add({e}), e);
  EXPECT_EQ(SymExpr::Mul({e}), e);
  EXPECT_EQ(e.ToString(), "s1 + 2*s0");
}

}  // namespace
}  // namespace kiln::graph
