// libFuzzer: the .npy reader never crashes; what it accepts scans and classifies.
#include <cstdint>
#include <cstring>
#include <vector>

#include "../../tools/masklens/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::uint64_t> aligned(size / 8 + 1);
  std::memcpy(aligned.data(), data, size);
  auto file = masklens::npy::File::parse(reinterpret_cast<const std::uint8_t*>(aligned.data()), size,
                                         masklens::ElementType::bfloat16);
  if (!file) return 0;
  // Keep the work bounded: the reader has already checked the size against the data.
  const auto& v = file->view;
  if (v.batch() * v.heads() * v.q_len() * v.k_len() > (1 << 20)) return 0;
  auto spans = masklens::scan(v);
  if (spans) (void)masklens::classify(*spans);
  return 0;
}
