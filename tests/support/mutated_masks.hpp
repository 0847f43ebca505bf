// Test support: the generated and mutated masks both device suites compare with the host
// (tests/cuda/test_device_scan.cpp, test_device_tiles.cpp): a random structure at odd and
// random sizes, in any element type, polarity and layout, rewritten half the time (where
// additive) in one of the encodings frameworks write, then with up to three elements
// flipped. One generator, so that both suites meet the same kinds of masks.
#pragma once

#include <cstdint>
#include <iterator>
#include <string>

#include "additive_encodings.hpp"
#include "mask_gen.hpp"

namespace masklens::testing {

// Moved, never copied: the view points into the storage it came with.
struct MutatedMask {
  DenseMask dense;
  Layout layout = Layout::contiguous;
  std::string encoding = "rendered";  // or the additive encoding it was rewritten in

  MutatedMask() = default;
  MutatedMask(MutatedMask&&) = default;
  MutatedMask& operator=(MutatedMask&&) = default;
  MutatedMask(const MutatedMask&) = delete;
  MutatedMask& operator=(const MutatedMask&) = delete;
};

// A mask of q_len up to max_q_len (or an odd size up to 127) and k_len up to 3000 (or an
// odd size up to 4097), batch and heads 1 or 2.
inline MutatedMask mutated_mask(Rng& rng, std::int64_t max_q_len) {
  static constexpr ElementType kTypes[] = {ElementType::boolean, ElementType::uint8,    ElementType::int8,
                                           ElementType::float16, ElementType::bfloat16, ElementType::float32};
  static constexpr std::int64_t kOddSizes[] = {1, 3, 7, 15, 17, 31, 33, 63, 65, 127, 129, 1023, 2047, 2049, 4097};
  const std::int64_t q_len = coin(rng) ? kOddSizes[uniform(rng, 0, 14) % 10] : uniform(rng, 1, max_q_len);
  const std::int64_t k_len = coin(rng) ? kOddSizes[uniform(rng, 0, 14)] : uniform(rng, 1, 3000);
  const ElementType dtype = kTypes[uniform(rng, 0, 5)];
  MutatedMask out;
  out.layout = static_cast<Layout>(uniform(rng, 0, 3));
  const std::int64_t batch = uniform(rng, 1, 2), heads = uniform(rng, 1, 2);
  MaskStructure spec = out.layout == Layout::expand ? repeat_batches(random_structure(rng, 1, q_len, k_len), batch)
                                                    : random_structure(rng, batch, q_len, k_len);
  out.dense = render(spec, heads, dtype, coin(rng, 0.2) ? Polarity::true_masks : Polarity::true_attends, out.layout,
                     rng, coin(rng, 0.3) ? 0.2 : 0.0);
  // Additive masks: half keep the renderer's encodings (one masked value per row, a bias
  // now and then), half are rewritten in one of every encoding frameworks write.
  if (is_additive(dtype) && coin(rng)) {
    const Encoding e = kEncodings[uniform(rng, 0, std::ssize(kEncodings) - 1)];
    reencode(out.dense.view, e, rng);
    out.encoding = to_string(e);
  }
  // Mutate: random single flips, often none.
  const MaskView& view = out.dense.view;
  auto* raw = const_cast<std::uint8_t*>(view.element_ptr(0, 0, 0, 0));
  const int esize = element_size(dtype);
  for (int f = static_cast<int>(uniform(rng, 0, 3)); f > 0; --f) {
    const std::int64_t q = uniform(rng, 0, q_len - 1), k = uniform(rng, 0, k_len - 1);
    const bool was = attends(view.at(0, 0, q, k));
    write_value(raw + view.offset(0, 0, q, k) * esize, dtype, view.encoding().polarity,
                was ? Value::masked : Value::allowed, f);
  }
  return out;
}

}  // namespace masklens::testing
