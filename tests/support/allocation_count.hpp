// Counts heap allocations by replacing the global operator new, and counts the heap
// blocks a Policy owns, so a program can check that decide() allocates nothing beyond
// its result. Include in exactly one translation unit of a program (the replacement
// operators are definitions).
#pragma once

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <variant>

#include <masklens/policy.hpp>

namespace masklens::testing {

inline std::atomic<long> g_allocations{0};

// Heap blocks the result holds: its vectors and the strings and vectors inside them.
inline long owned_blocks(const Policy& p) {
  auto heap = [](const auto& v) { return v.capacity() ? 1L : 0L; };
  auto string_heap = [](const std::string& s) { return s.capacity() > std::string().capacity() ? 1L : 0L; };
  auto args_blocks = [&](const Args& args) {
    long n = heap(args);
    for (const Arg& a : args) {
      if (const auto* s = std::get_if<std::string>(&a.value)) n += string_heap(*s);
      if (const auto* v = std::get_if<std::vector<std::int64_t>>(&a.value)) n += heap(*v);
    }
    return n;
  };
  long n = args_blocks(p.args) + heap(p.plan) + heap(p.rejected) + heap(p.hazards);
  for (const PlanStep& s : p.plan) n += args_blocks(s.args);
  for (const Hazard& h : p.hazards) n += string_heap(h.kind) + string_heap(h.detail);
  return n;
}

}  // namespace masklens::testing

void* operator new(std::size_t n) {
  masklens::testing::g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
