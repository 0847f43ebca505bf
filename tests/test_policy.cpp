// decide(): the rules the policy must hold, every defect row, and plans that are exact.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "support/calls.hpp"
#include "support/mask_gen.hpp"

using namespace masklens;
using masklens::testing::plan_is_exact;
using masklens::testing::seed_call;

namespace {

MaskStructure structure(std::int64_t batch, std::int64_t q_len, std::int64_t k_len, StructureKind kind) {
  return make_structure(kind, batch, q_len, k_len);
}

bool arg_is(const Args& args, const std::string& name, const ArgValue& v) {
  const ArgValue* a = find_arg(args, name);
  return a && *a == v;
}

bool drops_mask_as_plain_causal(const Policy& p) {
  return p.plan.empty() && arg_is(p.args, "attn_mask", std::string("drop")) && arg_is(p.args, "is_causal", true);
}

bool rejected(const Policy& p, Backend b, const std::string& needle = "") {
  return std::any_of(p.rejected.begin(), p.rejected.end(), [&](const Rejection& r) {
    return r.backend == b && r.reason().find(needle) != std::string::npos;
  });
}
bool has_hazard(const Policy& p, const std::string& kind) {
  return std::any_of(p.hazards.begin(), p.hazards.end(), [&](const Hazard& h) { return h.kind == kind; });
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("the seed case: 69632^2 dense bool causal, bf16, d256, sm90, torch 2.11") {
  auto p = decide(structure(1, 69632, 69632, StructureKind::causal), seed_call());
  REQUIRE(p.ok());
  CHECK(drops_mask_as_plain_causal(*p));
  CHECK((p->backend == Backend::sdpa_cudnn || p->backend == Backend::sdpa_flash));
  // Every backend is either chosen or rejected with a reason and a source.
  CHECK(p->rejected.size() + 1 == std::size(kAllBackends));
  for (const Rejection& r : p->rejected) {
    CHECK_FALSE(r.reason().empty());
    CHECK_FALSE(r.source.empty());
  }
}

TEST_CASE("the same shape with other structures is never plain is_causal") {
  const std::int64_t L = 69632;
  std::vector<std::pair<const char*, MaskStructure>> cases;
  {
    auto s = structure(1, L, L, StructureKind::sliding_window);
    s.window = 4096;
    cases.push_back({"sliding window", s});
  }
  {
    auto s = structure(2, L, L, StructureKind::causal);
    s.kv_valid = {{0, L}, {0, 50000}};
    cases.push_back({"right padding", s});
  }
  {
    auto s = structure(1, L, L, StructureKind::causal);
    s.segments = {{0, 1000, 30000, L}};
    cases.push_back({"packed documents", s});
  }
  {
    auto s = structure(1, L, L, StructureKind::causal_blocks);
    s.blocks = {{100, 356}, {5000, 5256}};
    cases.push_back({"VLM blocks", s});
  }
  for (const auto& [name, s] : cases) {
    INFO(name);
    for (bool training : {false, true}) {
      AttentionCall c = seed_call();
      c.training = training;
      auto p = decide(s, c);
      REQUIRE(p.ok());
      CHECK_FALSE(drops_mask_as_plain_causal(*p));
      if (!p->plan.empty()) CHECK(plan_is_exact(s, *p));
      else CHECK(arg_is(p->args, "attn_mask", std::string("keep")));
      CHECK(p->backend != Backend::sdpa_efficient);  // Q*K > 2^32 with a dense mask
    }
  }
}

TEST_CASE("plans are exact for every generated structure") {
  testing::Rng rng(testing::test_seed(99));
  int plans = 0;
  for (int i = 0; i < 400; ++i) {
    const std::int64_t q = testing::uniform(rng, 1, 40);
    const std::int64_t k = testing::coin(rng) ? q : testing::uniform(rng, 1, 40);
    MaskStructure s = testing::random_structure(rng, testing::uniform(rng, 1, 3), q, k);
    AttentionCall c = seed_call();
    DecideOptions o;
    o.max_plan_calls = 1000;
    auto p = decide(s, c, o);
    REQUIRE(p.ok());
    if (p->plan.empty()) continue;
    ++plans;
    INFO(describe(s));
    CHECK(plan_is_exact(s, *p));
  }
  CHECK(plans > 100);
}

TEST_CASE("efficient never gets a dense mask once Lq * round_up(Lk, 16) >= 2^32") {
  for (auto [q, k] : {std::pair<std::int64_t, std::int64_t>{40000, 131072}, {69632, 69632}, {65552, 65552}}) {
    auto s = structure(1, q, k, StructureKind::arbitrary);
    AttentionCall c = seed_call();
    c.head_dim = 128;
    c.training = false;
    auto p = decide(s, c);
    REQUIRE(p.ok());
    CHECK(p->backend != Backend::sdpa_efficient);
    CHECK(rejected(*p, Backend::sdpa_efficient, "efficient_mask_offset_32bit"));
  }
  // Below the bound efficient with a mask is fine.
  auto small = decide(structure(1, 65535, 65536, StructureKind::arbitrary), [] {
    AttentionCall c = seed_call();
    c.training = false;
    c.available = kFamilyTorch;
    return c;
  }());
  REQUIRE(small.ok());
  CHECK_FALSE(rejected(*small, Backend::sdpa_efficient, "efficient_mask_offset_32bit"));
}

TEST_CASE("long queries, short padded keys: a named correct backend") {
  auto s = structure(2, 69632, 1024, StructureKind::full);
  s.kv_valid = {{0, 1024}, {0, 700}};
  auto p = decide(s, seed_call());
  REQUIRE(p.ok());
  if (p->plan.empty()) {
    CHECK((p->backend == Backend::sdpa_efficient || p->backend == Backend::sdpa_cudnn));
  } else {
    CHECK(plan_is_exact(s, *p));
    for (const PlanStep& step : p->plan) CHECK(step.backend != Backend::zeros);
  }
}

TEST_CASE("fully masked rows: hazard listed, cuDNN never gets them with a mask") {
  auto s = structure(1, 4096, 4096, StructureKind::arbitrary);
  s.empty_rows = 12;
  AttentionCall c = seed_call();
  c.training = false;
  auto p = decide(s, c);
  REQUIRE(p.ok());
  CHECK(has_hazard(*p, "empty_rows"));
  CHECK(p->backend != Backend::sdpa_cudnn);
  CHECK(rejected(*p, Backend::sdpa_cudnn, "cudnn_empty_rows_mean_of_v"));
  CHECK((p->backend == Backend::sdpa_efficient || p->backend == Backend::sdpa_math));
  // Rows masked only by finite values are what the dense math computes: kept, not a cuDNN defect.
  s.finite_masked_rows = 12;
  auto q = decide(s, c);
  REQUIRE(q.ok());
  CHECK(has_hazard(*q, "finite_masked_rows"));
  CHECK_FALSE(rejected(*q, Backend::sdpa_cudnn, "cudnn_empty_rows_mean_of_v"));
}

TEST_CASE("left padding leaves empty rows: the plan writes zeros for them") {
  auto s = structure(1, 256, 256, StructureKind::causal);
  s.kv_valid = {{40, 256}};
  s.empty_rows = 40;
  auto p = decide(s, seed_call());
  REQUIRE(p.ok());
  REQUIRE_FALSE(p->plan.empty());
  CHECK(plan_is_exact(s, *p));
  CHECK(p->plan.front().backend == Backend::zeros);
}

TEST_CASE("an fp32 mask with bf16 inputs never goes to cuDNN") {
  auto s = structure(1, 2048, 2048, StructureKind::arbitrary);
  AttentionCall c = seed_call();
  c.training = false;
  c.mask_dtype = ElementType::float32;
  auto p = decide(s, c);
  REQUIRE(p.ok());
  CHECK(p->backend != Backend::sdpa_cudnn);
  CHECK(rejected(*p, Backend::sdpa_cudnn, "cudnn_fp32_mask_reinterpreted"));
}

TEST_CASE("decode: no mask without padding; a correct path with left padding") {
  AttentionCall c = seed_call();
  c.training = false;
  auto full = decide(structure(4, 1, 3000, StructureKind::full), c);
  REQUIRE(full.ok());
  CHECK(arg_is(full->args, "attn_mask", std::string("drop")));
  CHECK(full->plan.empty());
  auto s = structure(3, 1, 3000, StructureKind::full);
  s.kv_valid = {{0, 3000}, {100, 3000}, {2000, 3000}};
  auto padded = decide(s, c);
  REQUIRE(padded.ok());
  const bool one_masked_call = arg_is(padded->args, "attn_mask", std::string("drop")) && padded->plan.empty();
  CHECK_FALSE(one_masked_call);
  if (!padded->plan.empty()) CHECK(plan_is_exact(s, *padded));
  // With flash-attn installed, varlen takes it in one call.
  c.available |= kFamilyFlashAttn;
  c.flash_attn = version(2, 8, 3);
  auto varlen = decide(s, c);
  REQUIRE(varlen.ok());
  CHECK(varlen->backend == Backend::flash_attn_varlen);
  CHECK(arg_is(varlen->args, "cu_seqlens_k", std::vector<std::int64_t>{0, 3000, 5900, 6900}));
}

TEST_CASE("bias masks are always kept; refused head dims and dtypes are never chosen") {
  auto s = structure(1, 1024, 1024, StructureKind::causal);
  s.bias = true;
  auto p = decide(s, seed_call());
  REQUIRE(p.ok());
  CHECK(arg_is(p->args, "attn_mask", std::string("keep")));
  CHECK(has_hazard(*p, "bias"));

  AttentionCall big = seed_call();
  big.head_dim = 512;
  auto q = decide(structure(1, 1024, 1024, StructureKind::causal), big);
  REQUIRE(q.ok());
  CHECK(q->backend != Backend::sdpa_flash);
  CHECK(q->backend != Backend::sdpa_cudnn);
  CHECK(rejected(*q, Backend::sdpa_flash, "head_dim <= 256"));

  AttentionCall fp32 = seed_call();
  fp32.dtype = DType::float32;
  auto r = decide(structure(1, 1024, 1024, StructureKind::causal), fp32);
  REQUIRE(r.ok());
  CHECK((r->backend == Backend::sdpa_efficient || r->backend == Backend::sdpa_math));
}

TEST_CASE("GQA: enable_gqa where the kernel has it, an expand hazard where not") {
  AttentionCall c = seed_call();
  c.heads = 32;
  c.kv_heads = 8;
  auto p = decide(structure(1, 4096, 4096, StructureKind::causal), c);
  REQUIRE(p.ok());
  CHECK(arg_is(p->args, "enable_gqa", true));
  c.dtype = DType::float32;  // only efficient / math remain
  c.head_dim = 64;
  auto q = decide(structure(1, 4096, 4096, StructureKind::causal), c);
  REQUIRE(q.ok());
  if (q->backend == Backend::sdpa_efficient) CHECK(has_hazard(*q, "gqa_expand"));
}

TEST_CASE("bottom-right causal goes to CausalBias lower-right, flash-attn when installed") {
  auto s = structure(1, 512, 4096, StructureKind::causal);
  s.alignment = Alignment::bottom_right;
  auto p = decide(s, seed_call());
  REQUIRE(p.ok());
  CHECK(p->backend == Backend::sdpa_causal_lower_right);
  AttentionCall c = seed_call();
  c.available |= kFamilyFlashAttn3;
  c.flash_attn3 = version(3, 0);
  auto q = decide(s, c);
  REQUIRE(q.ok());
  CHECK(q->backend == Backend::flash_attn3);
  CHECK(arg_is(q->args, "causal", true));
}

TEST_CASE("each defect strikes at its boundary and not below") {
  const MaskStructure plain_s = structure(1, 1024, 1024, StructureKind::arbitrary);
  const auto hits = [](Backend b, Usage u, const AttentionCall& c, const MaskStructure& s, std::string_view id) {
    for (const Defect* d : defects_for({b, u, c, s}))
      if (d->id == id) return true;
    return false;
  };
  AttentionCall c = seed_call();
  // efficient_mask_offset_32bit: Lq * round_up(Lk, 16) >= 2^32.
  c.q_len = 65536; c.k_len = 65536;
  CHECK(hits(Backend::sdpa_efficient, Usage::dense_mask, c, plain_s, "efficient_mask_offset_32bit"));
  c.q_len = 65535;
  CHECK_FALSE(hits(Backend::sdpa_efficient, Usage::dense_mask, c, plain_s, "efficient_mask_offset_32bit"));
  c.k_len = 65537;  // rounds up to 65552: 65535 * 65552 >= 2^32
  CHECK(hits(Backend::sdpa_efficient, Usage::dense_mask, c, plain_s, "efficient_mask_offset_32bit"));
  CHECK_FALSE(hits(Backend::sdpa_efficient, Usage::native, c, plain_s, "efficient_mask_offset_32bit"));
  // efficient_dropout_offset_32bit
  c.q_len = c.k_len = 70000; c.dropout = 0.1;
  CHECK(hits(Backend::sdpa_efficient, Usage::native, c, plain_s, "efficient_dropout_offset_32bit"));
  c.dropout = 0;
  CHECK_FALSE(hits(Backend::sdpa_efficient, Usage::native, c, plain_s, "efficient_dropout_offset_32bit"));
  // efficient_backward_mask_46344
  c.q_len = c.k_len = 46345; c.training = true;
  CHECK(hits(Backend::sdpa_efficient, Usage::dense_mask, c, plain_s, "efficient_backward_mask_46344"));
  c.q_len = c.k_len = 46344;
  CHECK_FALSE(hits(Backend::sdpa_efficient, Usage::dense_mask, c, plain_s, "efficient_backward_mask_46344"));
  // cudnn_empty_rows_mean_of_v
  MaskStructure empty = plain_s;
  empty.empty_rows = 1;
  CHECK(hits(Backend::sdpa_cudnn, Usage::dense_mask, c, empty, "cudnn_empty_rows_mean_of_v"));
  CHECK_FALSE(hits(Backend::sdpa_cudnn, Usage::dense_mask, c, plain_s, "cudnn_empty_rows_mean_of_v"));
  // cudnn_fp32_mask_reinterpreted
  c.mask_dtype = ElementType::float32;
  CHECK(hits(Backend::sdpa_cudnn, Usage::dense_mask, c, plain_s, "cudnn_fp32_mask_reinterpreted"));
  c.mask_dtype = ElementType::boolean;
  CHECK_FALSE(hits(Backend::sdpa_cudnn, Usage::dense_mask, c, plain_s, "cudnn_fp32_mask_reinterpreted"));
  // cudnn_q_not_multiple_of_128: only up to cuDNN 9.15.0.
  c.q_len = 1000;
  c.cudnn = version(9, 15, 0);
  CHECK(hits(Backend::sdpa_cudnn, Usage::native, c, plain_s, "cudnn_q_not_multiple_of_128"));
  c.cudnn = version(9, 15, 1);
  CHECK_FALSE(hits(Backend::sdpa_cudnn, Usage::native, c, plain_s, "cudnn_q_not_multiple_of_128"));
  // cudnn_b200_few_kv_heads
  c.sm = 100; c.heads = 32; c.kv_heads = 4;
  CHECK(hits(Backend::sdpa_cudnn, Usage::native, c, plain_s, "cudnn_b200_few_kv_heads"));
  c.kv_heads = 8;
  CHECK_FALSE(hits(Backend::sdpa_cudnn, Usage::native, c, plain_s, "cudnn_b200_few_kv_heads"));
  // cudnn_mask_nan_grad_q
  c.sm = 90; c.training = true; c.q_len = c.k_len = 4096 + 64;
  CHECK(hits(Backend::sdpa_cudnn, Usage::dense_mask, c, plain_s, "cudnn_mask_nan_grad_q"));
  c.q_len = c.k_len = 4096;
  CHECK_FALSE(hits(Backend::sdpa_cudnn, Usage::dense_mask, c, plain_s, "cudnn_mask_nan_grad_q"));
}

TEST_CASE("versions parse and compare; bad calls are errors") {
  CHECK(*Version::parse("2.11") == version(2, 11));
  CHECK(*Version::parse("2.14.0.dev20260612") == version(2, 14, 0));
  CHECK(version(9, 15, 1) > version(9, 15, 0));
  CHECK_FALSE(Version::parse("x2").ok());
  AttentionCall c = seed_call();
  c.kv_heads = 3;
  auto p = decide(structure(1, 8, 8, StructureKind::causal), c);
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message().find("multiple of kv_heads") != std::string::npos);
}

}  // TEST_SUITE

TEST_CASE("native arguments in each backend's own names and conventions") {
  auto args_of = [](Backend b, const MaskStructure& s) {
    Args a;
    REQUIRE(detail::native_args(b, s, &a));
    CHECK(detail::native_args(b, s));  // the question alone gives the same answer
    return a;
  };
  using V = std::vector<std::int64_t>;
  // Packed documents with a sliding window: flash-attn varlen, window (W - 1, 0) inside documents.
  auto docs = structure(2, 100, 100, StructureKind::sliding_window);
  docs.window = 8;
  docs.segments = {{0, 30, 100}, {0, 100}};
  Args fa = args_of(Backend::flash_attn_varlen, docs);
  CHECK(arg_is(fa, "cu_seqlens_q", V{0, 30, 100, 200}));
  CHECK(arg_is(fa, "cu_seqlens_k", V{0, 30, 100, 200}));
  CHECK(arg_is(fa, "max_seqlen_q", std::int64_t{100}));
  CHECK(arg_is(fa, "window_size", V{7, 0}));
  CHECK(arg_is(fa, "causal", true));
  CHECK_FALSE(detail::native_args(Backend::flash_attn, docs));  // the dense kernel has no documents
  CHECK_FALSE(detail::native_args(Backend::xformers, docs));    // no block-diagonal local mask here
  // Chunked: flash-attn 3 attention_chunk; the varlen forms cut documents at each chunk.
  auto chunked = structure(1, 100, 100, StructureKind::chunked);
  chunked.chunk = 40;
  CHECK(arg_is(args_of(Backend::flash_attn3, chunked), "attention_chunk", std::int64_t{40}));
  CHECK_FALSE(detail::native_args(Backend::flash_attn, chunked));
  CHECK(arg_is(args_of(Backend::flash_attn3_varlen, chunked), "cu_seqlens_q", V{0, 40, 80, 100}));
  // Packed causal documents: xformers seqlens, TE thd, FlashInfer indptr, cuDNN ragged offsets.
  auto packed = structure(2, 100, 100, StructureKind::causal);
  packed.segments = {{0, 30, 100}, {0, 100}};
  Args xf = args_of(Backend::xformers, packed);
  CHECK(arg_is(xf, "attn_bias", std::string("BlockDiagonalCausalMask.from_seqlens")));
  CHECK(arg_is(xf, "seqlens", V{30, 70, 100}));
  Args te = args_of(Backend::transformer_engine, packed);
  CHECK(arg_is(te, "qkv_format", std::string("thd")));
  CHECK(arg_is(te, "attn_mask_type", std::string("padding_causal")));
  CHECK(arg_is(te, "cu_seqlens_kv", V{0, 30, 100, 200}));
  CHECK(arg_is(args_of(Backend::flashinfer, packed), "kv_indptr", V{0, 30, 100, 200}));
  CHECK(arg_is(args_of(Backend::cudnn_frontend, packed), "ragged_offsets", V{0, 30, 100, 200}));
  // Bottom-right causal Q < K: TE and cuDNN frontend name the alignment; torch uses CausalBias.
  auto br = structure(1, 16, 64, StructureKind::causal);
  br.alignment = Alignment::bottom_right;
  CHECK(arg_is(args_of(Backend::transformer_engine, br), "attn_mask_type", std::string("causal_bottom_right")));
  CHECK(arg_is(args_of(Backend::cudnn_frontend, br), "diagonal_alignment", std::string("BOTTOM_RIGHT")));
  CHECK(arg_is(args_of(Backend::xformers, br), "attn_bias", std::string("LowerTriangularFromBottomRightMask")));
  CHECK(arg_is(args_of(Backend::sdpa_causal_lower_right, br), "attn_mask_object",
               std::string("torch.nn.attention.bias.causal_lower_right(16, 64)")));
  CHECK_FALSE(detail::native_args(Backend::sdpa_flash, br));
  // Right-padded keys of a full attention: cuDNN seq_len_kv, flash-attn gathers the valid keys.
  auto padded = structure(2, 8, 64, StructureKind::full);
  padded.kv_valid = {{0, 64}, {0, 40}};
  CHECK(arg_is(args_of(Backend::cudnn_frontend, padded), "seq_len_kv", V{64, 40}));
  CHECK(arg_is(args_of(Backend::flash_attn_varlen, padded), "cu_seqlens_k", V{0, 64, 104}));
  padded.kv_valid = {{0, 64}, {10, 64}};  // left padding: no seq_len_kv form
  CHECK_FALSE(detail::native_args(Backend::cudnn_frontend, padded));
  CHECK(arg_is(args_of(Backend::flashinfer, padded), "k_gather_starts", V{0, 10}));
}

TEST_CASE("efficient head-dim alignment: 4 for fp32, 8 for fp16/bf16 (as torch 2.11 checks it)") {
  auto refused = [](DType dtype, std::int64_t head_dim) {
    AttentionCall c = seed_call();
    c.dtype = dtype;
    c.head_dim = head_dim;
    return detail::refusals(Backend::sdpa_efficient, c).any();
  };
  CHECK_FALSE(refused(DType::float32, 60));
  CHECK(refused(DType::float32, 62));
  CHECK(refused(DType::bfloat16, 60));
  CHECK_FALSE(refused(DType::bfloat16, 64));
  CHECK(refused(DType::float16, 100));
}

TEST_SUITE("host") {

TEST_CASE("decide() derives empty rows from the structure: a padded window never goes to cuDNN with its mask") {
  // masklens policy --structure '{"kind":"sliding_window","window":64,"kv_valid":[[100,512]]}' --shape 1,1,512,512:
  // key 100 is the first valid one, so rows 0..99 see no valid key inside their window.
  MaskStructure s = make_structure(StructureKind::sliding_window, 1, 512, 512);
  s.window = 64;
  s.kv_valid = {{100, 512}};
  REQUIRE(s.empty_rows == 0);  // not given
  CHECK(s.implied_empty_rows() == 100);
  AttentionCall c = seed_call();
  c.training = false;
  c.head_dim = 128;
  auto p = decide(s, c);
  REQUIRE(p.ok());
  CHECK(rejected(*p, Backend::sdpa_cudnn, "cudnn_empty_rows_mean_of_v"));
  CHECK(p->backend != Backend::sdpa_cudnn);
  CHECK(has_hazard(*p, "empty_rows"));
  // The same count given explicitly decides the same; a wrong one is refused.
  s.empty_rows = 100;
  auto given = decide(s, c);
  REQUIRE(given.ok());
  CHECK(given->backend == p->backend);
  s.empty_rows = 1;
  CHECK(decide(s, c).status().code() == ErrorCode::invalid_argument);
}

}  // TEST_SUITE
