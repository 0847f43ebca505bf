// decide(structure, call, options) -> Policy: the backend and arguments that compute
// this mask correctly and fastest for this call, or an exact plan of several calls,
// with every rejected backend, its reason and source, and the hazards that remain.
//
// Order of preference: a backend that takes the structure natively with the mask
// dropped (cost_rank order); else an exact plan of unmasked calls within
// max_plan_calls; else the dense mask on a backend that is correct for it.
#pragma once

#include <algorithm>
#include <array>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "backends/cudnn_frontend.hpp"
#include "backends/flash_attn.hpp"
#include "backends/flashinfer.hpp"
#include "backends/flex_attention.hpp"
#include "backends/torch_sdpa.hpp"
#include "backends/transformer_engine.hpp"
#include "backends/xformers.hpp"
#include "call.hpp"
#include "defects.hpp"
#include "plan.hpp"
#include "status.hpp"
#include "structure.hpp"

namespace masklens {

struct PlanStep {
  Backend backend = Backend::sdpa_math;
  Args args;
  std::int64_t batch = 0;
  KeyRange q_range, k_range;
};

enum class RejectionKind : std::uint8_t {
  unavailable,    // its family is not in AttentionCall::available
  refused,        // a capability rule refuses the call
  defect,         // a known defect makes every way it could run wrong or failing
  inexpressible,  // cannot run this structure natively and takes no dense mask
  slower,         // correct, but the chosen call is cheaper
};

constexpr std::string_view to_string(RejectionKind k) noexcept {
  switch (k) {
    case RejectionKind::unavailable: return "unavailable";
    case RejectionKind::refused: return "refused";
    case RejectionKind::defect: return "defect";
    case RejectionKind::inexpressible: return "inexpressible";
    case RejectionKind::slower: return "slower";
  }
  return "unknown";
}

// Why a backend was not chosen. Holds static text, rule bits and numbers, formatting
// reason() on demand, so decide() allocates nothing for rejections but their vector.
struct Rejection {
  Backend backend = Backend::sdpa_math;
  RejectionKind kind = RejectionKind::unavailable;
  std::string_view source;          // where the rule, defect or cost order comes from
  Refusals refusals;                // refused: the rules that refuse
  AttentionCall call;               // refused: the call their reasons quote
  const Defect* defect = nullptr;   // defect
  Usage usage = Usage::native;      // slower: the way it would have run
  int cost = 0, chosen_cost = 0;    // slower
  std::int64_t plan_calls = 0;      // slower, usage plan_step
  StructureKind structure = StructureKind::arbitrary;  // inexpressible

  [[nodiscard]] std::string reason() const {
    switch (kind) {
      case RejectionKind::unavailable: return "not available (its family is not in AttentionCall::available)";
      case RejectionKind::refused: return refusals.text(call);
      case RejectionKind::defect:
        return std::string(defect->effect == Effect::silently_wrong ? "silently wrong: " : "fails: ") +
               std::string(defect->condition) + " [" + std::string(defect->id) + "]";
      case RejectionKind::inexpressible:
        return backend == Backend::sdpa_flash
                   ? "takes no attn_mask, and cannot express " + std::string(to_string(structure)) + " natively"
                   : "cannot express this structure natively and takes no dense mask";
      case RejectionKind::slower: {
        const char* how = usage == Usage::native ? "natively" : usage == Usage::dense_mask ? "with the dense mask"
                                                                                          : "in a plan";
        std::string text = std::string("correct ") + how;
        if (usage == Usage::plan_step) text += " of " + std::to_string(plan_calls) + " calls";
        return text + " but slower (cost " + std::to_string(cost) + " vs " + std::to_string(chosen_cost) + ")";
      }
    }
    return {};
  }
};

struct Hazard {
  std::string kind;  // empty_rows | finite_masked_rows | bias | gqa_expand | plan
  std::string detail;
};

struct Policy {
  Backend backend = Backend::sdpa_math;
  Args args;                     // attn_mask: drop | keep | replace, and the backend's own arguments
  std::vector<PlanStep> plan;    // empty = one call
  std::vector<Rejection> rejected;
  std::vector<Hazard> hazards;
};

struct DecideOptions {
  // A plan beats the dense mask only while it stays this short (calls over all batches).
  std::int64_t max_plan_calls = 64;
};

// The cost order of the ways to run a mask: native < plan < dense mask.
inline constexpr int kPlanPenalty = 3;
inline constexpr int kDensePenalty = 10;

namespace detail {

// The capability rules of a backend, in the order they are checked.
inline std::span<const Rule> rules(Backend b) noexcept {
  switch (family(b)) {
    case kFamilyTorch: return backends::torch_sdpa::rules(b);
    case kFamilyFlashAttn:
    case kFamilyFlashAttn3: return backends::flash_attn::rules(b);
    case kFamilyFlex: return backends::flex_attention::kRules;
    case kFamilyXformers: return backends::xformers::kRules;
    case kFamilyTransformerEngine: return backends::transformer_engine::kRules;
    case kFamilyFlashInfer: return backends::flashinfer::kRules;
    case kFamilyCudnnFrontend: return backends::cudnn_frontend::kRules;
  }
  return {};
}

// Every table fits the Refusals bit set.
static_assert(std::size(backends::torch_sdpa::kCausalLowerRightRules) <= kMaxRules &&
              std::size(backends::torch_sdpa::kCudnnRules) <= kMaxRules &&
              std::size(backends::flash_attn::kFa2Rules) <= kMaxRules &&
              std::size(backends::flash_attn::kFa3Rules) <= kMaxRules &&
              std::size(backends::flex_attention::kRules) <= kMaxRules &&
              std::size(backends::xformers::kRules) <= kMaxRules &&
              std::size(backends::transformer_engine::kRules) <= kMaxRules &&
              std::size(backends::flashinfer::kRules) <= kMaxRules &&
              std::size(backends::cudnn_frontend::kRules) <= kMaxRules);

inline Refusals refusals(Backend b, const AttentionCall& c) noexcept {
  return family(b) == kFamilyTorch ? backends::torch_sdpa::refusals(b, c) : check_rules(rules(b), c);
}

// Whether `b` computes `s` with the mask dropped; its arguments into `out` when given.
inline bool native_args(Backend b, const MaskStructure& s, Args* out = nullptr) {
  if (s.has_q_valid()) return false;  // no backend's native form leaves padded query rows empty yet
  switch (family(b)) {
    case kFamilyTorch: return backends::torch_sdpa::native_args(b, s, out);
    case kFamilyFlashAttn:
    case kFamilyFlashAttn3: return backends::flash_attn::native_args(b, s, out);
    case kFamilyFlex:
      if (s.kind == StructureKind::arbitrary) return false;  // reads the dense mask: see dense_args
      return emit(out, [&] { return backends::flex_attention::args(s); });
    case kFamilyXformers: return backends::xformers::native_args(s, out);
    case kFamilyTransformerEngine: return backends::transformer_engine::native_args(s, out);
    case kFamilyFlashInfer: return backends::flashinfer::native_args(s, out);
    case kFamilyCudnnFrontend: return backends::cudnn_frontend::native_args(s, out);
  }
  return false;
}

// Dense-mask forms: SDPA's attn_mask, flex reading the tensor in its mask_mod,
// xformers / cuDNN frontend bias tensors, TE "arbitrary", FlashInfer custom masks.
inline bool dense_args(Backend b, const MaskStructure& s, Args* out = nullptr) {
  if (backends::torch_sdpa::accepts_dense_mask(b))
    return emit(out, [] { return Args{{"attn_mask", "keep"}, {"is_causal", false}}; });
  switch (b) {
    case Backend::flex_attention:
      return emit(out, [&] {
        MaskStructure arbitrary = s;
        arbitrary.kind = StructureKind::arbitrary;
        return backends::flex_attention::args(arbitrary);
      });
    case Backend::xformers: return emit(out, [] { return Args{{"attn_mask", "keep"}, {"attn_bias", "tensor"}}; });
    case Backend::transformer_engine:
      return emit(out, [] {
        return Args{{"attn_mask", "keep"}, {"attn_mask_type", "arbitrary"},
                    {"mask_polarity", "true = masked out (invert torch's bool mask)"}};
      });
    case Backend::flashinfer:
      return emit(out, [] {
        return Args{{"attn_mask", "keep"}, {"mask_mode", "custom"}, {"custom_mask", "packbits(mask, bitorder='little')"}};
      });
    case Backend::cudnn_frontend: return emit(out, [] { return Args{{"attn_mask", "keep"}, {"bias", "mask"}}; });
    default: return false;
  }
}

// A way to run the mask: its arguments are built only for the one chosen.
struct Candidate {
  Backend backend;
  Usage usage;
  int score;
};

// The best torch SDPA call for one unmasked plan step on a slice of the call.
inline std::optional<PlanStep> plan_step(const RowRun& run, const AttentionCall& call, const MaskStructure& s) {
  PlanStep step;
  step.batch = run.batch;
  step.q_range = run.q_range;
  step.k_range = run.k_range;
  if (run.kind == RunKind::zeros) {
    step.backend = Backend::zeros;
    step.args = {{"output", std::string("zeros")}};
    return step;
  }
  AttentionCall sub = call;
  sub.batch = 1;
  sub.q_len = run.q_range.end - run.q_range.start;
  sub.k_len = run.k_range.end - run.k_range.start;
  MaskStructure slice;
  slice.q_len = sub.q_len;
  slice.k_len = sub.k_len;
  slice.kind = run.kind == RunKind::full ? StructureKind::full : StructureKind::causal;
  slice.alignment = Alignment::bottom_right;
  std::optional<Backend> best;
  for (Backend b : {Backend::sdpa_cudnn, Backend::sdpa_flash, Backend::sdpa_causal_lower_right,
                    Backend::sdpa_efficient, Backend::sdpa_math}) {
    if (refusals(b, sub).any() || first_defect({b, Usage::plan_step, sub, s})) continue;
    if (!backends::torch_sdpa::native_args(b, slice)) continue;
    if (!best || cost_rank(b) < cost_rank(*best)) best = b;
  }
  if (!best) return std::nullopt;
  step.backend = *best;
  backends::torch_sdpa::native_args(*best, slice, &step.args);
  return step;
}

}  // namespace detail

// The call decide() judges: lengths left 0 take the structure's, and the batch covers it.
inline AttentionCall effective_call(const MaskStructure& structure, AttentionCall call) noexcept {
  if (call.q_len == 0) call.q_len = structure.q_len;
  if (call.k_len == 0) call.k_len = structure.k_len;
  if (call.batch < structure.batch) call.batch = structure.batch;
  return call;
}

inline Result<Policy> decide(const MaskStructure& structure, const AttentionCall& call_in, const DecideOptions& options = {}) {
  if (Status invalid = structure.validate(); !invalid.ok()) return invalid;
  // Judge what the structure implies (its empty rows), never a count it was handed.
  if (!spelled_out(structure)) {
    Result<MaskStructure> explicit_structure = spell_out(structure);
    if (!explicit_structure) return explicit_structure.status();
    return decide(*explicit_structure, call_in, options);
  }
  if (structure.q_len < 1 || structure.k_len < 1 || structure.batch < 1)
    return error(ErrorCode::invalid_shape, "structure has an empty shape");
  if (call_in.head_dim < 1 || call_in.heads < 1 || call_in.key_heads() < 1 || call_in.heads % call_in.key_heads() != 0)
    return error(ErrorCode::invalid_argument, "call needs head_dim >= 1 and heads a multiple of kv_heads, got heads " +
                                                  std::to_string(call_in.heads) + ", kv_heads " +
                                                  std::to_string(call_in.key_heads()));
  if (!(call_in.dropout >= 0.0 && call_in.dropout < 1.0))
    return error(ErrorCode::invalid_argument, "dropout must be in [0, 1)");
  return catch_alloc([&]() -> Result<Policy> {
    const AttentionCall call = effective_call(structure, call_in);
    const MaskStructure& s = structure;
    // The mask must stay whenever dropping it would change the result.
    const bool must_keep_mask = s.kind == StructureKind::arbitrary || s.bias || s.finite_masked_rows > 0;

    // Every backend either becomes a candidate (a way to run the mask, arguments not yet
    // built) or a rejection; fixed arrays, so this loop allocates nothing.
    constexpr std::size_t kBackends = std::size(kAllBackends);
    std::array<detail::Candidate, kBackends> candidates{};
    std::array<Rejection, kBackends> refused{};
    std::size_t n_candidates = 0, n_refused = 0;
    bool any_native = false;
    for (Backend b : kAllBackends) {
      Rejection& no = refused[n_refused];
      no.backend = b;
      if (!call.has(family(b))) {
        no.kind = RejectionKind::unavailable;
        no.source = "AttentionCall::available";
        ++n_refused;
        continue;
      }
      if (const Refusals why = detail::refusals(b, call); why.any()) {
        no.kind = RejectionKind::refused;
        no.refusals = why;
        no.call = call;
        no.source = why.source();
        ++n_refused;
        continue;
      }
      const Defect* lost = nullptr;
      if (!must_keep_mask && detail::native_args(b, s)) {
        if (!(lost = first_defect({b, Usage::native, call, s}))) {
          candidates[n_candidates++] = {b, Usage::native, cost_rank(b)};
          any_native = true;
          continue;
        }
      }
      if (detail::dense_args(b, s)) {
        if (const Defect* d = first_defect({b, Usage::dense_mask, call, s})) {
          lost = lost ? lost : d;
        } else {
          candidates[n_candidates++] = {b, Usage::dense_mask, cost_rank(b) + kDensePenalty};
          continue;
        }
      }
      if (lost) {
        no.kind = RejectionKind::defect;
        no.defect = lost;
        no.source = lost->source;
      } else {
        no.kind = RejectionKind::inexpressible;
        no.structure = s.kind;
        no.source = "docs/backends.md";
      }
      ++n_refused;
    }

    // No single native call: an exact plan of unmasked torch calls, if short enough.
    Policy policy;
    std::string plan_note;
    std::optional<detail::Candidate> plan;
    std::vector<PlanStep> plan_steps;
    if (!any_native && !must_keep_mask && call.has(kFamilyTorch)) {
      if (auto runs = decompose_rows(s, options.max_plan_calls)) {
        plan_steps.reserve(runs->size());
        int worst = 0;
        for (const RowRun& run : *runs) {
          std::optional<PlanStep> step = detail::plan_step(run, call, s);
          if (!step) {
            plan_steps.clear();
            plan_note = "a plan step has no capable torch backend";
            break;
          }
          worst = std::max(worst, cost_rank(step->backend));
          plan_steps.push_back(std::move(*step));
        }
        if (!plan_steps.empty()) {
          const auto main = std::find_if(plan_steps.begin(), plan_steps.end(),
                                         [](const PlanStep& p) { return p.backend != Backend::zeros; });
          plan = detail::Candidate{main == plan_steps.end() ? Backend::zeros : main->backend, Usage::plan_step,
                                   worst + kPlanPenalty};
        }
      } else {
        plan_note = "an exact plan needs more than max_plan_calls (" + std::to_string(options.max_plan_calls) + ") calls";
      }
    }

    if (n_candidates == 0 && !plan) return error(ErrorCode::invalid_argument, "no available backend computes this mask correctly");
    const detail::Candidate* best = std::min_element(candidates.data(), candidates.data() + n_candidates,
                                                     [](const auto& a, const auto& b) { return a.score < b.score; });
    if (plan && (n_candidates == 0 || plan->score < best->score)) best = &*plan;
    policy.backend = best->backend;
    if (best->usage == Usage::native) detail::native_args(best->backend, s, &policy.args);
    else if (best->usage == Usage::dense_mask) detail::dense_args(best->backend, s, &policy.args);
    else {
      policy.args = {{"attn_mask", "drop"}};
      policy.plan = std::move(plan_steps);
    }
    policy.rejected.reserve(n_candidates + (plan ? 1 : 0) + n_refused);
    auto slower = [&](const detail::Candidate& c, std::int64_t plan_calls) {
      Rejection r;
      r.backend = c.backend;
      r.kind = RejectionKind::slower;
      r.source = "docs/backends.md (cost order)";
      r.usage = c.usage;
      r.cost = c.score;
      r.chosen_cost = best->score;
      r.plan_calls = plan_calls;
      policy.rejected.push_back(std::move(r));
    };
    for (std::size_t i = 0; i < n_candidates; ++i)
      if (&candidates[i] != best) slower(candidates[i], 0);
    if (plan && best != &*plan) slower(*plan, static_cast<std::int64_t>(plan_steps.size()));
    std::move(refused.begin(), refused.begin() + static_cast<std::ptrdiff_t>(n_refused),
              std::back_inserter(policy.rejected));
    if (!plan_note.empty() && best->usage != Usage::plan_step)
      policy.hazards.push_back({"plan", "no plan: " + plan_note});

    // Hazards that stay with the chosen call.
    const std::int64_t hard_empty = s.empty_rows - s.finite_masked_rows;
    if (hard_empty > 0)
      policy.hazards.push_back({"empty_rows", std::to_string(hard_empty) +
                                                  " query rows attend to nothing: the result for them is 0 here (math, "
                                                  "efficient, flex, plan zeros); cuDNN with a mask returns the mean of V"});
    if (s.finite_masked_rows > 0)
      policy.hazards.push_back({"finite_masked_rows", std::to_string(s.finite_masked_rows) +
                                                          " rows are masked only by finite values: dense softmax attends "
                                                          "uniformly over them, so the mask is kept"});
    if (s.bias) policy.hazards.push_back({"bias", "the additive mask carries bias values: it is kept"});
    const bool torch_sdpa = family(best->backend) == kFamilyTorch && best->backend != Backend::zeros;
    if (call.gqa() && torch_sdpa) {
      if (backends::torch_sdpa::native_gqa(best->backend, call)) {
        policy.args.push_back({"enable_gqa", true});
      } else {
        policy.hazards.push_back({"gqa_expand", "kv_heads " + std::to_string(call.key_heads()) + " < heads " +
                                                    std::to_string(call.heads) +
                                                    ": expand K and V (repeat_interleave) before the call"});
      }
    }
    return policy;
  });
}

}  // namespace masklens
