// Tile summaries on the device: the entry points declared in masklens/cuda/tiles.hpp,
// compiled once with nvcc into masklens_cuda_dep beside scan.cu and runs.cu (another build
// system compiles this file into the program). Every CUDA call's result is checked and returned
// as a Status naming the call; cleanup failures are reported too, after any earlier one.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <masklens/cuda/check.cuh>
#include <masklens/cuda/dispatch_tiles.cuh>
#include <masklens/cuda/temp_storage.hpp>
#include <masklens/cuda/tiles.hpp>
#include <masklens/scan.hpp>
#include <masklens/tiles.hpp>

namespace masklens::gpu {

namespace {

using detail::allocate;
using detail::check;
using detail::keep_first;

bool aligned(const void* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

// The BlockMask arrays by field, for the checks and the copies.
std::int32_t* field(const BlockMaskArrays& a, BlockMaskField f) {
  switch (f) {
    case BlockMaskField::kv_num_blocks: return a.kv_num_blocks;
    case BlockMaskField::kv_indices: return a.kv_indices;
    case BlockMaskField::full_kv_num_blocks: return a.full_kv_num_blocks;
    case BlockMaskField::full_kv_indices: return a.full_kv_indices;
    case BlockMaskField::q_num_blocks: return a.q_num_blocks;
    case BlockMaskField::q_indices: return a.q_indices;
    case BlockMaskField::full_q_num_blocks: return a.full_q_num_blocks;
    case BlockMaskField::full_q_indices: return a.full_q_indices;
  }
  return nullptr;
}

// Entries of one BlockMask array of grid g, as a size.
std::size_t entries(const TileGrid& g, BlockMaskField f) { return static_cast<std::size_t>(block_mask_entries(g, f)); }

std::string field_name(BlockMaskField f) { return "d_block_mask." + std::string(to_string(f)); }
// The BlockMask arrays' alignment; `any` set where one is given.
Status check_arrays(const BlockMaskArrays& arrays, bool& any) {
  for (const BlockMaskField f : kBlockMaskFields) {
    const std::int32_t* p = field(arrays, f);
    if (p == nullptr) continue;
    any = true;
    if (!aligned(p, alignof(std::int32_t)))
      return error(ErrorCode::misaligned_pointer, field_name(f) + " is not aligned to int32 (4 bytes)");
  }
  return {};
}

// The host side of a TileScan for `view` and `g`, every array sized.
Result<TileScan> host_result(const MaskView& view, const TileGrid& g) {
  if (g.tiles() > static_cast<std::int64_t>(SIZE_MAX / 64))
    return error(ErrorCode::out_of_memory, "a tile summary of " + std::to_string(g.tiles()) + " tiles is too large");
  Result<SpanTable> spans = SpanTable::for_view(view);
  if (!spans) return spans.status();
  Result<TileSummary> tiles = TileSummary::for_grid(g);
  if (!tiles) return tiles.status();
  return catch_alloc([&]() -> Result<TileScan> {
    TileScan out{std::move(*spans), std::move(*tiles), BlockMaskTensors{}};
    BlockMaskTensors& t = out.block_mask;
    t.grid = g;
    for (std::vector<std::int32_t>* counts : {&t.kv_num_blocks, &t.full_kv_num_blocks})
      counts->resize(entries(g, BlockMaskField::kv_num_blocks));
    for (std::vector<std::int32_t>* counts : {&t.q_num_blocks, &t.full_q_num_blocks})
      counts->resize(entries(g, BlockMaskField::q_num_blocks));
    for (std::vector<std::int32_t>* indices : {&t.kv_indices, &t.full_kv_indices, &t.q_indices, &t.full_q_indices})
      indices->resize(entries(g, BlockMaskField::kv_indices));
    return out;
  });
}

// scan_with_tiles() and scan_host_mask_with_tiles(): `host_view` null means `view` is
// already device memory; otherwise `view` is the host view, copied first.
Result<TileScan> run_with_tiles(const MaskView& view, const MaskView* host_view, std::int64_t offset_bytes,
                                TileSize size, Stream stream) {
  if (view.data() == nullptr) return error(ErrorCode::invalid_argument, "view is empty (data is null)");
  Result<TileGrid> grid = tile_grid_for(view, size);
  if (!grid) return grid.status();
  const TileGrid& g = *grid;
  std::size_t temp_bytes = 0;
  if (Status st = scan_spans_tiles(nullptr, temp_bytes, view, size, nullptr, BlockMaskArrays{}, nullptr, stream);
      !st.ok())
    return st;
  Result<TileScan> made = host_result(view, g);
  if (!made) return made.status();
  TileScan& out = *made;

  // One device block: [mask copy][spans][states][the eight arrays][temporary storage],
  // each part at a 256-byte boundary (the mask `offset_bytes` past one); 255 spare bytes,
  // as the pool's alignment is not documented.
  detail::StorageLayout layout;
  const std::size_t mask_at =
      host_view ? layout.add(static_cast<std::size_t>(view.extent_bytes()) + static_cast<std::size_t>(offset_bytes)) : 0;
  const std::size_t spans_at = layout.add(out.spans.rows.size() * sizeof(RowSpan));
  const std::size_t states_at = layout.add(out.tiles.states.size());
  std::size_t fields_at[std::size(kBlockMaskFields)];
  for (std::size_t i = 0; i < std::size(kBlockMaskFields); ++i)
    fields_at[i] = layout.add(entries(g, kBlockMaskFields[i]) * sizeof(std::int32_t));
  const std::size_t temp_at = layout.add(temp_bytes);

  void* raw = nullptr;
  Status st = allocate(&raw, layout.bytes() + detail::kStorageAlignment - 1, stream, "cudaMallocAsync(tile scan)");
  if (!st.ok()) return st;
  std::uint8_t* base = detail::align_up(raw);
  MaskView device_view = view;
  if (host_view) {
    std::uint8_t* mask = base + mask_at + offset_bytes;
    st = check(cudaMemcpyAsync(mask, view.data(), static_cast<std::size_t>(view.extent_bytes()), cudaMemcpyHostToDevice,
                               stream),
               "cudaMemcpyAsync(mask to the device)");
    if (st.ok()) {
      auto on_device = MaskView::make(mask, view.dtype(), view.shape(), view.strides(), view.encoding());
      if (on_device) device_view = *on_device;
      else st = on_device.status();
    }
  }
  auto* d_rows = reinterpret_cast<RowSpan*>(base + spans_at);
  auto* d_states = reinterpret_cast<TileState*>(base + states_at);
  BlockMaskArrays d_out{};
  BlockMaskArrays h_out = out.block_mask.arrays();
  std::int32_t** d_fields[] = {&d_out.kv_num_blocks, &d_out.kv_indices, &d_out.full_kv_num_blocks,
                               &d_out.full_kv_indices, &d_out.q_num_blocks, &d_out.q_indices,
                               &d_out.full_q_num_blocks, &d_out.full_q_indices};
  for (std::size_t i = 0; i < std::size(kBlockMaskFields); ++i)
    *d_fields[i] = reinterpret_cast<std::int32_t*>(base + fields_at[i]);
  if (st.ok()) st = scan_spans_tiles(base + temp_at, temp_bytes, device_view, size, d_rows, d_out, d_states, stream);
  if (st.ok())
    st = check(cudaMemcpyAsync(out.spans.rows.data(), d_rows, out.spans.rows.size() * sizeof(RowSpan),
                               cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync(spans to the host)");
  if (st.ok())
    st = check(cudaMemcpyAsync(out.tiles.states.data(), d_states, out.tiles.states.size(), cudaMemcpyDeviceToHost,
                               stream),
               "cudaMemcpyAsync(tile states to the host)");
  for (std::size_t i = 0; st.ok() && i < std::size(kBlockMaskFields); ++i) {
    const BlockMaskField f = kBlockMaskFields[i];
    st = check(cudaMemcpyAsync(field(h_out, f), field(d_out, f), entries(g, f) * sizeof(std::int32_t),
                               cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync(BlockMask tensors to the host)");
  }
  keep_first(st, check(cudaFreeAsync(raw, stream), "cudaFreeAsync(tile scan)"));
  // The one synchronisation: the results are read on the host only after it.
  keep_first(st, check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  if (!st.ok()) return st;
  // The first NaN / +inf: its element where the mask is on the host, as the host scanner
  // names it, else its row.
  if (Status bad = host_view ? masklens::detail::check_scanned_rows(*host_view, out.spans)
                             : masklens::detail::check_flagged_rows(out.spans);
      !bad.ok())
    return bad;
  return made;
}

// The tile scan's kernels for Policy and this element size: the block's counters in
// shared memory, or the q tile's 64-bit counts (launch_tile_plan takes one per plan).
template <class Policy, int Esize>
Status load_tile_scan_with() {
  const std::string size = std::to_string(Esize) + "-byte elements";
  return detail::load_kernels_named(
      {{reinterpret_cast<const void*>(&detail::scan_tiles_warp_kernel<Policy, Esize, true>),
        "scan_tiles_warp_kernel, shared counters, " + size},
       {reinterpret_cast<const void*>(&detail::scan_tiles_warp_kernel<Policy, Esize, false>),
        "scan_tiles_warp_kernel, global counts, " + size}});
}

}  // namespace

Status load_tile_kernels() {
  Status st = detail::load_for_current_arch<detail::TileScanTuning>([](auto policy, auto esize) {
    return load_tile_scan_with<typename decltype(policy)::type, decltype(esize)::value>();
  });
  // The counts' zeroing, and the BlockMask writer from each source: the scan's counts,
  // states the caller has, a structure's ranges.
  if (st.ok())
    st = detail::load_kernels_named(
        {{reinterpret_cast<const void*>(&detail::zero_counts_kernel<unsigned long long>), "zero_counts_kernel"},
         {reinterpret_cast<const void*>(&detail::block_mask_kernel<detail::StatesFromCounts>),
          "block_mask_kernel, states from counts"},
         {reinterpret_cast<const void*>(&detail::block_mask_kernel<detail::StatesGiven>),
          "block_mask_kernel, states given"},
         {reinterpret_cast<const void*>(&detail::block_mask_kernel<detail::StatesFromRanges>),
          "block_mask_kernel, a structure's ranges"}});
  return st;
}

Status scan_spans_tiles(void* d_temp_storage, std::size_t& temp_storage_bytes, const MaskView& device_view,
                        TileSize size, RowSpan* d_rows, const BlockMaskArrays& d_block_mask, TileState* d_states,
                        Stream stream) {
  if (device_view.data() == nullptr) return error(ErrorCode::invalid_argument, "view is empty (data is null)");
  Result<TileGrid> grid = tile_grid_for(device_view, size);
  if (!grid) return grid.status();
  const TileGrid& g = *grid;
  const std::size_t needed = detail::tile_scan_temp_bytes(g);
  if (needed == 0)
    return error(ErrorCode::out_of_memory, "the counts of " + std::to_string(g.tiles()) + " tiles do not fit in memory");
  if (detail::answer_size_query(d_temp_storage, temp_storage_bytes, needed)) return {};
  if (Status st = detail::check_temp_storage_bytes(temp_storage_bytes, needed); !st.ok()) return st;
  if (d_rows == nullptr) return error(ErrorCode::invalid_argument, "d_rows is null");
  if (!aligned(d_rows, alignof(RowSpan))) return error(ErrorCode::misaligned_pointer, "d_rows is not aligned to RowSpan");
  bool any_output = d_states != nullptr;
  if (Status st = check_arrays(d_block_mask, any_output); !st.ok()) return st;
  if (!any_output)
    return error(ErrorCode::invalid_argument,
                 "no tile output: every d_block_mask pointer is null and d_states is null (scan_spans() scans spans alone)");
  auto* counts = reinterpret_cast<unsigned long long*>(detail::align_up(d_temp_storage));
  // Three kernels, the last two chained where the device allows (dependent_launch.cuh):
  // the scan reads while the counts are zeroed, the writer launches while the scan drains.
  Status st = check(detail::launch_zero_counts(counts, g.tiles(), stream), "cudaLaunchKernelEx(tile counts zeroed)");
  int arch = 0;
  bool chained = false;
  if (st.ok()) st = check(detail::current_arch(arch), "cudaGetDevice / cudaDeviceGetAttribute(compute capability)");
  if (st.ok()) st = check(detail::tile_pass_chains(chained), "cudaFuncGetAttributes(tile kernels)");
  if (st.ok())
    st = check(detail::dispatch_scan_tiles(device_view, g, d_rows, counts, stream, arch, chained),
               "cudaLaunchKernelEx(tile scan kernel)");
  if (st.ok())
    st = check(detail::launch_block_mask(detail::StatesFromCounts::of(g, counts), d_block_mask, d_states, stream, chained),
               "cudaLaunchKernelEx(BlockMask kernel)");
  return st;
}

namespace {

// What both writers over the caller's device data check before any CUDA call — the grid,
// their own input (check_input()), the arrays — then the launch with states from
// make_source(checked grid).
template <class CheckInput, class MakeSource>
Status launch_writer(const TileGrid& grid, const BlockMaskArrays& d_block_mask, Stream stream, CheckInput check_input,
                     MakeSource make_source) {
  Result<TileGrid> checked = make_tile_grid(grid);
  if (!checked) return checked.status();
  if (Status st = check_input(); !st.ok()) return st;
  bool any_output = false;
  if (Status st = check_arrays(d_block_mask, any_output); !st.ok()) return st;
  if (!any_output) return error(ErrorCode::invalid_argument, "no BlockMask array: every d_block_mask pointer is null");
  return check(detail::launch_block_mask(make_source(*checked), d_block_mask, nullptr, stream),
               "cudaLaunchKernelEx(BlockMask kernel)");
}

}  // namespace

Status write_block_mask(const TileGrid& grid, const TileState* d_states, const BlockMaskArrays& d_block_mask,
                        Stream stream) {
  return launch_writer(
      grid, d_block_mask, stream,
      [&]() -> Status {
        if (d_states == nullptr) return error(ErrorCode::invalid_argument, "d_states is null");
        return {};
      },
      [&](const TileGrid& g) { return detail::StatesGiven::of(g, d_states); });
}

Status write_block_mask_from_ranges(const TileGrid& grid, const TileRowRanges* d_ranges,
                                    const BlockMaskArrays& d_block_mask, Stream stream) {
  return launch_writer(
      grid, d_block_mask, stream,
      [&]() -> Status {
        if (d_ranges == nullptr) return error(ErrorCode::invalid_argument, "d_ranges is null");
        if (!aligned(d_ranges, alignof(TileRowRanges)))
          return error(ErrorCode::misaligned_pointer, "d_ranges is not aligned to TileRowRanges (8 bytes)");
        return {};
      },
      [&](const TileGrid& g) { return detail::StatesFromRanges::of(g, d_ranges); });
}

Result<TileScan> scan_with_tiles(const MaskView& device_view, TileSize size, Stream stream) {
  return run_with_tiles(device_view, nullptr, 0, size, stream);
}

Result<TileScan> scan_host_mask_with_tiles(const MaskView& host_view, TileSize size, std::int64_t offset_bytes,
                                           Stream stream) {
  if (host_view.data() == nullptr) return error(ErrorCode::invalid_argument, "view is empty (data is null)");
  const int esize = element_size(host_view.dtype());
  if (offset_bytes < 0 || offset_bytes >= 256 || offset_bytes % esize != 0)
    return error(ErrorCode::misaligned_pointer, "offset_bytes must be a multiple of the element size (" +
                                                    std::to_string(esize) + ") in [0, 256), got " +
                                                    std::to_string(offset_bytes));
  return run_with_tiles(host_view, &host_view, offset_bytes, size, stream);
}

}  // namespace masklens::gpu
