// .npy files: a strict reader (format versions 1-3; |b1 |u1 |i1 <f2 <f4, and 2-byte
// <u2 / <V2 / |V2 read as bf16 when asked), memory-mapped so a 4 GiB mask is not
// copied, and a writer for the masks `masklens make` produces. Every malformed or
// truncated file is an error naming what is wrong.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <masklens/masklens.hpp>

namespace masklens::npy {

// An open .npy file: the view of its data (valid while the file lives).
class File {
 public:
  File() = default;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  File(File&& o) noexcept { *this = std::move(o); }
  File& operator=(File&& o) noexcept {
    std::swap(map_, o.map_);
    std::swap(size_, o.size_);
    std::swap(copy_, o.copy_);
    view = o.view;
    shape = std::move(o.shape);
    descr = std::move(o.descr);
    return *this;
  }
  ~File() {
    if (map_) munmap(map_, size_);
  }

  MaskView view;
  std::vector<std::int64_t> shape;
  std::string descr;

  // Parses a header + data held in memory (the fuzzer's entry point); `bytes` must
  // outlive the File.
  static Result<File> parse(const std::uint8_t* bytes, std::size_t size, std::optional<ElementType> two_byte_as,
                            MaskEncoding encoding = {}) {
    File f;
    if (Status s = f.parse_into(bytes, size, two_byte_as, encoding); !s.ok()) return s;
    return f;
  }

  static Result<File> open(const std::string& path, std::optional<ElementType> two_byte_as, MaskEncoding encoding = {}) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return error(ErrorCode::io_error, "cannot open " + path + ": " + std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return error(ErrorCode::io_error, path + " is not a regular file");
    }
    File f;
    f.size_ = static_cast<std::size_t>(st.st_size);
    if (f.size_ == 0) {
      ::close(fd);
      return error(ErrorCode::parse_error, path + ": empty file, not .npy");
    }
    void* map = mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) return error(ErrorCode::io_error, "cannot map " + path + ": " + std::strerror(errno));
    f.map_ = map;
    if (Status s = f.parse_into(static_cast<const std::uint8_t*>(map), f.size_, two_byte_as, encoding); !s.ok())
      return error(s.code(), path + ": " + s.message());
    return f;
  }

 private:
  Status parse_into(const std::uint8_t* bytes, std::size_t size, std::optional<ElementType> two_byte_as,
                    MaskEncoding encoding) {
    static constexpr char kMagic[] = "\x93NUMPY";
    if (size < 10 || std::memcmp(bytes, kMagic, 6) != 0) return error(ErrorCode::parse_error, "not an .npy file (bad magic)");
    const int major = bytes[6];
    std::size_t header_len = 0, header_start = 0;
    if (major == 1) {
      header_len = bytes[8] | (static_cast<std::size_t>(bytes[9]) << 8);
      header_start = 10;
    } else if (major == 2 || major == 3) {
      if (size < 12) return error(ErrorCode::parse_error, "truncated header");
      header_len = bytes[8] | (static_cast<std::size_t>(bytes[9]) << 8) | (static_cast<std::size_t>(bytes[10]) << 16) |
                   (static_cast<std::size_t>(bytes[11]) << 24);
      header_start = 12;
    } else {
      return error(ErrorCode::parse_error, "unsupported .npy format version " + std::to_string(major));
    }
    if (header_len > size - header_start) return error(ErrorCode::parse_error, "truncated header");
    const std::string_view header(reinterpret_cast<const char*>(bytes + header_start), header_len);

    auto descr_text = quoted_value(header, "descr");
    if (!descr_text) return error(ErrorCode::parse_error, "header has no 'descr'");
    descr = std::string(*descr_text);
    ElementType dtype;
    if (descr == "|b1") dtype = ElementType::boolean;
    else if (descr == "|u1") dtype = ElementType::uint8;
    else if (descr == "|i1") dtype = ElementType::int8;
    else if (descr == "<f2") dtype = ElementType::float16;
    else if (descr == "<f4") dtype = ElementType::float32;
    else if (descr == "<u2" || descr == "<V2" || descr == "|V2") {
      if (!two_byte_as) return error(ErrorCode::unsupported_dtype, "2-byte descr '" + descr + "' needs --mask-dtype bf16");
      dtype = *two_byte_as;
    } else {
      return error(ErrorCode::unsupported_dtype, "descr '" + descr + "' is not a mask type (|b1 |u1 |i1 <f2 <f4, bf16 as <u2)");
    }
    const auto fortran_pos = header.find("'fortran_order'");
    if (fortran_pos == std::string_view::npos) return error(ErrorCode::parse_error, "header has no 'fortran_order'");
    const auto after = header.substr(fortran_pos + 15);
    const auto value_at = after.find_first_not_of(": ");
    bool fortran;
    if (value_at != std::string_view::npos && after.substr(value_at, 4) == "True") fortran = true;
    else if (value_at != std::string_view::npos && after.substr(value_at, 5) == "False") fortran = false;
    else return error(ErrorCode::parse_error, "'fortran_order' is neither True nor False");

    const auto shape_pos = header.find("'shape'");
    if (shape_pos == std::string_view::npos) return error(ErrorCode::parse_error, "header has no 'shape'");
    const auto open_paren = header.find('(', shape_pos), close_paren = header.find(')', shape_pos);
    if (open_paren == std::string_view::npos || close_paren == std::string_view::npos || close_paren < open_paren)
      return error(ErrorCode::parse_error, "'shape' is not a tuple");
    shape.clear();
    std::string_view dims = header.substr(open_paren + 1, close_paren - open_paren - 1);
    while (!dims.empty()) {
      const auto start = dims.find_first_not_of(", ");
      if (start == std::string_view::npos) break;
      dims.remove_prefix(start);
      std::int64_t v = 0;
      std::size_t n = 0;
      while (n < dims.size() && dims[n] >= '0' && dims[n] <= '9') {
        if (v > (INT64_MAX - 9) / 10) return error(ErrorCode::invalid_shape, "a dimension in 'shape' overflows 64 bits");
        v = v * 10 + (dims[n++] - '0');
      }
      if (n == 0) return error(ErrorCode::parse_error, "'shape' holds something other than integers");
      shape.push_back(v);
      dims.remove_prefix(n);
    }
    if (shape.empty() || shape.size() > 4)
      return error(ErrorCode::invalid_shape, "a mask has 1 to 4 dims, the file has " + std::to_string(shape.size()));

    const std::size_t data_start = header_start + header_len;
    const std::int64_t esize = element_size(dtype);
    std::int64_t count = 1;
    for (std::int64_t d : shape) {
      if (d < 1) return error(ErrorCode::invalid_shape, "every dimension must be >= 1");
      if (count > INT64_MAX / d / esize) return error(ErrorCode::invalid_shape, "declared shape overflows 64 bits");
      count *= d;
    }
    const auto need = static_cast<std::uint64_t>(count * esize);
    if (need > size - data_start)
      return error(ErrorCode::parse_error, "header lies about size: shape needs " + std::to_string(need) +
                                               " data bytes, the file has " + std::to_string(size - data_start));
    const std::uint8_t* data = bytes + data_start;
    if (reinterpret_cast<std::uintptr_t>(data) % static_cast<std::uintptr_t>(esize) != 0) {
      // A hand-made header may leave the data unaligned: copy it once.
      copy_ = std::make_unique<std::uint64_t[]>(need / 8 + 1);
      std::memcpy(copy_.get(), data, need);
      data = reinterpret_cast<const std::uint8_t*>(copy_.get());
    }
    std::vector<std::int64_t> strides(shape.size());
    std::int64_t running = 1;
    if (fortran) {
      for (std::size_t i = 0; i < shape.size(); ++i) strides[i] = running, running *= shape[i];
    } else {
      for (std::size_t i = shape.size(); i-- > 0;) strides[i] = running, running *= shape[i];
    }
    auto v = MaskView::make(data, dtype, shape, strides, encoding);
    if (!v) return v.status();
    view = *v;
    return {};
  }

  // The string after 'key': '...' in a Python dict literal.
  static std::optional<std::string_view> quoted_value(std::string_view header, std::string_view key) {
    const std::string pattern = "'" + std::string(key) + "'";
    const auto at = header.find(pattern);
    if (at == std::string_view::npos) return std::nullopt;
    const auto open = header.find('\'', at + pattern.size());
    if (open == std::string_view::npos) return std::nullopt;
    const auto close = header.find('\'', open + 1);
    if (close == std::string_view::npos) return std::nullopt;
    return header.substr(open + 1, close - open - 1);
  }

  void* map_ = nullptr;
  std::size_t size_ = 0;
  std::unique_ptr<std::uint64_t[]> copy_;
};

// Writes a C-order .npy (format 1.0, header padded to 64 bytes).
inline Status write(const std::string& path, std::string_view descr, const std::vector<std::int64_t>& shape,
                    const void* data, std::size_t bytes) {
  std::string dims;
  for (std::int64_t d : shape) dims += std::to_string(d) + ", ";
  if (shape.size() > 1) dims.resize(dims.size() - 1);
  std::string header = "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  if (header.size() > 65535) return error(ErrorCode::invalid_shape, "shape too long for an .npy 1.0 header");
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return error(ErrorCode::io_error, "cannot write " + path + ": " + std::strerror(errno));
  const unsigned char prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<unsigned char>(header.size() & 0xff),
                                    static_cast<unsigned char>(header.size() >> 8)};
  const bool ok = std::fwrite(prefix, 1, 10, f) == 10 && std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
                  std::fwrite(data, 1, bytes, f) == bytes;
  if (std::fclose(f) != 0 || !ok) return error(ErrorCode::io_error, "short write to " + path);
  return {};
}

}  // namespace masklens::npy
