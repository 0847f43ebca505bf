// The whole device step — scan on the GPU, runs to the host, classify, decide — against
// one plain read of the mask (issue 13's goal: within 1.1x), on 65536^2 and 69632^2
// bool and bf16 masks: causal, sliding window 4096, 3 packed documents, left-padded
// causal. Per case, in one run:
//   read       a vectorised 16-byte read of the mask's bytes (the baseline)
//   scan       scan_spans (device, CUDA events)
//   reduce     reduce_runs (device, CUDA events)
//   copy       the run count and the runs to the host, synchronised (host clock)
//   classify   classify(SpanRuns) on the host
//   decide     decide(structure, call) on the host
//   step       inspect_runs + decide as a program calls them (allocation on the stream's
//              pool, one synchronisation): median, and its first call on the mask
//   buffers    the same with the caller's buffers (no allocation): scan_spans,
//              reduce_runs, the copy, classify, decide: its first call on the mask (timed
//              before anything else touches the new mask), and its median
//   rows path  gpu::inspect + decide: every row to the host, classify(SpanTable)
//   read, first  the plain read timed as the first calls are (host clock, synchronised,
//              right after the mask is written): the baseline of the first-call ratios,
//              since a first touch of freshly written memory costs the read too
// Ratios are to the read. bf16 masks hold 0 / finfo(bf16).min as transformers writes them
// (--neg-inf: 0 / -inf). Writes a JSON line per case with --json FILE; --only SUBSTRING
// runs the cases whose name holds it. --preload calls gpu::load_kernels() once the CUDA
// context exists and before anything is timed (the baseline read's warm-up included),
// timed on the host clock, then again (finding them loaded): the process's first call
// (the first case's "buffers (first)", marked [first call of the process]) can then be
// set against a first read with the kernels already loaded, and against a run without
// the flag, where CUDA's lazy loading loads them inside that call.
#include <cuda_runtime.h>
#include <masklens/classify_runs.hpp>
#include <masklens/cuda/load_kernels.hpp>
#include <masklens/cuda/runs.hpp>
#include <masklens/cuda/scan.hpp>
#include <masklens/masklens.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "device_bench.cuh"

using namespace masklens;

namespace {

using masklens_bench::median_ms;
using masklens_bench::plain_read;

void require(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
    std::exit(1);
  }
}

// The structures of the cases: k <= q, inside a window, a document and the valid keys.
struct Shape {
  std::int64_t window = 0;           // 0: none
  std::int64_t doc1 = 0, doc2 = 0;   // document starts (0: none)
  std::int64_t pad = 0;              // keys before it are padding
};

__device__ __forceinline__ bool allowed(const Shape& s, std::int64_t q, std::int64_t k) {
  const auto doc = [&](std::int64_t x) { return (s.doc1 && x >= s.doc1 ? 1 : 0) + (s.doc2 && x >= s.doc2 ? 1 : 0); };
  return k <= q && (s.window == 0 || k > q - s.window) && k >= s.pad && doc(k) == doc(q);
}

// One block per row, threads over keys: bool 1 / 0, or bf16 0 / `masked`.
__global__ void fill(std::uint8_t* m, std::int64_t L, int esize, std::uint16_t masked, Shape s) {
  const std::int64_t q = blockIdx.x;
  for (std::int64_t k = threadIdx.x; k < L; k += blockDim.x) {
    const bool a = allowed(s, q, k);
    if (esize == 1) m[q * L + k] = a ? 1 : 0;
    else reinterpret_cast<std::uint16_t*>(m)[q * L + k] = a ? 0 : masked;
  }
}

template <class F>
double host_ms(F&& f) {
  const auto a = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count();
}

template <class F>
double median_host_ms(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(host_ms(f));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

AttentionCall call_for(std::int64_t L) {
  AttentionCall c;
  c.dtype = DType::bfloat16;
  c.head_dim = 128;
  c.heads = 32;
  c.kv_heads = 8;
  c.q_len = L;
  c.k_len = L;
  return c;
}

// The caller's buffers for the framework-style step: spans, runs + count, both temps,
// a pinned host landing for the count and runs.
struct Buffers {
  RowSpan* rows = nullptr;
  std::uint8_t* runs_block = nullptr;  // [count, 64 bytes][runs]
  void* scan_temp = nullptr;
  void* runs_temp = nullptr;
  std::size_t scan_temp_bytes = 0, runs_temp_bytes = 0;
  std::uint8_t* host = nullptr;  // pinned, same layout as runs_block
  std::int64_t capacity = 0;     // rows
};

Buffers make_buffers(std::int64_t rows, const MaskView& any_view) {
  Buffers b;
  b.capacity = rows;
  CHECK_CUDA(cudaMalloc(&b.rows, rows * sizeof(RowSpan)));
  CHECK_CUDA(cudaMalloc(&b.runs_block, 64 + rows * sizeof(SpanRun)));
  CHECK_CUDA(cudaMemset(b.runs_block, 0, 64 + rows * sizeof(SpanRun)));  // the copy reads 256 runs, written or not
  require(gpu::scan_spans(nullptr, b.scan_temp_bytes, any_view, nullptr), "scan_spans size");
  require(gpu::reduce_runs(nullptr, b.runs_temp_bytes, nullptr, rows, rows, nullptr, 1, nullptr), "reduce_runs size");
  CHECK_CUDA(cudaMalloc(&b.scan_temp, std::max<std::size_t>(b.scan_temp_bytes, 1)));
  CHECK_CUDA(cudaMalloc(&b.runs_temp, b.runs_temp_bytes));
  CHECK_CUDA(cudaMallocHost(&b.host, 64 + rows * sizeof(SpanRun)));
  return b;
}

// Count and runs to the host (pinned): the count with the first 256 runs, then the rest.
double copy_runs(const Buffers& b, SpanRuns& out, cudaStream_t stream) {
  return host_ms([&] {
    const std::int64_t eager = std::min<std::int64_t>(b.capacity, 256);
    CHECK_CUDA(cudaMemcpyAsync(b.host, b.runs_block, 64 + eager * sizeof(SpanRun), cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    std::int64_t count = 0;
    std::memcpy(&count, b.host, sizeof count);
    if (count > eager) {
      CHECK_CUDA(cudaMemcpyAsync(b.host + 64 + eager * sizeof(SpanRun), b.runs_block + 64 + eager * sizeof(SpanRun),
                                 (count - eager) * sizeof(SpanRun), cudaMemcpyDeviceToHost, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
    }
    out.runs.resize(static_cast<std::size_t>(count));
    std::memcpy(out.runs.data(), b.host + 64, count * sizeof(SpanRun));
  });
}

FILE* json = nullptr;

// A time for the JSON line, or null where it was not taken (negative).
std::string json_ms(double ms) {
  if (ms < 0) return "null";
  char text[32];
  std::snprintf(text, sizeof text, "%.4f", ms);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  std::string only;
  bool neg_inf = false, preload = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      if ((json = std::fopen(argv[++i], "w")) == nullptr) {
        std::fprintf(stderr, "cannot write %s\n", argv[i]);
        return 1;
      }
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--neg-inf") {
      neg_inf = true;
    } else if (a == "--preload") {
      preload = true;
    } else {
      std::fprintf(stderr, "usage: device_step [--json FILE] [--only SUBSTRING] [--neg-inf] [--preload]\n");
      return 2;
    }
  }
  const int reps = 20;
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs; bf16 masked value %s; times in ms, (x) = ratio to the plain read\n", prop.name,
              prop.multiProcessorCount, neg_inf ? "-inf" : "finfo.min");
  const unsigned read_grid = static_cast<unsigned>(prop.multiProcessorCount) * 8;
  unsigned* sink = nullptr;
  CHECK_CUDA(cudaMalloc(&sink, sizeof(unsigned)));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // --preload: masklens' kernels loaded as a framework's start-up would, the context
  // already made (cudaMalloc above), before anything is timed. The second call finds them
  // loaded: what a call that is not the first costs.
  double preload_ms = -1, preload_again_ms = -1;
  if (preload) {
    preload_ms = host_ms([] { require(gpu::load_kernels(), "load_kernels"); });
    preload_again_ms = host_ms([] { require(gpu::load_kernels(), "load_kernels (again)"); });
    std::printf("preload: gpu::load_kernels() %.3f ms, again %.3f ms (host clock, before anything timed)\n",
                preload_ms, preload_again_ms);
  }
  // Load the baseline's kernel now: the first "read, first" must not pay for it.
  plain_read<<<1, 32, 0, stream>>>(reinterpret_cast<const uint4*>(sink), 0, sink);
  CHECK_LAUNCH();
  CHECK_CUDA(cudaStreamSynchronize(stream));

  const std::int64_t Lmax = 69632;
  std::uint8_t* mask = nullptr;
  CHECK_CUDA(cudaMalloc(&mask, Lmax * Lmax * 2));
  const std::int64_t max_shape[] = {Lmax, Lmax};
  Buffers buf = make_buffers(Lmax, *MaskView::contiguous(mask, ElementType::bfloat16, max_shape));

  struct Structure {
    const char* name;
    Shape shape;
  };
  bool first_of_process = true;
  std::printf("%-38s %7s %7s %7s %7s %8s %8s | %15s %15s | %7s %23s %15s | %15s | %-s\n", "case", "read", "scan", "reduce",
              "copy", "classify", "decide", "step (first)", "median", "read 1st", "buffers (first: x read 1st)",
              "median", "rows path", "runs / verdict");
  for (const std::int64_t L : {std::int64_t{65536}, Lmax})
    for (const int esize : {1, 2})
      for (const Structure& st : {Structure{"causal", {}}, Structure{"window 4096", {4096, 0, 0, 0}},
                                  Structure{"3 documents", {0, L / 3, 2 * L / 3, 0}},
                                  Structure{"left-padded causal", {0, 0, 0, 1234}}}) {
        const std::string name = std::string(esize == 1 ? "bool " : "bf16 ") + std::to_string(L) + "^2 " + st.name;
        if (name.find(only) == std::string::npos) continue;
        fill<<<static_cast<unsigned>(L), 256, 0, stream>>>(mask, L, esize, neg_inf ? 0xFF80 : 0xFF7F, st.shape);
        CHECK_LAUNCH();
        CHECK_CUDA(cudaStreamSynchronize(stream));
        const std::int64_t shape[] = {L, L};
        const MaskView view =
            *MaskView::contiguous(mask, esize == 1 ? ElementType::boolean : ElementType::bfloat16, shape);
        const AttentionCall call = call_for(L);
        const std::int64_t bytes = L * L * esize;

        std::size_t runs_temp = buf.runs_temp_bytes;
        const auto reduce_now = [&](cudaStream_t s) {
          require(gpu::reduce_runs(buf.runs_temp, runs_temp, buf.rows, L, L, reinterpret_cast<SpanRun*>(buf.runs_block + 64),
                                   buf.capacity, reinterpret_cast<std::int64_t*>(buf.runs_block), nullptr, s),
                  "reduce_runs");
        };
        SpanRuns runs;
        runs.batch = runs.heads = runs.distinct_batch = runs.distinct_heads = 1;
        runs.q_len = runs.k_len = L;
        // Framework style: the caller's buffers, no allocation, one stream. Its first call
        // comes first on this mask (the process's very first call also loads the kernels).
        const auto buffers_step = [&] {
          require(gpu::scan_spans(buf.scan_temp, buf.scan_temp_bytes, view, buf.rows, stream), "scan_spans");
          reduce_now(stream);
          SpanRuns r = runs;
          copy_runs(buf, r, stream);
          auto v = classify(r);
          require(v.status(), "classify");
          require(decide(*v, call).status(), "decide");
        };
        // The first calls meet memory just written: the baseline for them is a read timed
        // the same way, on a mask just written (the fill again, so that both see the same).
        const double read_first = host_ms([&] {
          plain_read<<<read_grid, 256, 0, stream>>>(reinterpret_cast<const uint4*>(mask), bytes / 16, sink);
          CHECK_LAUNCH();
          CHECK_CUDA(cudaStreamSynchronize(stream));
        });
        fill<<<static_cast<unsigned>(L), 256, 0, stream>>>(mask, L, esize, neg_inf ? 0xFF80 : 0xFF7F, st.shape);
        CHECK_LAUNCH();
        CHECK_CUDA(cudaStreamSynchronize(stream));
        const double buffers_first = host_ms(buffers_step);

        // The whole step as a program calls it (allocation on the stream's pool), first on
        // this mask, then its median.
        Result<MaskStructure> verdict = error(ErrorCode::invalid_argument, "not run");
        const double first = host_ms([&] {
          verdict = gpu::inspect_runs(view, stream);
          require(verdict.status(), "inspect_runs");
          require(decide(*verdict, call).status(), "decide");
        });
        const double step = median_host_ms(reps, [&] {
          auto v = gpu::inspect_runs(view, stream);
          require(v.status(), "inspect_runs");
          require(decide(*v, call).status(), "decide");
        });

        const float read = median_ms(reps, [&] {
          plain_read<<<read_grid, 256>>>(reinterpret_cast<const uint4*>(mask), bytes / 16, sink);
        });
        CHECK_LAUNCH();
        const float scan = median_ms(reps, [&] {
          require(gpu::scan_spans(buf.scan_temp, buf.scan_temp_bytes, view, buf.rows), "scan_spans");
        });
        const float reduce = median_ms(reps, [&] { reduce_now(nullptr); });
        CHECK_CUDA(cudaDeviceSynchronize());
        // Copy, classify and decide on the runs just reduced.
        std::vector<double> copies;
        for (int i = 0; i < reps; ++i) copies.push_back(copy_runs(buf, runs, stream));
        std::sort(copies.begin(), copies.end());
        const double copy = copies[copies.size() / 2];
        Result<MaskStructure> from_runs = classify(runs);
        require(from_runs.status(), "classify(SpanRuns)");
        const double classify_ms = median_host_ms(reps * 10, [&] { (void)classify(runs); });
        const double decide_ms = median_host_ms(reps * 10, [&] { (void)decide(*from_runs, call); });

        const double buffers = median_host_ms(reps, buffers_step);
        // Every row to the host, classify(SpanTable).
        const double rows_path = median_host_ms(reps / 4, [&] {
          auto v = gpu::inspect(view, stream);
          require(v.status(), "inspect");
          require(decide(*v, call).status(), "decide");
        });
        const std::string text = describe(*verdict);
        const bool same = describe(*from_runs) == text;
        std::printf("%-38s %7.3f %7.3f %7.3f %7.3f %8.4f %8.4f | %6.3f (%5.2fx) %6.3f (%5.2fx) | %7.3f %6.3f (%5.2fx, %5.2fx) %6.3f (%5.2fx) | %6.3f (%5.2fx) | %zu: %.40s%s%s\n",
                    name.c_str(), read, scan, reduce, copy, classify_ms, decide_ms, first, first / read, step,
                    step / read, read_first, buffers_first, buffers_first / read, buffers_first / read_first, buffers,
                    buffers / read, rows_path, rows_path / read, runs.runs.size(), text.c_str(),
                    same ? "" : " (VERDICTS DIFFER)",
                    first_of_process ? (preload ? " [first call of the process] [kernels preloaded]"
                                                : " [first call of the process]")
                                     : "");
        if (json)
          std::fprintf(json,
                       "{\"case\": \"%s\", \"bytes\": %lld, \"read_ms\": %.4f, \"scan_ms\": %.4f, \"reduce_ms\": %.4f, "
                       "\"copy_ms\": %.4f, \"classify_ms\": %.5f, \"decide_ms\": %.5f, \"step_first_ms\": %.4f, "
                       "\"step_ms\": %.4f, \"read_first_ms\": %.4f, \"step_buffers_first_ms\": %.4f, \"step_buffers_ms\": %.4f, \"rows_path_ms\": %.4f, \"runs\": %zu, "
                       "\"step_ratio\": %.4f, \"step_buffers_ratio\": %.4f, \"first_of_process\": %s, \"verdict\": \"%s\", "
                       "\"preload\": %s, \"preload_ms\": %s, \"preload_again_ms\": %s}\n",
                       name.c_str(), static_cast<long long>(bytes), read, scan, reduce, copy, classify_ms, decide_ms,
                       first, step, read_first, buffers_first, buffers, rows_path, runs.runs.size(), step / read, buffers / read,
                       first_of_process ? "true" : "false", text.c_str(), preload ? "true" : "false",
                       json_ms(preload_ms).c_str(), json_ms(preload_again_ms).c_str());
        first_of_process = false;
        if (!same) return 1;
      }
  CHECK_CUDA(cudaFreeHost(buf.host));
  CHECK_CUDA(cudaFree(buf.rows));
  CHECK_CUDA(cudaFree(buf.runs_block));
  CHECK_CUDA(cudaFree(buf.scan_temp));
  CHECK_CUDA(cudaFree(buf.runs_temp));
  CHECK_CUDA(cudaFree(mask));
  CHECK_CUDA(cudaFree(sink));
  CHECK_CUDA(cudaStreamDestroy(stream));
  if (json && std::fclose(json) != 0) return 1;
  return 0;
}
