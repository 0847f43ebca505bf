// Test support: the attention calls and environments the tests and benchmarks ask about.
#pragma once

#include <masklens/call.hpp>

namespace masklens::testing {

// Qwen3.5 training at 69632 tokens (the seed pull request): bf16, head dim 256, 4 heads.
inline AttentionCall seed_call() {
  AttentionCall c;
  c.dtype = DType::bfloat16;
  c.head_dim = 256;
  c.heads = 4;
  c.training = true;
  return c;
}

// An H200 with torch 2.11 / cuDNN 9.19 and nothing else installed.
inline Environment h200() {
  Environment e;
  e.sm = 90;
  e.torch = version(2, 11);
  e.cudnn = version(9, 19);
  return e;
}

// `e` with every backend family installed, at the versions the CLI assumes by default.
inline Environment with_every_family(Environment e = h200()) {
  e.available = kEveryFamily;
  e.flash_attn = version(2, 8, 3);
  e.flash_attn3 = version(3, 0);
  e.xformers = version(0, 0, 33);
  e.transformer_engine = version(2, 8);
  e.flashinfer = version(0, 5);
  e.cudnn_frontend = version(1, 16);
  return e;
}

}  // namespace masklens::testing
