// masklens — inspect and explain attention masks.
//   masklens inspect MASK.npy [--json] [call options] [--mask-dtype bf16] [--png FILE] [--device cpu|cuda]
//                             [--tiles N|QxK]
//   masklens policy --structure JSON|@FILE|@- --shape B,H,Q,K [--json] [call options]
//   masklens make KIND --shape B,H,Q,K [params] -o FILE.npy
//   masklens samples DIR            writes a sample mask of every structure and inspects each
//   masklens --version
// Every bad argument is one line on stderr naming the option and exit status 2; a bad
// input (a mask, a structure file) or a resource that runs out is exit status 1
// (docs/cli.md, docs/errors.md).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <masklens/cuda/scan.hpp>
#include <masklens/cuda/tiles.hpp>
#include <masklens/call_args.hpp>
#include <masklens/json.hpp>
#include <masklens/masklens.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "npy.hpp"
#include "png.hpp"

using namespace masklens;

namespace {

// The call options as written: integers are read by parse_integer (exactly, refusing
// what does not fit) and every range is the library's own AttentionCall/Environment
// validate(), so the CLI and the Python package accept the same calls.
// The defaults are the library's own (AttentionCall{}, Environment{}), written once there.
struct CallOptions {
  std::string dtype{to_string(AttentionCall{}.dtype)};
  std::string head_dim = std::to_string(AttentionCall{}.head_dim), heads = std::to_string(AttentionCall{}.heads),
              sm = std::to_string(Environment{}.sm);
  std::optional<std::string> head_dim_v, kv_heads;  // unset: the head dim, the heads
  bool heads_given = false;                          // inspect, policy: unset, the heads follow the mask
  // Set by inspect and policy until the mask's heads are known (match_mask_heads): the
  // default heads are no call yet, so --kv-heads is checked against the mask's instead.
  bool heads_follow_mask = false;
  bool training = false, deterministic = false;
  double dropout = 0;
  std::string torch = Environment{}.torch.to_string(), cudnn = Environment{}.cudnn.to_string();
  std::string available = family_names(Environment{}.available, ",");
  // Each family's library version as written, in kFamilies' order: its default until
  // given (families without a version of their own keep an empty, unused one).
  std::array<std::string, std::size(kFamilies)> versions = [] {
    std::array<std::string, std::size(kFamilies)> v;
    for (std::size_t i = 0; i < v.size(); ++i)
      if (kFamilies[i].version) v[i] = kFamilies[i].default_version.to_string();
    return v;
  }();
};

// An integer option exactly as written: decimal digits after an optional sign. CLI11
// would saturate 99999999999999999999 to 2^63 - 1 and read 0x10 as 16; here anything
// but a decimal integer that fits 64 bits is refused, quoting the text given.
Result<std::int64_t> parse_integer(const std::string& option, const std::string& text) {
  const auto bad = [&] { return error(ErrorCode::invalid_argument, option + " wants an integer, got '" + text + "'"); };
  const std::size_t digits_at = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  if (text.size() == digits_at || text.find_first_not_of("0123456789", digits_at) != std::string::npos) return bad();
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno == ERANGE) return error(ErrorCode::invalid_argument, option + " does not fit 64 bits, got " + text);
  return static_cast<std::int64_t>(v);
}

// The library's field names in a message, as the options that set them.
std::string with_option_names(std::string message) {
  static const std::pair<std::string_view, std::string_view> names[] = {
      {"call.head_dim_v", "--head-dim-v"}, {"call.head_dim", "--head-dim"}, {"call.kv_heads", "--kv-heads"},
      {"call.heads", "--heads"},           {"call.dropout", "--dropout"},   {"environment.sm", "--sm"}};
  for (const auto& [field, option] : names)
    for (std::size_t at; (at = message.find(field)) != std::string::npos;) message.replace(at, field.size(), option);
  return message;
}

// --available: the bits of known family names (kFamilies), none empty (split by hand:
// getline would drop the trailing empty name of "torch,").
Result<std::uint32_t> available_families(const std::string& list) {
  std::uint32_t bits = 0;
  for (std::size_t start = 0;;) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    const std::string item = list.substr(start, comma - start);
    if (item.empty()) return error(ErrorCode::invalid_argument, "--available: empty family name in '" + list + "'");
    const FamilyInfo* family = family_named(item);
    if (!family)
      return error(ErrorCode::invalid_argument, "--available: unknown family '" + item + "' (" + family_names() + ")");
    bits |= family->bit;
    if (comma == list.size()) return bits;
    start = comma + 1;
  }
}

// The call and environment the options describe, checked by the library's validate()
// with the option named in the message: every command runs it before it reads a mask or
// a structure or prints anything.
Result<CallContext> make_call(const CallOptions& o, std::optional<ElementType> mask_dtype) {
  const auto bad = [](const std::string& message) { return error(ErrorCode::invalid_argument, message); };
  CallContext context;
  AttentionCall& c = context.call;
  Environment& e = context.env;
  if (o.dtype == "bf16" || o.dtype == "bfloat16") c.dtype = DType::bfloat16;
  else if (o.dtype == "fp16" || o.dtype == "float16") c.dtype = DType::float16;
  else if (o.dtype == "fp32" || o.dtype == "float32") c.dtype = DType::float32;
  else return bad("--dtype must be bf16, fp16 or fp32, got '" + o.dtype + "'");
  // An option left out is 0 in the call (the head dim, the heads); one given must be >= 1.
  const std::tuple<const char*, const std::string*, std::int64_t*> integers[] = {
      {"--head-dim", &o.head_dim, &c.head_dim},
      {"--head-dim-v", o.head_dim_v ? &*o.head_dim_v : nullptr, &c.head_dim_v},
      {"--heads", &o.heads, &c.heads},
      {"--kv-heads", o.kv_heads ? &*o.kv_heads : nullptr, &c.kv_heads}};
  for (const auto& [option, text, into] : integers) {
    if (!text) continue;
    auto v = parse_integer(option, *text);
    if (!v) return v.status();
    if (*v < 1) return bad(std::string(option) + " must be >= 1, got " + *text);
    *into = *v;
  }
  // Heads that will follow the mask are no call yet: the kv heads are checked against the
  // mask's (match_mask_heads), so stand them in for the heads until then.
  if (o.heads_follow_mask && !o.heads_given && o.kv_heads) c.heads = c.kv_heads;
  if (o.kv_heads && c.heads % c.kv_heads != 0)
    return bad("--kv-heads must divide --heads (" + std::to_string(c.heads) + "), got " + *o.kv_heads);
  auto sm = parse_integer("--sm", o.sm);
  if (!sm) return sm.status();
  e.sm = static_cast<int>(std::clamp<std::int64_t>(*sm, INT32_MIN, INT32_MAX));
  if (e.sm != *sm) return bad("--sm must be a compute capability major*10+minor from 10 to 129, got " + o.sm);
  c.training = o.training;
  c.deterministic = o.deterministic;
  c.dropout = o.dropout;
  c.mask_dtype = mask_dtype;
  std::vector<std::tuple<std::string_view, const std::string*, Version*>> versions = {{"--torch", &o.torch, &e.torch},
                                                                                     {"--cudnn", &o.cudnn, &e.cudnn}};
  for (std::size_t i = 0; i < std::size(kFamilies); ++i)
    if (kFamilies[i].version) versions.emplace_back(kFamilies[i].version_option, &o.versions[i], &(e.*kFamilies[i].version));
  for (const auto& [option, text, into] : versions) {
    auto v = Version::parse(*text);
    if (!v) return bad(std::string(option) + ": " + v.status().message());
    *into = *v;
  }
  auto available = available_families(o.available);
  if (!available) return available.status();
  e.available = *available;
  // A library's version counts only where it is installed: the rest stay unknown.
  for (const FamilyInfo& f : kFamilies)
    if (f.version && !e.has(f.bit)) e.*f.version = Version{};
  if (Status s = c.validate(); !s.ok()) return bad(with_option_names(s.message()));
  if (Status s = e.validate(); !s.ok()) return bad(with_option_names(s.message()));
  return context;
}

Status validate_call_options(const CallOptions& o) { return make_call(o, std::nullopt).status(); }

void add_call_options(CLI::App& app, CallOptions& o) {
  app.add_option("--dtype", o.dtype, "q/k/v dtype: bf16, fp16, fp32")->capture_default_str()->group("Call");
  app.add_option("--head-dim", o.head_dim, "head dim of q/k (and v)")->capture_default_str()->group("Call");
  app.add_option_function<std::string>("--head-dim-v", [&o](const std::string& v) { o.head_dim_v = v; },
                                       "head dim of v (default: head dim)")->group("Call");
  app.add_option_function<std::string>("--heads", [&o](const std::string& v) { o.heads = v, o.heads_given = true; },
                                       "query heads (default " + std::to_string(AttentionCall{}.heads) + "; inspect: the mask's heads)")->group("Call");
  app.add_option_function<std::string>("--kv-heads", [&o](const std::string& v) { o.kv_heads = v; },
                                       "key/value heads (default: heads)")->group("Call");
  app.add_flag("--training", o.training, "a backward pass follows")->group("Call");
  app.add_flag("--deterministic", o.deterministic, "torch.use_deterministic_algorithms(True)")->group("Call");
  app.add_option("--dropout", o.dropout, "dropout probability")->capture_default_str()->group("Call");
  app.add_option("--sm", o.sm, "GPU compute capability, major*10+minor")->capture_default_str()->group("Call");
  app.add_option("--torch", o.torch, "torch version")->capture_default_str()->group("Call");
  app.add_option("--cudnn", o.cudnn, "cuDNN version")->capture_default_str()->group("Call");
  app.add_option("--available", o.available, "backend families installed: " + family_names())
      ->capture_default_str()->group("Call");
  for (std::size_t i = 0; i < std::size(kFamilies); ++i)
    if (const FamilyInfo& f = kFamilies[i]; f.version)
      app.add_option(std::string(f.version_option), o.versions[i], std::string(f.library) + " version")
          ->capture_default_str()->group("Versions");
}

// Indents every line of a snippet under the "call" column.
std::string indented(const std::string& code) {
  std::string out = "          ";
  for (char ch : code) {
    out += ch;
    if (ch == '\n') out += "          ";
  }
  return out;
}

void print_policy(const Policy& p, const MaskStructure& s, std::optional<ElementType> mask_dtype) {
  std::printf("call      %s (mask %s%s)  estimated %s\n", std::string(to_string(p.backend())).c_str(),
              std::string(to_string(p.call.mask)).c_str(),
              p.call.mask_cast ? (", cast to " + std::string(to_string(*p.call.mask_cast))).c_str() : "",
              format_ms(p.cost_ms).c_str());
  if (p.plan.empty()) {
    std::printf("%s\n", indented(python_call(p.call, s.batch, s.q_len, s.k_len, mask_dtype, &s)).c_str());
  } else {
    std::printf("          a plan of %zu calls, each on q[b:b+1, :, q_range] and k/v[b:b+1, :, k_range]:\n", p.plan.size());
    for (std::size_t i = 0; i < p.plan.size() && i < 8; ++i) {
      const PlanStep& st = p.plan[i];
      std::printf("          # b=%lld q[%lld:%lld] k[%lld:%lld]\n%s\n", static_cast<long long>(st.batch),
                  static_cast<long long>(st.q_range.start), static_cast<long long>(st.q_range.end),
                  static_cast<long long>(st.k_range.start), static_cast<long long>(st.k_range.end),
                  indented(python_call(st.call, 1, st.q_range.end - st.q_range.start,
                                            st.k_range.end - st.k_range.start, mask_dtype)).c_str());
    }
    if (p.plan.size() > 8) std::printf("          # ... %zu more\n", p.plan.size() - 8);
  }
  for (const Hazard& h : p.hazards)
    std::printf("hazard    %s: %s\n", std::string(to_string(h.kind)).c_str(), h.detail.c_str());
  std::string unavailable;
  for (const Rejection& r : p.rejected) {
    if (r.kind == RejectionKind::unavailable) {
      unavailable += (unavailable.empty() ? "" : ", ") + std::string(to_string(r.backend));
      continue;
    }
    std::printf("rejected  %s: %s  [%s]\n", std::string(to_string(r.backend)).c_str(), r.reason().c_str(), std::string(r.source).c_str());
  }
  if (!unavailable.empty()) std::printf("rejected  not available (--available): %s\n", unavailable.c_str());
}

int fail(const Status& s) {
  std::fprintf(stderr, "masklens: %s\n", s.to_string().c_str());
  return s.code() == ErrorCode::invalid_argument ? 2 : 1;
}

// A bad input file: exit status 1 whatever the code (a structure file whose window is 0
// is invalid_argument, but the command line that named it is fine).
int fail_input(const Status& s) {
  fail(s);
  return 1;
}

int bad_argument(const std::string& message) { return fail(error(ErrorCode::invalid_argument, message)); }

Result<std::vector<std::int64_t>> parse_shape(const std::string& text) {
  std::vector<std::int64_t> shape;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    try {
      std::size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size() || v < 1) throw std::invalid_argument(item);
      shape.push_back(v);
    } catch (const std::exception&) {
      return error(ErrorCode::invalid_argument, "--shape wants B,H,Q,K with integers >= 1, got '" + text + "'");
    }
  }
  if (shape.size() != 4 || text.back() == ',')
    return error(ErrorCode::invalid_argument, "--shape wants four numbers B,H,Q,K, got '" + text + "'");
  return shape;
}

// --masked-threshold as the float the scanner compares with: finite and negative
// once rounded to float32, so -1e-46 (which rounds to -0) and -1e39 (to -inf) are
// refused here, quoting the text given, not after the mask is read.
Result<float> parse_threshold(const std::string& text) {
  const auto bad = [&] {
    return error(ErrorCode::invalid_argument,
                 "--masked-threshold must be finite and negative as a float32 (-3.4e38 to -1.4e-45), got " + text);
  };
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return bad();
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v) || std::fabs(v) > std::numeric_limits<float>::max()) return bad();
  const auto as_float = static_cast<float>(v);
  if (!(as_float < 0)) return bad();
  return as_float;
}

// inspect's own options, checked before the mask is read.
Status validate_inspect_options(const std::string& mask_dtype, const std::string& device, const std::string& threshold) {
  if (!mask_dtype.empty() && mask_dtype != "bf16" && mask_dtype != "fp16")
    return error(ErrorCode::invalid_argument, "--mask-dtype must be bf16 or fp16, got '" + mask_dtype + "'");
  if (device != "cpu" && device != "cuda")
    return error(ErrorCode::invalid_argument, "--device must be cpu or cuda, got '" + device + "'");
  return parse_threshold(threshold).status();
}

// SDPA broadcasts a mask's heads only from 1, so a mask of H heads is a call of H
// heads: without --heads the call takes the mask's; a --heads that differs, or a
// --kv-heads that does not divide the mask's heads, is refused naming both.
Status match_mask_heads(CallOptions& o, std::int64_t mask_heads, const std::string& path) {
  o.heads_follow_mask = false;  // the call's heads are settled here
  if (mask_heads == 1) return {};
  // The options were checked before the mask was read: these parse.
  const auto number = [](const std::string& text) {
    auto v = parse_integer("", text);
    return v ? *v : 1;
  };
  const std::string heads = std::to_string(mask_heads);
  if (o.heads_given && number(o.heads) != mask_heads)
    return error(ErrorCode::invalid_argument,
                 "--heads " + o.heads + " does not match the " + heads + " heads of " + path +
                     " (a mask's heads broadcast only from 1; leave --heads out to take the mask's)");
  if (o.kv_heads && mask_heads % number(*o.kv_heads) != 0)
    return error(ErrorCode::invalid_argument,
                 "--kv-heads " + *o.kv_heads + " does not divide the " + heads + " heads of " + path);
  o.heads = heads;
  return {};
}

// An error about the mask's contents (NaN, a malformed span) names the file, as the
// reader's own errors do.
Status about_file(const std::string& path, const Status& s) { return error(s.code(), path + ": " + s.message()); }

// --tiles N (N x N) or QxK: query rows x keys per tile, each an integer >= 1.
Result<TileSize> parse_tiles(const std::string& text) {
  const auto bad = [&] {
    return error(ErrorCode::invalid_argument,
                 "--tiles wants a tile size N or QxK (query rows x keys), integers >= 1, got '" + text + "'");
  };
  const auto number = [](const std::string& digits) -> std::int64_t {
    if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoll(digits);
  };
  const std::size_t x = text.find('x');
  const std::int64_t q = number(text.substr(0, x));
  const std::int64_t k = x == std::string::npos ? q : number(text.substr(x + 1));
  if (q < 1 || k < 1) return bad();
  return TileSize{q, k};
}

// The tile summary inspect reports and, for an arbitrary mask, charges flex on (--tiles).
struct InspectTiles {
  std::optional<TileSize> requested;  // --tiles
  std::optional<TileSummary> summary;
};

int inspect_file(const std::string& path, const std::string& mask_dtype, const std::string& png, const std::string& device,
                 const std::string& threshold_text, bool json, CallOptions call_options, InspectTiles tiles = {}) {
  std::optional<ElementType> two_byte;
  if (mask_dtype == "bf16") two_byte = ElementType::bfloat16;
  else if (mask_dtype == "fp16") two_byte = ElementType::float16;
  else if (!mask_dtype.empty()) return fail(error(ErrorCode::invalid_argument, "--mask-dtype must be bf16 or fp16"));
  auto threshold = parse_threshold(threshold_text);
  if (!threshold) return fail(threshold.status());
  MaskEncoding enc;
  enc.masked_threshold = *threshold;
  auto file = npy::File::open(path, two_byte, enc);
  if (!file) return fail(file.status());
  const MaskView& view = file->view;
  if (Status s = match_mask_heads(call_options, view.heads(), path); !s.ok()) return fail(s);
  Result<SpanTable> spans = error(ErrorCode::invalid_argument, "--device must be cpu or cuda, got " + device);
  // Threads as the Python package chooses them (scan_threads.hpp): one below
  // kThreadedScanBytes of distinct mask, where starting threads costs more than it saves.
  const ScanOptions threads = scan_options_for(view);
  if (device == "cpu" && tiles.requested) {
    // The spans and the tiles from one read of the mask.
    auto both = scan_with_tiles(view, *tiles.requested, threads);
    if (!both) return fail(about_file(path, both.status()));
    spans = std::move(both->spans);
    tiles.summary = std::move(both->tiles);
  } else if (device == "cpu") {
    spans = scan(view, threads);
  } else if (device == "cuda" && tiles.requested) {
    // The spans and the tiles from one read of the mask on the device.
    auto both = gpu::scan_host_mask_with_tiles(view, *tiles.requested);
    if (!both) return fail(about_file(path, both.status()));
    spans = std::move(both->spans);
    tiles.summary = std::move(both->tiles);
  } else if (device == "cuda") {
    spans = gpu::scan_host_mask(view);
  }
  if (!spans) return fail(about_file(path, spans.status()));
  auto verdict = classify(*spans);
  if (!verdict) return fail(about_file(path, verdict.status()));
  if (tiles.requested) {
    // An arbitrary mask is charged for flex on its tiles (an exact structure's follow
    // from its fields).
    if (verdict->kind == StructureKind::arbitrary) verdict->tile_fractions = tiles.summary->fractions();
  }
  auto call = make_call(call_options, view.dtype());
  if (!call) return fail(call.status());
  call->call.batch = view.batch();
  auto policy = decide(*verdict, call->call, call->env);
  const TileSummary* shown = tiles.summary ? &*tiles.summary : nullptr;
  if (!png.empty())
    if (Status s = picture::write_png(png, view, *verdict, shown); !s.ok()) return fail(s);
  if (json) {
    nlohmann::json doc = to_json(*verdict, policy ? &*policy : nullptr);
    if (shown) {
      auto tensors = block_mask_tensors(*shown);
      if (!tensors) return fail(tensors.status());
      doc["tiles"] = to_json(*tensors, shown->tally());
    }
    std::cout << doc.dump(2) << "\n";
    return policy ? 0 : fail(policy.status());
  }
  std::printf("mask      %s  [%lld, %lld, %lld, %lld] %s  (scanned on %s)\n", path.c_str(),
              static_cast<long long>(view.batch()), static_cast<long long>(view.heads()),
              static_cast<long long>(view.q_len()), static_cast<long long>(view.k_len()),
              std::string(to_string(view.dtype())).c_str(), device == "cuda" ? "the GPU" : "the CPU");
  std::fputs(picture::ascii_preview(view).c_str(), stdout);
  std::printf("structure %s\n", describe(*verdict).c_str());
  if (shown) {
    const TileTally t = shown->tally();
    std::printf("tiles     %lldx%lld: %lld empty, %lld partial, %lld full (of %lld, over %lld stored slices)\n",
                static_cast<long long>(shown->grid.block_q), static_cast<long long>(shown->grid.block_k),
                static_cast<long long>(t.empty), static_cast<long long>(t.partial), static_cast<long long>(t.full),
                static_cast<long long>(t.total()), static_cast<long long>(shown->grid.slices()));
  }
  if (!policy) return fail(policy.status());
  print_policy(*policy, *verdict, view.dtype());
  return 0;
}

// A structure is a few kilobytes even with per-batch lists for a large batch; reading
// more than this from @FILE (or stdin) means the file is something else (/dev/zero, a
// mask), so the read stops instead of filling memory.
constexpr std::size_t kMaxStructureBytes = std::size_t{64} << 20;

// The text of --structure @FILE (@- is stdin), at most kMaxStructureBytes. Pipes and
// process substitution (@<(jq ...)) are read like files, under the same cap.
Result<std::string> read_structure_file(const std::string& name) {
  const bool from_stdin = name == "-";
  const int fd = from_stdin ? STDIN_FILENO : ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return error(ErrorCode::io_error, "cannot open " + name + ": " + std::strerror(errno));
  struct stat st {};
  const bool directory = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
  std::string text;
  Status status;
  if (directory) status = error(ErrorCode::io_error, name + " is a directory");
  char chunk[1 << 16];
  while (status.ok()) {
    const ssize_t got = ::read(fd, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) status = error(ErrorCode::io_error, "cannot read " + name + ": " + std::strerror(errno));
    else if (got == 0) break;
    else if (text.size() + static_cast<std::size_t>(got) > kMaxStructureBytes)
      status = error(ErrorCode::parse_error, name + " holds more than 64 MiB, which is no structure");
    else text.append(chunk, static_cast<std::size_t>(got));
  }
  if (!from_stdin) ::close(fd);
  if (!status.ok()) return status;
  return text;
}

// A structure JSON nested deeper than this is not one (the deepest, segments, is 3); the
// parser drops what lies deeper, so "[[[[..." costs no memory per level.
constexpr int kMaxStructureDepth = 16;

// JSON text as a structure reads it: nested at most kMaxStructureDepth deep, and no
// object holding a key twice (the parser would keep the last and drop the first
// without a word, as a .npy header with two 'shape's would be read).
Result<nlohmann::json> parse_structure_json(const std::string& text) {
  bool too_deep = false;
  std::optional<std::string> repeated_key;
  std::vector<std::vector<std::string>> keys_at_depth;  // the keys seen so far in the open object at each depth
  // The key whose value is being read at each depth (empty once it is read): where the
  // text stops being JSON (a number that overflows a double, 1e400), the field is named.
  std::vector<std::string> open_key;
  const nlohmann::json::parser_callback_t keep = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& value) {
    using Event = nlohmann::json::parse_event_t;
    if (depth > kMaxStructureDepth) too_deep = true;
    const auto level = static_cast<std::size_t>(depth);
    if (event == Event::object_start && depth < kMaxStructureDepth) {
      if (keys_at_depth.size() <= level + 1) keys_at_depth.resize(level + 2);
      keys_at_depth[level + 1].clear();  // objects at one depth come one after the other
    } else if (event == Event::key && level < keys_at_depth.size() && value.is_string()) {
      auto& seen = keys_at_depth[level];
      const std::string& key = value.get_ref<const std::string&>();
      if (std::find(seen.begin(), seen.end(), key) != seen.end() && !repeated_key) repeated_key = key;
      seen.push_back(key);
    }
    if (depth <= kMaxStructureDepth) {
      if (open_key.size() <= level) open_key.resize(level + 1);
      if (event == Event::key && value.is_string()) open_key[level] = value.get<std::string>();
      else if (event == Event::value || event == Event::object_end || event == Event::array_end) open_key[level].clear();
    }
    return depth <= kMaxStructureDepth;
  };
  // The parser takes a NUL byte for the end of the text and would read what precedes it.
  if (const auto nul = text.find('\0'); nul != std::string::npos)
    return error(ErrorCode::parse_error, "not valid JSON: a NUL byte at byte " + std::to_string(nul));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text, keep, /*allow_exceptions=*/true);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann's own words past its "[json.exception.…] " tag, and the field being read.
    std::string what = e.what();
    if (const auto tag = what.find("] "); what.rfind("[json.exception.", 0) == 0 && tag != std::string::npos)
      what.erase(0, tag + 2);
    std::string field;
    for (const std::string& key : open_key)
      if (!key.empty()) field += (field.empty() ? "" : ".") + key;
    static constexpr std::string_view kDocumentKeys[] = {"schema", "shape", "structure", "policy", "tiles"};
    const bool document_key = std::find(std::begin(kDocumentKeys), std::end(kDocumentKeys),
                                        field.substr(0, field.find('.'))) != std::end(kDocumentKeys);
    if (!field.empty() && !document_key) field = "structure." + field;
    return error(ErrorCode::parse_error, "not valid JSON: " + detail::printable(what) +
                                             (field.empty() ? "" : " (the value of " + detail::printable(field) + ")"));
  }
  if (j.is_discarded()) return error(ErrorCode::parse_error, "not valid JSON");
  if (too_deep) return error(ErrorCode::parse_error, "JSON nested deeper than " + std::to_string(kMaxStructureDepth) + " levels");
  if (repeated_key)
    return error(ErrorCode::parse_error, "a JSON object has the key '" + detail::printable(*repeated_key) + "' twice");
  return j;
}

// Shape and parameters of `make`.
struct MakeOptions {
  std::string kind, shape = "1,1,256,256", output, dtype = "bool", segments, kv_valid, q_valid, blocks;
  std::string alignment;  // empty: not given (top_left for the causal kinds; full takes none)
  std::optional<std::string> window, chunk, prefix;  // as written: parse_integer reads them
};

// The library names a structure's fields (structure.kv_valid); for make they are the
// options that set them.
std::string with_make_option_names(const std::string& message) {
  static const std::pair<std::string_view, std::string_view> names[] = {
      {"structure.kind", "KIND"},          {"structure.alignment", "--alignment"}, {"structure.window", "--window"},
      {"structure.chunk", "--chunk"},      {"structure.prefix", "--prefix"},       {"structure.blocks", "--blocks"},
      {"structure.kv_valid", "--kv-valid"}, {"structure.q_valid", "--q-valid"}, {"structure.segments", "--segments"}};
  for (const auto& [field, option] : names)
    if (message.starts_with(field)) return std::string(option) + message.substr(field.size());
  // Shape rules name the structure's dimensions: for make they are --shape.
  if (message.starts_with("structure ")) return "--shape: " + message;
  return message;
}

// Every error of make is about its command line: exit status 2, naming the option.
Result<MaskStructure> structure_from(const MakeOptions& m) {
  auto shape = parse_shape(m.shape);
  if (!shape) return shape.status();
  nlohmann::json j;
  j["kind"] = m.kind;
  if (!m.alignment.empty()) j["alignment"] = m.alignment;
  for (const auto& [option, text, key] : {std::tuple{"--window", &m.window, "window"},
                                          {"--chunk", &m.chunk, "chunk"},
                                          {"--prefix", &m.prefix, "prefix"}}) {
    if (!*text) continue;
    auto v = parse_integer(option, **text);
    if (!v) return v.status();
    j[key] = *v;
  }
  for (const auto& [option, text, key] : {std::tuple{"--blocks", &m.blocks, "blocks"},
                                          {"--segments", &m.segments, "segments"},
                                          {"--kv-valid", &m.kv_valid, "kv_valid"},
                                          {"--q-valid", &m.q_valid, "q_valid"}}) {
    if (text->empty()) continue;
    j[key] = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (j[key].is_discarded()) return error(ErrorCode::invalid_argument, std::string(option) + " wants JSON, got '" + *text + "'");
  }
  const auto& s = *shape;
  auto structure = structure_from_json(j, s[0], s[1], s[2], s[3]);
  if (!structure) return error(ErrorCode::invalid_argument, with_make_option_names(structure.status().message()));
  // A parameter the kind does not use would be silently dropped: say so instead.
  for (const auto& [given, option, kind] : {std::tuple{m.window.has_value(), "--window", StructureKind::sliding_window},
                                            {m.chunk.has_value(), "--chunk", StructureKind::chunked},
                                            {m.prefix.has_value(), "--prefix", StructureKind::prefix_lm},
                                            {!m.blocks.empty(), "--blocks", StructureKind::causal_blocks}})
    if (given && structure->kind != kind)
      return error(ErrorCode::invalid_argument, std::string(option) + " applies to " + std::string(to_string(kind)) +
                                                    ", not " + m.kind);
  if (structure->kind == StructureKind::arbitrary)
    return error(ErrorCode::invalid_argument, "make cannot draw an arbitrary mask");
  return structure;
}

// How make stores an element that attends and one that is masked (little-endian).
struct MakeEncoding {
  std::string_view descr;
  std::vector<std::uint8_t> attend, masked;
};

Result<MakeEncoding> make_encoding(const std::string& dtype) {
  if (dtype == "bool") return MakeEncoding{"|b1", {1}, {0}};
  if (dtype == "bf16") return MakeEncoding{"<u2", {0, 0}, {0x7f, 0xff}};               // 0, bf16 lowest (-3.39e38)
  if (dtype == "fp32") return MakeEncoding{"<f4", {0, 0, 0, 0}, {0, 0, 0x80, 0xff}};  // 0, -inf
  return error(ErrorCode::invalid_argument, "--mask-dtype for make must be bool, bf16 or fp32, got '" + dtype + "'");
}

// Refuses up front a mask the output's file system cannot hold, rather than failing
// after writing gigabytes. A device or pipe (-o /dev/stdout) takes what it takes.
Status check_room(const std::string& path, std::uint64_t bytes) {
  struct stat st {};
  std::uint64_t freed = 0;
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) return {};
    freed = static_cast<std::uint64_t>(st.st_blocks) * 512;  // overwriting the file frees what it holds
  }
  std::string folder = std::filesystem::path(path).parent_path().string();
  if (folder.empty()) folder = ".";
  struct statvfs fs {};
  if (statvfs(folder.c_str(), &fs) != 0) return {};  // the open that follows names what is wrong
  const std::uint64_t blocks = fs.f_bavail, block = fs.f_frsize ? fs.f_frsize : fs.f_bsize;
  const std::uint64_t available = blocks > UINT64_MAX / std::max<std::uint64_t>(block, 1) ? UINT64_MAX : blocks * block;
  if (bytes > available && bytes - available > freed)
    return error(ErrorCode::io_error, path + " would take " + std::to_string(bytes) + " bytes; its file system has " +
                                          std::to_string(available) + " free");
  return {};
}

// Writes the mask row by row as it is rendered, so memory stays a few blocks whatever
// the shape; the heads are written out (a real [B, H, Q, K] file), not broadcast.
Status write_mask(const std::string& path, const MaskStructure& s, const std::string& dtype) {
  auto encoding = make_encoding(dtype);
  if (!encoding) return encoding.status();
  const auto esize = static_cast<std::int64_t>(encoding->attend.size());
  std::int64_t elements = s.batch;
  for (std::int64_t d : {s.heads, s.q_len, s.k_len, esize}) {
    if (elements > INT64_MAX / d)
      return error(ErrorCode::invalid_argument, "--shape: the mask would take more than 2^63 bytes");
    elements *= d;
  }
  const auto bytes = static_cast<std::uint64_t>(elements);
  if (Status room = check_room(path, bytes); !room.ok()) return room;
  const std::vector<std::int64_t> shape{s.batch, s.heads, s.q_len, s.k_len};
  auto writer = npy::Writer::create(path, encoding->descr, shape);
  if (!writer) return writer.status();
  // A block of each value, repeated for runs longer than it.
  const std::int64_t block_elements = std::min<std::int64_t>(s.k_len, std::int64_t{1} << 16);
  std::vector<std::uint8_t> attend_block, masked_block;
  for (std::int64_t i = 0; i < block_elements; ++i) {
    attend_block.insert(attend_block.end(), encoding->attend.begin(), encoding->attend.end());
    masked_block.insert(masked_block.end(), encoding->masked.begin(), encoding->masked.end());
  }
  const auto run = [&](const std::vector<std::uint8_t>& block, std::int64_t count) -> Status {
    for (; count > 0; count -= block_elements)
      if (Status st = writer->append(block.data(), static_cast<std::size_t>(std::min(count, block_elements) * esize)); !st.ok())
        return st;
    return {};
  };
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads; ++h)
      for (std::int64_t q = 0; q < s.q_len; ++q) {
        const RowSpan r = s.row(b, q);
        const std::int64_t first = r.empty() ? s.k_len : r.first, last = r.empty() ? s.k_len - 1 : r.last;
        Status st = run(masked_block, first);
        if (st.ok()) st = run(attend_block, last - first + 1);
        if (st.ok()) st = run(masked_block, s.k_len - 1 - last);
        if (!st.ok()) return st;
      }
  return writer->finish();
}

constexpr const char* kCommands = "inspect, policy, make, samples";

// An argument that reads as an option but names no option of the command and looks
// like a file ("-dash.npy" or any existing file): CLI11 takes it for an option, so the
// file is "missing". Returns it, for a hint, or nothing.
std::optional<std::string> file_taken_for_option(const CLI::App& command, int argc, char** argv) {
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    const std::string name = arg.substr(0, arg.find('='));
    if (command.get_option_no_throw(name) != nullptr || name == "-h" || name == "--help") continue;
    struct stat st {};
    if (arg.ends_with(".npy") || ::stat(arg.c_str(), &st) == 0) return arg;
  }
  return std::nullopt;
}

// CLI11's own errors as one line (its usual answer adds a help hint on a second line and
// exits 104-109): the message, naming the option, and how to get help.
int usage_error(const CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  std::string command = "masklens";
  for (const CLI::App* sub : app.get_subcommands()) command += " " + sub->get_name();
  std::string message = e.what();
  std::replace(message.begin(), message.end(), '\n', ' ');
  const auto subs = app.get_subcommands();
  if (const auto file = subs.empty() ? std::nullopt : file_taken_for_option(*subs.front(), argc, argv))
    message += "; to read a file whose name starts with '-', write -- before it or ./" + *file;
  return bad_argument(message + " (see " + command + " --help)");
}

// One setup / run pair per command: setup_X adds the command and its options to the
// app, writing into X's options; run_X runs it once the command line has parsed.

struct InspectCommand {
  std::string path, mask_dtype, png, device = "cpu", threshold = "-1000", tiles;
  bool json = false;
  CallOptions call;
};

CLI::App* setup_inspect(CLI::App& app, InspectCommand& o) {
  CLI::App* cmd = app.add_subcommand("inspect", "the structure of a .npy mask and the call to make");
  cmd->add_option("mask", o.path, "mask .npy file (1-4 dims; 2-D is [Q, K])")->required();
  cmd->add_flag("--json", o.json, "the JSON contract (docs/json.md)");
  cmd->add_option("--mask-dtype", o.mask_dtype, "how to read a 2-byte mask stored as <u2/<V2: bf16 or fp16");
  cmd->add_option("--png", o.png, "write a picture of slice [0, 0]");
  cmd->add_option("--device", o.device, "scan on cpu or cuda")->capture_default_str();
  cmd->add_option("--masked-threshold", o.threshold, "additive values <= this are masked")->capture_default_str();
  cmd->add_option("--tiles", o.tiles,
                  "tile summary at N x N or QxK tiles (torch BlockMask tensors in the JSON; shaded in the PNG)");
  add_call_options(*cmd, o.call);
  return cmd;
}

int run_inspect(const CLI::App& cmd, InspectCommand& o) {
  o.call.heads_follow_mask = true;
  if (Status s = validate_call_options(o.call); !s.ok()) return fail(s);
  if (Status s = validate_inspect_options(o.mask_dtype, o.device, o.threshold); !s.ok()) return fail(s);
  InspectTiles tiles;
  if (!o.tiles.empty() || cmd.count("--tiles") > 0) {
    auto size = parse_tiles(o.tiles);
    if (!size) return fail(size.status());
    tiles.requested = *size;
  }
  return inspect_file(o.path, o.mask_dtype, o.png, o.device, o.threshold, o.json, o.call, tiles);
}

struct PolicyCommand {
  std::string structure, shape, mask_dtype;
  bool json = false;
  CallOptions call;
};

CLI::App* setup_policy(CLI::App& app, PolicyCommand& o) {
  CLI::App* cmd = app.add_subcommand("policy", "the policy for a known structure, without a mask");
  cmd->add_option("--structure", o.structure,
                  "structure JSON, or @FILE (a structure or a whole inspect output; @- reads stdin)")->required();
  cmd->add_option("--shape", o.shape, "B,H,Q,K")->required();
  cmd->add_flag("--json", o.json, "the JSON contract (docs/json.md)");
  cmd->add_option("--mask-dtype", o.mask_dtype,
                  "element type of the dense mask a kept mask would pass: bool, uint8, int8, fp16, bf16, fp32");
  add_call_options(*cmd, o.call);
  return cmd;
}

// policy's --mask-dtype: none, or one of the mask element types.
Result<std::optional<ElementType>> dense_mask_dtype(const std::string& text) {
  if (text.empty()) return std::optional<ElementType>{};
  const std::pair<const char*, ElementType> names[] = {
      {"bool", ElementType::boolean}, {"uint8", ElementType::uint8},   {"int8", ElementType::int8},
      {"fp16", ElementType::float16}, {"bf16", ElementType::bfloat16}, {"fp32", ElementType::float32}};
  for (const auto& [name, type] : names)
    if (text == name) return std::optional<ElementType>(type);
  return error(ErrorCode::invalid_argument, "--mask-dtype must be bool, uint8, int8, fp16, bf16 or fp32, got " + text);
}

int run_policy(PolicyCommand& o) {
  o.call.heads_follow_mask = true;
  if (Status s = validate_call_options(o.call); !s.ok()) return fail(s);
  auto shape = parse_shape(o.shape);
  if (!shape) return fail(shape.status());
  auto dense_dtype = dense_mask_dtype(o.mask_dtype);
  if (!dense_dtype) return fail(dense_dtype.status());
  // An inline structure is part of the command line (exit 2 naming --structure); one
  // read from @FILE is an input file (exit 1 naming the file).
  const bool from_file = o.structure.starts_with("@");
  const std::string source = from_file ? o.structure.substr(1) : "--structure";
  const auto bad_structure = [&](const Status& s) {
    if (from_file) return fail_input(error(s.code(), source + ": " + s.message()));
    return fail(error(ErrorCode::invalid_argument, source + ": " + s.message()));
  };
  std::string text = o.structure;
  if (from_file) {
    auto read = read_structure_file(source);
    if (!read) return fail(read.status());
    text = std::move(*read);
  }
  auto j = parse_structure_json(text);
  if (!j) return bad_structure(j.status());
  auto s = structure_from_json(*j, (*shape)[0], (*shape)[1], (*shape)[2], (*shape)[3]);
  if (!s) return bad_structure(s.status());
  // --shape is the mask's: a mask kept in the call is [B, H, Q, K], so its heads are the call's.
  if (Status st = match_mask_heads(o.call, (*shape)[1], "--shape " + o.shape); !st.ok()) return fail(st);
  auto call = make_call(o.call, *dense_dtype);
  if (!call) return fail(call.status());
  call->call.batch = s->batch;
  auto p = decide(*s, call->call, call->env);
  if (!p) return fail(p.status());
  if (o.json) {
    std::cout << to_json(*s, &*p).dump(2) << "\n";
  } else {
    std::printf("structure %s\n", describe(*s).c_str());
    print_policy(*p, *s, *dense_dtype);
  }
  return 0;
}

CLI::App* setup_make(CLI::App& app, MakeOptions& make) {
  CLI::App* cmd = app.add_subcommand("make", "write a sample mask of a structure as .npy");
  cmd->add_option("kind", make.kind, "full, causal, sliding_window, chunked, prefix_lm, causal_blocks")->required();
  cmd->add_option("--shape", make.shape, "B,H,Q,K")->capture_default_str();
  cmd->add_option("-o,--output", make.output, "output .npy")->required();
  cmd->add_option("--mask-dtype", make.dtype, "bool, bf16 (additive, stored as <u2) or fp32 (additive)")->capture_default_str();
  cmd->add_option("--alignment", make.alignment, "top_left (the default) or bottom_right; the causal kinds only");
  cmd->add_option_function<std::string>("--window", [&make](const std::string& v) { make.window = v; }, "sliding window W");
  cmd->add_option_function<std::string>("--chunk", [&make](const std::string& v) { make.chunk = v; }, "chunk C");
  cmd->add_option_function<std::string>("--prefix", [&make](const std::string& v) { make.prefix = v; }, "prefix P");
  cmd->add_option("--blocks", make.blocks, "JSON [[start, end], ...]");
  cmd->add_option("--segments", make.segments, "JSON per batch [[0, e1, ..., Q], ...]");
  cmd->add_option("--kv-valid", make.kv_valid, "JSON per batch [[start, end], ...]");
  cmd->add_option("--q-valid", make.q_valid, "JSON per batch [[start, end], ...]: the query rows that attend");
  return cmd;
}

int run_make(const MakeOptions& make) {
  if (auto encoding = make_encoding(make.dtype); !encoding) return fail(encoding.status());
  auto s = structure_from(make);
  if (!s) return fail(s.status());
  if (Status st = write_mask(make.output, *s, make.dtype); !st.ok()) return fail(st);
  std::printf("wrote %s: %s\n", make.output.c_str(), describe(*s).c_str());
  return 0;
}

struct SamplesCommand {
  std::string dir;
  CallOptions call;
};

CLI::App* setup_samples(CLI::App& app, SamplesCommand& o) {
  CLI::App* cmd = app.add_subcommand("samples", "write a sample mask of every structure into DIR and inspect each");
  cmd->add_option("dir", o.dir, "output folder")->required();
  add_call_options(*cmd, o.call);
  return cmd;
}

// The masks `samples` writes: a file name and the make options of each.
std::vector<std::pair<const char*, MakeOptions>> sample_masks() {
  const auto opts = [](std::string kind, std::string shape, std::string dtype = "bool") {
    MakeOptions m;
    m.kind = std::move(kind);
    m.shape = std::move(shape);
    m.dtype = std::move(dtype);
    return m;
  };
  std::vector<std::pair<const char*, MakeOptions>> samples = {{"causal.npy", opts("causal", "1,1,512,512")}};
  samples.emplace_back("sliding_window.npy", opts("sliding_window", "1,1,512,512", "bf16"));
  samples.back().second.window = "128";
  samples.emplace_back("chunked.npy", opts("chunked", "1,1,512,512"));
  samples.back().second.chunk = "128";
  samples.emplace_back("prefix_lm.npy", opts("prefix_lm", "1,1,256,256"));
  samples.back().second.prefix = "64";
  samples.emplace_back("vlm_blocks.npy", opts("causal_blocks", "1,1,512,512"));
  samples.back().second.blocks = "[[10, 74], [200, 264]]";
  samples.emplace_back("packed.npy", opts("causal", "1,1,512,512"));
  samples.back().second.segments = "[[0, 100, 260, 512]]";
  samples.emplace_back("right_padded.npy", opts("causal", "2,1,256,256"));
  samples.back().second.kv_valid = "[[0, 256], [0, 180]]";
  samples.emplace_back("left_padded.npy", opts("causal", "2,1,256,256", "fp32"));
  samples.back().second.kv_valid = "[[0, 256], [40, 256]]";
  samples.emplace_back("prefill_with_cache.npy", opts("causal", "1,1,64,1024"));
  samples.back().second.alignment = "bottom_right";
  samples.emplace_back("decode_left_padded.npy", opts("full", "3,1,1,300", "bf16"));
  samples.back().second.kv_valid = "[[0, 300], [20, 300], [75, 300]]";
  return samples;
}

int run_samples(const SamplesCommand& o) {
  if (Status s = validate_call_options(o.call); !s.ok()) return fail(s);
  std::error_code ec;
  std::filesystem::create_directories(o.dir, ec);
  if (ec) return fail(error(ErrorCode::io_error, "cannot create " + o.dir + ": " + ec.message()));
  int failures = 0;
  for (const auto& [name, m] : sample_masks()) {
    const std::string file = (std::filesystem::path(o.dir) / name).string();
    auto s = structure_from(m);
    Status st = s ? write_mask(file, *s, m.dtype) : s.status();
    if (!st.ok()) return fail(st);
    std::printf("\n");
    failures += inspect_file(file, m.dtype == "bf16" ? "bf16" : "", "", "cpu", "-1000", false, o.call) != 0;
  }
  return failures ? 1 : 0;
}

// A command line that names no command, or an unknown one, or an option before the
// command: CLI11 would answer each with "A subcommand is required".
std::optional<int> refuse_without_command(const CLI::App& app, int argc, char** argv) {
  if (argc < 2) return bad_argument(std::string("a command is required; commands: ") + kCommands);
  const auto commands = app.get_subcommands([](const CLI::App*) { return true; });
  const auto is_command = [&](const std::string& name) {
    return std::any_of(commands.begin(), commands.end(), [&](const CLI::App* c) { return c->get_name() == name; });
  };
  if (const std::string first = argv[1]; !first.starts_with("-") && !is_command(first))
    return bad_argument("unknown command '" + first + "'; commands: " + kCommands);
  else if (first.starts_with("-") && first != "-h" && first != "--help" && first != "--version")
    return bad_argument("unknown option '" + first + "' before the command; commands: " + kCommands);
  return std::nullopt;
}

int run_command(int argc, char** argv) {
  CLI::App app{"masklens: prove what an attention mask is and name the backend that computes it"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "masklens " MASKLENS_VERSION_STRING);
  InspectCommand inspect;
  PolicyCommand policy;
  MakeOptions make;
  SamplesCommand samples;
  CLI::App* inspect_cmd = setup_inspect(app, inspect);
  CLI::App* policy_cmd = setup_policy(app, policy);
  CLI::App* make_cmd = setup_make(app, make);
  CLI::App* samples_cmd = setup_samples(app, samples);

  if (const std::optional<int> refused = refuse_without_command(app, argc, argv)) return *refused;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help, --version
    return usage_error(app, e, argc, argv);
  }
  if (*inspect_cmd) return run_inspect(*inspect_cmd, inspect);
  if (*policy_cmd) return run_policy(policy);
  if (*make_cmd) return run_make(make);
  if (*samples_cmd) return run_samples(samples);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The library returns allocation failures as a Status; this catches what the CLI's
  // own containers (and CLI11, nlohmann-json) throw, so no input ends in an abort.
  try {
    return run_command(argc, argv);
  } catch (const std::bad_alloc&) {
    return fail(error(ErrorCode::out_of_memory, "out of memory"));
  } catch (const std::length_error&) {
    return fail(error(ErrorCode::out_of_memory, "a container grew past its largest size"));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "masklens: internal error: %s\n", e.what());
    return 1;
  }
}
