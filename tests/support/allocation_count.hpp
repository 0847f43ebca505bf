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
  auto call_blocks = [&](const Call& c) {
    const VarlenArgs* v = c.get<VarlenArgs>();
    return v ? heap(v->sequences) : 0L;
  };
  long n = call_blocks(p.call) + heap(p.plan) + heap(p.rejected) + heap(p.hazards);
  for (const PlanStep& s : p.plan) n += call_blocks(s.call);
  for (const Hazard& h : p.hazards) n += string_heap(h.detail);
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
