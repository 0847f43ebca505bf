// libFuzzer: bytes -> a mask view -> scan -> classify; every row scans as the
// element-by-element reference does, a structured verdict renders back to the mask
// element for element (the proof property), and the table's runs expand back to it bit
// for bit and classify to the same verdict, or the same error (classify_runs.hpp).
#include <masklens/classify_runs.hpp>
#include <masklens/masklens.hpp>
#include <masklens/span_runs.hpp>

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
  auto table = masklens::scan(*view);
  if (!table) return 0;
  auto verdict = masklens::classify(*table);
  // The runs: exact, and the verdict (or error) of the rows, on the run path held to it.
  auto runs = masklens::SpanRuns::encode(*table);
  if (!runs) __builtin_trap();
  auto back = runs->expand();
  if (!back || back->rows.size() != table->rows.size() ||
      std::memcmp(back->rows.data(), table->rows.data(), table->rows.size() * sizeof(masklens::RowSpan)) != 0)
    __builtin_trap();
  const auto from_runs = masklens::detail::runs::classify_runs(*runs, {0, 64, 1 << 14}, nullptr);
  if (from_runs.ok() != verdict.ok()) __builtin_trap();
  if (!verdict) {
    if (from_runs.status().to_string() != verdict.status().to_string()) __builtin_trap();
    return 0;
  }
  const auto same = [](const masklens::MaskStructure& a, const masklens::MaskStructure& b) {
    return a.batch == b.batch && a.heads == b.heads && a.q_len == b.q_len && a.k_len == b.k_len && a.kind == b.kind &&
           a.alignment == b.alignment && a.window == b.window && a.chunk == b.chunk && a.prefix == b.prefix &&
           a.blocks == b.blocks && a.segments == b.segments && a.kv_valid == b.kv_valid && a.q_valid == b.q_valid &&
           a.empty_rows == b.empty_rows && a.finite_masked_rows == b.finite_masked_rows && a.bias == b.bias;
  };
  if (!same(*from_runs, *verdict)) __builtin_trap();
  if (verdict->kind == masklens::StructureKind::arbitrary) return 0;
  for (std::int64_t r = 0; r < q; ++r)
    for (std::int64_t c = 0; c < k; ++c)
      if (verdict->allows(0, r, c) != masklens::attends(view->at(0, 0, r, c))) __builtin_trap();
  return 0;
}
