// Prints docs/backends.md from the tables the policy uses (backend rules, native forms,
// cost ranks, defects) and its prose, a template (backends.md.in) whose {{name}}s it fills;
// `--check FILE` exits 1 when FILE differs from what it prints.
#include <masklens/masklens.hpp>

#include <algorithm>
#include <iterator>
#include <utility>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace masklens;

namespace {

MaskStructure make(StructureKind kind, std::int64_t q, std::int64_t k, Alignment a = Alignment::top_left) {
  MaskStructure s = make_structure(kind, 2, q, k, a);
  s.window = 256;
  s.chunk = 512;
  s.prefix = 300;
  s.blocks = {{100, 200}};
  return s;
}

std::string cell(Backend b, const MaskStructure& s) {
  const CallContext everything{AttentionCall{}, with_every_family()};
  const BackendInfo& i = info(b);
  if (i.native(s, everything, nullptr)) return "native";
  const bool dense = i.dense && i.dense(s, everything, nullptr);
  const bool plan_kernel = std::find(kPlanKernels.begin(), kPlanKernels.end(), b) !=
                           kPlanKernels.end();
  if (plan_kernel && b != Backend::sdpa_causal_lower_right && decompose_rows(s, 64)) return dense ? "plan / dense" : "plan";
  return dense ? "dense" : "no";
}

std::string fixed(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string shortest(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// The support matrix: how each backend computes each structure.
std::string support_matrix() {
  std::ostringstream out;
  struct Row {
    const char* name;
    MaskStructure s;
  };
  std::vector<Row> rows = {
      {"full", make(StructureKind::full, 4096, 4096)},
      {"causal (Q = K)", make(StructureKind::causal, 4096, 4096)},
      {"causal bottom-right (Q < K)", make(StructureKind::causal, 512, 4096, Alignment::bottom_right)},
      {"causal top-left (Q < K)", make(StructureKind::causal, 512, 4096)},
      {"sliding_window", make(StructureKind::sliding_window, 4096, 4096)},
      {"chunked", make(StructureKind::chunked, 4096, 4096)},
      {"prefix_lm", make(StructureKind::prefix_lm, 4096, 4096)},
      {"causal_blocks", make(StructureKind::causal_blocks, 4096, 4096)},
  };
  {
    auto s = make(StructureKind::causal, 4096, 4096);
    s.segments = {{0, 1000, 4096}, {0, 4096}};
    rows.push_back({"causal + segments (packed)", s});
  }
  {
    auto s = make(StructureKind::causal, 4096, 4096);
    s.kv_valid = {{0, 4096}, {0, 3000}};
    rows.push_back({"causal + right padding", s});
  }
  {
    // A padded batch's rows past its length attend nothing (the drop-in zeroes them).
    auto s = make(StructureKind::causal, 4096, 4096);
    s.kv_valid = {{0, 4096}, {0, 3000}};
    s.q_valid = {{0, 4096}, {0, 3000}};
    rows.push_back({"causal + right padding, padded rows empty (q_valid)", s});
  }
  {
    auto s = make(StructureKind::full, 1, 4096);
    s.kv_valid = {{0, 4096}, {500, 4096}};
    rows.push_back({"decode, left padding (full + kv_valid)", s});
  }
  rows.push_back({"arbitrary", make(StructureKind::arbitrary, 4096, 4096)});

  out << "| structure |";
  for (Backend b : kAllBackends) out << " `" << to_string(b) << "` |";
  out << "\n|---|";
  for (std::size_t i = 0; i < std::size(kAllBackends); ++i) out << "---|";
  out << "\n";
  for (const Row& r : rows) {
    out << "| " << r.name << " |";
    for (Backend b : kAllBackends) out << " " << cell(b, r.s) << " |";
    out << "\n";
  }
  return out.str();
}

std::string cost_rates() {
  std::ostringstream out;
  out << "| backend | native | dense mask | measured |\n|---|---|---|---|\n";
  for (Backend b : kAllBackends) {
    const CostRates r = masklens::cost_rates(b, 90);
    out << "| `" << to_string(b) << "` | " << fixed(r.native) << " | " << (r.dense > 0 ? fixed(r.dense) : "-")
        << " | " << (r.measured ? "yes" : "estimate") << " |\n";
  }
  return out.str();
}

std::string capability_rules() {
  std::ostringstream out;
  out << "| backend | rule | scope | refuses with | source |\n|---|---|---|---|---|\n";
  std::vector<const Rule*> printed;
  for (Backend b : kAllBackends) {
    const std::span<const Rule> table = info(b).rules;
    if (b == Backend::sdpa_causal_lower_right || table.empty() ||
        std::find(printed.begin(), printed.end(), table.data()) != printed.end())
      continue;
    printed.push_back(table.data());
    std::string names;  // every backend that shares this table (flash_attn and its varlen form)
    for (Backend other : kAllBackends)
      if (info(other).rules.data() == table.data())
        names += (names.empty() ? "`" : " / `") + std::string(to_string(other)) + "`";
    for (const Rule& r : table) {
      const char* scope = r.scope == RuleScope::call ? "call"
                          : r.fix == MaskFix::cast_to_bool ? "kept mask: cast to bool"
                          : r.fix == MaskFix::cast_to_query_dtype ? "kept mask: cast to the query's dtype"
                                                                  : "kept mask";
      out << "| " << names << " | `" << r.name << "` | " << scope << " | " << r.text << " | " << r.source << " |\n";
    }
  }
  return out.str();
}

std::string known_defects() {
  std::ostringstream out;
  out << "| id | backend | effect | when | source |\n|---|---|---|---|---|\n";
  for (const Defect& d : kDefects)
    out << "| `" << d.id << "` | `" << to_string(d.backend) << "` | "
        << (d.effect == Effect::silently_wrong ? "silently wrong" : "fails") << " | " << d.condition << " | "
        << d.source << " |\n";
  return out.str();
}

// The template's prose with each {{name}} replaced by what the tables say; a name the tool
// does not know is an error, so a typo in the template never reaches the docs.
Result<std::string> render(const std::string& tmpl) {
  const std::pair<const char*, std::string> values[] = {
      {"support_matrix", support_matrix()},
      {"cost_rates", cost_rates()},
      {"capability_rules", capability_rules()},
      {"known_defects", known_defects()},
      {"call_overhead_us", fixed(kCallOverheadMs * 1000)},
      {"flex_partial_rule", shortest(kFlexPartialTileRule)},
      {"flex_partial_read", shortest(kFlexPartialTileMaskRead)},
  };
  std::string out;
  std::size_t at = 0;
  while (true) {
    const std::size_t open = tmpl.find("{{", at);
    out += tmpl.substr(at, open == std::string::npos ? std::string::npos : open - at);
    if (open == std::string::npos) return out;
    const std::size_t close = tmpl.find("}}", open);
    if (close == std::string::npos) return error(ErrorCode::invalid_argument, "an unclosed {{ in the template");
    const std::string name = tmpl.substr(open + 2, close - open - 2);
    const auto* v = std::find_if(std::begin(values), std::end(values), [&](const auto& p) { return name == p.first; });
    if (v == std::end(values)) return error(ErrorCode::invalid_argument, "the template names {{" + name + "}}, which "
                                                                         "the tool does not fill");
    out += v->second;
    at = close + 2;
  }
}

bool read_file(const char* path, std::string& text) {
  std::ifstream f(path);
  if (!f) return false;
  std::stringstream s;
  s << f.rdbuf();
  text = s.str();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && !(argc == 4 && std::string(argv[2]) == "--check")) {
    std::fprintf(stderr, "usage: support_matrix TEMPLATE [--check FILE]\n");
    return 2;
  }
  std::string tmpl;
  if (!read_file(argv[1], tmpl)) {
    std::fprintf(stderr, "cannot read the template %s\n", argv[1]);
    return 2;
  }
  const Result<std::string> text = render(tmpl);
  if (!text) {
    std::fprintf(stderr, "%s: %s\n", argv[1], text.status().message().c_str());
    return 2;
  }
  if (argc == 4) {
    std::string have;
    if (read_file(argv[3], have) && have == *text) return 0;
    std::fprintf(stderr, "%s is out of date: regenerate it with support_matrix %s > %s\n", argv[3], argv[1], argv[3]);
    return 1;
  }
  std::fputs(text->c_str(), stdout);
  return 0;
}
