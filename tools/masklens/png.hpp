// A picture of a mask slice (libpng): allowed keys light, masked keys dark, empty rows
// red, kv_valid edges and document edges blue; with a tile summary, partial tiles amber
// and full tiles green. Large masks are downsampled to at most
// `max_side` pixels per side; a pixel's grey level is the share of allowed keys it covers.
#pragma once

#include <png.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <masklens/masklens.hpp>

namespace masklens::picture {

struct Size {
  std::int64_t width = 0, height = 0;
};

inline Size picture_size(const MaskView& v, std::int64_t max_side) {
  const std::int64_t factor = std::max<std::int64_t>(1, (std::max(v.q_len(), v.k_len()) + max_side - 1) / max_side);
  return {(v.k_len() + factor - 1) / factor, (v.q_len() + factor - 1) / factor};
}

// With `tiles`, each pixel is tinted by the state of the tile it falls in (slice [0, 0]):
// partial tiles amber, full tiles green, empty tiles left as they are.
inline Status write_png(const std::string& path, const MaskView& v, const MaskStructure& s,
                        const TileSummary* tiles = nullptr, std::int64_t max_side = 1024) {
  const std::int64_t factor = std::max<std::int64_t>(1, (std::max(v.q_len(), v.k_len()) + max_side - 1) / max_side);
  const Size size = picture_size(v, max_side);
  std::vector<std::uint8_t> rgb(static_cast<std::size_t>(size.width * size.height * 3), 0);
  std::vector<std::int64_t> allowed(static_cast<std::size_t>(size.width));
  for (std::int64_t py = 0; py < size.height; ++py) {
    std::fill(allowed.begin(), allowed.end(), 0);
    bool empty_rows = false;
    const std::int64_t q_end = std::min(v.q_len(), (py + 1) * factor);
    for (std::int64_t q = py * factor; q < q_end; ++q) {
      bool any = false;
      for (std::int64_t k = 0; k < v.k_len(); ++k)
        if (attends(v.at(0, 0, q, k))) {
          ++allowed[static_cast<std::size_t>(k / factor)];
          any = true;
        }
      empty_rows = empty_rows || !any;
    }
    for (std::int64_t px = 0; px < size.width; ++px) {
      const std::int64_t cells = (q_end - py * factor) * (std::min(v.k_len(), (px + 1) * factor) - px * factor);
      const auto level = static_cast<std::uint8_t>(40 + 215 * allowed[static_cast<std::size_t>(px)] / std::max<std::int64_t>(1, cells));
      std::uint8_t* p = &rgb[static_cast<std::size_t>((py * size.width + px) * 3)];
      p[0] = p[1] = p[2] = level;
      if (tiles) {
        const TileState state = tiles->state_at(0, 0, py * factor / tiles->grid.block_q, px * factor / tiles->grid.block_k);
        const auto tint = [&](int r, int g, int b) {  // 40 % of the tint over the grey level
          p[0] = static_cast<std::uint8_t>((3 * level + 2 * r) / 5);
          p[1] = static_cast<std::uint8_t>((3 * level + 2 * g) / 5);
          p[2] = static_cast<std::uint8_t>((3 * level + 2 * b) / 5);
        };
        if (state == TileState::partial) tint(255, 170, 0);
        else if (state == TileState::full) tint(40, 200, 90);
      }
      if (empty_rows) p[0] = 200, p[1] = p[2] = 40;
    }
  }
  // Edges the structure names, on slice 0.
  const auto mark_column = [&](std::int64_t k) {
    const std::int64_t px = std::min(size.width - 1, k / factor);
    for (std::int64_t py = 0; py < size.height; ++py) {
      std::uint8_t* p = &rgb[static_cast<std::size_t>((py * size.width + px) * 3)];
      p[0] = 30, p[1] = 90, p[2] = 230;
    }
  };
  if (s.has_kv_valid()) {
    if (s.kv_valid[0].start > 0) mark_column(s.kv_valid[0].start);
    if (s.kv_valid[0].end < s.k_len) mark_column(s.kv_valid[0].end);
  }
  if (s.has_segments())
    for (std::size_t i = 1; i + 1 < s.segments[0].size(); ++i) mark_column(s.segments[0][i]);

  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return error(ErrorCode::io_error, "cannot write " + path + ": " + std::strerror(errno));
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    std::fclose(f);
    return error(ErrorCode::io_error, "libpng failed writing " + path);
  }
  png_init_io(png, f);
  png_set_IHDR(png, info, static_cast<png_uint_32>(size.width), static_cast<png_uint_32>(size.height), 8,
               PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (std::int64_t y = 0; y < size.height; ++y) png_write_row(png, &rgb[static_cast<std::size_t>(y * size.width * 3)]);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return std::fclose(f) == 0 ? Status{} : error(ErrorCode::io_error, "short write to " + path);
}

// Up to 64x64: '#' attends, '.' masked, one line per query row of slice 0.
inline std::string ascii_preview(const MaskView& v) {
  if (v.q_len() > 64 || v.k_len() > 64) return {};
  std::string out;
  for (std::int64_t q = 0; q < v.q_len(); ++q) {
    out += "  ";
    for (std::int64_t k = 0; k < v.k_len(); ++k) out += attends(v.at(0, 0, q, k)) ? '#' : '.';
    out += '\n';
  }
  return out;
}

}  // namespace masklens::picture
