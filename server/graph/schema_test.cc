#include "server/graph/schema.h"

#include <gtest/gtest.h>

namespace kiln::graph {
namespace {

TEST(SchemaTest, ParsesAtenSchemas) {
  auto s = ParseSchema("add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "add");
  EXPECT_EQ(s->overload, "Tensor");
  ASSERT_EQ(s->args.size(), 3u);
  EXPECT_TRUE(s->args[2].kwarg_only);
  EXPECT_EQ(s->args[2].default_value->kind, Arg::Kind::kInt);
  EXPECT_EQ(s->ToString(), "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor");

  auto v = ParseSchema(
      "var_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> "
      "(Tensor, Tensor)");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->args[1].type.is_list);
  EXPECT_TRUE(v->args[1].type.optional);
  EXPECT_EQ(v->args[1].type.fixed_size, 1);
  EXPECT_EQ(v->returns.size(), 2u);

  auto split = ParseSchema("split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]");
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_TRUE(split->returns[0].is_list);

  auto idx = ParseSchema("index.Tensor(Tensor self, Tensor?[] indices) -> Tensor");
  ASSERT_TRUE(idx.ok());
  EXPECT_TRUE(idx->args[1].type.item_optional);
  EXPECT_FALSE(idx->args[1].type.optional);

  auto gelu = ParseSchema("gelu(Tensor self, *, str approximate='none') -> Tensor");
  ASSERT_TRUE(gelu.ok());
  EXPECT_EQ(gelu->overload, "");
  EXPECT_EQ(gelu->args[1].default_value->s, "none");

  auto f = ParseSchema("native_layer_norm(Tensor input, SymInt[] s, Tensor? w, Tensor? b, float eps=1) -> Tensor");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->args[4].default_value->kind, Arg::Kind::kFloat);  // normalized to the float type

  auto stride = ParseSchema("max_pool2d(Tensor self, int[2] kernel_size, int[2] stride=1) -> Tensor");
  ASSERT_TRUE(stride.ok());
  EXPECT_EQ(ArgToString(*stride->args[2].default_value), "[1, 1]");
}

TEST(SchemaTest, RejectsBadText) {
  EXPECT_FALSE(ParseSchema("").ok());
  EXPECT_FALSE(ParseSchema("add(Tensor self").ok());
  EXPECT_FALSE(ParseSchema("add(Blob self) -> Tensor").ok());
  EXPECT_FALSE(ParseSchema("add(Tensor self) Tensor").ok());
  EXPECT_FALSE(ParseSchema("add(Tensor self=[1, 2) -> Tensor").ok());
  EXPECT_FALSE(ParseSchema("add(Tensor self) -> Tensor trailing junk").ok());
}

TEST(SchemaTest, NormalizeArg) {
  SchemaType f;
  f.base = SchemaType::Base::kFloat;
  EXPECT_EQ(NormalizeArg(f, Arg::Int(2)).kind, Arg::Kind::kFloat);
  SchemaType l;
  l.base = SchemaType::Base::kInt;
  l.is_list = true;
  l.fixed_size = 2;
  EXPECT_EQ(ArgToString(NormalizeArg(l, Arg::Int(3))), "[3, 3]");
  // Nothing changes for an already normal argument.
  EXPECT_EQ(ArgToString(NormalizeArg(l, Arg::List({Arg::Int(1), Arg::Int(2)}))), "[1, 2]");
  SchemaType i;
  i.base = SchemaType::Base::kInt;
  EXPECT_EQ(NormalizeArg(i, Arg::Int(2)).kind, Arg::Kind::kInt);
}

}  // namespace
}  // namespace kiln::graph
