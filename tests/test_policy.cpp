// decide(): the rules the policy must hold, every defect row, mask dtypes, the cost
// order, and calls and plans that are exact.
#include <doctest/doctest.h>

#include <masklens/call_args.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "support/calls.hpp"
#include "support/mask_gen.hpp"

using namespace masklens;
using masklens::testing::call_is_exact;
using masklens::testing::h200;
using masklens::testing::plan_is_exact;
using masklens::testing::seed_call;

namespace {

MaskStructure structure(std::int64_t batch, std::int64_t q_len, std::int64_t k_len, StructureKind kind) {
  return make_structure(kind, batch, q_len, k_len);
}

bool drops_mask_as_plain_causal(const Policy& p) {
  const SdpaArgs* a = p.call.get<SdpaArgs>();
  return !p.is_plan() && p.call.mask == MaskUse::drop && a && a->is_causal;
}

bool rejected(const Policy& p, Backend b, const std::string& needle = "") {
  return std::any_of(p.rejected.begin(), p.rejected.end(), [&](const Rejection& r) {
    return r.backend == b && r.reason().find(needle) != std::string::npos;
  });
}
bool has_hazard(const Policy& p, HazardKind kind) {
  return std::any_of(p.hazards.begin(), p.hazards.end(), [&](const Hazard& h) { return h.kind == kind; });
}

// A policy that computes the structure: an exact plan, an exact native call, or the dense mask kept.
bool computes(const MaskStructure& s, const Policy& p) {
  if (p.is_plan()) return plan_is_exact(s, p);
  if (p.call.mask == MaskUse::keep) return true;
  return call_is_exact(s, p.call);
}

template <class T>
const T& args_of(const Policy& p) {
  const T* a = p.call.get<T>();
  REQUIRE(a != nullptr);
  return *a;
}

// The call `b` makes for `s` natively (the question alone must give the same answer).
Call native_call(Backend b, const MaskStructure& s, const CallContext& c = {seed_call(), with_every_family()}) {
  Call out;
  REQUIRE(info(b).native(s, c, &out));
  CHECK(info(b).native(s, c, nullptr));
  return out;
}

// The seed call at head_dim 128, training, and an H200 with FlexAttention available:
// where flex competes with the other kernels (its cost, compile and rules).
AttentionCall training_call_d128() {
  AttentionCall c = seed_call();
  c.head_dim = 128;
  c.training = true;
  return c;
}
Environment h200_with_flex() {
  Environment env = h200();
  env.available |= kFamilyFlex;
  return env;
}

const ArgValue& arg(const CallArgs& a, std::string_view name) {
  const ArgValue* v = find_arg(a.args, name);
  REQUIRE_MESSAGE(v != nullptr, "no argument " << name);
  return *v;
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("the seed case: 69632^2 dense bool causal, bf16, d256, sm90, torch 2.11") {
  auto p = decide(structure(1, 69632, 69632, StructureKind::causal), seed_call());
  REQUIRE(p.ok());
  CHECK(drops_mask_as_plain_causal(*p));
  CHECK(p->backend() == Backend::sdpa_cudnn);  // measured fastest for is_causal on the H200
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
  for (const auto& [name_of_case, s] : cases) {
    const auto& name = name_of_case;  // INFO's lambda captures it: clang 14 takes no structured binding there
    INFO(name);
    for (bool training : {false, true}) {
      AttentionCall c = seed_call();
      c.training = training;
      auto p = decide(s, c);
      REQUIRE(p.ok());
      CHECK_FALSE(drops_mask_as_plain_causal(*p));
      CHECK(computes(s, *p));
      CHECK(p->backend() != Backend::sdpa_efficient);  // Q*K > 2^32 with a dense mask
    }
  }
}

TEST_CASE("every policy computes its structure: plans and native calls are exact") {
  testing::Rng rng(testing::test_seed(99));
  int plans = 0, natives = 0;
  for (int i = 0; i < 600; ++i) {
    const std::int64_t q = testing::uniform(rng, 1, 40);
    const std::int64_t k = testing::coin(rng) ? q : testing::uniform(rng, 1, 40);
    MaskStructure s = testing::random_structure(rng, testing::uniform(rng, 1, 3), q, k);
    DecideOptions o;
    o.max_plan_calls = 1000;
    AttentionCall c = seed_call();
    c.heads = 1 << 16;  // work, not per-call overhead, decides: plans compete with the dense mask
    auto p = decide(s, c, testing::coin(rng) ? h200() : with_every_family(), o);
    REQUIRE(p.ok());
    INFO(describe(s));
    CHECK(computes(s, *p));
    plans += p->is_plan();
    natives += !p->is_plan() && p->call.mask != MaskUse::keep;
  }
  CHECK(plans > 50);
  CHECK(natives > 100);
}

TEST_CASE("every registry row is complete: a native form and both renderers") {
  for (const BackendInfo& b : backends::kRegistry) {
    INFO(b.name);
    CHECK(static_cast<bool>(b.native));
    CHECK(static_cast<bool>(b.args));
    CHECK(static_cast<bool>(b.python));
  }
}

TEST_CASE("every native form of every backend is exact on generated structures") {
  testing::Rng rng(testing::test_seed(7));
  const CallContext context{seed_call(), with_every_family()};
  std::vector<int> used(std::size(kAllBackends), 0);
  for (int i = 0; i < 1500; ++i) {
    const std::int64_t q = testing::uniform(rng, 1, 24);
    const std::int64_t k = testing::coin(rng) ? q : testing::uniform(rng, 1, 24);
    const MaskStructure s = testing::random_structure(rng, testing::uniform(rng, 1, 3), q, k);
    if (s.kind == StructureKind::arbitrary) continue;
    for (const BackendInfo& b : backends::kRegistry) {
      Call c;
      if (!b.native(s, context, &c)) continue;
      INFO(b.name << " on " << describe(s));
      CHECK(c.backend == b.id);
      CHECK(call_is_exact(s, c));
      ++used[static_cast<std::size_t>(b.id)];
    }
  }
  for (const BackendInfo& b : backends::kRegistry) {
    INFO(b.name);
    CHECK(used[static_cast<std::size_t>(b.id)] > 0);  // the property reached every backend
  }
}

TEST_CASE("efficient never gets a dense mask once Lq * round_up(Lk, 16) >= 2^32") {
  for (auto [q, k] : {std::pair<std::int64_t, std::int64_t>{40000, 131072}, {69632, 69632}, {65552, 65552}}) {
    auto s = structure(1, q, k, StructureKind::arbitrary);
    AttentionCall c = seed_call();
    c.head_dim = 128;
    c.training = false;
    auto p = decide(s, c);
    REQUIRE(p.ok());
    CHECK(p->backend() != Backend::sdpa_efficient);
    CHECK(rejected(*p, Backend::sdpa_efficient, "efficient_mask_offset_32bit"));
  }
  // Below the bound efficient with a mask is fine.
  AttentionCall c = seed_call();
  c.training = false;
  auto small = decide(structure(1, 65535, 65536, StructureKind::arbitrary), c);
  REQUIRE(small.ok());
  CHECK_FALSE(rejected(*small, Backend::sdpa_efficient, "efficient_mask_offset_32bit"));
}

TEST_CASE("long queries, short padded keys: a correct call") {
  auto s = structure(2, 69632, 1024, StructureKind::full);
  s.kv_valid = {{0, 1024}, {0, 700}};
  auto p = decide(s, seed_call());
  REQUIRE(p.ok());
  CHECK(computes(s, *p));
  CHECK(p->backend() != Backend::sdpa_efficient);  // 69632 * 1024 < 2^32, but training above 46344 with a mask
  for (const PlanStep& step : p->plan) CHECK(step.call.backend != Backend::zeros);
}

TEST_CASE("fully masked rows: hazard listed, cuDNN never gets them with a mask") {
  auto s = structure(1, 4096, 4096, StructureKind::arbitrary);
  s.empty_rows = 12;
  AttentionCall c = seed_call();
  c.training = false;
  auto p = decide(s, c);
  REQUIRE(p.ok());
  CHECK(has_hazard(*p, HazardKind::empty_rows));
  CHECK(p->backend() != Backend::sdpa_cudnn);
  CHECK(rejected(*p, Backend::sdpa_cudnn, "cudnn_empty_rows_mean_of_v"));
  CHECK(p->backend() == Backend::sdpa_efficient);  // cheaper than math
  // Rows masked only by finite values are what the dense math computes: kept, not a cuDNN defect.
  s.finite_masked_rows = 12;
  auto q = decide(s, c);
  REQUIRE(q.ok());
  CHECK(has_hazard(*q, HazardKind::finite_masked_rows));
  CHECK_FALSE(rejected(*q, Backend::sdpa_cudnn, "cudnn_empty_rows_mean_of_v"));
}

TEST_CASE("rows masked only by finite values: efficient and cuDNN get them wrong from a bf16 or fp32 mask, not from fp16") {
  auto s = structure(1, 128, 128, StructureKind::arbitrary);
  s.empty_rows = s.finite_masked_rows = 9;
  AttentionCall c = seed_call();
  c.training = false;
  for (ElementType mask : {ElementType::bfloat16, ElementType::float32}) {
    c.mask_dtype = mask;
    auto p = decide(s, c);
    REQUIRE(p.ok());
    CHECK(p->backend() == Backend::sdpa_math);  // the fused kernels get such rows wrong
    CHECK(rejected(*p, Backend::sdpa_efficient, "efficient_finite_masked_rows_zero"));
    CHECK(rejected(*p, Backend::sdpa_cudnn, "cudnn_finite_masked_rows"));
  }
  c.mask_dtype = ElementType::float16;  // its lowest value stays in range: efficient computes the uniform rows
  auto half = decide(s, c);
  REQUIRE(half.ok());
  CHECK_FALSE(rejected(*half, Backend::sdpa_efficient, "efficient_finite_masked_rows_zero"));
  CHECK_FALSE(rejected(*half, Backend::sdpa_cudnn, "cudnn_finite_masked_rows"));
  s.finite_masked_rows = 0;  // rows with no key at all (-inf): zeros are right
  c.mask_dtype = ElementType::bfloat16;
  auto inf = decide(s, c);
  REQUIRE(inf.ok());
  CHECK_FALSE(rejected(*inf, Backend::sdpa_efficient, "efficient_finite_masked_rows_zero"));
}

TEST_CASE("left padding leaves empty rows: the plan writes zeros for them") {
  auto s = structure(1, 4096, 4096, StructureKind::causal);
  s.kv_valid = {{40, 4096}};
  s.empty_rows = 40;
  auto p = decide(s, seed_call());
  REQUIRE(p.ok());
  REQUIRE(p->is_plan());
  CHECK(plan_is_exact(s, *p));
  CHECK(p->plan.front().call.backend == Backend::zeros);
}

TEST_CASE("mask dtypes: every (mask, query) pair gets a call torch accepts") {
  // validate_sdpa_input takes bool, fp32 or the query's dtype; efficient needs the query's
  // dtype for a float mask; cuDNN misreads any other float dtype (pytorch#191612).
  const ElementType masks[] = {ElementType::boolean, ElementType::uint8,    ElementType::int8,
                               ElementType::float16, ElementType::bfloat16, ElementType::float32};
  for (DType q : {DType::float16, DType::bfloat16, DType::float32}) {
    for (ElementType m : masks) {
      for (bool bias : {false, true}) {
        if (bias && !is_additive(m)) continue;
        AttentionCall c = seed_call();
        c.training = false;
        c.head_dim = 128;
        c.dtype = q;
        c.mask_dtype = m;
        auto s = structure(1, 2048, 2048, StructureKind::arbitrary);
        s.bias = bias;
        auto p = decide(s, c);
        REQUIRE(p.ok());
        INFO(to_string(q) << " query, " << to_string(m) << " mask, bias " << bias << " -> " << to_string(p->backend()));
        REQUIRE(p->call.mask == MaskUse::keep);
        const ElementType passed = p->call.mask_cast.value_or(m);
        // Accepted by validate_sdpa_input.
        CHECK((passed == ElementType::boolean || passed == ElementType::float32 || passed == c.query_element()));
        // Efficient and cuDNN get a float mask only in the query's dtype.
        if (p->backend() == Backend::sdpa_efficient || p->backend() == Backend::sdpa_cudnn)
          CHECK((passed == ElementType::boolean || passed == c.query_element()));
        // Integer masks become bool, never a float (their values are not additive).
        if (!is_additive(m)) CHECK(passed == ElementType::boolean);
        CHECK(has_hazard(*p, HazardKind::mask_cast) == (bias && passed != m));
      }
    }
  }
}

TEST_CASE("an ALiBi-like fp32 bias with bf16 inputs: kept and cast, never the raising call") {
  auto s = structure(1, 2048, 2048, StructureKind::causal);
  s.bias = true;
  AttentionCall c = seed_call();
  c.training = false;
  c.mask_dtype = ElementType::float32;
  auto p = decide(s, c);
  REQUIRE(p.ok());
  CHECK(p->call.mask == MaskUse::keep);
  CHECK(p->call.mask_cast == ElementType::bfloat16);
  CHECK(has_hazard(*p, HazardKind::bias));
  CHECK(has_hazard(*p, HazardKind::mask_cast));
  // Without the cast, cuDNN's defect would strike: it is the cast that makes cuDNN correct.
  CHECK(first_defect({Backend::sdpa_cudnn, Usage::dense_mask, c, h200(), s, ElementType::float32}) != nullptr);
  CHECK(first_defect({Backend::sdpa_cudnn, Usage::dense_mask, c, h200(), s, ElementType::bfloat16}) == nullptr);
}

TEST_CASE("decode: no mask without padding; a correct path with left padding") {
  AttentionCall c = seed_call();
  c.training = false;
  auto full = decide(structure(4, 1, 3000, StructureKind::full), c);
  REQUIRE(full.ok());
  CHECK(full->call.mask == MaskUse::drop);
  CHECK_FALSE(full->is_plan());
  auto s = structure(3, 1, 3000, StructureKind::full);
  s.kv_valid = {{0, 3000}, {100, 3000}, {2000, 3000}};
  auto padded = decide(s, c);
  REQUIRE(padded.ok());
  CHECK(computes(s, *padded));
  CHECK_FALSE((padded->call.mask == MaskUse::drop && !padded->is_plan() && padded->call.get<SdpaArgs>()));
  // torch's varlen_attn takes it in one call, keys gathered per batch.
  CHECK(padded->backend() == Backend::torch_varlen);
  CHECK(args_of<VarlenArgs>(*padded).cu_seqlens_k() == std::vector<std::int64_t>{0, 3000, 5900, 6900});
  // With flash-attn 3 installed, its varlen kernel is cheaper still.
  Environment e = h200();
  e.available |= kFamilyFlashAttn3;
  e.flash_attn3 = version(3, 0);
  auto fa3 = decide(s, c, e);
  REQUIRE(fa3.ok());
  CHECK(fa3->backend() == Backend::flash_attn3_varlen);
  CHECK(call_is_exact(s, fa3->call));
}

TEST_CASE("bias masks are always kept; refused head dims and dtypes are never chosen") {
  auto s = structure(1, 1024, 1024, StructureKind::causal);
  s.bias = true;
  auto p = decide(s, seed_call());
  REQUIRE(p.ok());
  CHECK(p->call.mask == MaskUse::keep);
  CHECK(has_hazard(*p, HazardKind::bias));

  AttentionCall big = seed_call();
  big.head_dim = 512;
  auto q = decide(structure(1, 1024, 1024, StructureKind::causal), big);
  REQUIRE(q.ok());
  CHECK(q->backend() != Backend::sdpa_flash);
  CHECK(q->backend() != Backend::sdpa_cudnn);
  CHECK(rejected(*q, Backend::sdpa_flash, "head_dim <= 256"));

  AttentionCall fp32 = seed_call();
  fp32.dtype = DType::float32;
  auto r = decide(structure(1, 1024, 1024, StructureKind::causal), fp32);
  REQUIRE(r.ok());
  CHECK(r->backend() == Backend::sdpa_efficient);
}

TEST_CASE("GQA: enable_gqa where the kernel has it, an expand hazard where not") {
  AttentionCall c = seed_call();
  c.heads = 32;
  c.kv_heads = 8;
  auto p = decide(structure(1, 4096, 4096, StructureKind::causal), c);
  REQUIRE(p.ok());
  CHECK(args_of<SdpaArgs>(*p).enable_gqa);
  CHECK_FALSE(has_hazard(*p, HazardKind::gqa_expand));
  c.dtype = DType::float32;  // only efficient / math remain: efficient lacks enable_gqa
  c.head_dim = 64;
  auto q = decide(structure(1, 4096, 4096, StructureKind::causal), c);
  REQUIRE(q.ok());
  REQUIRE(q->backend() == Backend::sdpa_efficient);
  CHECK_FALSE(args_of<SdpaArgs>(*q).enable_gqa);
  CHECK(has_hazard(*q, HazardKind::gqa_expand));
}

TEST_CASE("bottom-right causal goes to CausalBias lower-right, flash-attn 3 when installed") {
  auto s = structure(1, 512, 4096, StructureKind::causal);
  s.alignment = Alignment::bottom_right;
  auto p = decide(s, seed_call());
  REQUIRE(p.ok());
  CHECK(p->backend() == Backend::sdpa_causal_lower_right);
  CHECK(p->call.mask == MaskUse::replace);
  CHECK(args_of<SdpaArgs>(*p).causal_lower_right);
  Environment e = h200();
  e.available |= kFamilyFlashAttn3;
  e.flash_attn3 = version(3, 0);
  auto q = decide(s, seed_call(), e);
  REQUIRE(q.ok());
  CHECK(q->backend() == Backend::flash_attn3);
  CHECK(args_of<KernelArgs>(*q).causal);
  CHECK(call_is_exact(s, q->call));
}

TEST_CASE("the cost order follows the H200 measurements (bench/README.md)") {
  // 1 x 4 x 69632 x 128, bf16, forward and backward, torch only.
  AttentionCall c = seed_call();
  c.head_dim = 128;
  const std::int64_t L = 69632;
  // A 4096 window: varlen_attn (7.1 ms measured) over the dense mask (127.0 ms).
  auto window = structure(1, L, L, StructureKind::sliding_window);
  window.window = 4096;
  auto w = decide(window, c);
  REQUIRE(w.ok());
  CHECK(w->backend() == Backend::torch_varlen);
  CHECK(args_of<VarlenArgs>(*w).window_left == 4095);
  CHECK(w->cost_ms == doctest::Approx(7.1).epsilon(0.15));
  // With FlexAttention offered, compiled flex (5.3 ms measured) is cheaper still.
  Environment flex = h200();
  flex.available |= kFamilyFlex;
  auto wf = decide(window, c, flex);
  REQUIRE(wf.ok());
  CHECK(wf->backend() == Backend::flex_attention);
  // Three packed documents: three is_causal calls on cuDNN (11.8 ms) over varlen_attn (19.9 ms).
  auto docs = structure(1, L, L, StructureKind::causal);
  docs.segments = {{0, 23210, 46421, L}};
  auto d = decide(docs, c);
  REQUIRE(d.ok());
  REQUIRE(d->is_plan());
  CHECK(d->plan.size() == 3);
  CHECK(d->backend() == Backend::sdpa_cudnn);
  CHECK(d->cost_ms == doctest::Approx(11.8).epsilon(0.15));
  CHECK(rejected(*d, Backend::torch_varlen, "slower"));
  CHECK(plan_is_exact(docs, *d));
}

TEST_CASE("rejections say what the backend lacks, in words that fit") {
  auto packed = structure(1, 4096, 4096, StructureKind::causal);
  packed.segments = {{0, 1000, 4096}};
  auto p = decide(packed, seed_call());
  REQUIRE(p.ok());
  // It is the documents flash cannot express, not causal.
  CHECK(rejected(*p, Backend::sdpa_flash, "causal with packed documents (segments)"));
  // A plan of one call is "1 call".
  auto br = structure(1, 100, 400, StructureKind::full);
  br.kv_valid = {{0, 300}};
  Environment torch_only = h200();
  AttentionCall c = seed_call();
  c.dtype = DType::float32;  // no varlen, no cuDNN: a plan competes with the dense mask
  auto q = decide(br, c, torch_only);
  REQUIRE(q.ok());
  for (const Rejection& r : q->rejected) CHECK(r.reason().find("1 calls") == std::string::npos);
}

TEST_CASE("each defect strikes at its boundary and not below") {
  const MaskStructure plain_s = structure(1, 1024, 1024, StructureKind::arbitrary);
  Environment env = h200();
  const auto hits = [&](Backend b, Usage u, const AttentionCall& c, const MaskStructure& s, std::string_view id,
                        std::optional<ElementType> passed = std::nullopt) {
    for (const Defect* d : defects_for({b, u, c, env, s, passed}))
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
  // Lengths near INT64_MAX neither overflow nor miss.
  c.q_len = c.k_len = std::int64_t{1} << 62;
  CHECK(hits(Backend::sdpa_efficient, Usage::dense_mask, c, plain_s, "efficient_mask_offset_32bit"));
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
  // cudnn_fp32_mask_reinterpreted: the type the mask is passed as.
  CHECK(hits(Backend::sdpa_cudnn, Usage::dense_mask, c, plain_s, "cudnn_fp32_mask_reinterpreted", ElementType::float32));
  CHECK_FALSE(hits(Backend::sdpa_cudnn, Usage::dense_mask, c, plain_s, "cudnn_fp32_mask_reinterpreted", ElementType::boolean));
  // cudnn_q_not_multiple_of_128: only up to cuDNN 9.15.0.
  c.q_len = 1000;
  env.cudnn = version(9, 15, 0);
  CHECK(hits(Backend::sdpa_cudnn, Usage::native, c, plain_s, "cudnn_q_not_multiple_of_128"));
  env.cudnn = version(9, 15, 1);
  CHECK_FALSE(hits(Backend::sdpa_cudnn, Usage::native, c, plain_s, "cudnn_q_not_multiple_of_128"));
  // cudnn_b200_few_kv_heads
  env.sm = 100; c.heads = 32; c.kv_heads = 4;
  CHECK(hits(Backend::sdpa_cudnn, Usage::native, c, plain_s, "cudnn_b200_few_kv_heads"));
  c.kv_heads = 8;
  CHECK_FALSE(hits(Backend::sdpa_cudnn, Usage::native, c, plain_s, "cudnn_b200_few_kv_heads"));
  // cudnn_mask_nan_grad_q
  env.sm = 90; c.training = true; c.q_len = c.k_len = 4096 + 64;
  CHECK(hits(Backend::sdpa_cudnn, Usage::dense_mask, c, plain_s, "cudnn_mask_nan_grad_q"));
  c.q_len = c.k_len = 4096;
  CHECK_FALSE(hits(Backend::sdpa_cudnn, Usage::dense_mask, c, plain_s, "cudnn_mask_nan_grad_q"));
}

TEST_CASE("versions parse and compare; bad calls and environments are errors naming the field") {
  CHECK(*Version::parse("2.11") == version(2, 11));
  CHECK(*Version::parse("2.14.0.dev20260612") == version(2, 14, 0));
  CHECK(version(9, 15, 1) > version(9, 15, 0));
  CHECK_FALSE(Version::parse("x2").ok());
  const auto message = [](const AttentionCall& c, const Environment& e = h200()) {
    auto p = decide(structure(1, 8, 8, StructureKind::causal), c, e);
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().code() == ErrorCode::invalid_argument);
    return p.status().message();
  };
  AttentionCall c = seed_call();
  c.kv_heads = 3;
  CHECK(message(c).find("multiple of call.kv_heads") != std::string::npos);
  c = seed_call();
  c.head_dim = 0;
  CHECK(message(c).find("call.head_dim must be >= 1") != std::string::npos);
  c = seed_call();
  c.head_dim_v = -3;
  CHECK(message(c).find("call.head_dim_v") != std::string::npos);
  c = seed_call();
  c.dropout = 1.5;
  CHECK(message(c).find("call.dropout") != std::string::npos);
  Environment e = h200();
  e.sm = -5;
  CHECK(message(seed_call(), e).find("environment.sm") != std::string::npos);
}

TEST_CASE("native arguments in each backend's own names and conventions") {
  using V = std::vector<std::int64_t>;
  const auto tensor = [](V v) { return ArgValue(IndexTensor{std::move(v)}); };
  // Packed documents with a sliding window: flash-attn varlen, window (W - 1, 0) inside documents.
  auto docs = structure(2, 100, 100, StructureKind::sliding_window);
  docs.window = 8;
  docs.segments = {{0, 30, 100}, {0, 100}};
  const CallArgs fa = backend_args(native_call(Backend::flash_attn_varlen, docs), 2, 100, 100);
  CHECK(arg(fa, "cu_seqlens_q") == tensor({0, 30, 100, 200}));
  CHECK(arg(fa, "cu_seqlens_k") == tensor({0, 30, 100, 200}));
  CHECK(arg(fa, "max_seqlen_q") == ArgValue(std::int64_t{100}));
  CHECK(arg(fa, "window_size") == ArgValue(IntPair{7, 0}));
  CHECK(arg(fa, "causal") == ArgValue(true));
  const CallContext everything{seed_call(), with_every_family()};
  CHECK_FALSE(info(Backend::flash_attn).native(docs, everything, nullptr));  // the dense kernel has no documents
  CHECK_FALSE(info(Backend::xformers).native(docs, everything, nullptr));    // no block-diagonal local mask here
  // The same through torch's own varlen_attn.
  const CallArgs tv = backend_args(native_call(Backend::torch_varlen, docs), 2, 100, 100);
  CHECK(arg(tv, "cu_seq_q") == tensor({0, 30, 100, 200}));
  CHECK(arg(tv, "max_k") == ArgValue(std::int64_t{100}));
  CHECK(arg(tv, "window_size") == ArgValue(IntPair{7, 0}));
  // Chunked: flash-attn 3 attention_chunk; the varlen forms cut documents at each chunk.
  auto chunked = structure(1, 100, 100, StructureKind::chunked);
  chunked.chunk = 40;
  CHECK(arg(backend_args(native_call(Backend::flash_attn3, chunked), 1, 100, 100), "attention_chunk") ==
        ArgValue(std::int64_t{40}));
  CHECK_FALSE(info(Backend::flash_attn).native(chunked, everything, nullptr));
  CHECK(arg(backend_args(native_call(Backend::flash_attn3_varlen, chunked), 1, 100, 100), "cu_seqlens_q") ==
        tensor({0, 40, 80, 100}));
  // Packed causal documents: xformers block-diagonal, TE thd, FlashInfer indptr, cuDNN seq lens.
  auto packed = structure(2, 100, 100, StructureKind::causal);
  packed.segments = {{0, 30, 100}, {0, 100}};
  const CallArgs xf = backend_args(native_call(Backend::xformers, packed), 2, 100, 100);
  CHECK(xf.mask_object == "BlockDiagonalCausalMask.from_seqlens");
  CHECK(find_arg(xf.mask_object_args, "q_seqlen") != nullptr);
  CHECK(*find_arg(xf.mask_object_args, "q_seqlen") == tensor({30, 70, 100}));
  const CallArgs te = backend_args(native_call(Backend::transformer_engine, packed), 2, 100, 100);
  CHECK(arg(te, "qkv_format") == ArgValue(std::string_view("thd")));
  CHECK(arg(te, "attn_mask_type") == ArgValue(std::string_view("padding_causal")));
  CHECK(arg(te, "cu_seqlens_kv") == tensor({0, 30, 100, 200}));
  CHECK(arg(backend_args(native_call(Backend::flashinfer, packed), 2, 100, 100), "kv_indptr") ==
        tensor({0, 30, 100, 200}));
  // cuDNN frontend's packed form needs ragged offsets the typed call does not carry.
  CHECK_FALSE(info(Backend::cudnn_frontend).native(packed, everything, nullptr));
  // Bottom-right causal Q < K: TE and cuDNN frontend name the alignment; torch uses CausalBias.
  auto br = structure(1, 16, 64, StructureKind::causal);
  br.alignment = Alignment::bottom_right;
  CHECK(arg(backend_args(native_call(Backend::transformer_engine, br), 1, 16, 64), "attn_mask_type") ==
        ArgValue(std::string_view("causal_bottom_right")));
  CHECK(arg(backend_args(native_call(Backend::cudnn_frontend, br), 1, 16, 64), "diagonal_alignment") ==
        ArgValue(Identifier{"cudnn.diagonal_alignment.BOTTOM_RIGHT"}));
  CHECK(backend_args(native_call(Backend::xformers, br), 1, 16, 64).mask_object == "LowerTriangularFromBottomRightMask");
  const CallArgs lr = backend_args(native_call(Backend::sdpa_causal_lower_right, br), 1, 16, 64);
  CHECK(lr.mask_object == "causal_lower_right");
  CHECK(*find_arg(lr.mask_object_args, "seq_len_q") == ArgValue(std::int64_t{16}));
  CHECK_FALSE(info(Backend::sdpa_flash).native(br, everything, nullptr));
  // A window: cuDNN's left bound counts the diagonal (W), flash-attn's does not (W - 1).
  auto window = structure(1, 64, 64, StructureKind::sliding_window);
  window.window = 16;
  CHECK(arg(backend_args(native_call(Backend::cudnn_frontend, window), 1, 64, 64), "diagonal_band_left_bound") ==
        ArgValue(std::int64_t{16}));
  CHECK(arg(backend_args(native_call(Backend::flash_attn, window), 1, 64, 64), "window_size") == ArgValue(IntPair{15, 0}));
  CHECK(backend_args(native_call(Backend::xformers, window), 1, 64, 64).mask_object == "LocalAttentionFromBottomRightMask");
  // Right-padded keys of a full attention: cuDNN seq_len_kv, flash-attn gathers the valid keys.
  auto padded = structure(2, 8, 64, StructureKind::full);
  padded.kv_valid = {{0, 64}, {0, 40}};
  CHECK(arg(backend_args(native_call(Backend::cudnn_frontend, padded), 2, 8, 64), "seq_len_kv") == tensor({64, 40}));
  CHECK(arg(backend_args(native_call(Backend::flash_attn_varlen, padded), 2, 8, 64), "cu_seqlens_k") ==
        tensor({0, 64, 104}));
  padded.kv_valid = {{0, 64}, {10, 64}};  // left padding: no seq_len_kv form, a gather for varlen
  CHECK_FALSE(info(Backend::cudnn_frontend).native(padded, everything, nullptr));
  const Call gathered = native_call(Backend::flashinfer, padded);
  CHECK(gathered.get<VarlenArgs>()->sequences[1].k == KeyRange{10, 64});
  CHECK(call_is_exact(padded, gathered));
}

TEST_CASE("efficient head-dim alignment: 4 for fp32, 8 for fp16/bf16 (as torch 2.11 checks it)") {
  auto refused = [](DType dtype, std::int64_t head_dim) {
    AttentionCall c = seed_call();
    c.dtype = dtype;
    c.head_dim = head_dim;
    return refusals(Backend::sdpa_efficient, {c, h200()}).any();
  };
  CHECK_FALSE(refused(DType::float32, 60));
  CHECK(refused(DType::float32, 62));
  CHECK(refused(DType::bfloat16, 60));
  CHECK_FALSE(refused(DType::bfloat16, 64));
  CHECK(refused(DType::float16, 100));
}

TEST_CASE("the registry names every backend once, and names round-trip") {
  for (Backend b : kAllBackends) {
    INFO(to_string(b));
    CHECK(info(b).id == b);
    CHECK(backend_named(to_string(b)) == b);
    CHECK(static_cast<bool>(info(b).native));
  }
  CHECK(backend_named("zeros") == Backend::zeros);
  CHECK_FALSE(backend_named("torch.sdpa.nope").has_value());
}

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
  CHECK_FALSE((p->backend() == Backend::sdpa_cudnn && p->call.mask == MaskUse::keep));
  CHECK(has_hazard(*p, HazardKind::empty_rows));
  CHECK(computes(s, *p));
  // The same count given explicitly decides the same; a wrong one is refused.
  s.empty_rows = 100;
  auto given = decide(s, c);
  REQUIRE(given.ok());
  CHECK(given->backend() == p->backend());
  s.empty_rows = 1;
  CHECK(decide(s, c).status().code() == ErrorCode::invalid_argument);
}

TEST_CASE("a slower rejection's estimates never read alike: digits enough to tell them apart, a tie said as one") {
  Rejection r;
  r.kind = RejectionKind::slower;
  r.cost_ms = 0.0374;
  r.chosen_cost_ms = 0.0371;
  CHECK(r.reason() == "correct natively but slower (estimated 0.03740 ms vs 0.03710 ms)");
  r.cost_ms = 132.4;
  r.chosen_cost_ms = 69.85;
  CHECK(r.reason() == "correct natively but slower (estimated 132 ms vs 69.8 ms)");
  r.cost_ms = r.chosen_cost_ms = 0.037;
  CHECK(r.reason() == "correct natively and no faster (estimated 0.037 ms, as the chosen call)");
  CHECK(format_ms(0.0371) == "0.037 ms");
  CHECK(format_ms(69.85) == "69.8 ms");  // printf rounds the binary value: 69.849999...
  CHECK(format_ms(1234.6) == "1235 ms");
  r.cost_ms = 5.04;  // 5.0 ms vs 5.0 ms at one decimal: four digits, zeros kept
  r.chosen_cost_ms = 5.0;
  CHECK(r.reason() == "correct natively but slower (estimated 5.040 ms vs 5.000 ms)");
  r.cost_ms = 5.0 + 1e-12;  // alike to 9 digits: a tie
  CHECK(r.reason() == "correct natively and no faster (estimated 5.0 ms, as the chosen call)");
}

}  // TEST_SUITE

TEST_SUITE("policy") {

TEST_CASE("dropout never goes to a backend that takes none: flex and varlen refuse it, by rule") {
  AttentionCall c = training_call_d128();
  const Environment env = h200_with_flex();
  auto window = make_structure(StructureKind::sliding_window, 1, 69632, 69632);
  window.window = 4096;
  auto padded = make_structure(StructureKind::causal, 2, 4096, 4096);
  padded.q_valid = {{0, 4096}, {0, 3000}};
  padded.kv_valid = padded.q_valid;
  for (const MaskStructure& s : {window, padded}) {
    c.q_len = c.k_len = s.q_len;
    c.batch = s.batch;
    c.dropout = 0;
    auto without = decide(s, c, env);
    REQUIRE(without.ok());
    if (s.kind == StructureKind::sliding_window)
      CHECK(without->backend() == Backend::flex_attention);  // what dropout must change
    CHECK_FALSE(rejected(*without, Backend::flex_attention, "dropout"));
    c.dropout = 0.1;
    auto with = decide(s, c, env);
    REQUIRE(with.ok());
    CHECK(with->backend() != Backend::flex_attention);
    CHECK(with->backend() != Backend::torch_varlen);
    CHECK(rejected(*with, Backend::flex_attention, "flex_attention takes no dropout"));
    CHECK(computes(s, *with));
  }
}

TEST_CASE("a cold FlexAttention compile is a cost: never chosen where a compile-free call costs less than it") {
  AttentionCall c = training_call_d128();
  const Environment env = h200_with_flex();
  DecideOptions cold;
  cold.flex_compile_ms = kFlexColdCompileMs;
  const auto flex_rejection = [](const Policy& p) {
    return *std::find_if(p.rejected.begin(), p.rejected.end(),
                         [](const Rejection& r) { return r.backend == Backend::flex_attention; });
  };

  // The 4096 window at 69632 tokens: flex warm (5.5 ms) beats varlen_attn (7.1 ms); cold,
  // varlen_attn runs it without a compile, and flex's rejection carries the compile.
  auto window = make_structure(StructureKind::sliding_window, 1, 69632, 69632);
  window.window = 4096;
  auto warm = decide(window, c, env);
  auto fresh = decide(window, c, env, cold);
  REQUIRE(warm.ok());
  REQUIRE(fresh.ok());
  CHECK(warm->backend() == Backend::flex_attention);
  CHECK(fresh->backend() == Backend::torch_varlen);
  const Rejection flex = flex_rejection(*fresh);
  CHECK(flex.kind == RejectionKind::slower);
  CHECK(flex.compile_ms == kFlexColdCompileMs);
  CHECK(flex.cost_ms == doctest::Approx(warm->cost_ms + kFlexColdCompileMs));  // its tiles counted
  CHECK(flex.reason().find("a cold compile of 3500 ms included") != std::string::npos);

  // Structures torch runs only with the dense mask or a plan: at 69632 tokens those cost
  // less than the compile, so a cold flex loses to them too.
  auto prefix_lm = make_structure(StructureKind::prefix_lm, 1, 69632, 69632);
  prefix_lm.prefix = 4096;
  auto torch_only = decide(prefix_lm, c);
  auto cold_prefix = decide(prefix_lm, c, env, cold);
  REQUIRE(torch_only.ok());
  REQUIRE(cold_prefix.ok());
  CHECK(decide(prefix_lm, c, env)->backend() == Backend::flex_attention);
  CHECK(cold_prefix->backend() == torch_only->backend());
  CHECK(cold_prefix->cost_ms == doctest::Approx(torch_only->cost_ms));

  // Where every compile-free call costs more than the compile and flex's run together (VLM
  // blocks too many for a plan, the dense mask over 64 heads x 131072^2: 7 s), a cold flex
  // is chosen and its estimate includes the compile.
  auto blocks = make_structure(StructureKind::causal_blocks, 1, 131072, 131072);
  for (std::int64_t at = 100; at + 300 < 131072; at += 400) blocks.blocks.push_back({at, at + 300});
  AttentionCall big = c;
  big.heads = 64;
  auto dense_only = decide(blocks, big);
  auto cold_blocks = decide(blocks, big, env, cold);
  REQUIRE(dense_only.ok());
  REQUIRE(cold_blocks.ok());
  CHECK(dense_only->cost_ms > kFlexColdCompileMs);
  CHECK(cold_blocks->backend() == Backend::flex_attention);
  CHECK(cold_blocks->cost_ms > kFlexColdCompileMs);
  CHECK(cold_blocks->cost_ms < dense_only->cost_ms);

  // +inf: flex is never chosen where anything else runs; a compile cost that is no
  // number, or negative, is an invalid option.
  DecideOptions never;
  never.flex_compile_ms = std::numeric_limits<double>::infinity();
  CHECK(decide(blocks, big, env, never)->backend() != Backend::flex_attention);
  for (double bad : {-1.0, std::numeric_limits<double>::quiet_NaN()}) {
    DecideOptions o;
    o.flex_compile_ms = bad;
    CHECK(decide(window, c, env, o).status().code() == ErrorCode::invalid_argument);
  }
}

TEST_CASE("a mask known without its tensor: building it is a cost, and +inf never builds it") {
  // A left-padded batch on the CPU in fp32: the math kernel with the mask kept (one call)
  // beats a plan of is_causal slices while the mask is at hand.
  auto s = structure(3, 20, 20, StructureKind::causal);
  s.kv_valid = {{0, 20}, {4, 20}, {9, 20}};
  AttentionCall c;
  c.dtype = DType::float32;
  c.head_dim = 16;
  c.heads = 4;
  c.kv_heads = 2;
  c.batch = 3;
  c.q_len = c.k_len = 20;
  c.training = true;
  Environment cpu;
  cpu.sm = 10;
  cpu.torch = version(2, 11);
  cpu.available = kFamilyTorch;
  auto at_hand = decide(s, c, cpu);
  REQUIRE(at_hand.ok());
  CHECK(!at_hand->is_plan());
  CHECK(at_hand->call.mask == MaskUse::keep);
  for (double build_ms : {1.0, std::numeric_limits<double>::infinity()}) {
    DecideOptions o;
    o.mask_build_ms = build_ms;
    auto built = decide(s, c, cpu, o);
    REQUIRE(built.ok());
    CHECK(built->is_plan());
    CHECK(plan_is_exact(s, *built));
    CHECK(built->cost_ms < at_hand->cost_ms + build_ms);
  }
  // A build cost too small to matter changes nothing; one that is no number is invalid.
  DecideOptions tiny;
  tiny.mask_build_ms = 1e-6;
  CHECK(decide(s, c, cpu, tiny)->call.mask == MaskUse::keep);
  for (double bad : {-1.0, std::numeric_limits<double>::quiet_NaN()}) {
    DecideOptions o;
    o.mask_build_ms = bad;
    CHECK(decide(s, c, cpu, o).status().code() == ErrorCode::invalid_argument);
  }
}

TEST_CASE("a plan of one step that is the chosen call is not listed as rejected") {
  // On the CPU (sm 10, torch only) plain causal runs torch's math kernel with is_causal;
  // a plan of that one call over the whole mask is the same call, not an alternative
  // "correct as a plan of 1 call and no faster".
  AttentionCall c;
  c.dtype = DType::float32;
  c.head_dim = 32;
  c.heads = 4;
  c.q_len = c.k_len = 64;
  Environment cpu;
  cpu.sm = 10;
  cpu.torch = version(2, 11);
  cpu.available = kFamilyTorch;
  auto p = decide(structure(1, 64, 64, StructureKind::causal), c, cpu);
  REQUIRE(p.ok());
  CHECK(drops_mask_as_plain_causal(*p));
  for (const Rejection& r : p->rejected) CHECK_MESSAGE(r.backend != p->call.backend, r.reason());
  // A plan of several calls is an alternative, and listed where it is not chosen.
  auto padded = structure(2, 64, 64, StructureKind::causal);
  padded.kv_valid = {{0, 64}, {8, 64}};
  c.batch = 2;
  auto q = decide(padded, c, cpu);
  REQUIRE(q.ok());
  if (!q->is_plan()) CHECK(rejected(*q, q->call.backend, "as a plan of"));
}

}  // TEST_SUITE
