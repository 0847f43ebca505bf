// The JSON contract: structures round-trip, policies serialise to DESIGN's shape,
// malformed structures name the field.
#include <doctest/doctest.h>

#include <masklens/json.hpp>

#include "support/mask_gen.hpp"

using namespace masklens;

TEST_SUITE("host") {

TEST_CASE("structures round-trip through JSON") {
  testing::Rng rng(testing::test_seed(3));
  for (int i = 0; i < 300; ++i) {
    const std::int64_t q = testing::uniform(rng, 1, 60), k = testing::coin(rng) ? q : testing::uniform(rng, 1, 60);
    MaskStructure s = testing::random_structure(rng, testing::uniform(rng, 1, 3), q, k);
    s.empty_rows = s.implied_empty_rows();
    s.finite_masked_rows = testing::uniform(rng, 0, s.empty_rows);
    s.bias = testing::coin(rng);
    const nlohmann::json j = to_json(s, nullptr);
    CHECK(j["schema"] == 2);
    auto back = structure_from_json(nlohmann::json::parse(j.dump()), s.batch, s.heads, s.q_len, s.k_len);
    REQUIRE_MESSAGE(back.ok(), back.status().to_string() << " " << j.dump());
    CHECK(to_json(*back) == to_json(s));
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t row = 0; row < s.q_len; ++row) REQUIRE(back->row(b, row).same_keys(s.row(b, row)));
  }
}

TEST_CASE("a policy serialises to the contract's fields") {
  MaskStructure s = make_structure(StructureKind::causal, 2, 4096, 4096);
  s.kv_valid = {{0, 4096}, {40, 4096}};
  s.empty_rows = 40;
  auto p = decide(s, AttentionCall{});
  REQUIRE(p.ok());
  REQUIRE(p->is_plan());
  const nlohmann::json j = to_json(s, &*p);
  CHECK(j["shape"] == nlohmann::json({2, 1, 4096, 4096}));
  CHECK(j["structure"]["kind"] == "causal");
  CHECK(j["structure"]["alignment"] == "top_left");
  CHECK(j["structure"]["segments"].is_null());
  CHECK(j["structure"]["kv_valid"] == nlohmann::json({{0, 4096}, {40, 4096}}));
  CHECK(j["policy"]["mask"] == "drop");
  CHECK(j["policy"]["mask_cast"].is_null());
  REQUIRE(j["policy"]["plan"].is_array());
  CHECK(j["policy"]["plan"].size() == p->plan.size());
  // Batch 0 is one causal call; batch 1 starts with the 40 rows that attend to nothing.
  CHECK(j["policy"]["plan"][0]["call"]["type"] == "sdpa");
  CHECK(j["policy"]["plan"][0]["args"]["is_causal"] == true);
  CHECK(j["policy"]["plan"][1]["backend"] == "zeros");
  CHECK(j["policy"]["plan"][1]["batch"] == 1);
  CHECK(j["policy"]["plan"][1]["q_range"] == nlohmann::json({0, 40}));
  CHECK(j["policy"]["rejected"].size() == p->rejected.size());
  for (const auto& r : j["policy"]["rejected"]) CHECK(r.contains("source"));
}

TEST_CASE("a typed call serialises with its own fields and its backend's argument names") {
  MaskStructure s = make_structure(StructureKind::sliding_window, 1, 4096, 4096);
  s.window = 512;
  auto p = decide(s, AttentionCall{});
  REQUIRE(p.ok());
  REQUIRE(p->backend() == Backend::torch_varlen);
  const nlohmann::json j = to_json(s, &*p)["policy"];
  CHECK(j["backend"] == "torch.varlen_attn");
  CHECK(j["call"]["type"] == "varlen");
  CHECK(j["call"]["window_left"] == 511);
  CHECK(j["call"]["sequences"] == nlohmann::json({{0, 0, 4096, 0, 4096}}));
  CHECK(j["args"]["window_size"] == nlohmann::json({511, 0}));
  CHECK(j["args"]["cu_seq_q"] == nlohmann::json({0, 4096}));
  CHECK(j["mask_object"].is_null());
  // A kept fp32 bias with bf16 inputs says the cast.
  MaskStructure bias = make_structure(StructureKind::arbitrary, 1, 256, 256);
  bias.bias = true;
  AttentionCall c;
  c.mask_dtype = ElementType::float32;
  auto q = decide(bias, c);
  REQUIRE(q.ok());
  const nlohmann::json k = to_json(bias, &*q)["policy"];
  CHECK(k["mask"] == "keep");
  CHECK(k["mask_cast"] == "bfloat16");
}

TEST_CASE("rejections say their kind, the rules that refuse and the defect") {
  MaskStructure s = make_structure(StructureKind::arbitrary, 1, 69632, 69632);
  AttentionCall c;
  c.head_dim = 264;  // flash and cuDNN refuse; efficient takes it but not with this dense mask
  Environment e;
  e.available = kFamilyTorch | kFamilyFlashAttn;  // flash_attn offered without a version
  auto p = decide(s, c, e);
  REQUIRE(p.ok());
  const nlohmann::json j = to_json(*p, s);
  auto find = [&](std::string_view backend) {
    for (const auto& r : j["rejected"])
      if (r["backend"] == backend) return r;
    FAIL("no rejection for " << backend);
    return nlohmann::json();
  };
  CHECK(find("torch.sdpa.flash")["kind"] == "refused");
  CHECK(find("torch.sdpa.flash")["rules"] == nlohmann::json({"flash.head_dim"}));
  CHECK(find("torch.sdpa.cudnn")["rules"] == nlohmann::json({"cudnn.head_dim"}));
  CHECK(find("flash_attn")["rules"] == nlohmann::json({"fa2.installed", "fa2.head_dim"}));
  CHECK(find("torch.sdpa.efficient")["kind"] == "defect");
  CHECK(find("torch.sdpa.efficient")["defect"] == "efficient_mask_offset_32bit");
  CHECK(find("xformers")["kind"] == "unavailable");
  CHECK(find("torch.sdpa.causal_lower_right")["kind"] == "inexpressible");
  CHECK(j["backend"] == "torch.sdpa.math");
}

TEST_CASE("malformed structures are errors naming the field") {
  struct Bad {
    const char* text;
    ErrorCode code;  // parse_error: a value of the wrong JSON type; invalid_argument: MaskStructure::validate()
    const char* message;
  };
  const Bad cases[] = {
      {"[]", ErrorCode::parse_error, "must be a JSON object"},
      {"{}", ErrorCode::parse_error, "structure.kind must be a string"},
      {R"({"kind": "diagonal"})", ErrorCode::parse_error, "'diagonal' is not a known kind"},
      {R"({"kind": "sliding_window"})", ErrorCode::parse_error, "structure.window must be an integer"},
      {R"({"kind": "sliding_window", "window": 2.5})", ErrorCode::parse_error, "structure.window must be an integer"},
      {R"({"kind": "sliding_window", "window": -3})", ErrorCode::invalid_argument,
       "structure.window must be in [1, 2^62] for sliding_window, got -3"},
      {R"({"kind": "chunked", "chunk": 0})", ErrorCode::invalid_argument, "structure.chunk must be in [1, 2^62]"},
      {R"({"kind": "prefix_lm", "prefix": 4611686018427387905})", ErrorCode::invalid_argument, "structure.prefix"},
      {R"({"kind": "causal", "alignment": "middle"})", ErrorCode::parse_error, "top_left or bottom_right"},
      {R"({"kind": "causal_blocks", "blocks": [[5, 3]]})", ErrorCode::invalid_argument, "sorted, disjoint"},
      {R"({"kind": "causal_blocks", "blocks": [[0, 4], [3, 8]]})", ErrorCode::invalid_argument, "structure.blocks[1]"},
      {R"({"kind": "causal_blocks", "blocks": [[0, 17]]})", ErrorCode::invalid_argument, "inside [0, K)"},
      {R"({"kind": "causal_blocks", "blocks": []})", ErrorCode::invalid_argument, "at least one block"},
      {R"({"kind": "causal_blocks", "blocks": [[0, "4"]]})", ErrorCode::parse_error, "structure.blocks[0] must be [start, end]"},
      {R"({"kind": "causal", "kv_valid": [[0, 8], [0, 8], [0, 8]]})", ErrorCode::invalid_argument,
       "structure.kv_valid must list one entry per batch (2) or a single one for all batches, got 3"},
      {R"({"kind": "causal", "kv_valid": [[0, 99], [0, 8]]})", ErrorCode::invalid_argument,
       "structure.kv_valid[0] must satisfy 0 <= start <= end <= K (16), got [0, 99]"},
      {R"({"kind": "causal", "kv_valid": [[-1, 4], [0, 8]]})", ErrorCode::invalid_argument, "structure.kv_valid[0]"},
      {R"({"kind": "causal", "kv_valid": {"a": 1}})", ErrorCode::parse_error, "structure.kv_valid must be an array"},
      {R"({"kind": "causal", "segments": [[0, 4, 4, 16], [0, 16]]})", ErrorCode::invalid_argument,
       "structure.segments[0] must rise strictly from 0 to Q (16)"},
      {R"({"kind": "causal", "segments": [[0, 16], [0, 16], [0, 16]]})", ErrorCode::invalid_argument,
       "structure.segments must list one entry per batch (2)"},
      {R"({"kind": "causal", "segments": [[0, "x"]]})", ErrorCode::parse_error, "structure.segments[0] must be an array of integers"},
      {R"({"kind": "arbitrary", "kv_valid": [[0, 8]]})", ErrorCode::invalid_argument, "arbitrary takes none"},
      {R"({"kind": "causal", "empty_rows": -1})", ErrorCode::invalid_argument, "structure.empty_rows"},
      {R"({"kind": "causal", "empty_rows": 3})", ErrorCode::invalid_argument,
       "structure.empty_rows is 3 but the structure implies 0"},
      {R"({"kind": "causal", "kv_valid": [[4, 16]], "finite_masked_rows": 9})", ErrorCode::invalid_argument,
       "structure.finite_masked_rows (9) must be <= empty_rows (8)"},
      {R"({"kind": "arbitrary", "empty_rows": 33})", ErrorCode::invalid_argument, "must be <= B*H*Q (32)"},
      {R"({"kind": "causal", "bias": "yes"})", ErrorCode::parse_error, "structure.bias"},
      // A key the reader does not know, or one the kind does not take, is an error naming
      // it: dropped, it gave the advice of another mask.
      {R"({"kind": "causal", "kv_vaild": [[0, 4], [0, 8]]})", ErrorCode::parse_error,
       "structure.kv_vaild is not a structure field"},
      {R"({"kind": "causal", "window": 3})", ErrorCode::parse_error, "structure.window applies to sliding_window, not causal"},
      {R"({"kind": "sliding_window", "window": 3, "chunk": 4})", ErrorCode::parse_error,
       "structure.chunk applies to chunked, not sliding_window"},
      {R"({"kind": "chunked", "chunk": 4, "prefix": 2})", ErrorCode::parse_error, "structure.prefix applies to prefix_lm"},
      {R"({"kind": "causal", "blocks": [[0, 4]]})", ErrorCode::parse_error, "structure.blocks applies to causal_blocks"},
      {R"({"kind": "full", "alignment": "bottom_right"})", ErrorCode::parse_error, "structure.alignment applies to"},
      {R"({"schema": 2, "structure": {"kind": "causal"}, "polcy": null})", ErrorCode::parse_error,
       "'polcy' is not a key of an inspect document"},
      {R"({"schema": 2, "shape": [2, 1, 16, 16], "structure": {"kind": "causal", "Kind": "full"}})", ErrorCode::parse_error,
       "structure.Kind is not a structure field"},
      // A whole inspect document is read with its schema and its shape: another schema, or
      // another mask's lengths (its ranges are positions in that mask), are refused.
      {R"({"structure": {"kind": "causal"}})", ErrorCode::parse_error,
       "an inspect document gives its \"schema\" (2) and \"shape\" [B, H, Q, K]"},
      {R"({"schema": 1, "shape": [2, 1, 16, 16], "structure": {"kind": "causal"}})", ErrorCode::parse_error,
       "the inspect document has schema 1; this masklens reads schema 2"},
      {R"({"schema": "2", "shape": [2, 1, 16, 16], "structure": {"kind": "causal"}})", ErrorCode::parse_error,
       "the inspect document has schema \"2\""},
      {R"({"schema": 2, "shape": [2, 1, 12, 12], "structure": {"kind": "causal", "kv_valid": [[0, 12], [0, 8]]}})",
       ErrorCode::invalid_shape, "the inspect document's shape [2,1,12,12] is not the shape asked for, [2, 1, 16, 16]"},
      {R"({"schema": 2, "shape": [4, 1, 16, 16], "structure": {"kind": "causal"}})", ErrorCode::invalid_shape,
       "the inspect document's shape [4,1,16,16]"},
      {R"({"schema": 2, "shape": [2, 1, 16, 16.5], "structure": {"kind": "causal"}})", ErrorCode::parse_error,
       "the inspect document's shape must be [B, H, Q, K], four integers"},
      {R"({"schema": 2, "shape": [18446744073709551615, 1, 16, 16], "structure": {"kind": "causal"}})",
       ErrorCode::invalid_shape, "the inspect document's shape"},
      // tile_fractions holds its three fields only; a NUL in a name stays in the message, escaped.
      {R"({"kind": "arbitrary", "tile_fractions": {"block": [128, 128], "partial": 0.1, "full": 0.2, "ful": 0.3}})",
       ErrorCode::parse_error, "structure.tile_fractions.ful is not a tile_fractions field (block, partial, full)"},
      {R"({"kind": "causal\u0000x"})", ErrorCode::parse_error, "structure.kind 'causal\\u0000x' is not a known kind"},
      {R"({"kind": "causal", "a\u0001\nb": 1})", ErrorCode::parse_error, "structure.a\\u0001\\u000ab is not a structure field"},
      // An empty per-batch list is neither one entry nor one per batch.
      {R"({"kind": "causal", "kv_valid": []})", ErrorCode::invalid_argument,
       "structure.kv_valid must list one entry per batch (2) or a single one for all batches, got 0"},
      {R"({"kind": "causal", "q_valid": []})", ErrorCode::invalid_argument, "structure.q_valid must list one entry per batch (2)"},
      {R"({"kind": "causal", "segments": []})", ErrorCode::invalid_argument, "structure.segments must list one entry per batch (2)"},
      // Integers from 2^63 to 2^64 read as unsigned: reported as written, not wrapped.
      {R"({"kind": "sliding_window", "window": 18446744073709551615})", ErrorCode::invalid_argument,
       "structure.window must be at most 2^63 - 1, got 18446744073709551615"},
      {R"({"kind": "chunked", "chunk": 9223372036854775808})", ErrorCode::invalid_argument, "got 9223372036854775808"},
      {R"({"kind": "causal", "kv_valid": [[0, 18446744073709551615]]})", ErrorCode::invalid_argument,
       "structure.kv_valid[0][1] must be at most 2^63 - 1, got 18446744073709551615"},
      {R"({"kind": "causal", "segments": [[0, 9223372036854775809, 16]]})", ErrorCode::invalid_argument,
       "structure.segments[0][1] must be at most 2^63 - 1, got 9223372036854775809"},
      {R"({"kind": "causal", "empty_rows": 18446744073709551615})", ErrorCode::invalid_argument, "got 18446744073709551615"},
      {R"({"kind": "arbitrary", "tile_fractions": {"block": [18446744073709551615, 4], "partial": 0.1, "full": 0.2}})",
       ErrorCode::invalid_argument, "got 18446744073709551615"},
      {R"({"kind": "arbitrary", "tile_fractions": {"block": [128], "partial": 0.1, "full": 0.2}})", ErrorCode::parse_error,
       "structure.tile_fractions must be"},
      {R"({"kind": "arbitrary", "tile_fractions": {"block": [128, 128], "partial": "0.1", "full": 0.2}})",
       ErrorCode::parse_error, "structure.tile_fractions must be"},
      {R"({"kind": "arbitrary", "tile_fractions": {"block": [128, 128], "partial": 0.9, "full": 0.2}})",
       ErrorCode::invalid_argument, "sum to at most 1"},
      {R"({"kind": "arbitrary", "tile_fractions": {"block": [0, 128], "partial": 0.1, "full": 0.2}})",
       ErrorCode::invalid_argument, "structure.tile_fractions.block"},
      {R"({"kind": "causal", "tile_fractions": {"block": [128, 128], "partial": 0.1, "full": 0.2}})",
       ErrorCode::invalid_argument, "only arbitrary takes them"},
  };
  for (const Bad& c : cases) {
    INFO(c.text);
    auto r = structure_from_json(nlohmann::json::parse(c.text), 2, 1, 16, 16);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == c.code);
    CHECK_MESSAGE(r.status().message().find(c.message) != std::string::npos, r.status().message());
  }
  SUBCASE("segments need Q == K") {
    auto r = structure_from_json(nlohmann::json::parse(R"({"kind": "full", "segments": [[0, 4, 8]]})"), 1, 1, 8, 9);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message() == "structure.segments need Q == K, got Q 8, K 9");
  }
  SUBCASE("the shape") {
    auto r = structure_from_json(nlohmann::json::parse(R"({"kind": "causal"})"), 1, 0, 8, 8);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == ErrorCode::invalid_shape);
    CHECK(r.status().message() == "structure heads must be in [1, 2^62], got 0");
  }
}

TEST_CASE("a null value reads as a key left out, whatever the kind") {
  auto s = structure_from_json(
      nlohmann::json::parse(R"({"kind": "causal", "window": null, "kv_valid": null, "segments": null, "alignment": null})"),
      2, 1, 16, 16);
  REQUIRE_MESSAGE(s.ok(), s.status().to_string());
  CHECK(s->kind == StructureKind::causal);
  CHECK_FALSE(s->has_kv_valid());
}

TEST_CASE("the empty-row count is derived: left out it reads as implied, wrong it is an error") {
  // Sliding window 64 over 512 keys, keys [100, 512) valid: rows 0..99 attend nothing.
  const auto j = nlohmann::json::parse(R"({"kind": "sliding_window", "window": 64, "kv_valid": [[100, 512]]})");
  auto s = structure_from_json(j, 1, 2, 512, 512);
  REQUIRE(s.ok());
  CHECK(s->empty_rows == 200);  // 100 rows in each of 2 heads
  nlohmann::json given = j;
  given["empty_rows"] = 200;
  CHECK(structure_from_json(given, 1, 2, 512, 512).ok());
  given["empty_rows"] = 100;
  auto wrong = structure_from_json(given, 1, 2, 512, 512);
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.status().message() == "structure.empty_rows is 100 but the structure implies 200 (give 0 to have it derived)");
  // An arbitrary structure implies nothing: its count is taken as given.
  auto arbitrary = structure_from_json(nlohmann::json::parse(R"({"kind": "arbitrary", "empty_rows": 7})"), 1, 1, 8, 8);
  REQUIRE(arbitrary.ok());
  CHECK(arbitrary->empty_rows == 7);
}

TEST_CASE("one modifier entry holds for every batch") {
  const auto j = nlohmann::json::parse(R"({"kind": "causal", "kv_valid": [[2, 8]], "segments": [[0, 5, 8]]})");
  auto s = structure_from_json(j, 3, 1, 8, 8);
  REQUIRE(s.ok());
  CHECK(s->kv_valid.size() == 1);
  CHECK(to_json(*s)["kv_valid"] == nlohmann::json({{2, 8}}));
  // Per batch, the same three batches.
  auto per_batch = structure_from_json(
      nlohmann::json::parse(R"({"kind": "causal", "kv_valid": [[2, 8], [2, 8], [2, 8]],
                                "segments": [[0, 5, 8], [0, 5, 8], [0, 5, 8]]})"),
      3, 1, 8, 8);
  REQUIRE(per_batch.ok());
  CHECK(s->description_cost() == per_batch->description_cost());
  CHECK(s->empty_rows == 3 * 2);  // rows 0 and 1 of each batch see no valid key
  CHECK(s->empty_rows == per_batch->empty_rows);
  for (std::int64_t b = 0; b < 3; ++b)
    for (std::int64_t q = 0; q < 8; ++q) CHECK(s->row(b, q).same_keys(per_batch->row(b, q)));
}

TEST_CASE("an arbitrary mask's tile fractions round-trip; a tile summary serialises as torch's BlockMask tensors") {
  MaskStructure s = make_structure(StructureKind::arbitrary, 2, 300, 200);
  s.tile_fractions = TileFractions{128, 64, 0.123456789012345, 0.25};
  const nlohmann::json j = to_json(s, nullptr);
  CHECK(j["structure"]["tile_fractions"]["block"] == nlohmann::json({128, 64}));
  auto back = structure_from_json(nlohmann::json::parse(j.dump()), 2, 1, 300, 200);
  REQUIRE(back.ok());
  REQUIRE(back->tile_fractions.has_value());
  CHECK(back->tile_fractions->partial == s.tile_fractions->partial);  // exactly: the text round-trips a double
  CHECK(back->tile_fractions->full == 0.25);
  CHECK(back->tile_fractions->block_k == 64);
  CHECK_FALSE(to_json(make_structure(StructureKind::causal, 1, 8, 8)).contains("tile_fractions"));

  MaskStructure causal = make_structure(StructureKind::causal, 1, 5, 5);
  auto tiles = tiles_from_structure(causal, TileSize{2, 2});
  REQUIRE(tiles.ok());
  auto bm = block_mask_tensors(*tiles);
  REQUIRE(bm.ok());
  const nlohmann::json t = to_json(*bm, tiles->tally());
  CHECK(t["block"] == nlohmann::json({2, 2}));
  CHECK(t["seq_lengths"] == nlohmann::json({5, 5}));
  CHECK(t["shape"] == nlohmann::json({1, 1, 3, 3}));
  CHECK(t["counts"] == nlohmann::json({{"empty", 3}, {"partial", 5}, {"full", 1}}));
  // Shaped as torch's tensors: [1, 1, 3] counts, [1, 1, 3, 3] indices.
  CHECK(t["kv_num_blocks"] == nlohmann::json::parse("[[[1, 1, 3]]]"));
  CHECK(t["kv_indices"] == nlohmann::json::parse("[[[[0, 1, 2], [1, 0, 2], [0, 1, 2]]]]"));
  CHECK(t["full_q_indices"] == nlohmann::json::parse("[[[[1, 0, 2], [0, 1, 2], [0, 1, 2]]]]"));
  for (const char* key : {"full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices", "full_q_num_blocks"})
    CHECK(t.contains(key));
}

}  // TEST_SUITE
