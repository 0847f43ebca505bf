// Test support: the attention calls the tests and benchmarks ask about.
#pragma once

#include <masklens/call.hpp>

namespace masklens::testing {

// Qwen3.5 training at 69632 tokens on an H200 with torch 2.11 (the seed pull request).
inline AttentionCall seed_call() {
  AttentionCall c;
  c.dtype = DType::bfloat16;
  c.head_dim = 256;
  c.heads = 4;
  c.training = true;
  c.sm = 90;
  c.torch = version(2, 11);
  return c;
}

// `c` with every backend family installed, at the versions the CLI assumes by default.
inline AttentionCall with_every_family(AttentionCall c) {
  c.available = 0xff;
  c.flash_attn = version(2, 8, 3);
  c.flash_attn3 = version(3, 0);
  c.xformers = version(0, 0, 33);
  c.transformer_engine = version(2, 8);
  c.flashinfer = version(0, 5);
  c.cudnn_frontend = version(1, 16);
  return c;
}

}  // namespace masklens::testing
