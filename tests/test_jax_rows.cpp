// The JAX rows (backends/jax.hpp): jax.nn.dot_product_attention with implementation
// "cudnn" and "xla" — the forms each takes (JAX's top-left is_causal and
// local_window_size, key_value_seq_lengths for right padding only), the arguments under
// JAX's names, the rules read from jax's source, and decide() in a JAX environment.
#include <doctest/doctest.h>

#include <masklens/call_args.hpp>
#include <masklens/policy.hpp>

#include <algorithm>
#include <string>

#include "support/calls.hpp"
#include "support/mask_gen.hpp"

using namespace masklens;
using masklens::testing::call_is_exact;

namespace {

// A GPU with JAX and the cuDNN it loads, nothing else.
Environment jax_gpu(int sm = 90) {
  Environment e;
  e.sm = sm;
  e.available = kFamilyJax;
  e.jax = version(0, 11, 2);
  e.cudnn = version(9, 19);
  return e;
}
// The CPU: XLA only.
Environment jax_cpu() {
  Environment e = jax_gpu(10);
  e.cudnn = Version{};
  return e;
}

AttentionCall bf16_call(std::int64_t head_dim = 128) {
  AttentionCall c;
  c.dtype = DType::bfloat16;
  c.head_dim = head_dim;
  c.heads = 8;
  c.kv_heads = 2;  // GQA: no expansion for JAX
  return c;
}

const ArgValue* arg(const CallArgs& a, std::string_view name) { return find_arg(a.args, name); }

// Whether rule `rule` of backend `b` refuses the call.
bool refuses(Backend b, const AttentionCall& call, const Environment& env, std::string_view rule) {
  bool found = false;
  refusals(b, {call, env}).for_each([&](const Rule& x) { found = found || x.name == rule; });
  return found;
}

bool rejected_by(const Policy& p, Backend b, std::string_view rule) {
  return std::any_of(p.rejected.begin(), p.rejected.end(), [&](const Rejection& r) {
    if (r.backend != b || r.kind != RejectionKind::refused) return false;
    bool found = false;
    r.refusals.for_each([&](const Rule& x) { found = found || x.name == rule; });
    return found;
  });
}

}  // namespace

TEST_CASE("jax: causal, windows and right padding drop the mask; cuDNN where it is known to compute them") {
  const CallContext gpu{bf16_call(), jax_gpu()};
  auto causal = make_structure(StructureKind::causal, 2, 64, 64);
  auto p = decide(causal, gpu.call, gpu.env);
  REQUIRE(p.ok());
  CHECK(p->call.backend == Backend::jax_cudnn);
  CHECK(p->call.mask == MaskUse::drop);
  CallArgs a = backend_args(p->call, 2, 64, 64);
  CHECK(*arg(a, "is_causal") == ArgValue(true));
  CHECK(*arg(a, "implementation") == ArgValue(std::string_view("cudnn")));
  CHECK(p->hazards.empty());  // GQA runs grouped: no expansion

  // A window of W keys: (W - 1, 0) with is_causal.
  auto window = make_structure(StructureKind::sliding_window, 1, 64, 64);
  window.window = 16;
  p = decide(window, gpu.call, gpu.env);
  REQUIRE(p.ok());
  CHECK(p->call.backend == Backend::jax_cudnn);
  a = backend_args(p->call, 1, 64, 64);
  CHECK(*arg(a, "local_window_size") == ArgValue(IntPair{15, 0}));
  CHECK(*arg(a, "is_causal") == ArgValue(true));

  // Causal with right padding: key_value_seq_lengths, is_causal top-left.
  auto padded = make_structure(StructureKind::causal, 3, 64, 64);
  padded.kv_valid = {{0, 64}, {0, 40}, {0, 1}};
  p = decide(padded, gpu.call, gpu.env);
  REQUIRE(p.ok());
  CHECK(p->call.backend == Backend::jax_cudnn);
  const VarlenArgs* v = p->call.get<VarlenArgs>();
  REQUIRE(v != nullptr);
  CHECK(v->alignment == Alignment::top_left);
  CHECK(call_is_exact(padded, p->call));
  a = backend_args(p->call, 3, 64, 64);
  CHECK(*arg(a, "key_value_seq_lengths") == ArgValue(IndexTensor{{64, 40, 1}}));
  CHECK(*arg(a, "is_causal") == ArgValue(true));

  // Left padding: JAX's lengths pad on the right only; the mask is kept.
  auto left = make_structure(StructureKind::full, 2, 8, 64);
  left.kv_valid = {{0, 64}, {10, 64}};
  CHECK_FALSE(info(Backend::jax_xla).native(left, gpu, nullptr));
  CHECK_FALSE(info(Backend::jax_cudnn).native(left, gpu, nullptr));
  p = decide(left, gpu.call, gpu.env);
  REQUIRE(p.ok());
  CHECK(p->call.mask == MaskUse::keep);

  // Packed documents: no segment arguments in jax.nn.dot_product_attention.
  auto packed = make_structure(StructureKind::causal, 1, 64, 64);
  packed.segments = {{0, 20, 64}};
  CHECK_FALSE(info(Backend::jax_xla).native(packed, gpu, nullptr));
}

TEST_CASE("jax: bottom-right and empty rows: XLA's window arithmetic, never cuDNN") {
  const CallContext gpu{bf16_call(), jax_gpu()};
  // Bottom-right causal Q < K: local_window_size = (K, K - Q) on XLA; cuDNN takes square causal only.
  auto br = make_structure(StructureKind::causal, 1, 16, 64, Alignment::bottom_right);
  CHECK_FALSE(info(Backend::jax_cudnn).native(br, gpu, nullptr));
  Call c;
  REQUIRE(info(Backend::jax_xla).native(br, gpu, &c));
  CHECK(call_is_exact(br, c));
  CHECK(*arg(backend_args(c, 1, 16, 64), "local_window_size") == ArgValue(IntPair{64, 48}));
  CHECK(arg(backend_args(c, 1, 16, 64), "is_causal") == nullptr);
  // A bottom-right window of 60 keys over K - Q = 48: (59 - 48, 48).
  auto bw = make_structure(StructureKind::sliding_window, 1, 16, 64, Alignment::bottom_right);
  bw.window = 60;
  REQUIRE(info(Backend::jax_xla).native(bw, gpu, &c));
  CHECK(call_is_exact(bw, c));
  CHECK(*arg(backend_args(c, 1, 16, 64), "local_window_size") == ArgValue(IntPair{11, 48}));
  // Narrower than K - Q + 1: the left size would be negative, outside JAX's documented sizes.
  bw.window = 40;
  CHECK_FALSE(info(Backend::jax_xla).native(bw, gpu, nullptr));
  // Q > K bottom-right: a negative right size; the mask is kept.
  auto tall = make_structure(StructureKind::causal, 1, 64, 16, Alignment::bottom_right);
  CHECK_FALSE(info(Backend::jax_xla).native(tall, gpu, nullptr));
  // A batch with no valid key: rows that attend nothing average V in JAX's dense call and
  // in XLA's lengths alike; cuDNN is not taken there.
  auto empty = make_structure(StructureKind::full, 2, 8, 8);
  empty.kv_valid = {{0, 8}, {0, 0}};
  CHECK(info(Backend::jax_xla).native(empty, gpu, nullptr));
  CHECK_FALSE(info(Backend::jax_cudnn).native(empty, gpu, nullptr));
  // cuDNN with the dense mask gives those rows neither the mean of V nor a finite grad_q
  // (measured): the mask is kept on XLA, cuDNN is rejected by the defect.
  empty.empty_rows = 8;
  auto p = decide(empty, bf16_call(), jax_gpu());
  REQUIRE(p.ok());
  CHECK(p->backend() == Backend::jax_xla);
  CHECK(std::any_of(p->rejected.begin(), p->rejected.end(), [](const Rejection& r) {
    return r.backend == Backend::jax_cudnn && r.kind == RejectionKind::defect &&
           r.defect != nullptr && r.defect->id == "jax_cudnn_empty_rows";
  }));
  // Top-left causal Q != K: is_causal on XLA (jnp.tril over [T, S]), cuDNN only when square.
  auto tl = make_structure(StructureKind::causal, 1, 16, 64, Alignment::top_left);
  REQUIRE(info(Backend::jax_xla).native(tl, gpu, &c));
  CHECK(call_is_exact(tl, c));
  CHECK(*arg(backend_args(c, 1, 16, 64), "is_causal") == ArgValue(true));
  CHECK_FALSE(info(Backend::jax_cudnn).native(tl, gpu, nullptr));
}

TEST_CASE("jax: the rules read from jax's source refuse what jax raises on") {
  // The CPU: no cuDNN (and sm 10): XLA decides.
  auto causal = make_structure(StructureKind::causal, 1, 64, 64);
  AttentionCall fp32 = bf16_call();
  fp32.dtype = DType::float32;
  auto p = decide(causal, fp32, jax_cpu());
  REQUIRE(p.ok());
  CHECK(p->call.backend == Backend::jax_xla);
  CHECK(rejected_by(*p, Backend::jax_cudnn, "jax_cudnn.cudnn"));
  CHECK(rejected_by(*p, Backend::jax_cudnn, "jax_cudnn.dtype"));
  // Head dims: <= 128 before Hopper, <= 256 on sm90, a multiple of 8.
  p = decide(causal, bf16_call(256), jax_gpu(80));
  CHECK(rejected_by(*p, Backend::jax_cudnn, "jax_cudnn.head_dim"));
  p = decide(causal, bf16_call(256), jax_gpu(90));
  CHECK(p->call.backend == Backend::jax_cudnn);
  p = decide(causal, bf16_call(100), jax_gpu(90));
  CHECK(rejected_by(*p, Backend::jax_cudnn, "jax_cudnn.head_dim"));
  // Value and key of one shape; no dropout argument; an old jax.
  AttentionCall mla = bf16_call();
  mla.head_dim_v = 64;
  CHECK(refuses(Backend::jax_xla, mla, jax_gpu(), "jax.head_dim_v"));
  CHECK(refuses(Backend::jax_cudnn, mla, jax_gpu(), "jax.head_dim_v"));
  AttentionCall dropout = bf16_call();
  dropout.dropout = 0.1;
  CHECK(decide(causal, dropout, jax_gpu()).status().code() == ErrorCode::invalid_argument);
  Environment old = jax_gpu();
  old.jax = version(0, 4, 30);
  CHECK(refuses(Backend::jax_xla, bf16_call(), old, "jax.version"));
  CHECK(refuses(Backend::jax_xla, dropout, jax_gpu(), "jax.dropout"));
  // A kept mask in training on cuDNN needs even lengths (a bias); XLA keeps it then.
  auto arbitrary = make_structure(StructureKind::arbitrary, 1, 63, 64);
  AttentionCall training = bf16_call();
  training.training = true;
  p = decide(arbitrary, training, jax_gpu());
  REQUIRE(p.ok());
  CHECK(p->call.backend == Backend::jax_xla);
  CHECK(p->call.mask == MaskUse::keep);
  CHECK(rejected_by(*p, Backend::jax_cudnn, "jax_cudnn.bias_training_even"));
  // An integer mask kept is cast to bool; an additive one is no jax mask.
  AttentionCall int_mask = bf16_call();
  int_mask.mask_dtype = ElementType::uint8;
  p = decide(make_structure(StructureKind::arbitrary, 1, 64, 64), int_mask, jax_gpu());
  REQUIRE(p.ok());
  CHECK(p->call.mask_cast == ElementType::boolean);
  CHECK(python_call(p->call, 1, 64, 64, int_mask.mask_dtype).find("mask=mask.astype(bool)") != std::string::npos);
}

TEST_CASE("jax: the family is not available by default, so torch decisions are as before") {
  const Environment torch_only;  // the defaults: torch alone
  CHECK_FALSE(torch_only.has(kFamilyJax));
  auto p = decide(make_structure(StructureKind::causal, 1, 4096, 4096), testing::seed_call(), torch_only);
  REQUIRE(p.ok());
  CHECK(p->call.backend == Backend::sdpa_cudnn);
  const auto unavailable = std::count_if(p->rejected.begin(), p->rejected.end(), [](const Rejection& r) {
    return (r.backend == Backend::jax_cudnn || r.backend == Backend::jax_xla) && r.kind == RejectionKind::unavailable;
  });
  CHECK(unavailable == 2);
  CHECK(family_named("jax") != nullptr);
  CHECK(family_named("jax")->python_module.empty());  // torch's environment never finds it installed
}

TEST_CASE("jax: the printed Python calls jax.nn.dot_product_attention") {
  auto padded = make_structure(StructureKind::causal, 2, 32, 32);
  padded.kv_valid = {{0, 32}, {0, 20}};
  auto p = decide(padded, bf16_call(), jax_gpu());
  REQUIRE(p.ok());
  const std::string text = python_call(p->call, 2, 32, 32, std::nullopt);
  CHECK(text.find("key_value_seq_lengths = jnp.array([32, 20], dtype=jnp.int32)") != std::string::npos);
  CHECK(text.find("jax.nn.dot_product_attention(jnp.swapaxes(q, 1, 2)") != std::string::npos);
  CHECK(text.find("implementation=\"cudnn\"") != std::string::npos);
}
