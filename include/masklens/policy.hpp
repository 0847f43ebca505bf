// decide(structure, call, environment, options) -> Policy: the backend and typed call
// that compute this mask correctly and fastest, or an exact plan of several calls,
// with every rejected backend, its reason and source, and the hazards that remain.
//
// The steps (docs/policy.md), one function each:
//   1. check the inputs (the structure, the call, the environment);
//   2. judge every backend: unavailable, refused by a rule, a defect, inexpressible,
//      or a candidate way to run the mask (natively, or with the dense mask kept and
//      cast as its rules require) with its estimated cost (cost.hpp);
//   3. where no backend runs the structure natively, an exact plan of unmasked torch
//      calls (plan.hpp), costed the same way;
//   4. choose the cheapest candidate and build its call;
//   5. list the rest as rejections and the hazards that stay with the call.
#pragma once

#include <algorithm>
#include <array>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "backend_call.hpp"
#include "backends/registry.hpp"
#include "call.hpp"
#include "cost.hpp"
#include "defects.hpp"
#include "plan.hpp"
#include "status.hpp"
#include "structure.hpp"
#include "structure_tiles.hpp"

namespace masklens {

struct PlanStep {
  Call call;
  std::int64_t batch = 0;
  KeyRange q_range, k_range;  // the step reads q[batch, :, q_range] and k/v[batch, :, k_range]
};

enum class RejectionKind : std::uint8_t {
  unavailable,    // its family is not in Environment::available
  refused,        // a capability rule refuses the call
  defect,         // a known defect makes every way it could run wrong or failing
  inexpressible,  // cannot run this structure natively and takes no dense mask
  slower,         // correct, but the chosen call costs less
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

// Milliseconds as the reasons and the CLI print them: three decimals below 1 ms, one
// below 100, none above; `significant` > 0: that many significant digits instead.
inline std::string format_ms(double ms, int significant = 0) {
  char buf[48];
  if (significant > 0)
    std::snprintf(buf, sizeof buf, "%#.*g ms", significant, ms);  // '#': trailing zeros kept
  else
    std::snprintf(buf, sizeof buf, ms < 1 ? "%.3f ms" : ms < 100 ? "%.1f ms" : "%.0f ms", ms);
  return buf;
}

// Why a backend was not chosen. Holds static text, rule bits and numbers, formatting
// reason() on demand, so decide() allocates nothing for rejections but their vector.
struct Rejection {
  Backend backend = Backend::sdpa_math;
  RejectionKind kind = RejectionKind::unavailable;
  std::string_view source;          // where the rule, defect or cost figure comes from
  Refusals refusals;                // refused: the rules that refuse
  CallContext context;              // refused: the call their reasons quote
  const Defect* defect = nullptr;   // defect
  Usage usage = Usage::native;      // slower: the way it would have run
  double cost_ms = 0, chosen_cost_ms = 0;  // slower: estimated milliseconds (cost.hpp)
  double compile_ms = 0;            // slower: the part of cost_ms a cold FlexAttention compile is
  std::int64_t plan_calls = 0;      // slower, usage plan_step
  StructureKind structure = StructureKind::arbitrary;  // inexpressible
  bool segments = false, kv_valid = false;              // inexpressible: the structure's modifiers

  [[nodiscard]] std::string reason() const {
    switch (kind) {
      case RejectionKind::unavailable: return "not available (its family is not in Environment::available)";
      case RejectionKind::refused: return refusals.text(context);
      case RejectionKind::defect:
        return std::string(defect->effect == Effect::silently_wrong ? "silently wrong: " : "fails: ") +
               std::string(defect->condition) + " [" + std::string(defect->id) + "]";
      case RejectionKind::inexpressible: {
        std::string what(to_string(structure));
        if (segments) what += " with packed documents (segments)";
        if (kv_valid) what += segments ? " and padding (kv_valid)" : " with padding (kv_valid)";
        return (info(backend).dense ? "cannot express " : "takes no dense mask and cannot express ") + what +
               " natively";
      }
      case RejectionKind::slower: {
        const char* how = usage == Usage::native ? "natively" : usage == Usage::dense_mask ? "with the dense mask"
                                                                                          : "as a plan";
        std::string text = std::string("correct ") + how;
        if (usage == Usage::plan_step)
          text += " of " + std::to_string(plan_calls) + (plan_calls == 1 ? " call" : " calls");
        // Digits enough that two different estimates never read alike; estimates alike to
        // 9 digits (or equal: the candidate met first was chosen) are said as a tie.
        std::string mine = format_ms(cost_ms), chosen = format_ms(chosen_cost_ms);
        for (int digits = 4; mine == chosen && digits <= 9; ++digits) {
          mine = format_ms(cost_ms, digits);
          chosen = format_ms(chosen_cost_ms, digits);
        }
        const std::string cold = compile_ms > 0 ? ", a cold compile of " + format_ms(compile_ms) + " included" : "";
        if (mine == chosen || !(cost_ms > chosen_cost_ms))
          return text + " and no faster (estimated " + format_ms(cost_ms) + cold + ", as the chosen call)";
        return text + " but slower (estimated " + mine + cold + " vs " + chosen + ")";
      }
    }
    return {};
  }
};

enum class HazardKind : std::uint8_t { empty_rows, finite_masked_rows, bias, gqa_expand, mask_cast, plan };

constexpr std::string_view to_string(HazardKind k) noexcept {
  switch (k) {
    case HazardKind::empty_rows: return "empty_rows";
    case HazardKind::finite_masked_rows: return "finite_masked_rows";
    case HazardKind::bias: return "bias";
    case HazardKind::gqa_expand: return "gqa_expand";
    case HazardKind::mask_cast: return "mask_cast";
    case HazardKind::plan: return "plan";
  }
  return "unknown";
}

struct Hazard {
  HazardKind kind;
  std::string detail;
};

struct Policy {
  Call call;                     // the one call; for a plan, its main step's backend with the mask dropped
  std::vector<PlanStep> plan;    // empty = one call
  std::vector<Rejection> rejected;
  std::vector<Hazard> hazards;
  double cost_ms = 0;            // the chosen call's estimated cost (cost.hpp)

  [[nodiscard]] bool is_plan() const noexcept { return !plan.empty(); }
  [[nodiscard]] Backend backend() const noexcept { return call.backend; }
};

struct DecideOptions {
  // A plan is considered only while it stays this short (calls over all batches).
  std::int64_t max_plan_calls = 64;
  // Milliseconds a FlexAttention call spends compiling before it runs: 0 (the default)
  // where a compiled kernel for the call's shape bucket is warm, or where the caller
  // runs flex without compiling; kFlexColdCompileMs (cost.hpp), or the caller's own
  // estimate, where it would compile now; +inf where flex must not run at all. A cold
  // flex pays it on top of its run: it is never chosen where a warm or compile-free call
  // (varlen_attn, cuDNN with the mask, a plan of is_causal slices) costs less than the
  // compile (docs/policy.md, "A cold compile").
  double flex_compile_ms = 0;
  // Milliseconds building the dense mask costs before a call that keeps it can run: 0
  // (the default) where the mask is at hand (it was handed over, or scanned); the
  // caller's estimate where the structure is known without the mask (a definition read
  // back, masklens.transformers), so that a call that drops it wins unless keeping it
  // saves more; +inf where it must not be built at all. Charged to every call that keeps
  // the mask, never to a plan.
  double mask_build_ms = 0;

  [[nodiscard]] Status validate() const {
    if (!(flex_compile_ms >= 0))  // written so that NaN fails too
      return Status(ErrorCode::invalid_argument,
                    "options.flex_compile_ms must be >= 0 (or +inf), got " + short_number(flex_compile_ms));
    if (!(mask_build_ms >= 0))
      return Status(ErrorCode::invalid_argument,
                    "options.mask_build_ms must be >= 0 (or +inf), got " + short_number(mask_build_ms));
    return {};
  }
};

namespace detail {

// A way to run the mask, its call not yet built (only the chosen one is).
struct Candidate {
  Backend backend = Backend::sdpa_math;
  Usage usage = Usage::native;
  double cost_ms = 0;
  std::optional<ElementType> mask_cast;
  // FlexAttention on an exact structure: cost_ms is the attended-pairs estimate every
  // native kernel gets, until refine_flex() counts the structure's tiles.
  bool flex_untiled = false;
  double compile_ms = 0;  // FlexAttention: the cold compile cost_ms includes (charge_flex_compile)
};

// The mask must stay whenever dropping it would change the result.
inline bool must_keep_mask(const MaskStructure& s) noexcept {
  return s.kind == StructureKind::arbitrary || s.bias || s.finite_masked_rows > 0;
}

inline double call_cost(Backend b, Usage usage, double pairs, const CallContext& c) noexcept {
  const CostRates r = cost_rates(b, c.env.sm);
  return kCallOverheadMs + (usage == Usage::dense_mask ? r.dense : r.native) * work_units(pairs, c.call);
}

// A backend's candidate, costed by its work model (cost.hpp). A flex_tiles backend:
// an arbitrary mask is charged on the tiles its scan counted (every tile partial when it
// gave none); an exact structure first gets the estimate of any native kernel, its
// attended pairs, and refine_flex() counts its tiles when it may win.
inline Candidate candidate(const BackendInfo& b, const MaskStructure& s, Usage usage,
                           std::optional<ElementType> cast, const CallContext& c) noexcept {
  const bool dense_mask = usage == Usage::dense_mask;
  Candidate out{b.id, usage, 0, cast, false};
  if (b.work != WorkModel::flex_tiles) {
    out.cost_ms = call_cost(b.id, usage, computed_pairs(b.work, dense_mask, s), c);
  } else if (s.kind == StructureKind::arbitrary) {
    out.cost_ms = call_cost(b.id, usage, flex_pairs(s, s.tile_fractions.value_or(kEveryTilePartial), dense_mask), c);
  } else {
    out.cost_ms = call_cost(b.id, usage, attended_pairs(s), c);
    out.flex_untiled = true;
  }
  return out;
}

// Step 2, for flex on an exact structure: when its attended-pairs estimate is the
// lowest, its cost becomes that of the tiles it computes (structure_tiles.hpp, O(q
// tiles) per distinct batch). Tiles only add to the attended pairs, so a flex call whose
// estimate already loses is left at it; this keeps decide() O(1) in the tile count
// whenever another backend is cheaper.
inline void refine_flex(const MaskStructure& s, const CallContext& c, Candidate* candidates, std::size_t n) noexcept {
  // Past this many q tiles over the distinct batches (about 10 ms of counting) the
  // attended-pairs estimate stands, so no structure makes decide() slow.
  constexpr std::int64_t kMaxCountedTileRows = std::int64_t{1} << 20;
  const TileGrid grid = structure_tile_grid(s, TileSize{});
  if (grid.distinct_batch * grid.q_tiles() > kMaxCountedTileRows) return;
  for (std::size_t i = 0; i < n; ++i) {
    Candidate& flex = candidates[i];
    if (!flex.flex_untiled) continue;
    bool may_win = true;
    for (std::size_t j = 0; j < n; ++j)
      if (j != i && candidates[j].cost_ms < flex.cost_ms) may_win = false;
    if (!may_win) continue;
    const TileFractions tiles = structure_tile_fractions(s, TileSize{});  // FlexArgs' default 128 x 128
    flex.cost_ms = call_cost(flex.backend, flex.usage,
                             flex_pairs(s, tiles, flex.usage == Usage::dense_mask), c);
    flex.flex_untiled = false;
  }
}

// Step 2, last: a cold FlexAttention (a flex_tiles backend) pays its compile on top of
// its run (DecideOptions::flex_compile_ms). Charged after refine_flex, which compares warm costs: a flex call
// that would win warm has its tiles counted, so its rejection says what it would cost
// once compiled (masklens.torch reads that to know what the cold rule gives up).
inline void charge_flex_compile(Candidate* candidates, std::size_t n, double compile_ms) noexcept {
  if (compile_ms <= 0) return;
  for (std::size_t i = 0; i < n; ++i) {
    if (info(candidates[i].backend).work != WorkModel::flex_tiles) continue;
    candidates[i].cost_ms += compile_ms;
    candidates[i].compile_ms = compile_ms;
  }
}

// Step 2, last too: a call that keeps the mask pays for building it where it is not at
// hand (DecideOptions::mask_build_ms).
inline void charge_mask_build(Candidate* candidates, std::size_t n, double build_ms) noexcept {
  if (build_ms <= 0) return;
  for (std::size_t i = 0; i < n; ++i)
    if (candidates[i].usage == Usage::dense_mask) candidates[i].cost_ms += build_ms;
}

// The kept mask's rules: the cast they ask for, or false when one refuses outright.
inline bool kept_mask_cast(const BackendInfo& b, const CallContext& c, std::optional<ElementType>& cast,
                           Refusals& refused) noexcept {
  const Refusals mask_rules = check_rules(b.rules, c, RuleScope::kept_mask);
  refused = Refusals{b.rules};
  mask_rules.for_each([&](const Rule& r) {
    if (r.fix == MaskFix::cast_to_bool) cast = ElementType::boolean;
    else if (r.fix == MaskFix::cast_to_query_dtype) cast = c.call.query_element();
    else refused.refused |= std::uint64_t{1} << static_cast<std::size_t>(&r - b.rules.data());
  });
  return !refused.any();
}

// Step 2: one backend becomes a candidate, or a rejection.
inline std::optional<Candidate> judge(const BackendInfo& b, const MaskStructure& s, const CallContext& c,
                                      Rejection& no) {
  no.backend = b.id;
  if (!c.env.has(b.family)) {
    no.kind = RejectionKind::unavailable;
    no.source = "Environment::available";
    return std::nullopt;
  }
  if (const Refusals why = refusals(b.id, c); why.any()) {
    no.kind = RejectionKind::refused;
    no.refusals = why;
    no.context = c;
    no.source = why.source();
    return std::nullopt;
  }
  const Defect* lost = nullptr;
  if (!must_keep_mask(s) && b.native && b.native(s, c, nullptr)) {
    lost = first_defect({b.id, Usage::native, c.call, c.env, s, std::nullopt});
    if (!lost) return candidate(b, s, Usage::native, std::nullopt, c);
  }
  if (b.dense && b.dense(s, c, nullptr)) {
    std::optional<ElementType> cast;
    Refusals mask_refusals;
    if (!kept_mask_cast(b, c, cast, mask_refusals)) {
      if (!lost) {
        no.kind = RejectionKind::refused;
        no.refusals = mask_refusals;
        no.context = c;
        no.source = mask_refusals.source();
        return std::nullopt;
      }
    } else {
      const std::optional<ElementType> passed = cast ? cast : c.call.mask_dtype;
      if (const Defect* d = first_defect({b.id, Usage::dense_mask, c.call, c.env, s, passed})) lost = lost ? lost : d;
      else return candidate(b, s, Usage::dense_mask, cast, c);
    }
  }
  if (lost) {
    no.kind = RejectionKind::defect;
    no.defect = lost;
    no.source = lost->source;
  } else {
    no.kind = RejectionKind::inexpressible;
    no.structure = s.kind;
    no.segments = s.has_segments();
    no.kv_valid = s.has_kv_valid();
    no.source = "docs/backends.md (support matrix)";
  }
  return std::nullopt;
}

// The cheapest unmasked torch call for one run of a plan, with its cost.
inline std::optional<PlanStep> plan_step(const RowRun& run, const CallContext& c, const MaskStructure& s,
                                         double& cost_ms) {
  PlanStep step;
  step.batch = run.batch;
  step.q_range = run.q_range;
  step.k_range = run.k_range;
  if (run.kind == RunKind::zeros) {
    step.call.backend = Backend::zeros;
    cost_ms = kCallOverheadMs;
    return step;
  }
  CallContext sub = c;
  sub.call.batch = 1;
  sub.call.q_len = run.q_range.end - run.q_range.start;
  sub.call.k_len = run.k_range.end - run.k_range.start;
  const MaskStructure slice = make_structure(run.kind == RunKind::full ? StructureKind::full : StructureKind::causal, 1,
                                             sub.call.q_len, sub.call.k_len, Alignment::bottom_right);
  std::optional<Backend> best;
  double best_cost = 0;
  for (Backend b : kPlanKernels) {
    const BackendInfo& i = info(b);
    if (refusals(b, sub).any() || !i.native(slice, sub, nullptr) ||
        first_defect({b, Usage::plan_step, sub.call, sub.env, s, std::nullopt}))
      continue;
    const double cost = call_cost(b, Usage::native, computed_pairs(i.work, false, slice), sub);
    if (!best || cost < best_cost) best = b, best_cost = cost;
  }
  if (!best) return std::nullopt;
  info(*best).native(slice, sub, &step.call);
  cost_ms = best_cost;
  return step;
}

// Whether a plan could cost less than the best candidate: it computes at least the
// attended pairs at the cheapest capable torch kernel's rate, in at least one call.
// Building a plan allocates, so decisions a plan cannot win skip it.
inline bool plan_may_beat(const MaskStructure& s, const CallContext& c, const Candidate* candidates,
                          std::size_t n) noexcept {
  double best = 0;
  for (std::size_t i = 0; i < n; ++i) best = i == 0 ? candidates[i].cost_ms : std::min(best, candidates[i].cost_ms);
  double rate = -1;
  for (Backend b : kPlanKernels)
    if (!refusals(b, c).any() && (rate < 0 || cost_rates(b, c.env.sm).native < rate)) rate = cost_rates(b, c.env.sm).native;
  return rate >= 0 && kCallOverheadMs + rate * work_units(attended_pairs(s), c.call) < best;
}

// Step 3: an exact plan of unmasked torch calls; `note` says why there is none.
inline std::optional<Candidate> find_plan(const MaskStructure& s, const CallContext& c, const DecideOptions& options,
                                          std::vector<PlanStep>& steps, std::string& note) {
  std::optional<std::vector<RowRun>> runs = decompose_rows(s, options.max_plan_calls);
  if (!runs) {
    note = "an exact plan needs more than max_plan_calls (" + std::to_string(options.max_plan_calls) + ") calls";
    return std::nullopt;
  }
  steps.reserve(runs->size());
  double total = 0;
  for (const RowRun& run : *runs) {
    double cost = 0;
    std::optional<PlanStep> step = plan_step(run, c, s, cost);
    if (!step) {
      steps.clear();
      note = "a plan step has no capable torch kernel";
      return std::nullopt;
    }
    total += cost;
    steps.push_back(std::move(*step));
  }
  if (steps.empty()) return std::nullopt;
  const auto main = std::find_if(steps.begin(), steps.end(),
                                 [](const PlanStep& p) { return p.call.backend != Backend::zeros; });
  return Candidate{main == steps.end() ? Backend::zeros : main->call.backend, Usage::plan_step, total, std::nullopt, false};
}

// Step 5: the hazards that stay with the chosen call.
inline void add_hazards(Policy& policy, const MaskStructure& s, const CallContext& c, const Candidate& chosen) {
  const std::int64_t hard_empty = s.empty_rows - s.finite_masked_rows;
  if (hard_empty > 0)
    policy.hazards.push_back({HazardKind::empty_rows,
                              std::to_string(hard_empty) +
                                  " query rows attend to nothing: the result for them is 0 here (math, efficient, flex, "
                                  "plan zeros); cuDNN with a mask returns the mean of V"});
  if (s.finite_masked_rows > 0)
    policy.hazards.push_back({HazardKind::finite_masked_rows,
                              std::to_string(s.finite_masked_rows) +
                                  " rows are masked only by finite values: dense softmax attends uniformly over them, "
                                  "so the mask is kept"});
  if (s.bias) policy.hazards.push_back({HazardKind::bias, "the additive mask carries bias values: it is kept"});
  if (chosen.mask_cast && c.call.mask_dtype && is_additive(*c.call.mask_dtype) && is_additive(*chosen.mask_cast) &&
      s.bias)
    policy.hazards.push_back({HazardKind::mask_cast, "the mask is cast from " +
                                                         std::string(to_string(*c.call.mask_dtype)) + " to " +
                                                         std::string(to_string(*chosen.mask_cast)) +
                                                         ": its bias values are rounded to that type"});
  const SdpaArgs* sdpa = policy.call.get<SdpaArgs>();
  const bool expands = (sdpa && !sdpa->enable_gqa) ||
                       (!policy.plan.empty() && std::any_of(policy.plan.begin(), policy.plan.end(), [](const PlanStep& p) {
                         const SdpaArgs* a = p.call.get<SdpaArgs>();
                         return a && !a->enable_gqa;
                       }));
  if (c.call.gqa() && expands)
    policy.hazards.push_back({HazardKind::gqa_expand, "kv_heads " + std::to_string(c.call.key_heads()) + " < heads " +
                                                          std::to_string(c.call.heads) +
                                                          ": expand K and V (repeat_interleave) before the call"});
}

}  // namespace detail

// The call decide() judges: lengths left 0 take the structure's, and the batch covers it.
inline AttentionCall effective_call(const MaskStructure& structure, AttentionCall call) noexcept {
  if (call.q_len == 0) call.q_len = structure.q_len;
  if (call.k_len == 0) call.k_len = structure.k_len;
  if (call.batch < structure.batch) call.batch = structure.batch;
  return call;
}

// Step 1: every input inside its domain (MaskStructure::validate names the field).
inline Status check_inputs(const MaskStructure& structure, const AttentionCall& call, const Environment& env) {
  if (Status s = structure.validate(); !s.ok()) return s;
  if (Status s = call.validate(); !s.ok()) return s;
  return env.validate();
}

inline Result<Policy> decide(const MaskStructure& structure, const AttentionCall& call, const Environment& env = {},
                             const DecideOptions& options = {}) {
  if (Status s = check_inputs(structure, call, env); !s.ok()) return s;
  if (Status s = options.validate(); !s.ok()) return s;
  // Judge what the structure implies (its empty rows, one modifier entry per batch),
  // never a count it was handed; a copy only when the given form differs.
  if (!spelled_out(structure)) {
    Result<MaskStructure> explicit_structure = spell_out(structure);
    if (!explicit_structure) return explicit_structure.status();
    return decide(*explicit_structure, call, env, options);
  }
  return catch_alloc([&]() -> Result<Policy> {
    const CallContext context{effective_call(structure, call), env};
    const MaskStructure& s = structure;

    // Step 2, in fixed arrays: this loop allocates nothing.
    constexpr std::size_t kBackends = std::size(kAllBackends);
    std::array<detail::Candidate, kBackends> candidates{};
    std::array<Rejection, kBackends> refused{};
    std::size_t n_candidates = 0, n_refused = 0;
    bool any_native = false;
    for (const BackendInfo& b : backends::kRegistry) {
      if (std::optional<detail::Candidate> c = detail::judge(b, s, context, refused[n_refused])) {
        any_native = any_native || c->usage == Usage::native;
        candidates[n_candidates++] = *c;
      } else {
        ++n_refused;
      }
    }

    detail::refine_flex(s, context, candidates.data(), n_candidates);
    detail::charge_flex_compile(candidates.data(), n_candidates, options.flex_compile_ms);
    detail::charge_mask_build(candidates.data(), n_candidates, options.mask_build_ms);

    // Step 3.
    Policy policy;
    std::string plan_note;
    std::optional<detail::Candidate> plan;
    std::vector<PlanStep> plan_steps;
    if (!detail::must_keep_mask(s) && context.env.has(kFamilyTorch) &&
        (!any_native || detail::plan_may_beat(s, context, candidates.data(), n_candidates)))
      plan = detail::find_plan(s, context, options, plan_steps, plan_note);

    // Step 4.
    if (n_candidates == 0 && !plan)
      return error(ErrorCode::invalid_argument, "no available backend computes this mask correctly");
    const detail::Candidate* best =
        std::min_element(candidates.data(), candidates.data() + n_candidates,
                         [](const auto& a, const auto& b) { return a.cost_ms < b.cost_ms; });
    if (plan && (n_candidates == 0 || plan->cost_ms < best->cost_ms)) best = &*plan;
    const BackendInfo* chosen = best->usage == Usage::plan_step ? nullptr : &info(best->backend);
    if (best->usage == Usage::native) {
      chosen->native(s, context, &policy.call);
    } else if (best->usage == Usage::dense_mask) {
      chosen->dense(s, context, &policy.call);
      policy.call.mask_cast = best->mask_cast;
    } else {
      policy.call.backend = best->backend;
      policy.call.mask = MaskUse::drop;
      policy.plan = std::move(plan_steps);
    }
    policy.cost_ms = best->cost_ms;

    // Step 5.
    policy.rejected.reserve(n_candidates + (plan ? 1 : 0) + n_refused);
    auto slower = [&](const detail::Candidate& c, std::int64_t plan_calls) {
      Rejection r;
      r.backend = c.backend;
      r.kind = RejectionKind::slower;
      r.source = cost_rates(c.backend, context.env.sm).measured
                     ? "bench/README.md (measured cost rates)"
                     : "bench/README.md (cost rates estimated, not measured)";
      r.usage = c.usage;
      r.cost_ms = c.cost_ms;
      r.compile_ms = c.compile_ms;
      r.chosen_cost_ms = best->cost_ms;
      r.plan_calls = plan_calls;
      policy.rejected.push_back(std::move(r));
    };
    for (std::size_t i = 0; i < n_candidates; ++i)
      if (&candidates[i] != best) slower(candidates[i], 0);
    // A plan of one step that is the chosen call over the whole mask (one causal call of
    // the kernel chosen natively) is that call again, not an alternative: not listed.
    const bool plan_is_the_call = plan_steps.size() == 1 && s.batch == 1 && plan_steps[0].batch == 0 &&
                                  plan_steps[0].q_range == KeyRange{0, s.q_len} &&
                                  plan_steps[0].k_range == KeyRange{0, s.k_len} && plan_steps[0].call == policy.call;
    if (plan && best != &*plan && !plan_is_the_call) slower(*plan, static_cast<std::int64_t>(plan_steps.size()));
    for (std::size_t i = 0; i < n_refused; ++i) policy.rejected.push_back(std::move(refused[i]));
    if (!plan_note.empty() && best->usage != Usage::plan_step)
      policy.hazards.push_back({HazardKind::plan, "no plan: " + plan_note});
    detail::add_hazards(policy, s, context, *best);
    return policy;
  });
}

}  // namespace masklens
