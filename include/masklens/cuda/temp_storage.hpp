// Device storage as the entry points lay it out, for any compiler (the "built without
// CUDA" stubs answer size queries too). CUB's two-phase protocol: a call given no
// temporary storage only says how many bytes it needs, and a call given storage checks
// it holds them. And the blocks the entry points allocate: parts one after another, each
// at a 256-byte boundary (cudaMalloc's alignment, where a kernel's vector loads and
// CUB's storage are at home) unless it asks for less.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "../status.hpp"

namespace masklens::gpu::detail {

inline constexpr std::size_t kStorageAlignment = 256;

// The first multiple of `alignment` (a power of two) at or after n.
[[nodiscard]] constexpr std::size_t align_up(std::size_t n, std::size_t alignment = kStorageAlignment) noexcept {
  return (n + alignment - 1) & ~(alignment - 1);
}

// The first 256-byte boundary at or after p: storage of any address holds `bytes` there
// when it was sized `bytes + kStorageAlignment - 1`.
[[nodiscard]] inline std::uint8_t* align_up(void* p) noexcept {
  return reinterpret_cast<std::uint8_t*>(align_up(reinterpret_cast<std::uintptr_t>(p)));
}

// Parts laid out one after another: add() returns a part's offset, bytes() is where the
// last part ends.
class StorageLayout {
 public:
  std::size_t add(std::size_t part_bytes, std::size_t alignment = kStorageAlignment) noexcept {
    const std::size_t at = align_up(end_, alignment);
    end_ = at + part_bytes;
    return at;
  }
  [[nodiscard]] std::size_t bytes() const noexcept { return end_; }

 private:
  std::size_t end_ = 0;
};

// The size query: where `d_temp_storage` is null, `needed` goes into temp_storage_bytes
// and the call is answered (true); otherwise the call goes on (false).
[[nodiscard]] inline bool answer_size_query(const void* d_temp_storage, std::size_t& temp_storage_bytes,
                                            std::size_t needed) noexcept {
  if (d_temp_storage != nullptr) return false;
  temp_storage_bytes = needed;
  return true;
}

// Storage given with fewer bytes than the size query set.
[[nodiscard]] inline Status check_temp_storage_bytes(std::size_t temp_storage_bytes, std::size_t needed) {
  if (temp_storage_bytes >= needed) return {};
  return error(ErrorCode::invalid_argument, "temp_storage_bytes is " + std::to_string(temp_storage_bytes) +
                                                "; pass what the size query set (" + std::to_string(needed) + ")");
}

}  // namespace masklens::gpu::detail
