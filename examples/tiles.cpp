// docs/tiles.md's example: the tile summary of a dense mask (one read, with the row
// spans), torch BlockMask's tensors from it, the flex call it makes cheaper, and an
// exact structure's tiles from its fields alone.
#include <masklens/masklens.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

int main() {
  using namespace masklens;
  // A 4096-token sliding window of 512 that also attends the first 64 keys (attention
  // sinks): no exact structure describes it, so it is arbitrary.
  const std::int64_t L = 4096, W = 512, sinks = 64;
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(L * L));
  for (std::int64_t q = 0; q < L; ++q)
    for (std::int64_t k = 0; k <= q; ++k) mask[static_cast<std::size_t>(q * L + k)] = q - k < W || k < sinks;
  const std::int64_t shape[] = {L, L};
  auto view = MaskView::contiguous(mask.data(), ElementType::boolean, shape);
  if (!view) return std::fprintf(stderr, "%s\n", view.status().to_string().c_str()), 1;

  // The row spans and the 128 x 128 tiles in one read.
  auto read = scan_with_tiles(*view, TileSize{128, 128});
  if (!read) return std::fprintf(stderr, "%s\n", read.status().to_string().c_str()), 1;
  auto verdict = classify(read->spans);
  if (!verdict) return std::fprintf(stderr, "%s\n", verdict.status().to_string().c_str()), 1;
  verdict->tile_fractions = read->tiles.fractions();  // what decide() charges flex on
  const TileTally t = read->tiles.tally();
  std::printf("%s\n%lld empty, %lld partial, %lld full tiles\n", describe(*verdict).c_str(),
              static_cast<long long>(t.empty), static_cast<long long>(t.partial), static_cast<long long>(t.full));

  // BlockMask.from_kv_blocks' tensors (and the q side for the backward), int32, shaped
  // [1, 1, 32] and [1, 1, 32, 32]; flash-attn's CuTe kernels take the same four kv ones.
  auto tensors = block_mask_tensors(read->tiles);
  if (!tensors) return std::fprintf(stderr, "%s\n", tensors.status().to_string().c_str()), 1;
  for (BlockMaskField f : kBlockMaskFields) {
    const Int32Tensor x = tensors->tensor(f);
    std::printf("  %-18s (CuTe %-14s) [%lld, %lld, %lld%s]\n", std::string(to_string(f)).c_str(),
                std::string(cute_name(f)).c_str(), static_cast<long long>(x.shape[0]),
                static_cast<long long>(x.shape[1]), static_cast<long long>(x.shape[2]),
                x.rank == 4 ? (", " + std::to_string(x.shape[3])).c_str() : "");
  }
  // Row 20 of the kv side: the partial k tiles first, ascending, then torch's padding.
  const std::int32_t* row = tensors->kv_indices.data() + 20 * 32;
  std::printf("  q tile 20: %d partial k tiles: %d %d %d, then %d ...\n", tensors->kv_num_blocks[20], row[0], row[1],
              row[2], row[3]);

  // With FlexAttention installed, the mask runs as a block-sparse flex call that reads
  // the mask only in its partial tiles.
  AttentionCall call;
  call.head_dim = 128;
  Environment env;
  env.available |= kFamilyFlex;
  auto policy = decide(*verdict, call, env);
  if (!policy) return std::fprintf(stderr, "%s\n", policy.status().to_string().c_str()), 1;
  std::printf("-> %s (mask %s)\n", std::string(to_string(policy->backend())).c_str(),
              std::string(to_string(policy->call.mask)).c_str());

  // An exact structure's tiles need no mask: a plain 512 window, from its fields.
  MaskStructure window = make_structure(StructureKind::sliding_window, 1, L, L);
  window.window = W;
  auto derived = tiles_from_structure(window);
  if (!derived) return std::fprintf(stderr, "%s\n", derived.status().to_string().c_str()), 1;
  std::printf("window %lld: %lld partial, %lld full tiles, no read\n", static_cast<long long>(W),
              static_cast<long long>(derived->tally().partial), static_cast<long long>(derived->tally().full));

  const bool expected = verdict->kind == StructureKind::arbitrary && policy->backend() == Backend::flex_attention &&
                        tensors->kv_num_blocks[20] == 3 && t.full > 0;
  return expected ? 0 : 1;
}
