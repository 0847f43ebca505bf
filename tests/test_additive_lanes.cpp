// The lane classifier (additive_bits.hpp: AdditiveLanes) against the per-element
// definition (classify_element) on every 16-bit pattern in every lane position and on
// random and boundary fp32 patterns, with both word sizes: 64-bit words are what the
// host scanner instantiates, 32-bit words what the device kernel instantiates, so the
// device's classification is checked here on the CPU bit for bit.
#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "support/mask_gen.hpp"

using namespace masklens;
using namespace masklens::testing;

namespace {

// What classify_element says of a vector of lanes: the attend bits and the row flags.
struct Expected {
  std::uint32_t attend = 0, flags = 0;
  bool operator==(const VectorClass& c) const { return attend == c.attend && flags == c.flags; }
};

template <class Lane, std::size_t N>
Expected expected_from(const std::array<Lane, N>& lanes, const std::vector<ElementClass>& class_of) {
  Expected e;
  for (std::size_t i = 0; i < N; ++i) {
    const ElementClass c = class_of[lanes[i]];
    if (attends(c)) e.attend |= 1u << i;
    e.flags |= row_flag(c);
  }
  return e;
}

// The lanes as the scanners load them: 16 bytes of memory read as words.
template <int Esize, class Word, class Lane, std::size_t N>
VectorClass classify_as_loaded(const std::array<Lane, N>& lanes, const AdditiveBits& bits) {
  static_assert(sizeof(Lane) * N == 16);
  Word words[16 / sizeof(Word)];
  std::memcpy(words, lanes.data(), 16);
  return AdditiveLanes<Esize, Word>(bits).classify(words);
}

// classify_element of one 16-bit pattern (from a properly typed element, as a view reads it).
ElementClass element_class(std::uint16_t bits, ElementType dtype, float threshold) {
  // Room for any element type: the compiler sees classify_element's 4-byte branch too.
  alignas(4) const std::uint16_t element[2] = {bits, 0};
  return classify_element(element, dtype, Polarity::true_attends, threshold);
}
ElementClass element_class(std::uint32_t bits, float threshold) {
  const float f = std::bit_cast<float>(bits);
  return classify_element(&f, ElementType::float32, Polarity::true_attends, threshold);
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("lane classifier: readable vectors, both word sizes") {
  const AdditiveBits bits = additive_bits(ElementType::bfloat16, -1000.0f);
  // 0, -0, -inf, finfo.min, -9984 (masked: <= -1000), -1 (a bias), NaN, +inf
  const std::array<std::uint16_t, 8> mixed = {0x0000, 0x8000, 0xff80, 0xff7f, 0xc61c, 0xbf80, 0x7fc0, 0x7f80};
  for (const VectorClass c : {classify_as_loaded<2, std::uint64_t>(mixed, bits),
                              classify_as_loaded<2, std::uint32_t>(mixed, bits)}) {
    CHECK(c.attend == 0b00100011u);  // lanes 0, 1 (zeros) and 5 (the bias)
    CHECK(c.flags == (kRowBias | kRowFiniteMasked | kRowInvalid));
  }
  // The usual causal row of transformers' additive mask: zeros, then finfo.min.
  const std::array<std::uint16_t, 8> causal = {0, 0, 0, 0, 0xff7f, 0xff7f, 0xff7f, 0xff7f};
  for (const VectorClass c : {classify_as_loaded<2, std::uint64_t>(causal, bits),
                              classify_as_loaded<2, std::uint32_t>(causal, bits)}) {
    CHECK(c.attend == 0x0fu);
    CHECK(c.flags == kRowFiniteMasked);
  }
  // -inf only: no flag at all.
  const std::array<std::uint16_t, 8> plain = {0xff80, 0, 0xff80, 0x8000, 0xff80, 0xff80, 0, 0xff80};
  for (const VectorClass c : {classify_as_loaded<2, std::uint64_t>(plain, bits),
                              classify_as_loaded<2, std::uint32_t>(plain, bits)}) {
    CHECK(c.attend == 0b01001010u);
    CHECK(c.flags == 0u);
  }
  // fp32: -1e4 is masked at -1000 and a bias at -1e5.
  const std::array<std::uint32_t, 4> wide = {std::bit_cast<std::uint32_t>(-1e4f), 0, 0x80000000u,
                                             std::bit_cast<std::uint32_t>(-1e4f)};
  CHECK(classify_as_loaded<4, std::uint64_t>(wide, additive_bits(ElementType::float32, -1000.0f)).flags ==
        kRowFiniteMasked);
  const VectorClass as_bias = classify_as_loaded<4, std::uint32_t>(wide, additive_bits(ElementType::float32, -1e5f));
  CHECK(as_bias.attend == 0xfu);
  CHECK(as_bias.flags == kRowBias);
}

TEST_CASE("lane classifier: gathering lane top bits, every subset of lanes") {
  const auto check_word = [](auto word_tag, auto lane_bits_tag) {
    using Word = decltype(word_tag);
    constexpr int kLaneBits = decltype(lane_bits_tag)::value;
    constexpr int kLanes = 8 * static_cast<int>(sizeof(Word)) / kLaneBits;
    for (std::uint32_t subset = 0; subset < (1u << kLanes); ++subset) {
      Word tops = 0;
      for (int j = 0; j < kLanes; ++j)
        if (subset & (1u << j)) tops |= Word{1} << (j * kLaneBits + kLaneBits - 1);
      INFO(sizeof(Word) << "-byte word, " << kLaneBits << "-bit lanes, subset " << subset);
      REQUIRE(lanes::gather_tops<Word, kLaneBits>(tops) == subset);
    }
  };
  check_word(std::uint32_t{}, std::integral_constant<int, 8>{});
  check_word(std::uint32_t{}, std::integral_constant<int, 16>{});
  check_word(std::uint32_t{}, std::integral_constant<int, 32>{});
  check_word(std::uint64_t{}, std::integral_constant<int, 8>{});
  check_word(std::uint64_t{}, std::integral_constant<int, 16>{});
  check_word(std::uint64_t{}, std::integral_constant<int, 32>{});
}

TEST_CASE("lane classifier: every 16-bit pattern in every lane, 32- and 64-bit words, as classify_element") {
  Rng rng(test_seed(31));
  std::int64_t vectors = 0;
  for (const ElementType dtype : {ElementType::float16, ElementType::bfloat16}) {
    // Thresholds: usual ones, each format's lowest finite, beyond any finite value, and
    // one inside the subnormals (thr_mag of 1 or 2).
    for (const float threshold : {-1000.0f, -1.0f, -65504.0f, -3.0e38f, -1e-7f}) {
      const AdditiveBits bits = additive_bits(dtype, threshold);
      std::vector<ElementClass> class_of(65536);
      for (std::uint32_t p = 0; p < 65536; ++p) {
        const auto h = static_cast<std::uint16_t>(p);
        class_of[p] = element_class(h, dtype, threshold);
        // The one-value form agrees on every pattern too.
        if (classify_bits(p, bits) != class_of[p]) {
          INFO(to_string(dtype) << " threshold " << threshold << " pattern 0x" << std::hex << p);
          REQUIRE(classify_bits(p, bits) == class_of[p]);
        }
      }
      const auto neg_inf = static_cast<std::uint16_t>(bits.sign | bits.inf_mag);
      const auto at_thr = static_cast<std::uint16_t>(bits.sign | bits.thr_mag);
      const auto lowest = static_cast<std::uint16_t>(neg_inf - 1);
      // Zeros and masked values only: with the pattern in one lane, the fast path's
      // decision rests on that lane alone.
      const std::uint16_t plain[] = {0x0000, 0x8000, neg_inf, lowest, at_thr};
      for (std::uint32_t p = 0; p < 65536; ++p) {
        for (int lane = 0; lane < 8; ++lane) {
          for (const bool noisy : {false, true}) {
            std::array<std::uint16_t, 8> lanes{};
            for (auto& l : lanes)
              l = noisy && coin(rng, 0.3) ? static_cast<std::uint16_t>(uniform(rng, 0, 65535))
                                          : plain[uniform(rng, 0, 4)];
            lanes[static_cast<std::size_t>(lane)] = static_cast<std::uint16_t>(p);
            const Expected want = expected_from(lanes, class_of);
            const VectorClass wide = classify_as_loaded<2, std::uint64_t>(lanes, bits);
            const VectorClass narrow = classify_as_loaded<2, std::uint32_t>(lanes, bits);
            if (!(want == wide) || !(want == narrow)) {
              INFO(to_string(dtype) << " threshold " << threshold << " pattern 0x" << std::hex << p << " in lane "
                                    << std::dec << lane << (noisy ? " (noisy)" : ""));
              CHECK(wide.attend == want.attend);
              CHECK(wide.flags == want.flags);
              CHECK(narrow.attend == want.attend);
              REQUIRE(narrow.flags == want.flags);
            }
            ++vectors;
          }
        }
      }
    }
  }
  CHECK(vectors == 2 * 5 * 65536 * 8 * 2);
  MESSAGE(vectors << " 16-bit vectors classified with both word sizes");
}

TEST_CASE("lane classifier: random and boundary fp32 patterns, 32- and 64-bit words, as classify_element") {
  Rng rng(test_seed(32));
  std::int64_t vectors = 0;
  for (const float threshold : {-1000.0f, -1.0f, -1e4f, std::numeric_limits<float>::lowest(), -1e-40f}) {
    const AdditiveBits bits = additive_bits(ElementType::float32, threshold);
    const std::uint32_t thr = bits.sign | bits.thr_mag;
    // Zeros, the specials and the edges of every class, in both signs.
    const std::uint32_t edges[] = {0u,          0x80000000u, 0xff800000u, 0x7f800000u, 0xff7fffffu, 0x7f7fffffu,
                                   0xff800001u, 0x7f800001u, 0xffffffffu, 0x7fffffffu, 0xffc00000u, 0x00000001u,
                                   0x80000001u, thr,         thr - 1,     thr + 1,     thr & 0x7fffffffu,
                                   std::bit_cast<std::uint32_t>(threshold)};
    for (int i = 0; i < 200000; ++i) {
      std::array<std::uint32_t, 4> lanes{};
      const bool mostly_plain = coin(rng);
      for (auto& l : lanes) {
        const auto pick = uniform(rng, 0, 9);
        l = mostly_plain && pick < 7 ? (coin(rng) ? 0u : bits.sign | bits.inf_mag)
            : pick < 4               ? static_cast<std::uint32_t>(rng())
                                     : edges[static_cast<std::size_t>(uniform(rng, 0, std::ssize(edges) - 1))];
      }
      Expected want;
      for (std::size_t j = 0; j < 4; ++j) {
        const ElementClass c = element_class(lanes[j], threshold);
        if (classify_bits(lanes[j], bits) != c) {
          INFO("threshold " << threshold << " pattern 0x" << std::hex << lanes[j]);
          REQUIRE(classify_bits(lanes[j], bits) == c);
        }
        if (attends(c)) want.attend |= 1u << j;
        want.flags |= row_flag(c);
      }
      const VectorClass wide = classify_as_loaded<4, std::uint64_t>(lanes, bits);
      const VectorClass narrow = classify_as_loaded<4, std::uint32_t>(lanes, bits);
      if (!(want == wide) || !(want == narrow)) {
        INFO("threshold " << threshold << std::hex << " lanes 0x" << lanes[0] << " 0x" << lanes[1] << " 0x"
                          << lanes[2] << " 0x" << lanes[3]);
        CHECK(wide.attend == want.attend);
        CHECK(wide.flags == want.flags);
        CHECK(narrow.attend == want.attend);
        REQUIRE(narrow.flags == want.flags);
      }
      ++vectors;
    }
  }
  MESSAGE(vectors << " fp32 vectors classified with both word sizes");
}

}  // TEST_SUITE
