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
    s.empty_rows = testing::uniform(rng, 0, 5);
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
    const char* message;
  };
  const Bad cases[] = {
      {"[]", "must be a JSON object"},
      {"{}", "structure.kind must be a string"},
      {R"({"kind": "diagonal"})", "'diagonal' is not a known kind"},
      {R"({"kind": "sliding_window"})", "structure.window must be an integer >= 1"},
      {R"({"kind": "sliding_window", "window": -3})", "structure.window"},
      {R"({"kind": "chunked", "chunk": 0})", "structure.chunk"},
      {R"({"kind": "causal", "alignment": "middle"})", "top_left or bottom_right"},
      {R"({"kind": "causal_blocks", "blocks": [[5, 3]]})", "sorted, disjoint"},
      {R"({"kind": "causal", "kv_valid": [[0, 8]]})", "one [start, end] per batch"},
      {R"({"kind": "causal", "kv_valid": [[0, 99], [0, 8]]})", "0 <= start <= end <= K"},
      {R"({"kind": "causal", "segments": [[0, 4, 4, 16], [0, 16]]})", "rise strictly"},
      {R"({"kind": "causal", "empty_rows": -1})", "empty_rows"},
      {R"({"kind": "causal", "bias": "yes"})", "structure.bias"},
  };
  for (const Bad& c : cases) {
    INFO(c.text);
    auto r = structure_from_json(nlohmann::json::parse(c.text), 2, 1, 16, 16);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == ErrorCode::parse_error);
    CHECK_MESSAGE(r.status().message().find(c.message) != std::string::npos, r.status().message());
  }
}

}  // TEST_SUITE
