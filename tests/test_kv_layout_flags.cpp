#include <gtest/gtest.h>

#include "bie/planner/kv_layout_flags.h"

namespace bie::planner {
namespace {

KvLayout resolve(KvLayoutFlags f) {
  auto r = resolve_kv_layout(f);
  EXPECT_TRUE(r.ok()) << r.error();
  return r.ok() ? *r : KvLayout{};
}

TEST(KvLayoutFlags, F16IsTheDefault) {
  const KvLayout l = resolve({});
  EXPECT_EQ(l.k, kKvF16);
  EXPECT_EQ(l.v, kKvF16);
  EXPECT_FALSE(l.rotate);
  EXPECT_EQ(kv_layout_label(l), "f16");
}

// The 4-bit recipe (int4_asym = int4 = int4_channel): per-channel int4 keys over 64-token blocks,
// per-token int4 values in groups of 64, no rotation: 4.5 + 4.5 bits per value.
TEST(KvLayoutFlags, Int4IsPerChannelKeysWithPerTokenValues) {
  for (const char* name : {"int4_asym", "int4", "int4_channel"}) {
    SCOPED_TRACE(name);
    KvLayoutFlags f;
    f.dtype = name;
    const KvLayout l = resolve(f);
    EXPECT_EQ(l.block_size, kDefaultChannelBlock);
    EXPECT_EQ(l.block_size, 64);
    EXPECT_EQ(l.k, (KvFormat{KvType::kInt4Channel, 64}));
    EXPECT_EQ(l.v, (KvFormat{KvType::kInt4Asym, 64}));
    EXPECT_FALSE(l.rotate);
    EXPECT_EQ(kv_layout_label(l), "k=int4_channel_t64 v=int4_asym_g64");
    f.block_size = 32;  // an explicit block size is the key tile
    f.group_size = 32;  // and the group size the values' group
    EXPECT_EQ(resolve(f).k, (KvFormat{KvType::kInt4Channel, 32}));
    EXPECT_EQ(resolve(f).v, (KvFormat{KvType::kInt4Asym, 32}));
    f.rotate = true;
    EXPECT_TRUE(resolve(f).rotate);
  }
}

// The per-token 4-bit recipe by its format's name: K and V int4_asym_gN, keys rotated, B = 16.
TEST(KvLayoutFlags, PerTokenInt4IsTheRotatedFormatName) {
  KvLayoutFlags f;
  f.dtype = "int4_asym_g64";
  const KvLayout l = resolve(f);
  EXPECT_EQ(l.block_size, 16);
  EXPECT_EQ(l.k, (KvFormat{KvType::kInt4Asym, 64}));
  EXPECT_EQ(l.v, (KvFormat{KvType::kInt4Asym, 64}));
  EXPECT_TRUE(l.rotate);
  EXPECT_EQ(kv_layout_label(l), "int4_asym_g64 +rotate");
  f.dtype = "int4_asym_g32";
  EXPECT_EQ(resolve(f).k, (KvFormat{KvType::kInt4Asym, 32}));
  f.rotate = false;
  EXPECT_FALSE(resolve(f).rotate);
}

// int8: 8-bit per-channel keys over 64-token blocks (q8_0's 8.5 bits), per-token int8 values.
TEST(KvLayoutFlags, Int8IsPerChannelKeysWithPerTokenValues) {
  for (const char* name : {"int8", "int8_channel"}) {
    SCOPED_TRACE(name);
    KvLayoutFlags f;
    f.dtype = name;
    const KvLayout l = resolve(f);
    EXPECT_EQ(l.block_size, kDefaultChannelBlock);
    EXPECT_EQ(l.k, (KvFormat{KvType::kInt8Channel, 64}));
    EXPECT_EQ(l.v, (KvFormat{KvType::kInt8, 0}));
    EXPECT_FALSE(l.rotate);
    EXPECT_EQ(kv_layout_label(l), "k=int8_channel_t64 v=int8");
    f.block_size = 16;  // an explicit block size is the tile
    EXPECT_EQ(resolve(f).k, (KvFormat{KvType::kInt8Channel, 16}));
    f.dtype_k = "int8";  // the per-token key format, literally
    EXPECT_EQ(resolve(f).k, (KvFormat{KvType::kInt8, 0}));
  }
  // Every name without per-channel keys keeps 16-token blocks by default.
  for (const char* name : {"f16", "fp8", "int4_asym_g64", "q8_0", "q4_0"}) {
    KvLayoutFlags o;
    o.dtype = name;
    EXPECT_EQ(resolve(o).block_size, 16) << name;
  }
}

TEST(KvLayoutFlags, PerTensorFlagsOverride) {
  KvLayoutFlags f;
  f.dtype = "int8";
  f.dtype_v = "fp8";
  f.rotate = true;
  const KvLayout l = resolve(f);
  EXPECT_EQ(l.k.type, KvType::kInt8Channel);  // the int8 recipe's keys
  EXPECT_EQ(l.v.type, KvType::kFp8E4M3);
  EXPECT_TRUE(l.rotate);
}

TEST(KvLayoutFlags, ErrorsNameTheFlag) {
  KvLayoutFlags f;
  f.dtype = "int3";
  auto r = resolve_kv_layout(f);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("--kv-cache-dtype"), std::string::npos) << r.error();
  f = {};
  f.dtype_v = "int4_channel";
  r = resolve_kv_layout(f);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("--kv-cache-dtype-v"), std::string::npos) << r.error();
  f = {};
  f.block_size = -1;
  EXPECT_FALSE(resolve_kv_layout(f).ok());
  f.block_size = 5000;
  EXPECT_FALSE(resolve_kv_layout(f).ok());
  f.block_size = 0;  // the regime's default
  EXPECT_EQ(resolve(f).block_size, 16);
}

}  // namespace
}  // namespace bie::planner
