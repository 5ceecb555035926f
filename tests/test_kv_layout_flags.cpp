#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "bie/planner/kv_bytes.h"
#include "bie/planner/kv_layer_map.h"
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

// --kv-layer-map: each layer's names parsed at the layout's block size (64 by default, the
// per-channel key tile), the label counting formats, rotation on only for int4_asym_gN keys.
TEST(KvLayoutFlags, LayerMapGivesEachLayerItsFormats) {
  KvLayoutFlags f;
  f.layer_map = {{"int4_channel", "int4_asym_g128"},
                 {"int8_channel", "int8"},
                 {"int4_channel", "int4_asym_g128"}};
  const KvLayout l = resolve(f);
  EXPECT_EQ(l.block_size, 64);
  ASSERT_EQ(l.per_layer.size(), 3u);
  EXPECT_EQ(l.body(0).k, (KvFormat{KvType::kInt4Channel, 64}));
  EXPECT_EQ(l.body(0).v, (KvFormat{KvType::kInt4Asym, 128}));
  EXPECT_EQ(l.body(1).k, (KvFormat{KvType::kInt8Channel, 64}));
  EXPECT_EQ(l.body(1).v, (KvFormat{KvType::kInt8, 0}));
  EXPECT_TRUE(l.mixed());
  EXPECT_TRUE(l.has_per_channel());
  EXPECT_FALSE(l.rotate);
  EXPECT_EQ(kv_layout_label(l),
            "layer-map k=int4_channel_t64 x2,int8_channel_t64 x1 v=int4_asym_g128 x2,int8 x1");
  f.layer_map[1].k = "int4_asym_g64";
  EXPECT_TRUE(resolve(f).rotate);

  // Bytes: the layers' own formats, summed; 128-wide heads at int4_channel_t64 + int4_asym_g64
  // are 4.5 bits per value.
  ModelGeometry g;
  g.n_layer = 3;
  g.layers.assign(3, LayerKv{2, 128, 128, 0});
  f.layer_map = {{"int4_channel", "int4_asym_g64"},
                 {"int4_channel", "int4_asym_g64"},
                 {"int4_channel", "int4_asym_g64"}};
  EXPECT_DOUBLE_EQ(kv_body_bits_per_value(g, resolve(f)), 4.5);
  f.layer_map[2] = {"int8_channel", "int8"};  // (8.5 + 8.125) / 2 on one layer of three
  const KvLayout m = resolve(f);
  EXPECT_DOUBLE_EQ(kv_body_bits_per_value(g, m), (4.5 * 2 + (8.5 + 8.125) / 2) / 3);
  EXPECT_EQ(kv_bytes_per_token(g, m), 2 * (2 * (64 + 8 + 64 + 8)) + 2 * (128 + 8 + 128 + 2));
  const std::vector<KvLayerGroup> groups = kv_layer_groups(g, m);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].n_layers, 2);
  EXPECT_EQ(groups[1].n_layers, 1);
  EXPECT_EQ(kv_layer_group_of(groups, g, m, 2), 1u);
  EXPECT_TRUE(check_kv_layout(g, m).ok());
}

TEST(KvLayoutFlags, LayerMapErrorsNameTheLayer) {
  KvLayoutFlags f;
  f.layer_map = {{"int4_channel", "int4_asym_g64"}, {"int5", "int8"}};
  auto r = resolve_kv_layout(f);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("--kv-layer-map, layer 1 k"), std::string::npos) << r.error();
  f.layer_map[1] = {"int8_channel", "int8_channel"};
  r = resolve_kv_layout(f);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("key format"), std::string::npos) << r.error();

  ModelGeometry g;
  g.n_layer = 3;
  g.layers.assign(3, LayerKv{2, 64, 64, 0});
  f.layer_map = {{"int4_channel", "int4_asym_g64"}, {"f16", "f16"}, {"int8_channel", "int8"}};
  auto s = check_kv_layout(g, resolve(f));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().find("layer 1"), std::string::npos) << s.error();
  f.layer_map.pop_back();
  s = check_kv_layout(g, resolve(f));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().find("2 layers, the model 3"), std::string::npos) << s.error();
  f.layer_map = {
      {"int4_channel", "int4_asym_g128"}, {"int8_channel", "int8"}, {"int8_channel", "int8"}};
  s = check_kv_layout(g, resolve(f));  // g128 on 64-wide heads
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().find("V cache (layer 0 of the map)"), std::string::npos) << s.error();
}

TEST(KvLayerMap, FileRoundTripsAndBadFilesSayWhy) {
  const std::vector<KvLayerNames> layers = {{"int4_channel", "int4_asym_g64"},
                                            {"int8_channel", "int8"}};
  const std::string path = ::testing::TempDir() + "/bie_map_test.json";
  std::ofstream(path) << kv_layer_map_json(layers, R"({"model": "m", "bits_per_value": 6.3})");
  auto back = read_kv_layer_map(path);
  ASSERT_TRUE(back.ok()) << back.error();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[1].k, "int8_channel");
  EXPECT_EQ((*back)[1].v, "int8");

  const auto error_of = [&](const std::string& text) {
    std::ofstream(path) << text;
    auto r = read_kv_layer_map(path);
    return r.ok() ? std::string("ok") : r.error();
  };
  EXPECT_NE(error_of("{not json").find("not a JSON object"), std::string::npos);
  EXPECT_NE(error_of(R"({"layers": []})").find("\"format\" must be"), std::string::npos);
  EXPECT_NE(error_of(R"({"format": "bie-kv-layer-map", "version": 2, "layers": []})")
                .find("\"version\" must be 1"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format": "bie-kv-layer-map", "version": 1, "layers": {}})")
                .find("non-empty array"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format": "bie-kv-layer-map", "version": 1, "layers": [{"k": "f16"}]})")
                .find("layer 0: needs string fields"),
            std::string::npos);
  std::remove(path.c_str());
  auto missing = read_kv_layer_map(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().find("cannot open"), std::string::npos);
}

}  // namespace
}  // namespace bie::planner
