// libFuzzer: the .npy reader never crashes; what it accepts scans and classifies.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../../tools/masklens/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::uint64_t> aligned(size / 8 + 1);
  std::memcpy(aligned.data(), data, size);
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(aligned.data());

  // File::open's path: the prefix says how long the header is, then the header alone is
  // parsed against the file's size (the data is never in the buffer the header sits in).
  if (auto data_start = masklens::npy::data_offset(bytes, std::min<std::size_t>(size, 12)); data_start && *data_start <= size) {
    const std::vector<std::uint8_t> header(bytes, bytes + *data_start);
    (void)masklens::npy::parse_header(header.data(), header.size(), size, masklens::ElementType::bfloat16);
  }

  auto file = masklens::npy::File::parse(bytes, size, masklens::ElementType::bfloat16);
  if (!file) return 0;
  // Keep the work bounded: the reader has already checked the size against the data.
  const auto& v = file->view;
  if (v.batch() * v.heads() * v.q_len() * v.k_len() > (1 << 20)) return 0;
  auto spans = masklens::scan(v);
  if (spans) (void)masklens::classify(*spans);
  return 0;
}
