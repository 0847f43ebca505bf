// .npy files: a strict reader (format versions 1-3; |b1 |u1 |i1 <f2 <f4, and 2-byte
// <u2 / <V2 / |V2 read as bf16 when asked) and a streaming writer for the masks
// `masklens make` produces. Every malformed or truncated file is an error naming what
// is wrong.
//
// The reader copies the data into memory it owns (pread) instead of mapping the file:
// a mapped file that another process truncates raises SIGBUS in whichever scanner
// thread touches the lost pages, and a handler could only recover by remapping the page
// (mmap is not async-signal-safe) or by longjmp out of library frames on a thread the
// CLI does not own, both undefined behaviour. A read that comes up short is an ordinary error, and once read
// the mask cannot change under the scanner. The price is one copy, read by several
// threads (docs/cli.md has what it costs). No MADV_HUGEPAGE on the copy: where the
// kernel compacts memory for it on demand, a fragmented machine stalled for seconds.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <masklens/masklens.hpp>

namespace masklens::npy {

// numpy itself refuses headers over 10000 bytes unless told otherwise; 1 MiB leaves room
// for any real header and keeps a hostile one from being read into memory.
inline constexpr std::size_t kMaxHeaderBytes = std::size_t{1} << 20;

// A file whose size reads as 0 (/proc, /sys) is read as a stream up to this much.
inline constexpr std::size_t kMaxStreamedBytes = std::size_t{64} << 20;

// Page-aligned memory of its own (an anonymous mapping): the data of a File.
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~Buffer() {
    if (data_) munmap(data_, size_);
  }

  static Result<Buffer> allocate(std::size_t bytes) {
    Buffer b;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return error(ErrorCode::out_of_memory, "cannot hold the mask's " + std::to_string(bytes) + " bytes in memory: " +
                                                 std::strerror(errno));
    b.data_ = p;
    b.size_ = bytes;
    return b;
  }

  [[nodiscard]] std::uint8_t* data() const noexcept { return static_cast<std::uint8_t*>(data_); }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

// What a header declares: the element type, the shape and where the data starts.
struct Header {
  std::string descr;
  ElementType dtype = ElementType::boolean;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  // in elements
  std::size_t data_start = 0;         // bytes from the start of the file
  std::uint64_t data_bytes = 0;       // what the shape needs
};

// Where the data starts, from the magic, version and header length; `bytes` holds the
// first `size` bytes of the file (at least 12 where the file has them).
inline Result<std::size_t> data_offset(const std::uint8_t* bytes, std::size_t size) {
  static constexpr char kMagic[] = "\x93NUMPY";
  if (size < 6 || std::memcmp(bytes, kMagic, 6) != 0) return error(ErrorCode::parse_error, "not an .npy file (bad magic)");
  if (size < 10) return error(ErrorCode::parse_error, "truncated header (the file ends inside its version and length)");
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
  if (header_len > kMaxHeaderBytes)
    return error(ErrorCode::parse_error, "header of " + std::to_string(header_len) + " bytes is longer than 1 MiB");
  return header_start + header_len;
}

namespace detail {

// A header's text for a message: printable ASCII as it is, any other byte as \xNN, at
// most 40 characters.
inline std::string printable(std::string_view text) {
  std::string out;
  for (unsigned char ch : text.substr(0, 40)) {
    if (ch >= 0x20 && ch < 0x7f) {
      out += static_cast<char>(ch);
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[ch >> 4];
      out += kHex[ch & 15];
    }
  }
  return text.size() > 40 ? out + "..." : out;
}

// The three fields of a header, each found exactly once.
struct HeaderFields {
  std::optional<std::string> descr;
  std::optional<bool> fortran_order;
  std::optional<std::vector<std::int64_t>> shape;
};

// A descr the reader takes, in each spelling numpy reads on a little-endian host ('?',
// 'b1', '<u1', 'f4', '=f4', 'e', ...: numpy writes |b1 |u1 |i1 <f2 <f4, others write
// these); raw_two_bytes: <u2 / V2, whose type --mask-dtype says (bf16 has no descr).
struct MaskDescr {
  ElementType type;
  bool raw_two_bytes = false;
};

inline std::optional<MaskDescr> mask_descr(std::string_view descr) {
  // One-byte elements have no byte order: any prefix, or none.
  const auto one_byte = [&](std::string_view code, std::string_view letter) {
    if (descr == letter) return true;
    if (!descr.empty() && (descr[0] == '|' || descr[0] == '<' || descr[0] == '>' || descr[0] == '='))
      return descr.substr(1) == code;
    return descr == code;
  };
  // Multi-byte elements: little-endian, or native ('=' or none) where the host is.
  constexpr bool little_host = std::endian::native == std::endian::little;
  const auto little = [&](std::string_view code, std::string_view letter) {
    if (descr.empty()) return false;
    if (descr[0] == '<') return descr.substr(1) == code || descr.substr(1) == letter;
    if (descr[0] == '=') return little_host && (descr.substr(1) == code || descr.substr(1) == letter);
    return little_host && (descr == code || descr == letter);
  };
  if (one_byte("b1", "?")) return MaskDescr{ElementType::boolean};
  if (one_byte("u1", "B")) return MaskDescr{ElementType::uint8};
  if (one_byte("i1", "b")) return MaskDescr{ElementType::int8};
  if (little("f2", "e")) return MaskDescr{ElementType::float16};
  if (little("f4", "f")) return MaskDescr{ElementType::float32};
  if (little("u2", "H") || descr == "|V2" || descr == "V2" || descr == "<V2") return MaskDescr{ElementType::float16, true};
  return std::nullopt;
}

// Reads a header's dict literal as numpy does (ast.literal_eval, then exactly the keys
// descr, fortran_order and shape): quoted keys, a string descr, True or False, a tuple
// of integers, commas, optional trailing commas and white space. A key numpy does not
// write is an error, as numpy makes it; so is a key given twice, which numpy reads as its
// last value: a header that says two things is refused rather than guessed at.
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : text_(text) {}

  Result<HeaderFields> parse() {
    HeaderFields f;
    skip_space();
    if (!take('{')) return unexpected("the header is not a dict: it does not start with '{'");
    for (skip_space(); !peek('}');) {
      auto key = quoted();
      if (!key) return key.status();
      skip_space();
      if (!take(':')) return unexpected("no ':' after the key '" + printable(*key) + "'");
      skip_space();
      if (Status s = value(*key, f); !s.ok()) return s;
      skip_space();
      if (take(',')) skip_space();
      else if (!peek('}')) return unexpected("no ',' or '}' after the value of '" + printable(*key) + "'");
    }
    ++at_;
    skip_space();
    if (at_ != text_.size()) return unexpected("text after the header's dict");
    return f;
  }

 private:
  Status value(const std::string& key, HeaderFields& f) {
    const auto twice = [&] { return error(ErrorCode::parse_error, "header has '" + key + "' twice"); };
    if (key == "descr") {
      if (f.descr) return twice();
      if (peek('['))
        return error(ErrorCode::unsupported_dtype, "descr is a structured dtype (a list of fields), not a mask type");
      auto text = quoted();
      if (!text) return text.status();
      f.descr = std::move(*text);
    } else if (key == "fortran_order") {
      if (f.fortran_order) return twice();
      if (text_.substr(at_).starts_with("True")) f.fortran_order = true, at_ += 4;
      else if (text_.substr(at_).starts_with("False")) f.fortran_order = false, at_ += 5;
      else return error(ErrorCode::parse_error, "'fortran_order' is neither True nor False");
    } else if (key == "shape") {
      if (f.shape) return twice();
      auto dims = tuple();
      if (!dims) return dims.status();
      f.shape = std::move(*dims);
    } else {
      return error(ErrorCode::parse_error, "header has the key '" + printable(key) +
                                               "'; numpy writes exactly 'descr', 'fortran_order' and 'shape'");
    }
    return {};
  }

  // (d0, d1, ...) with a trailing comma allowed, (d0,) for one dim, () for none: (5)
  // is the integer 5 in Python, not a tuple, and numpy refuses it.
  Result<std::vector<std::int64_t>> tuple() {
    const auto not_tuple = [] { return error(ErrorCode::parse_error, "'shape' is not a tuple"); };
    const auto unclosed = [] { return error(ErrorCode::parse_error, "'shape' is not a tuple: its '(' is never closed"); };
    const auto not_integer = [] { return error(ErrorCode::parse_error, "'shape' holds something other than integers"); };
    if (!take('(')) return not_tuple();
    std::vector<std::int64_t> dims;
    bool comma = false;
    for (skip_space(); !take(')');) {
      // A dimension is followed by a comma or the ')'; the dict going on (or the header
      // ending) means the tuple was never closed; a number going on (8.5, 1e3, 8j, 8L) is
      // no integer.
      if (at_ >= text_.size() || peek('}')) return unclosed();
      if (!dims.empty() && !comma) return not_tuple();
      auto d = integer();
      if (!d) return d.status();
      if (at_ < text_.size()) {
        const char c = text_[at_];
        if (c == '.' || c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return not_integer();
      }
      dims.push_back(*d);
      skip_space();
      comma = take(',');
      skip_space();
    }
    if (dims.size() == 1 && !comma) return not_tuple();
    return dims;
  }

  Result<std::int64_t> integer() {
    const bool negative = take('-');
    std::int64_t v = 0;
    std::size_t n = 0;
    for (; at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9'; ++at_, ++n) {
      if (v > (INT64_MAX - 9) / 10) return error(ErrorCode::invalid_shape, "a dimension in 'shape' overflows 64 bits");
      v = v * 10 + (text_[at_] - '0');
    }
    if (n == 0) return error(ErrorCode::parse_error, "'shape' holds something other than integers");
    if (negative && v > 0)
      return error(ErrorCode::invalid_shape, "every dimension must be >= 1, got -" + std::to_string(v));
    return v;
  }

  // A Python string literal in single or double quotes (numpy writes single); escapes
  // are not read, as no key or mask descr has one.
  Result<std::string> quoted() {
    if (at_ >= text_.size() || (text_[at_] != '\'' && text_[at_] != '"'))
      return unexpected("a key or string that is not in quotes");
    const char quote = text_[at_++];
    const std::size_t close = text_.find(quote, at_);
    if (close == std::string_view::npos) return unexpected("a string without its closing quote");
    std::string out(text_.substr(at_, close - at_));
    at_ = close + 1;
    return out;
  }

  Status unexpected(const std::string& what) const {
    return error(ErrorCode::parse_error, "header is not a dict numpy reads: " + what + " at byte " + std::to_string(at_) +
                                             " of the header ('" + printable(text_.substr(std::min(at_, text_.size()))) +
                                             "')");
  }
  void skip_space() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r'))
      ++at_;
  }
  bool peek(char ch) const { return at_ < text_.size() && text_[at_] == ch; }
  bool take(char ch) {
    if (!peek(ch)) return false;
    ++at_;
    return true;
  }

  std::string_view text_;
  std::size_t at_ = 0;
};

}  // namespace detail

// Parses the header held in the first `size` bytes of a file of `file_size` bytes and
// checks that the file holds exactly the data the header declares: a shape that
// accounts for fewer bytes than the file holds is as wrong as one that needs more (a
// [16, 16] header on a 32 x 32 file would read another mask).
inline Result<Header> parse_header(const std::uint8_t* bytes, std::size_t size, std::uint64_t file_size,
                                   std::optional<ElementType> two_byte_as) {
  auto data_start = data_offset(bytes, size);
  if (!data_start) return data_start.status();
  if (*data_start > size) return error(ErrorCode::parse_error, "truncated header");
  Header h;
  h.data_start = *data_start;
  const std::size_t header_start = bytes[6] == 1 ? 10 : 12;
  const std::string_view header(reinterpret_cast<const char*>(bytes + header_start), h.data_start - header_start);
  auto fields = detail::HeaderParser(header).parse();
  if (!fields) return fields.status();

  if (!fields->descr) return error(ErrorCode::parse_error, "header has no 'descr'");
  h.descr = *fields->descr;
  const std::string& descr = h.descr;
  const std::optional<detail::MaskDescr> read = detail::mask_descr(descr);
  if (!read) {
    const bool big_endian = descr.size() > 1 && descr[0] == '>' && descr != ">b1" && descr != ">u1" && descr != ">i1";
    return error(ErrorCode::unsupported_dtype,
                 "descr '" + detail::printable(descr) + "' is not a mask type (|b1 |u1 |i1 <f2 <f4, bf16 as <u2)" +
                     (big_endian ? ": a big-endian array; save it as little-endian (a.astype(a.dtype.newbyteorder('<')))"
                                 : ""));
  }
  if (read->raw_two_bytes) {
    if (!two_byte_as) return error(ErrorCode::unsupported_dtype, "2-byte descr '" + descr + "' needs --mask-dtype bf16");
    h.dtype = *two_byte_as;
  } else if (two_byte_as && !(read->type == ElementType::float16 && *two_byte_as == ElementType::float16)) {
    // --mask-dtype says how to read raw 2-byte elements; a file whose descr names its type
    // would be read as that type, the option silently dropped.
    return error(ErrorCode::invalid_argument, "--mask-dtype applies to raw 2-byte elements (<u2, <V2); the file's descr '" +
                                                  descr + "' already names its type");
  } else {
    h.dtype = read->type;
  }
  if (!fields->fortran_order) return error(ErrorCode::parse_error, "header has no 'fortran_order'");
  const bool fortran = *fields->fortran_order;
  if (!fields->shape) return error(ErrorCode::parse_error, "header has no 'shape'");
  h.shape = std::move(*fields->shape);
  // SDPA takes masks of 2 to 4 dims ([Q, K] at least) and refuses a 1-D one: so does the CLI,
  // rather than advise on a call torch would not run.
  if (h.shape.size() < 2 || h.shape.size() > 4)
    return error(ErrorCode::invalid_shape, "a mask has 2 to 4 dims ([Q, K], [H, Q, K] or [B, H, Q, K]) as SDPA takes it, the file has " +
                                               std::to_string(h.shape.size()));

  const std::int64_t esize = element_size(h.dtype);
  std::int64_t count = 1;
  for (std::int64_t d : h.shape) {
    if (d < 1) return error(ErrorCode::invalid_shape, "every dimension must be >= 1, got " + std::to_string(d));
    if (count > INT64_MAX / d / esize) return error(ErrorCode::invalid_shape, "declared shape overflows 64 bits");
    count *= d;
  }
  h.data_bytes = static_cast<std::uint64_t>(count * esize);
  const std::uint64_t available = file_size - h.data_start;
  if (h.data_bytes != available)
    return error(ErrorCode::parse_error, "header lies about size: shape needs " + std::to_string(h.data_bytes) +
                                             " data bytes, the file has " + std::to_string(available));
  h.strides.resize(h.shape.size());
  std::int64_t running = 1;
  if (fortran) {
    for (std::size_t i = 0; i < h.shape.size(); ++i) h.strides[i] = running, running *= h.shape[i];
  } else {
    for (std::size_t i = h.shape.size(); i-- > 0;) h.strides[i] = running, running *= h.shape[i];
  }
  return h;
}

// Reads exactly `size` bytes at `offset`; a file that ends sooner has shrunk since its
// size was checked (another process truncated it), which is an error, not a crash.
inline Status read_exactly(int fd, std::uint8_t* into, std::size_t size, std::uint64_t offset, const std::string& what) {
  // Linux moves at most ~2 GiB per call.
  constexpr std::size_t kMaxCall = std::size_t{1} << 30;
  std::size_t done = 0;
  while (done < size) {
    const ssize_t got = ::pread(fd, into + done, std::min(size - done, kMaxCall), static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return error(ErrorCode::io_error, "cannot read " + what + ": " + std::strerror(errno));
    if (got == 0)
      return error(ErrorCode::parse_error,
                   what + " ends at byte " + std::to_string(offset + done) + ": the file shrank while being read");
    done += static_cast<std::size_t>(got);
  }
  return {};
}

// read_exactly in parallel slices: copying from the page cache and faulting in the
// destination is CPU work, about 4 GB/s for one core, so a large mask is read by as many
// threads as the scanner will use.
inline Status read_exactly_parallel(int fd, std::uint8_t* into, std::size_t size, std::uint64_t offset,
                                    const std::string& what) {
  constexpr std::size_t kMinSlice = std::size_t{64} << 20, kMaxThreads = 16;
  const std::size_t threads =
      std::min({size / kMinSlice, static_cast<std::size_t>(std::max(1u, std::thread::hardware_concurrency())), kMaxThreads});
  if (threads <= 1) return read_exactly(fd, into, size, offset, what);
  const std::size_t per = (size / threads + 4095) / 4096 * 4096;  // whole pages: no two threads fault one page
  Status results[kMaxThreads];
  Status spawn = catch_alloc([&]() -> Status {
    std::vector<std::jthread> pool;
    pool.reserve(threads);
    for (std::size_t t = 0; t < threads; ++t) {
      const std::size_t begin = std::min(size, t * per), end = t + 1 == threads ? size : std::min(size, begin + per);
      const auto read_slice = [&, t, begin, end] {
        results[t] = read_exactly(fd, into + begin, end - begin, offset + begin, what);
      };
      try {
        pool.emplace_back(read_slice);
      } catch (const std::system_error&) {
        read_slice();  // no thread to be had: read the slice here
      }
    }
    return {};
  });
  if (!spawn.ok()) return spawn;
  for (std::size_t t = 0; t < threads; ++t)
    if (!results[t].ok()) return results[t];
  return {};
}

// An open .npy file: the view of its data, which the File owns.
class File {
 public:
  MaskView view;
  std::vector<std::int64_t> shape;
  std::string descr;

  // Parses a header + data held in memory (the fuzzer's entry point); `bytes` must
  // outlive the File unless the data had to be copied to align it.
  // With `copy`, the File holds a copy of the data and `bytes` may go at once.
  static Result<File> parse(const std::uint8_t* bytes, std::size_t size, std::optional<ElementType> two_byte_as,
                            MaskEncoding encoding = {}, bool copy = false) {
    auto header = parse_header(bytes, size, size, two_byte_as);
    if (!header) return header.status();
    File f;
    const std::uint8_t* data = bytes + header->data_start;
    if (copy || reinterpret_cast<std::uintptr_t>(data) % static_cast<std::uintptr_t>(element_size(header->dtype)) != 0) {
      // A hand-made header may leave the data unaligned: copy it once.
      auto copy = Buffer::allocate(header->data_bytes);
      if (!copy) return copy.status();
      std::memcpy(copy->data(), data, header->data_bytes);
      f.data_ = std::move(*copy);
      data = f.data_.data();
    }
    if (Status s = f.adopt(*header, data, encoding); !s.ok()) return s;
    return f;
  }

  static Result<File> open(const std::string& path, std::optional<ElementType> two_byte_as, MaskEncoding encoding = {}) {
    // O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever before
    // fstat could say it is not a regular file. Regular files ignore the flag.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return error(ErrorCode::io_error, "cannot open " + path + ": " + std::strerror(errno));
    auto f = read_from(fd, two_byte_as, encoding);
    ::close(fd);
    if (!f) return error(f.status().code(), path + ": " + f.status().message());
    return f;
  }

 private:
  static Result<File> read_from(int fd, std::optional<ElementType> two_byte_as,
                                MaskEncoding encoding) {
    struct stat st {};
    if (fstat(fd, &st) != 0) return error(ErrorCode::io_error, std::string("cannot stat: ") + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) return error(ErrorCode::io_error, "not a regular file");
    const auto file_size = static_cast<std::uint64_t>(st.st_size);
    if (file_size == 0) return read_streamed(fd, two_byte_as, encoding);
    // The fixed prefix first: it says how long the header is.
    std::uint8_t prefix[12] = {};
    const auto prefix_size = static_cast<std::size_t>(std::min<std::uint64_t>(file_size, sizeof prefix));
    if (Status s = read_exactly(fd, prefix, prefix_size, 0, "the header"); !s.ok()) return s;
    auto data_start = data_offset(prefix, prefix_size);
    if (!data_start) return data_start.status();
    if (*data_start > file_size) return error(ErrorCode::parse_error, "truncated header");
    std::vector<std::uint8_t> head(*data_start);
    if (Status s = read_exactly(fd, head.data(), head.size(), 0, "the header"); !s.ok()) return s;
    auto header = parse_header(head.data(), head.size(), file_size, two_byte_as);
    if (!header) return header.status();
    auto data = Buffer::allocate(header->data_bytes);
    if (!data) return data.status();
    if (Status s = read_exactly_parallel(fd, data->data(), header->data_bytes, header->data_start, "the data"); !s.ok()) return s;
    File f;
    f.data_ = std::move(*data);
    if (Status s = f.adopt(*header, f.data_.data(), encoding); !s.ok()) return s;
    return f;
  }

  // A regular file whose size stat reports as 0 may hold bytes all the same (/proc,
  // /sys): read as a stream, at most kMaxStreamedBytes, and parsed from memory.
  static Result<File> read_streamed(int fd, std::optional<ElementType> two_byte_as, MaskEncoding encoding) {
    std::vector<std::uint8_t> bytes;
    std::uint8_t chunk[1 << 16];
    for (;;) {
      const ssize_t got = ::read(fd, chunk, sizeof chunk);
      if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (got < 0) return error(ErrorCode::io_error, std::string("cannot read: ") + std::strerror(errno));
      if (got == 0) break;
      if (bytes.size() + static_cast<std::size_t>(got) > kMaxStreamedBytes)
        return error(ErrorCode::parse_error, "its size reads as 0 bytes but it holds more than 64 MiB: not a mask file");
      bytes.insert(bytes.end(), chunk, chunk + got);
    }
    if (bytes.empty()) return error(ErrorCode::parse_error, "empty file, not .npy");
    return parse(bytes.data(), bytes.size(), two_byte_as, encoding, /*copy=*/true);
  }

  Status adopt(Header& header, const std::uint8_t* data, MaskEncoding encoding) {
    auto v = MaskView::make(data, header.dtype, header.shape, header.strides, encoding);
    if (!v) return v.status();
    view = *v;
    shape = std::move(header.shape);
    descr = std::move(header.descr);
    return {};
  }

  Buffer data_;
};

// Writes a C-order .npy (format 1.0, header padded to 64 bytes) as it is produced, so a
// mask of any size needs no buffer of its size. A Writer that is not finished (an
// error on the way) removes what it wrote when that is a regular file.
class Writer {
 public:
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  Writer(Writer&& o) noexcept
      : file_(std::exchange(o.file_, nullptr)), path_(std::move(o.path_)), remove_on_failure_(o.remove_on_failure_) {}
  Writer& operator=(Writer&&) = delete;
  ~Writer() {
    if (!file_) return;
    std::fclose(file_);
    if (remove_on_failure_) std::remove(path_.c_str());
  }

  static Result<Writer> create(const std::string& path, std::string_view descr, std::span<const std::int64_t> shape) {
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
    struct stat st {};
    Writer w(f, path, fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode));
    // Rows may be a few bytes each: a large buffer keeps them from costing a call each.
    (void)std::setvbuf(f, nullptr, _IOFBF, std::size_t{1} << 20);
    const unsigned char prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<unsigned char>(header.size() & 0xff),
                                      static_cast<unsigned char>(header.size() >> 8)};
    if (Status s = w.append(prefix, sizeof prefix); !s.ok()) return s;
    if (Status s = w.append(header.data(), header.size()); !s.ok()) return s;
    return w;
  }

  Status append(const void* data, std::size_t bytes) {
    if (std::fwrite(data, 1, bytes, file_) != bytes)
      return error(ErrorCode::io_error, "cannot write " + path_ + ": " + std::strerror(errno));
    return {};
  }

  // Flushes and closes; the file is complete only when this succeeds.
  Status finish() {
    const bool flushed = std::fflush(file_) == 0;
    const int flush_errno = errno;
    const bool closed = std::fclose(std::exchange(file_, nullptr)) == 0;
    if (flushed && closed) return {};
    if (remove_on_failure_) std::remove(path_.c_str());
    return error(ErrorCode::io_error, "cannot write " + path_ + ": " + std::strerror(flushed ? errno : flush_errno));
  }

 private:
  Writer(std::FILE* f, std::string path, bool remove_on_failure)
      : file_(f), path_(std::move(path)), remove_on_failure_(remove_on_failure) {}

  std::FILE* file_ = nullptr;
  std::string path_;
  bool remove_on_failure_ = false;
};

}  // namespace masklens::npy
