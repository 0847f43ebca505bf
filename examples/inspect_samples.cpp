// The main job until the CLI lands: build the masks frameworks hand to attention
// (each as a dense mask in the type they use), prove what each one is, print it.
#include <masklens/masklens.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace masklens;

namespace {

struct Sample {
  const char* name;
  MaskStructure truth;
  ElementType dtype;
};

// Dense mask bytes for `dtype`: bool 1/0, or additive bf16 0 / finfo.min.
std::vector<std::uint8_t> encode(const std::vector<std::uint8_t>& attend, ElementType dtype) {
  if (dtype == ElementType::boolean) return attend;
  std::vector<std::uint8_t> out(attend.size() * 2);
  for (std::size_t i = 0; i < attend.size(); ++i) {
    const std::uint16_t bits = attend[i] ? 0x0000 : 0xFF7F;  // bf16 0 / finfo(bf16).min
    std::memcpy(out.data() + 2 * i, &bits, 2);
  }
  return out;
}

}  // namespace

int main() {
  std::vector<Sample> samples;
  samples.push_back({"HF causal, bool [1,1,512,512]", make_structure(StructureKind::causal, 1, 512, 512), ElementType::boolean});
  {
    auto s = make_structure(StructureKind::sliding_window, 1, 512, 512);
    s.window = 128;
    samples.push_back({"sliding window 128 (Mistral/Gemma local layers)", s, ElementType::bfloat16});
  }
  {
    auto s = make_structure(StructureKind::causal, 2, 256, 256);
    s.kv_valid = {{0, 256}, {0, 180}};
    samples.push_back({"right-padded causal batch", s, ElementType::boolean});
  }
  {
    auto s = make_structure(StructureKind::causal, 2, 256, 256);
    s.kv_valid = {{0, 256}, {40, 256}};
    samples.push_back({"left-padded causal batch (generation)", s, ElementType::bfloat16});
  }
  {
    auto s = make_structure(StructureKind::causal, 1, 512, 512);
    s.segments = {{0, 100, 260, 512}};
    samples.push_back({"packed documents", s, ElementType::boolean});
  }
  {
    auto s = make_structure(StructureKind::causal_blocks, 1, 512, 512);
    s.blocks = {{10, 74}, {200, 264}};
    samples.push_back({"VLM image blocks (Gemma3)", s, ElementType::boolean});
  }
  {
    auto s = make_structure(StructureKind::prefix_lm, 1, 256, 256);
    s.prefix = 64;
    samples.push_back({"prefix-LM (PaliGemma)", s, ElementType::boolean});
  }
  {
    auto s = make_structure(StructureKind::chunked, 1, 512, 512);
    s.chunk = 128;
    samples.push_back({"chunked attention (Llama 4)", s, ElementType::boolean});
  }
  {
    auto s = make_structure(StructureKind::causal, 1, 64, 1024);
    s.alignment = Alignment::bottom_right;
    samples.push_back({"chunked prefill with a KV cache", s, ElementType::boolean});
  }
  {
    auto s = make_structure(StructureKind::full, 3, 1, 300);
    s.kv_valid = {{0, 300}, {20, 300}, {75, 300}};
    samples.push_back({"decode step, left padding", s, ElementType::bfloat16});
  }

  int wrong = 0;
  for (const Sample& sample : samples) {
    auto attend = render_dense(sample.truth);
    if (!attend) return std::fprintf(stderr, "%s\n", attend.status().to_string().c_str()), 1;
    const std::vector<std::uint8_t> bytes = encode(*attend, sample.dtype);
    const std::int64_t dims[] = {sample.truth.batch, 1, sample.truth.q_len, sample.truth.k_len};
    auto view = MaskView::contiguous(bytes.data(), sample.dtype, dims);
    auto verdict = view ? inspect(*view) : Result<MaskStructure>(view.status());
    if (!verdict) return std::fprintf(stderr, "%s: %s\n", sample.name, verdict.status().to_string().c_str()), 1;
    std::printf("%-48s [%lld,1,%lld,%lld] %-8s -> %s\n", sample.name, static_cast<long long>(dims[0]),
                static_cast<long long>(dims[2]), static_cast<long long>(dims[3]),
                std::string(to_string(sample.dtype)).c_str(), describe(*verdict).c_str());
    // The proof: the verdict renders back to exactly the mask.
    auto back = render_dense(*verdict);
    wrong += !back || *back != *attend;
  }
  if (wrong) std::fprintf(stderr, "%d verdicts did not render back to their mask\n", wrong);
  return wrong ? 1 : 0;
}
