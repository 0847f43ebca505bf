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

}  // namespace masklens::testing
