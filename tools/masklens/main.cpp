// masklens — inspect and explain attention masks.
//   masklens inspect MASK.npy [--json] [call options] [--mask-dtype bf16] [--png FILE] [--device cpu|cuda]
//   masklens policy --structure JSON|@FILE --shape B,H,Q,K [--json] [call options]
//   masklens make KIND --shape B,H,Q,K [params] -o FILE.npy
//   masklens samples DIR            writes a sample mask of every structure and inspects each
#include <CLI/CLI.hpp>
#include <masklens/cuda/scan.hpp>
#include <masklens/json.hpp>
#include <masklens/masklens.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "call_code.hpp"
#include "npy.hpp"
#include "png.hpp"

using namespace masklens;

namespace {

struct CallOptions {
  std::string dtype = "bf16";
  std::int64_t head_dim = 128, head_dim_v = 0, heads = 16, kv_heads = 0;
  bool training = false, deterministic = false;
  double dropout = 0;
  int sm = 90;
  std::string torch = "2.11", cudnn = "9.19";
  std::string available = "torch";
  std::string flash_attn = "2.8.3", flash_attn3 = "3.0", xformers = "0.0.33", te = "2.8", flashinfer = "0.5",
              cudnn_frontend = "1.16";
};

void add_call_options(CLI::App& app, CallOptions& o) {
  app.add_option("--dtype", o.dtype, "q/k/v dtype: bf16, fp16, fp32")->capture_default_str()->group("Call");
  app.add_option("--head-dim", o.head_dim, "head dim of q/k (and v)")->capture_default_str()->group("Call");
  app.add_option("--head-dim-v", o.head_dim_v, "head dim of v (default: head dim)")->group("Call");
  app.add_option("--heads", o.heads, "query heads")->capture_default_str()->group("Call");
  app.add_option("--kv-heads", o.kv_heads, "key/value heads (default: heads)")->group("Call");
  app.add_flag("--training", o.training, "a backward pass follows")->group("Call");
  app.add_flag("--deterministic", o.deterministic, "torch.use_deterministic_algorithms(True)")->group("Call");
  app.add_option("--dropout", o.dropout, "dropout probability")->capture_default_str()->group("Call");
  app.add_option("--sm", o.sm, "GPU compute capability, major*10+minor")->capture_default_str()->group("Call");
  app.add_option("--torch", o.torch, "torch version")->capture_default_str()->group("Call");
  app.add_option("--cudnn", o.cudnn, "cuDNN version")->capture_default_str()->group("Call");
  app.add_option("--available", o.available,
                 "backend families installed: torch, flash_attn, flash_attn3, flex, xformers, te, flashinfer, cudnn_frontend")
      ->capture_default_str()->group("Call");
  app.add_option("--flash-attn-version", o.flash_attn, "flash_attn version")->capture_default_str()->group("Versions");
  app.add_option("--flash-attn3-version", o.flash_attn3, "flash_attn3 version")->capture_default_str()->group("Versions");
  app.add_option("--xformers-version", o.xformers, "xformers version")->capture_default_str()->group("Versions");
  app.add_option("--te-version", o.te, "TransformerEngine version")->capture_default_str()->group("Versions");
  app.add_option("--flashinfer-version", o.flashinfer, "FlashInfer version")->capture_default_str()->group("Versions");
  app.add_option("--cudnn-frontend-version", o.cudnn_frontend, "cudnn_frontend version")->capture_default_str()->group("Versions");
}

Result<CallContext> make_call(const CallOptions& o, std::optional<ElementType> mask_dtype) {
  CallContext context;
  AttentionCall& c = context.call;
  Environment& e = context.env;
  if (o.dtype == "bf16" || o.dtype == "bfloat16") c.dtype = DType::bfloat16;
  else if (o.dtype == "fp16" || o.dtype == "float16") c.dtype = DType::float16;
  else if (o.dtype == "fp32" || o.dtype == "float32") c.dtype = DType::float32;
  else return error(ErrorCode::invalid_argument, "--dtype must be bf16, fp16 or fp32, got " + o.dtype);
  c.head_dim = o.head_dim;
  c.head_dim_v = o.head_dim_v;
  c.heads = o.heads;
  c.kv_heads = o.kv_heads;
  c.training = o.training;
  c.deterministic = o.deterministic;
  c.dropout = o.dropout;
  e.sm = o.sm;
  c.mask_dtype = mask_dtype;
  for (auto [text, into, name] : {std::tuple{&o.torch, &e.torch, "--torch"}, {&o.cudnn, &e.cudnn, "--cudnn"}}) {
    auto v = Version::parse(*text);
    if (!v) return error(ErrorCode::invalid_argument, std::string(name) + ": " + v.status().message());
    *into = *v;
  }
  e.available = 0;
  std::stringstream list(o.available);
  for (std::string item; std::getline(list, item, ',');) {
    struct Family {
      const char* name;
      BackendFamily family;
      const std::string* version;
      Version* into;
    };
    const Family families[] = {{"torch", kFamilyTorch, nullptr, nullptr},
                               {"flash_attn", kFamilyFlashAttn, &o.flash_attn, &e.flash_attn},
                               {"flash_attn3", kFamilyFlashAttn3, &o.flash_attn3, &e.flash_attn3},
                               {"flex", kFamilyFlex, nullptr, nullptr},
                               {"xformers", kFamilyXformers, &o.xformers, &e.xformers},
                               {"te", kFamilyTransformerEngine, &o.te, &e.transformer_engine},
                               {"flashinfer", kFamilyFlashInfer, &o.flashinfer, &e.flashinfer},
                               {"cudnn_frontend", kFamilyCudnnFrontend, &o.cudnn_frontend, &e.cudnn_frontend}};
    bool known = false;
    for (const Family& f : families) {
      if (item != f.name) continue;
      known = true;
      e.available |= f.family;
      if (f.version) {
        auto v = Version::parse(*f.version);
        if (!v) return error(ErrorCode::invalid_argument, std::string(f.name) + " version: " + v.status().message());
        *f.into = *v;
      }
    }
    if (!known) return error(ErrorCode::invalid_argument, "--available: unknown family '" + item + "'");
  }
  return context;
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
  std::printf("call      %s (mask %s%s)  estimated %.2f ms\n", std::string(to_string(p.backend())).c_str(),
              std::string(to_string(p.call.mask)).c_str(),
              p.call.mask_cast ? (", cast to " + std::string(to_string(*p.call.mask_cast))).c_str() : "", p.cost_ms);
  if (p.plan.empty()) {
    if (p.backend() == Backend::flex_attention) std::printf("%s\n", indented(cli::python_mask_mod(s, p.call, mask_dtype)).c_str());
    std::printf("%s\n", indented(cli::python_call(p.call, s.batch, s.q_len, s.k_len, mask_dtype)).c_str());
  } else {
    std::printf("          a plan of %zu calls, each on q[b:b+1, :, q_range] and k/v[b:b+1, :, k_range]:\n", p.plan.size());
    for (std::size_t i = 0; i < p.plan.size() && i < 8; ++i) {
      const PlanStep& st = p.plan[i];
      std::printf("          # b=%lld q[%lld:%lld] k[%lld:%lld]\n%s\n", static_cast<long long>(st.batch),
                  static_cast<long long>(st.q_range.start), static_cast<long long>(st.q_range.end),
                  static_cast<long long>(st.k_range.start), static_cast<long long>(st.k_range.end),
                  indented(cli::python_call(st.call, 1, st.q_range.end - st.q_range.start,
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
  if (shape.size() != 4) return error(ErrorCode::invalid_argument, "--shape wants four numbers B,H,Q,K, got '" + text + "'");
  return shape;
}

int inspect_file(const std::string& path, const std::string& mask_dtype, const std::string& png, const std::string& device,
                 double threshold, bool json, const CallOptions& call_options) {
  std::optional<ElementType> two_byte;
  if (mask_dtype == "bf16") two_byte = ElementType::bfloat16;
  else if (mask_dtype == "fp16") two_byte = ElementType::float16;
  else if (!mask_dtype.empty()) return fail(error(ErrorCode::invalid_argument, "--mask-dtype must be bf16 or fp16"));
  MaskEncoding enc;
  enc.masked_threshold = static_cast<float>(threshold);
  auto file = npy::File::open(path, two_byte, enc);
  if (!file) return fail(file.status());
  const MaskView& view = file->view;
  Result<SpanTable> spans = error(ErrorCode::invalid_argument, "--device must be cpu or cuda, got " + device);
  if (device == "cpu") spans = scan(view, ScanOptions{0});
  else if (device == "cuda") spans = gpu::scan_host_mask(view);
  if (!spans) return fail(spans.status());
  auto verdict = classify(*spans);
  if (!verdict) return fail(verdict.status());
  auto call = make_call(call_options, view.dtype());
  if (!call) return fail(call.status());
  call->call.batch = view.batch();
  auto policy = decide(*verdict, call->call, call->env);
  if (!png.empty())
    if (Status s = picture::write_png(png, view, *verdict); !s.ok()) return fail(s);
  if (json) {
    std::cout << to_json(*verdict, policy ? &*policy : nullptr).dump(2) << "\n";
    return policy ? 0 : fail(policy.status());
  }
  std::printf("mask      %s  [%lld, %lld, %lld, %lld] %s  (scanned on %s)\n", path.c_str(),
              static_cast<long long>(view.batch()), static_cast<long long>(view.heads()),
              static_cast<long long>(view.q_len()), static_cast<long long>(view.k_len()),
              std::string(to_string(view.dtype())).c_str(), device == "cuda" ? "the GPU" : "the CPU");
  std::fputs(picture::ascii_preview(view).c_str(), stdout);
  std::printf("structure %s\n", describe(*verdict).c_str());
  if (!policy) return fail(policy.status());
  print_policy(*policy, *verdict, view.dtype());
  return 0;
}

// Shape and parameters of `make`.
struct MakeOptions {
  std::string kind, shape = "1,1,256,256", output, dtype = "bool", alignment = "top_left", segments, kv_valid, blocks;
  std::int64_t window = 0, chunk = 0, prefix = 0;
};

Result<MaskStructure> structure_from(const MakeOptions& m) {
  auto shape = parse_shape(m.shape);
  if (!shape) return shape.status();
  nlohmann::json j;
  j["kind"] = m.kind;
  j["alignment"] = m.alignment;
  if (m.window) j["window"] = m.window;
  if (m.chunk) j["chunk"] = m.chunk;
  if (m.prefix) j["prefix"] = m.prefix;
  try {
    if (!m.blocks.empty()) j["blocks"] = nlohmann::json::parse(m.blocks);
    if (!m.segments.empty()) j["segments"] = nlohmann::json::parse(m.segments);
    if (!m.kv_valid.empty()) j["kv_valid"] = nlohmann::json::parse(m.kv_valid);
  } catch (const nlohmann::json::exception& e) {
    return error(ErrorCode::parse_error, std::string("--blocks/--segments/--kv-valid want JSON: ") + e.what());
  }
  const auto& s = *shape;
  return structure_from_json(j, s[0], s[1], s[2], s[3]);
}

Status write_mask(const std::string& path, const MaskStructure& s, const std::string& dtype) {
  if (s.kind == StructureKind::arbitrary) return error(ErrorCode::invalid_argument, "make cannot draw an arbitrary mask");
  auto attend = render_dense(s);
  if (!attend) return attend.status();
  // [B, Q, K] rendered; heads broadcast by writing them out.
  const std::vector<std::int64_t> shape{s.batch, s.heads, s.q_len, s.k_len};
  const std::size_t slice = static_cast<std::size_t>(s.q_len * s.k_len);
  std::vector<std::uint8_t> bytes;
  const auto emit = [&](auto value_of, std::size_t esize) {
    bytes.resize(static_cast<std::size_t>(s.batch * s.heads) * slice * esize);
    std::uint8_t* out = bytes.data();
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < s.heads; ++h)
        for (std::size_t i = 0; i < slice; ++i, out += esize) value_of((*attend)[static_cast<std::size_t>(b) * slice + i], out);
  };
  if (dtype == "bool") {
    emit([](std::uint8_t a, std::uint8_t* o) { *o = a; }, 1);
    return npy::write(path, "|b1", shape, bytes.data(), bytes.size());
  }
  if (dtype == "bf16") {
    emit([](std::uint8_t a, std::uint8_t* o) { const std::uint16_t v = a ? 0 : 0xFF7F; std::memcpy(o, &v, 2); }, 2);
    return npy::write(path, "<u2", shape, bytes.data(), bytes.size());
  }
  if (dtype == "fp32") {
    emit([](std::uint8_t a, std::uint8_t* o) { const float v = a ? 0.0f : -INFINITY; std::memcpy(o, &v, 4); }, 4);
    return npy::write(path, "<f4", shape, bytes.data(), bytes.size());
  }
  return error(ErrorCode::invalid_argument, "--mask-dtype for make must be bool, bf16 or fp32, got " + dtype);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"masklens: prove what an attention mask is and name the backend that computes it"};
  app.require_subcommand(1);
  CallOptions call_options;

  std::string path, mask_dtype, png, device = "cpu";
  double threshold = -1000;
  bool json = false;
  auto* inspect_cmd = app.add_subcommand("inspect", "the structure of a .npy mask and the call to make");
  inspect_cmd->add_option("mask", path, "mask .npy file (1-4 dims; 2-D is [Q, K])")->required();
  inspect_cmd->add_flag("--json", json, "the JSON contract (docs/json.md)");
  inspect_cmd->add_option("--mask-dtype", mask_dtype, "how to read a 2-byte mask stored as <u2/<V2: bf16 or fp16");
  inspect_cmd->add_option("--png", png, "write a picture of slice [0, 0]");
  inspect_cmd->add_option("--device", device, "scan on cpu or cuda")->capture_default_str();
  inspect_cmd->add_option("--masked-threshold", threshold, "additive values <= this are masked")->capture_default_str();
  add_call_options(*inspect_cmd, call_options);

  std::string structure_text, shape_text;
  auto* policy_cmd = app.add_subcommand("policy", "the policy for a known structure, without a mask");
  policy_cmd->add_option("--structure", structure_text, "structure JSON, or @FILE (a structure or a whole inspect output)")->required();
  policy_cmd->add_option("--shape", shape_text, "B,H,Q,K")->required();
  policy_cmd->add_flag("--json", json, "the JSON contract (docs/json.md)");
  std::string policy_mask_dtype;
  policy_cmd->add_option("--mask-dtype", policy_mask_dtype,
                         "element type of the dense mask a kept mask would pass: bool, uint8, int8, fp16, bf16, fp32");
  add_call_options(*policy_cmd, call_options);

  MakeOptions make;
  auto* make_cmd = app.add_subcommand("make", "write a sample mask of a structure as .npy");
  make_cmd->add_option("kind", make.kind, "full, causal, sliding_window, chunked, prefix_lm, causal_blocks")->required();
  make_cmd->add_option("--shape", make.shape, "B,H,Q,K")->capture_default_str();
  make_cmd->add_option("-o,--output", make.output, "output .npy")->required();
  make_cmd->add_option("--mask-dtype", make.dtype, "bool, bf16 (additive, stored as <u2) or fp32 (additive)")->capture_default_str();
  make_cmd->add_option("--alignment", make.alignment, "top_left or bottom_right")->capture_default_str();
  make_cmd->add_option("--window", make.window, "sliding window W");
  make_cmd->add_option("--chunk", make.chunk, "chunk C");
  make_cmd->add_option("--prefix", make.prefix, "prefix P");
  make_cmd->add_option("--blocks", make.blocks, "JSON [[start, end], ...]");
  make_cmd->add_option("--segments", make.segments, "JSON per batch [[0, e1, ..., Q], ...]");
  make_cmd->add_option("--kv-valid", make.kv_valid, "JSON per batch [[start, end], ...]");

  std::string samples_dir;
  auto* samples_cmd = app.add_subcommand("samples", "write a sample mask of every structure into DIR and inspect each");
  samples_cmd->add_option("dir", samples_dir, "output folder")->required();
  add_call_options(*samples_cmd, call_options);

  CLI11_PARSE(app, argc, argv);

  if (*inspect_cmd) return inspect_file(path, mask_dtype, png, device, threshold, json, call_options);

  if (*policy_cmd) {
    auto shape = parse_shape(shape_text);
    if (!shape) return fail(shape.status());
    std::string text = structure_text;
    if (!text.empty() && text[0] == '@') {
      std::ifstream f(text.substr(1));
      if (!f) return fail(error(ErrorCode::io_error, "cannot read " + text.substr(1)));
      std::stringstream buf;
      buf << f.rdbuf();
      text = buf.str();
    }
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) return fail(error(ErrorCode::parse_error, "--structure is not valid JSON"));
    auto s = structure_from_json(j, (*shape)[0], (*shape)[1], (*shape)[2], (*shape)[3]);
    if (!s) return fail(s.status());
    std::optional<ElementType> dense_dtype;
    if (!policy_mask_dtype.empty()) {
      const std::pair<const char*, ElementType> names[] = {
          {"bool", ElementType::boolean}, {"uint8", ElementType::uint8},     {"int8", ElementType::int8},
          {"fp16", ElementType::float16}, {"bf16", ElementType::bfloat16},   {"fp32", ElementType::float32}};
      for (const auto& [name, type] : names)
        if (policy_mask_dtype == name) dense_dtype = type;
      if (!dense_dtype)
        return fail(error(ErrorCode::invalid_argument,
                          "--mask-dtype must be bool, uint8, int8, fp16, bf16 or fp32, got " + policy_mask_dtype));
    }
    auto call = make_call(call_options, dense_dtype);
    if (!call) return fail(call.status());
    call->call.batch = s->batch;
    auto p = decide(*s, call->call, call->env);
    if (!p) return fail(p.status());
    if (json) std::cout << to_json(*s, &*p).dump(2) << "\n";
    else {
      std::printf("structure %s\n", describe(*s).c_str());
      print_policy(*p, *s, dense_dtype);
    }
    return 0;
  }

  if (*make_cmd) {
    auto s = structure_from(make);
    if (!s) return fail(s.status());
    if (Status st = write_mask(make.output, *s, make.dtype); !st.ok()) return fail(st);
    std::printf("wrote %s: %s\n", make.output.c_str(), describe(*s).c_str());
    return 0;
  }

  if (*samples_cmd) {
    std::error_code ec;
    std::filesystem::create_directories(samples_dir, ec);
    if (ec) return fail(error(ErrorCode::io_error, "cannot create " + samples_dir + ": " + ec.message()));
    struct Sample {
      const char* file;
      MakeOptions m;
    };
    const auto opts = [](std::string kind, std::string shape, std::string dtype = "bool") {
      MakeOptions m;
      m.kind = std::move(kind);
      m.shape = std::move(shape);
      m.dtype = std::move(dtype);
      return m;
    };
    std::vector<Sample> samples = {{"causal.npy", opts("causal", "1,1,512,512")}};
    samples.push_back({"sliding_window.npy", opts("sliding_window", "1,1,512,512", "bf16")});
    samples.back().m.window = 128;
    samples.push_back({"chunked.npy", opts("chunked", "1,1,512,512")});
    samples.back().m.chunk = 128;
    samples.push_back({"prefix_lm.npy", opts("prefix_lm", "1,1,256,256")});
    samples.back().m.prefix = 64;
    samples.push_back({"vlm_blocks.npy", opts("causal_blocks", "1,1,512,512")});
    samples.back().m.blocks = "[[10, 74], [200, 264]]";
    samples.push_back({"packed.npy", opts("causal", "1,1,512,512")});
    samples.back().m.segments = "[[0, 100, 260, 512]]";
    samples.push_back({"right_padded.npy", opts("causal", "2,1,256,256")});
    samples.back().m.kv_valid = "[[0, 256], [0, 180]]";
    samples.push_back({"left_padded.npy", opts("causal", "2,1,256,256", "fp32")});
    samples.back().m.kv_valid = "[[0, 256], [40, 256]]";
    samples.push_back({"prefill_with_cache.npy", opts("causal", "1,1,64,1024")});
    samples.back().m.alignment = "bottom_right";
    samples.push_back({"decode_left_padded.npy", opts("full", "3,1,1,300", "bf16")});
    samples.back().m.kv_valid = "[[0, 300], [20, 300], [75, 300]]";
    int failures = 0;
    for (const Sample& sample : samples) {
      const std::string file = (std::filesystem::path(samples_dir) / sample.file).string();
      auto s = structure_from(sample.m);
      Status st = s ? write_mask(file, *s, sample.m.dtype) : s.status();
      if (!st.ok()) return fail(st);
      std::printf("\n");
      failures += inspect_file(file, sample.m.dtype == "bf16" ? "bf16" : "", "", "cpu", -1000, false, call_options) != 0;
    }
    return failures ? 1 : 0;
  }
  return 0;
}
