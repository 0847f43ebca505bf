// The README's example: wrap a host mask in a view, prove what it is, decide the call.
#include <masklens/masklens.hpp>

#include <cstdio>
#include <string>
#include <vector>

int main() {
  const std::int64_t L = 1024;  // a dense [L, L] bool causal mask, as frameworks build it
  std::vector<std::uint8_t> mask(L * L);
  for (std::int64_t q = 0; q < L; ++q)
    for (std::int64_t k = 0; k < L; ++k) mask[static_cast<std::size_t>(q * L + k)] = k <= q;

  const std::int64_t shape[] = {L, L};
  auto view = masklens::MaskView::contiguous(mask.data(), masklens::ElementType::boolean, shape);
  auto verdict = view ? masklens::inspect(*view) : masklens::Result<masklens::MaskStructure>(view.status());
  if (!verdict) return std::fprintf(stderr, "%s\n", verdict.status().to_string().c_str()), 1;
  masklens::AttentionCall call;  // bf16, head_dim 128, 16 heads unless set; runs on an H200, torch 2.11
  call.head_dim = 256;
  auto policy = masklens::decide(*verdict, call);
  if (!policy) return std::fprintf(stderr, "%s\n", policy.status().to_string().c_str()), 1;
  std::printf("%s -> %s\n", masklens::describe(*verdict).c_str(),  // "causal top_left -> torch.sdpa.cudnn"
              std::string(masklens::to_string(policy->backend())).c_str());
  return verdict->kind == masklens::StructureKind::causal && policy->backend() == masklens::Backend::sdpa_cudnn ? 0 : 1;
}
