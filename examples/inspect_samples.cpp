// The main job until the CLI lands: build the masks frameworks hand to attention
// (each as a dense mask in the type they use), prove what each one is, print it.
#include <masklens/masklens.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace masklens;

namespace {

MaskStructure shape(std::int64_t batch, std::int64_t q_len, std::int64_t k_len, StructureKind kind) {
  MaskStructure s;
  s.batch = batch;
  s.q_len = q_len;
  s.k_len = k_len;
  s.kind = kind;
  return s;
}

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
  samples.push_back({"HF causal, bool [1,1,512,512]", shape(1, 512, 512, StructureKind::causal), ElementType::boolean});
  {
    auto s = shape(1, 512, 512, StructureKind::sliding_window);
    s.window = 128;
    samples.push_back({"sliding window 128 (Mistral/Gemma local layers)", s, ElementType::bfloat16});
  }
  {
    auto s = shape(2, 256, 256, StructureKind::causal);
    s.kv_valid = {{0, 256}, {0, 180}};
    samples.push_back({"right-padded causal batch", s, ElementType::boolean});
  }
  {
    auto s = shape(2, 256, 256, StructureKind::causal);
    s.kv_valid = {{0, 256}, {40, 256}};
    samples.push_back({"left-padded causal batch (generation)", s, ElementType::bfloat16});
  }
  {
    auto s = shape(1, 512, 512, StructureKind::causal);
    s.segments = {{0, 100, 260, 512}};
    samples.push_back({"packed documents", s, ElementType::boolean});
  }
  {
    auto s = shape(1, 512, 512, StructureKind::causal_blocks);
    s.blocks = {{10, 74}, {200, 264}};
    samples.push_back({"VLM image blocks (Gemma3)", s, ElementType::boolean});
  }
  {
    auto s = shape(1, 256, 256, StructureKind::prefix_lm);
    s.prefix = 64;
    samples.push_back({"prefix-LM (PaliGemma)", s, ElementType::boolean});
  }
  {
    auto s = shape(1, 512, 512, StructureKind::chunked);
    s.chunk = 128;
    samples.push_back({"chunked attention (Llama 4)", s, ElementType::boolean});
  }
  {
    auto s = shape(1, 64, 1024, StructureKind::causal);
    s.alignment = Alignment::bottom_right;
    samples.push_back({"chunked prefill with a KV cache", s, ElementType::boolean});
  }
  {
    auto s = shape(3, 1, 300, StructureKind::full);
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
