// libFuzzer: bytes -> a mask view -> scan -> classify; every row scans as the
// element-by-element reference does, and a structured verdict renders back to the mask
// element for element (the proof property).
#include <masklens/masklens.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 5) return 0;
  const auto dtype = static_cast<masklens::ElementType>(data[0] % 6);
  const std::int64_t q = 1 + data[1] % 48, k = 1 + data[2] % 48;
  const bool transpose = data[3] & 1;
  masklens::MaskEncoding enc;
  if ((data[3] & 2) && !masklens::is_additive(dtype)) enc.polarity = masklens::Polarity::true_masks;
  const int esize = masklens::element_size(dtype);
  std::vector<std::uint64_t> store(static_cast<std::size_t>(q * k * esize / 8 + 1), 0);
  auto* bytes = reinterpret_cast<std::uint8_t*>(store.data());
  // Fill from the input; sparse inputs become runs so structured masks are common.
  for (std::int64_t i = 0; i < q * k * esize; ++i) bytes[i] = data[4 + static_cast<std::size_t>(i) % (size - 4)];
  if (data[3] & 4)  // turn the bytes into a causal-ish pattern with the input's holes
    for (std::int64_t r = 0; r < q; ++r)
      for (std::int64_t c = 0; c < k; ++c)
        if (esize == 1) bytes[r * k + c] = (c <= r) ^ ((bytes[r * k + c] & 0x3f) == 0);
  const std::int64_t shape[2] = {q, k};
  const std::int64_t strides[2] = {transpose ? 1 : k, transpose ? q : 1};
  auto view = masklens::MaskView::make(bytes, dtype, shape, strides, enc);
  if (!view) return 0;
  // The word-at-a-time row scanners equal the element-by-element reference, row for row.
  const masklens::AdditiveBits bits = masklens::additive_bits(dtype, enc.masked_threshold);
  for (std::int64_t r = 0; r < q; ++r) {
    const masklens::RowSpan fast = masklens::detail::scan_row(*view, bits, 0, 0, r);
    const masklens::RowSpan want = masklens::detail::scan_generic_row(view->element_ptr(0, 0, r, 0), k,
                                                                      view->stride(3) * esize, dtype, enc);
    if (!fast.same_keys(want) || fast.flags != want.flags) __builtin_trap();
  }
  auto verdict = masklens::inspect(*view);
  if (!verdict || verdict->kind == masklens::StructureKind::arbitrary) return 0;
  for (std::int64_t r = 0; r < q; ++r)
    for (std::int64_t c = 0; c < k; ++c)
      if (verdict->allows(0, r, c) != masklens::attends(view->at(0, 0, r, c))) __builtin_trap();
  return 0;
}
