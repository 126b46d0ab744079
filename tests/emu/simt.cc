// The CPU emulator's engine (see include/simt.h): fibers on ucontext, counting barriers, and
// the warp collectives computed from PTX's fragment layouts (PTX ISA, "Matrix fragments for
// mma.m16n8k16" and "ldmatrix"), independently of the kernels' own description of them;
// and the race check, on the hooks ThreadSanitizer's instrumentation calls, which also give
// the memory profile (profile.h) its accesses.
#include <ucontext.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"
#include "profile.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace simt {
namespace {

// Under AddressSanitizer (tests/emu/engine.py builds so when the process runs under it) each
// switch of stacks is announced, or ASan would take a fiber's frames for the scheduler's; a
// fiber abandoned mid-kernel leaves its frames' redzones poisoned, so a stack is cleared
// before its next fiber starts on it.
#if defined(__SANITIZE_ADDRESS__)
void stack_switch_begin(void** fake_stack, const void* bottom, size_t size) {
  __sanitizer_start_switch_fiber(fake_stack, bottom, size);
}
void stack_switch_end(void* fake_stack, const void** bottom, size_t* size) {
  __sanitizer_finish_switch_fiber(fake_stack, bottom, size);
}
void stack_unpoison(void* p, size_t bytes) { __asan_unpoison_memory_region(p, bytes); }
#else
void stack_switch_begin(void**, const void*, size_t) {}
void stack_switch_end(void*, const void**, size_t*) {}
void stack_unpoison(void*, size_t) {}
#endif

constexpr size_t kStackBytes = 128 * 1024;
constexpr size_t kStaticSharedLimit = 48 * 1024;  // past this a kernel needs its attribute raised
constexpr size_t kWindowBytes = 227 * 1024;       // an H100's dynamic shared memory per CTA
constexpr uint8_t kPoison = 0xff;                 // shared memory's bytes when a CTA starts
constexpr uint8_t kGuard = 0xa5;      // the bytes past the launch's shared memory, checked after
constexpr size_t kGuardBytes = 4096;  // each CTA (plain stores are not checked as they happen)

struct Barrier {
  int expected = 0, arrived = 0;
  uint64_t generation = 0;
};

enum class Op {
  kShuffleXor,
  kShuffleIndex,
  kShuffleUp,
  kShuffleDown,
  kBallot,
  kMatchAny,
  kReduceAdd,
  kLdmatrix,
  kLdmatrixTrans,
  kMma
};

const char* op_name(Op op) {
  switch (op) {
    case Op::kShuffleXor:
      return "__shfl_xor_sync";
    case Op::kShuffleIndex:
      return "__shfl_sync";
    case Op::kShuffleUp:
      return "__shfl_up_sync";
    case Op::kShuffleDown:
      return "__shfl_down_sync";
    case Op::kBallot:
      return "__ballot_sync";
    case Op::kMatchAny:
      return "__match_any_sync";
    case Op::kReduceAdd:
      return "__reduce_add_sync";
    case Op::kLdmatrix:
      return "ldmatrix";
    case Op::kLdmatrixTrans:
      return "ldmatrix.trans";
    case Op::kMma:
      return "mma.sync";
  }
  return "?";
}

// A warp's collectives in progress. A lane arrives with its mask, operation and operands and
// waits until every lane its mask names has arrived in the same collective (lanes outside
// the mask, or lanes of the mask finishing a collective that leaves this lane out, may
// meanwhile be in another one); the last to arrive computes every participant's results and
// wakes them.
struct Warp {
  uint32_t lanes = 0;  // lanes that exist and have not exited
  uint32_t launched = 0;
  uint32_t arrived = 0;  // lanes waiting in a collective
  uint32_t mask[32] = {};
  Op op[32] = {};
  Element element[32] = {};
  uint32_t in[32][10] = {};
  uint32_t out[32][4] = {};
  Barrier done[32];  // lane l's wake-up: its generation moves when l's collective completes
  const void* ldmatrix_pc = nullptr;  // the code of its ldmatrix (for the memory profile)
};

struct Copy {
  uint8_t* dst;
  const uint8_t* src;  // null: 16 zero bytes
  bool landed;         // already landed at issue (land_at_issue); the wait only records it
};

struct Fiber {
  ucontext_t context;
  std::vector<uint8_t> stack;
  void* fake_stack = nullptr;  // AddressSanitizer's, while the fiber is switched out
  unsigned tid = 0;
  bool done = false;
  const Barrier* waiting = nullptr;
  uint64_t wait_generation = 0;
  std::vector<Copy> open;                // cp.async since the last commit
  std::deque<std::vector<Copy>> groups;  // committed, not yet landed
};

struct Engine {
  // the launch in progress
  dim3 grid, block, block_idx;
  size_t smem_bytes = 0;
  const std::function<void()>* body = nullptr;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  Barrier block_barrier;
  // Barrier intervals, counted over the launches: a new one starts with each CTA and after
  // each __syncthreads completes, so two threads' accesses in one interval are unordered
  // (see the race check below); the current one, the CTA's first and the launch's first.
  uint32_t interval = 1, cta_interval = 1, launch_interval = 1;
  Fiber* current = nullptr;
  ucontext_t scheduler;
  const void* scheduler_stack = nullptr;  // its bottom and size, for AddressSanitizer
  size_t scheduler_stack_bytes = 0;
  bool failed = false;
  std::string error;
  // set up by the test
  bool land_at_issue = false;  // cp.async lands when issued, not when waited for
  bool reverse = false;        // fibers run last thread first
  std::vector<std::pair<uintptr_t, size_t>> buffers;
  std::map<const void*, int> max_dynamic_shared;
  std::vector<std::pair<void*, size_t>> static_shared;  // every static __shared__ seen
};

Engine g;
std::mutex g_launch;
// The dynamic shared memory, and the guard bytes checked after each CTA.
alignas(128) uint8_t g_window[kWindowBytes + kGuardBytes];

void back_to_scheduler() {
  Fiber* f = g.current;
  stack_switch_begin(&f->fake_stack, g.scheduler_stack, g.scheduler_stack_bytes);
  swapcontext(&f->context, &g.scheduler);
  stack_switch_end(f->fake_stack, nullptr, nullptr);
}

// Records the first failure of the launch and, inside a fiber, never returns to it: the
// scheduler abandons the CTA.
[[noreturn]] void fail(const char* format, ...) {
  if (!g.failed) {
    char text[512];
    va_list args;
    va_start(args, format);
    std::vsnprintf(text, sizeof text, format, args);
    va_end(args);
    char where[128] = "";
    if (g.current) {
      std::snprintf(where, sizeof where, "block (%u, %u, %u) thread %u: ", g.block_idx.x,
                    g.block_idx.y, g.block_idx.z, g.current->tid);
    }
    g.error = std::string(where) + text;
    g.failed = true;
  }
  if (g.current) back_to_scheduler();
  std::abort();  // a failed fiber is never resumed
}

Fiber& self() {
  if (!g.current) fail("a device function was called outside a kernel launch");
  return *g.current;
}

// Arrives at `b`; true for the arrival that completes it (the barrier then resets for its
// next use), which the caller finishes before anyone waiting continues.
bool arrive(Barrier& b) {
  if (++b.arrived < b.expected) return false;
  b.arrived = 0;
  ++b.generation;
  return true;
}

void wait_for(const Barrier& b, uint64_t generation) {
  Fiber& f = self();
  f.waiting = &b;
  f.wait_generation = generation;
  back_to_scheduler();
}

// The registered buffer holding `bytes` at `p` (-1: none).
int buffer_of(const void* p, size_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (size_t i = 0; i < g.buffers.size(); ++i) {
    const auto& [base, size] = g.buffers[i];
    if (a >= base && a + bytes <= base + size) return static_cast<int>(i);
  }
  return -1;
}

bool in_buffers(const void* p, size_t bytes) {
  return g.buffers.empty() || buffer_of(p, bytes) >= 0;  // nothing registered: unchecked
}

// The race check (what compute-sanitizer's racecheck does). A kernel TU is compiled with
// -fsanitize=thread (tests/emu/engine.py), whose calls on every load and store reach the
// hooks at the end of this file, not a TSan runtime; ldmatrix's reads, cp.async's copies
// and page-table loads are recorded here. A byte of shared memory, or of a buffer the test
// registered (global memory), keeps its last write and the reads of the current barrier
// interval, and an access fails the launch where another thread's access to the byte has
// no order with it:
// - a read and a write, or two writes (two atomics excepted), by two threads in one barrier
//   interval, lanes of one warp too (warp collectives promise no memory order; __syncwarp
//   would, and no kernel of ours needs it, so the emulator has none);
// - any access to a byte a cp.async may still be writing: issued, and its group not yet
//   waited for by the thread that issued it (that thread's own reads included);
// - in global memory, a read and a write, or two writes, by two CTAs of one launch.
struct Shadow {
  uint32_t written = 0, read = 0;   // the last write's interval; the interval of the reads
                                    // below (older entries are stale)
  uint16_t writer = 0, reader = 0;  // the last writer; the first reader in `read`
  uint8_t flags = 0;
};
constexpr uint8_t kAtomic = 1, kInFlight = 2,
                  kReaders = 4;  // another thread than `reader` read too in `read`

// A global byte's: its Shadow within the CTA, and the CTAs of the launch that touched it
// (blocks numbered x + grid.x * (y + grid.y * z)).
struct GlobalShadow {
  Shadow in_cta;
  uint32_t writer_block = 0;  // the last write's (this launch's when in_cta.written is)
  uint32_t read_launch = 0;   // the first interval of the launch that last read it
  uint32_t reader_block = 0;  // the first CTA that read it then
  bool blocks_read = false;   // more than one CTA read it then
};

Shadow g_window_shadow[kWindowBytes];
std::vector<std::vector<Shadow>> g_static_shadow;  // g.static_shared's, in its order
constexpr size_t kPageBytes = 4096;
// by page of global memory, for this launch's accesses (cleared as each launch starts)
std::unordered_map<uintptr_t, std::unique_ptr<GlobalShadow[]>> g_global_shadow;

// The thread making an access.
struct Accessor {
  unsigned tid;
};

Accessor accessor() { return {self().tid}; }

uint32_t block_number() {
  return g.block_idx.x + g.grid.x * (g.block_idx.y + g.grid.y * g.block_idx.z);
}

// The shadow of the shared byte `p` (null: not shared memory).
Shadow* shadow_of(const uint8_t* p) {
  if (p >= g_window && p < g_window + kWindowBytes) return &g_window_shadow[p - g_window];
  for (size_t i = 0; i < g.static_shared.size(); ++i) {
    const uint8_t* base = static_cast<const uint8_t*>(g.static_shared[i].first);
    if (p >= base && p < base + g.static_shared[i].second) return &g_static_shadow[i][p - base];
  }
  return nullptr;
}

GlobalShadow& global_shadow_of(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::unique_ptr<GlobalShadow[]>& page = g_global_shadow[a / kPageBytes];
  if (!page) page = std::make_unique<GlobalShadow[]>(kPageBytes);
  return page[a % kPageBytes];
}

// Where the byte `p` is, for a report.
struct Place {
  char text[96];
  explicit Place(const uint8_t* p) {
    if (p >= g_window && p < g_window + kWindowBytes) {
      std::snprintf(text, sizeof text, "shared offset %zu", static_cast<size_t>(p - g_window));
      return;
    }
    for (const auto& [q, bytes] : g.static_shared) {
      const uint8_t* base = static_cast<const uint8_t*>(q);
      if (p >= base && p < base + bytes) {
        std::snprintf(text, sizeof text, "byte %zu of a static __shared__ variable at %p",
                      static_cast<size_t>(p - base), q);
        return;
      }
    }
    const int i = buffer_of(p, 1);
    if (i >= 0) {
      std::snprintf(text, sizeof text, "byte %zu of buffer %d",
                    static_cast<size_t>(reinterpret_cast<uintptr_t>(p) - g.buffers[i].first), i);
      return;
    }
    std::snprintf(text, sizeof text, "%p", static_cast<const void*>(p));
  }
};

// CTA number `n` as "block (x, y, z)".
struct Block {
  char text[48];
  explicit Block(uint32_t n) {
    std::snprintf(text, sizeof text, "block (%u, %u, %u)", n % g.grid.x, n / g.grid.x % g.grid.y,
                  n / (g.grid.x * g.grid.y));
  }
};

bool in_flight(const Shadow& e) { return (e.flags & kInFlight) && e.written >= g.cta_interval; }

// Checks and records a read of byte `p` (its shadow `e`) by `a` within the CTA.
void read_in_cta(Shadow& e, const Accessor& a, const uint8_t* p, const char* what) {
  if (in_flight(e)) {
    fail(
        "race: thread %u's %s reads %s, which thread %u's cp.async may still be writing "
        "(its group not yet waited for)",
        a.tid, what, Place(p).text, e.writer);
  }
  if (e.written == g.interval && e.writer != a.tid) {
    fail("race: thread %u's %s reads %s, which thread %u wrote with no __syncthreads between",
         a.tid, what, Place(p).text, e.writer);
  }
  if (e.read != g.interval) {
    e.read = g.interval;
    e.reader = static_cast<uint16_t>(a.tid);
    e.flags &= ~kReaders;
  } else if (e.reader != a.tid) {
    e.flags |= kReaders;
  }
}

// Records a write of the byte with shadow `e` by thread `tid`; `kind` is kAtomic, kInFlight
// (a cp.async's until its wait) or 0.
void record_write(Shadow& e, unsigned tid, uint8_t kind) {
  e.written = g.interval;
  e.writer = static_cast<uint16_t>(tid);
  e.flags = (e.flags & kReaders) | kind;
}

// Checks a write (`atomic`: an atomic read-modify-write) of byte `p` (its shadow `e`) by `a`
// within the CTA; records it, as a cp.async's until its wait if `in_flight_copy`.
void write_in_cta(Shadow& e, const Accessor& a, const uint8_t* p, bool atomic, bool in_flight_copy,
                  const char* what) {
  if (in_flight(e)) {
    fail(
        "race: thread %u's %s writes %s, which thread %u's cp.async may still be writing "
        "(its group not yet waited for)",
        a.tid, what, Place(p).text, e.writer);
  }
  if (e.written == g.interval && e.writer != a.tid && !(atomic && (e.flags & kAtomic))) {
    fail("race: thread %u's %s writes %s, which thread %u wrote with no __syncthreads between",
         a.tid, what, Place(p).text, e.writer);
  }
  if (e.read == g.interval && (e.reader != a.tid || (e.flags & kReaders))) {
    char reader[32] = "another thread";
    if (e.reader != a.tid) std::snprintf(reader, sizeof reader, "thread %u", e.reader);
    fail("race: thread %u's %s writes %s, which %s read with no __syncthreads between", a.tid, what,
         Place(p).text, reader);
  }
  record_write(e, a.tid, in_flight_copy ? kInFlight : atomic ? kAtomic : 0);
}

// Whether global byte `e` was written by another CTA of this launch.
bool other_cta_wrote(const GlobalShadow& e) {
  return e.in_cta.written >= g.launch_interval && e.writer_block != block_number();
}

enum class Region { kNone, kShared, kGlobal };

// Where an access of `bytes` at `p` falls: shared memory (no access straddles its edge), a
// registered buffer (global memory), or neither (a thread's stack, host memory).
Region region_of(const uint8_t* p, size_t bytes) {
  if (bytes == 0) return Region::kNone;
  if (shadow_of(p) || shadow_of(p + bytes - 1)) return Region::kShared;
  return buffer_of(p, bytes) >= 0 ? Region::kGlobal : Region::kNone;
}

// Calls on_shared(shadow, byte) for each byte of an access of `bytes` at `p` in shared
// memory, or on_global(shadow, byte) for each in a registered buffer; nothing elsewhere.
template <typename OnShared, typename OnGlobal>
void for_each_byte(const uint8_t* p, size_t bytes, OnShared on_shared, OnGlobal on_global) {
  switch (region_of(p, bytes)) {
    case Region::kShared:
      for (size_t i = 0; i < bytes; ++i) {
        if (Shadow* e = shadow_of(p + i)) on_shared(*e, p + i);
      }
      break;
    case Region::kGlobal:
      for (size_t i = 0; i < bytes; ++i) on_global(global_shadow_of(p + i), p + i);
      break;
    case Region::kNone:
      break;
  }
}

void race_read(const Accessor& a, const uint8_t* p, size_t bytes, const char* what) {
  for_each_byte(
      p, bytes, [&](Shadow& e, const uint8_t* b) { read_in_cta(e, a, b, what); },
      [&](GlobalShadow& e, const uint8_t* b) {
        if (other_cta_wrote(e)) {
          fail("race: thread %u's %s reads %s, which %s wrote in this launch", a.tid, what,
               Place(b).text, Block(e.writer_block).text);
        }
        read_in_cta(e.in_cta, a, b, what);
        if (e.read_launch != g.launch_interval) {
          e.read_launch = g.launch_interval;
          e.reader_block = block_number();
          e.blocks_read = false;
        } else if (e.reader_block != block_number()) {
          e.blocks_read = true;
        }
      });
}

void race_write(const Accessor& a, uint8_t* p, size_t bytes, bool atomic, bool in_flight_copy,
                const char* what) {
  for_each_byte(
      p, bytes,
      [&](Shadow& e, const uint8_t* b) { write_in_cta(e, a, b, atomic, in_flight_copy, what); },
      [&](GlobalShadow& e, const uint8_t* b) {
        if (other_cta_wrote(e)) {
          fail("race: thread %u's %s writes %s, which %s wrote in this launch", a.tid, what,
               Place(b).text, Block(e.writer_block).text);
        }
        if (e.read_launch == g.launch_interval &&
            (e.blocks_read || e.reader_block != block_number())) {
          fail("race: thread %u's %s writes %s, which %s read in this launch", a.tid, what,
               Place(b).text,
               e.reader_block != block_number() ? Block(e.reader_block).text : "another CTA");
        }
        write_in_cta(e.in_cta, a, b, atomic, in_flight_copy, what);
        e.writer_block = block_number();
      });
}

// Gives the memory profile, when on, the access of `bytes` at `p` by the code at `pc`: of
// kind `shared` in shared memory, `global` in a registered buffer (others are not counted).
void profiled(const void* pc, const void* p, size_t bytes, profile::Kind shared,
              profile::Kind global) {
  if (!profile::enabled()) return;
  const Region region = region_of(static_cast<const uint8_t*>(p), bytes);
  if (region != Region::kNone) {
    profile::access(region == Region::kShared ? shared : global, pc, self().tid, p, bytes);
  }
}

size_t shared_row(uint32_t address, const char* what) {
  if (address % 16 != 0 || size_t{address} + 16 > g.smem_bytes) {
    fail(
        "%s at shared offset %u: not 16-byte aligned or past the %zu bytes of dynamic shared "
        "memory",
        what, address, g.smem_bytes);
  }
  return address;
}

float element_value(uint16_t bits, Element e) {
  return e == Element::kHalf ? __half2float(__half{bits}) : __bfloat162float(__nv_bfloat16{bits});
}

uint16_t low(uint32_t r) { return static_cast<uint16_t>(r & 0xffffu); }
uint16_t high(uint32_t r) { return static_cast<uint16_t>(r >> 16); }

void compute_ldmatrix(Warp& w, bool trans) {
  const unsigned warp = static_cast<unsigned>(&w - g.warps.data());
  uint16_t m[4][8][8];  // matrix i's row r: the 16 bytes at lane 8i + r's address
  const uint8_t* rows[32];
  for (int i = 0; i < 4; ++i) {
    for (int r = 0; r < 8; ++r) {
      const uint8_t* row = g_window + shared_row(w.in[8 * i + r][0], "ldmatrix row");
      race_read({32 * warp + 8 * i + r}, row, 16, "ldmatrix");
      std::memcpy(m[i][r], row, 16);
      rows[8 * i + r] = row;
    }
  }
  if (profile::enabled()) profile::ldmatrix(w.ldmatrix_pc, warp, rows);
  for (int lane = 0; lane < 32; ++lane) {
    const int group = lane / 4, pair = 2 * (lane % 4);
    for (int i = 0; i < 4; ++i) {
      // lane holds row lane / 4, columns 2 (lane % 4) and + 1; transposed, that column's rows
      const uint16_t a = trans ? m[i][pair][group] : m[i][group][pair];
      const uint16_t b = trans ? m[i][pair + 1][group] : m[i][group][pair + 1];
      w.out[lane][i] = uint32_t{a} | uint32_t{b} << 16;
    }
  }
}

void compute_mma(Warp& w) {
  const Element element = w.element[0];  // every lane's: mma.sync takes the whole warp
  float a[16][16], b[16][8], c[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g8 = lane / 4, q2 = 2 * (lane % 4);
    const uint32_t* in = w.in[lane];
    // A (16 x 16, row): a0 a1 (g, 2q..), a2 a3 (g + 8, 2q..), a4 a5 (g, 2q + 8..), a6 a7
    // (g + 8, 2q + 8..); B (16 x 8, col): b0 b1 (2q.., g), b2 b3 (2q + 8.., g); C: c0 c1
    // (g, 2q..), c2 c3 (g + 8, 2q..)
    const int a_row[4] = {g8, g8 + 8, g8, g8 + 8}, a_col[4] = {q2, q2, q2 + 8, q2 + 8};
    for (int r = 0; r < 4; ++r) {
      a[a_row[r]][a_col[r]] = element_value(low(in[r]), element);
      a[a_row[r]][a_col[r] + 1] = element_value(high(in[r]), element);
    }
    for (int r = 0; r < 2; ++r) {
      b[q2 + 8 * r][g8] = element_value(low(in[4 + r]), element);
      b[q2 + 8 * r + 1][g8] = element_value(high(in[4 + r]), element);
    }
    for (int r = 0; r < 4; ++r) std::memcpy(&c[g8 + 8 * (r / 2)][q2 + r % 2], &in[6 + r], 4);
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g8 = lane / 4, q2 = 2 * (lane % 4);
    for (int r = 0; r < 4; ++r) {
      const int row = g8 + 8 * (r / 2), col = q2 + r % 2;
      double dot = 0;
      for (int k = 0; k < 16; ++k) dot += double{a[row][k]} * b[k][col];
      const float d = static_cast<float>(c[row][col] + dot);
      std::memcpy(&w.out[lane][r], &d, 4);
    }
  }
}

// The lane whose value `lane` receives (shfl.sync: a source past the lane's segment of
// `width` lanes, or before it for up, gives the lane its own value; an index wraps in it).
int shuffle_source(Op op, int lane, uint32_t operand, uint32_t width) {
  const int first = lane & ~static_cast<int>(width - 1), end = first + static_cast<int>(width);
  int source = lane;
  switch (op) {
    case Op::kShuffleXor:
      source = lane ^ static_cast<int>(operand & 31);
      break;
    case Op::kShuffleIndex:
      return first + static_cast<int>(operand & (width - 1));
    case Op::kShuffleUp:
      source = lane - static_cast<int>(operand);
      return source < first ? lane : source;
    case Op::kShuffleDown:
      source = lane + static_cast<int>(operand);
      break;
    default:
      break;
  }
  return source >= end ? lane : source;
}

// The results of the collective of the lanes in `mask` (they have all arrived).
void compute(Warp& w, uint32_t mask, Op op) {
  if (op == Op::kLdmatrix || op == Op::kLdmatrixTrans) {
    return compute_ldmatrix(w, op == Op::kLdmatrixTrans);
  }
  if (op == Op::kMma) return compute_mma(w);
  uint32_t bits = 0;
  for (int l = 0; l < 32; ++l) {
    if (mask >> l & 1) bits |= (w.in[l][0] & 1u) << l;
  }
  for (int lane = 0; lane < 32; ++lane) {
    if (!(mask >> lane & 1)) continue;
    if (op == Op::kBallot) {
      w.out[lane][0] = bits;
      continue;
    }
    if (op == Op::kMatchAny || op == Op::kReduceAdd) {
      uint32_t result = 0;
      for (int l = 0; l < 32; ++l) {
        if (!(mask >> l & 1)) continue;
        if (op == Op::kReduceAdd) {
          result += w.in[l][0];
        } else if (w.in[l][0] == w.in[lane][0]) {
          result |= 1u << l;
        }
      }
      w.out[lane][0] = result;
      continue;
    }
    const int source = shuffle_source(op, lane, w.in[lane][1], w.in[lane][2]);
    if (!(mask >> source & 1)) {
      fail("%s: lane %d reads lane %d, which the mask 0x%08x leaves out", op_name(op), lane, source,
           mask);
    }
    w.out[lane][0] = w.in[source][0];
  }
}

// Every lane `mask` names enters with its operands; each leaves with its results (out[lane]).
const uint32_t* collective(Op op, uint32_t mask, const uint32_t* in, int words,
                           Element element = Element::kHalf) {
  Fiber& f = self();
  const unsigned warp = f.tid / 32;
  Warp& w = g.warps[warp];
  const int lane = f.tid % 32;
  if (!(mask >> lane & 1)) {
    fail("%s with lane mask 0x%08x, which leaves out the calling lane %d", op_name(op), mask, lane);
  }
  if (mask & ~w.lanes) {
    fail("%s with lane mask 0x%08x in a warp whose lanes are 0x%08x (0x%08x not exited)",
         op_name(op), mask, w.launched, w.lanes);
  }
  // The lanes of `mask` already waiting here. One waiting in another collective that does
  // not name this lane comes here once that one completes; one that names this lane never
  // does (each waits for the other): they diverge.
  uint32_t here = 1u << lane;
  for (int l = 0; l < 32; ++l) {
    if (!(w.arrived >> l & 1) || !(mask >> l & 1)) continue;
    if (w.mask[l] == mask && w.op[l] == op && w.element[l] == element) {
      here |= 1u << l;
    } else if (w.mask[l] >> lane & 1) {
      fail("lanes of warp %u diverge: this one is in %s (mask 0x%08x), lane %d in %s (mask 0x%08x)",
           warp, op_name(op), mask, l, op_name(w.op[l]), w.mask[l]);
    }
  }
  w.mask[lane] = mask;
  w.op[lane] = op;
  w.element[lane] = element;
  std::memcpy(w.in[lane], in, sizeof(uint32_t) * words);
  w.arrived |= 1u << lane;
  if (here == mask) {
    compute(w, mask, op);
    w.arrived &= ~mask;
    for (int l = 0; l < 32; ++l) {
      if (l != lane && (mask >> l & 1)) ++w.done[l].generation;
    }
  } else {
    wait_for(w.done[lane], w.done[lane].generation);
  }
  return w.out[lane];
}

void land(const Copy& c) {
  if (c.src) {
    std::memcpy(c.dst, c.src, 16);
  } else {
    std::memset(c.dst, 0, 16);
  }
}

// A copy the issuing thread waited for: its bytes are that thread's write now.
void waited(const Copy& c) {
  if (!c.landed) land(c);
  const unsigned tid = self().tid;
  for (int i = 0; i < 16; ++i) record_write(g_window_shadow[c.dst - g_window + i], tid, 0);
}

void exit_thread(Fiber& f) {
  f.done = true;
  Warp& w = g.warps[f.tid / 32];
  const int lane = f.tid % 32;
  w.lanes &= ~(1u << lane);
  for (int l = 0; l < 32; ++l) {
    if ((w.arrived >> l & 1) && (w.mask[l] >> lane & 1)) {
      fail("exits while other lanes of warp %u wait for it in %s", f.tid / 32, op_name(w.op[l]));
    }
  }
  --g.block_barrier.expected;
  if (g.block_barrier.arrived > 0 && g.block_barrier.arrived == g.block_barrier.expected) {
    g.block_barrier.arrived = 0;
    ++g.block_barrier.generation;
    ++g.interval;
    if (profile::enabled()) profile::flush();
  }
}

void fiber_main() {
  stack_switch_end(nullptr, &g.scheduler_stack, &g.scheduler_stack_bytes);
  (*g.body)();
  exit_thread(*g.current);
  stack_switch_begin(nullptr, g.scheduler_stack, g.scheduler_stack_bytes);  // for good
}  // returns to the scheduler (uc_link)

void run_block() {
  const unsigned threads = g.block.x * g.block.y * g.block.z;
  if (g.smem_bytes) std::memset(g_window, kPoison, g.smem_bytes);
  std::memset(g_window + g.smem_bytes, kGuard, kGuardBytes);
  for (const auto& [p, bytes] : g.static_shared) std::memset(p, kPoison, bytes);
  g.block_barrier = Barrier{static_cast<int>(threads), 0, 0};
  g.cta_interval = ++g.interval;  // every shadow entry older than this CTA is stale
  g.warps.assign((threads + 31) / 32, Warp{});
  for (unsigned i = 0; i < g.warps.size(); ++i) {
    const unsigned lanes = std::min(32u, threads - 32 * i);
    Warp& w = g.warps[i];
    w.launched = w.lanes = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
  }
  for (unsigned t = 0; t < threads; ++t) {
    Fiber& f = g.fibers[t];
    f.tid = t;
    f.done = false;
    f.waiting = nullptr;
    f.open.clear();
    f.groups.clear();
    stack_unpoison(f.stack.data(), f.stack.size());
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack.data();
    f.context.uc_stack.ss_size = f.stack.size();
    f.context.uc_link = &g.scheduler;
    makecontext(&f.context, fiber_main, 0);
  }
  // In thread order, each fiber until it waits, round after round. Reversed: the last warp
  // first, its lanes last first, and each warp as far as it gets (until every lane of it
  // waits on another warp or is done) before the next one runs, so a warp that reads shared
  // memory another warp writes before a barrier publishes it reads it unwritten, even with
  // a warp collective between the write and the read.
  const unsigned warps = static_cast<unsigned>(g.warps.size());
  for (;;) {
    bool ran = false, live = false;
    for (unsigned wi = 0; wi < warps; ++wi) {
      const unsigned warp = g.reverse ? warps - 1 - wi : wi;
      const unsigned first = 32 * warp, lanes = std::min(32u, threads - first);
      for (bool progress = true; progress;) {
        progress = false;
        for (unsigned i = 0; i < lanes; ++i) {
          Fiber& f = g.fibers[first + (g.reverse ? lanes - 1 - i : i)];
          if (f.done) continue;
          live = true;
          if (f.waiting && f.waiting->generation == f.wait_generation) continue;
          f.waiting = nullptr;
          g.current = &f;
          void* fake_stack = nullptr;
          stack_switch_begin(&fake_stack, f.stack.data(), f.stack.size());
          swapcontext(&g.scheduler, &f.context);
          stack_switch_end(fake_stack, nullptr, nullptr);
          g.current = nullptr;
          ran = progress = true;
          if (g.failed) return;
        }
        progress = progress && g.reverse;
      }
    }
    if (!live) {
      for (size_t i = 0; i < kGuardBytes; ++i) {
        if (g_window[g.smem_bytes + i] != kGuard) {
          g.error = "block (" + std::to_string(g.block_idx.x) + ", " +
                    std::to_string(g.block_idx.y) + ", " + std::to_string(g.block_idx.z) +
                    "): shared memory written " + std::to_string(i) + " bytes past the launch's " +
                    std::to_string(g.smem_bytes);
          g.failed = true;
          return;
        }
      }
      if (profile::enabled()) profile::flush();
      return;
    }
    if (!ran) {
      int at_barrier = 0;
      for (const Fiber& f : g.fibers) at_barrier += !f.done && f.waiting == &g.block_barrier;
      g.error = "block (" + std::to_string(g.block_idx.x) + ", " + std::to_string(g.block_idx.y) +
                ", " + std::to_string(g.block_idx.z) + "): deadlock, " +
                std::to_string(at_barrier) +
                " threads wait in __syncthreads and the others in warp collectives";
      g.failed = true;
      return;
    }
  }
}

}  // namespace

uint3 thread_idx() {
  const unsigned t = self().tid;
  return {t % g.block.x, t / g.block.x % g.block.y, t / (g.block.x * g.block.y)};
}
uint3 block_idx() { return {g.block_idx.x, g.block_idx.y, g.block_idx.z}; }
dim3 block_dim() { return g.block; }
dim3 grid_dim() { return g.grid; }

void sync_threads() {
  const uint64_t generation = g.block_barrier.generation;
  if (arrive(g.block_barrier)) {
    ++g.interval;
    if (profile::enabled()) profile::flush();
  } else {
    wait_for(g.block_barrier, generation);
  }
}

uint32_t shuffle_bits(uint32_t mask, uint32_t value, int operand, Shuffle mode, int width) {
  constexpr Op kOps[] = {Op::kShuffleXor, Op::kShuffleIndex, Op::kShuffleUp, Op::kShuffleDown};
  const Op op = kOps[static_cast<int>(mode)];
  if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
    fail("%s of width %d: not a power of two up to 32", op_name(op), width);
  }
  const uint32_t in[3] = {value, static_cast<uint32_t>(operand), static_cast<uint32_t>(width)};
  return collective(op, mask, in, 3)[0];
}

uint32_t ballot(uint32_t mask, bool pred) {
  const uint32_t in[1] = {pred ? 1u : 0u};
  return collective(Op::kBallot, mask, in, 1)[0];
}

uint32_t match_any(uint32_t mask, uint32_t value) {
  const uint32_t in[1] = {value};
  return collective(Op::kMatchAny, mask, in, 1)[0];
}

uint32_t reduce_add(uint32_t mask, uint32_t value) {
  const uint32_t in[1] = {value};
  return collective(Op::kReduceAdd, mask, in, 1)[0];
}

void ldmatrix_x4(uint32_t* r, uint32_t address, bool trans) {
  g.warps[self().tid / 32].ldmatrix_pc = __builtin_return_address(0);
  const uint32_t in[1] = {address};
  std::memcpy(r, collective(trans ? Op::kLdmatrixTrans : Op::kLdmatrix, 0xffffffffu, in, 1), 16);
}

void mma_16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1, Element element) {
  uint32_t in[10] = {a[0], a[1], a[2], a[3], b0, b1};
  std::memcpy(in + 6, c, 16);
  std::memcpy(c, collective(Op::kMma, 0xffffffffu, in, 10, element), 16);
}

size_t shared_offset(const void* p) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  if (b < g_window || b >= g_window + kWindowBytes) {
    fail("__cvta_generic_to_shared of %p, outside shared memory", p);
  }
  return static_cast<size_t>(b - g_window);
}

int load_if(const int32_t* ptr, bool pred, int fallback) {
  if (!pred) return fallback;
  if (!in_buffers(ptr, 4)) fail("page-table load at %p, outside every registered buffer", ptr);
  profiled(__builtin_return_address(0), ptr, 4, profile::Kind::kSharedLoad,
           profile::Kind::kGlobalLoad);
  race_read(accessor(), reinterpret_cast<const uint8_t*>(ptr), 4, "page-table load");
  return *ptr;
}

void cp_async_16(void* smem, const void* gmem, bool fill) {
  const size_t at = shared_row(static_cast<uint32_t>(shared_offset(smem)), "cp.async destination");
  if (fill && (reinterpret_cast<uintptr_t>(gmem) % 16 != 0 || !in_buffers(gmem, 16))) {
    fail("cp.async reads 16 bytes at %p: unaligned or outside every registered buffer", gmem);
  }
  const Copy c{g_window + at, fill ? static_cast<const uint8_t*>(gmem) : nullptr, g.land_at_issue};
  if (profile::enabled()) {
    const void* pc = __builtin_return_address(0);
    profile::access(profile::Kind::kCpAsyncToShared, pc, self().tid, c.dst, 16);
    if (c.src) profile::access(profile::Kind::kCpAsyncFromGlobal, pc, self().tid, c.src, 16);
  }
  if (c.src) race_read(accessor(), c.src, 16, "cp.async");
  race_write(accessor(), c.dst, 16, false, true, "cp.async");
  if (c.landed) land(c);
  self().open.push_back(c);
}

void cp_async_commit() {
  Fiber& f = self();
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}

void cp_async_wait(int pending) {
  Fiber& f = self();
  while (f.groups.size() > static_cast<size_t>(pending)) {
    for (const Copy& c : f.groups.front()) waited(c);
    f.groups.pop_front();
  }
}

uint8_t* shared_window() { return g_window; }

void atomic_access(void* p, size_t bytes, const void* pc) {
  profiled(pc, p, bytes, profile::Kind::kSharedAtomic, profile::Kind::kGlobalAtomic);
  race_write(accessor(), static_cast<uint8_t*>(p), bytes, true, false, "atomic");
}

void shared_declared(void* p, size_t bytes) {
  for (const auto& [q, size] : g.static_shared) {
    if (q == p) return;
  }
  g.static_shared.emplace_back(p, bytes);
  g_static_shadow.emplace_back(bytes);
  std::memset(p, kPoison, bytes);
}

cudaError_t set_max_dynamic_shared(const void* kernel, int attribute, int bytes) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || bytes < 0) {
    return cudaErrorInvalidValue;
  }
  g.max_dynamic_shared[kernel] = bytes;
  return cudaSuccess;
}

cudaError_t launch(const void* kernel, dim3 grid, dim3 block, size_t smem_bytes,
                   const std::function<void()>& body) {
  std::lock_guard<std::mutex> lock(g_launch);
  if (g.failed) return cudaErrorLaunchFailure;  // sticky, as a failed launch is on a GPU
  const auto raised = g.max_dynamic_shared.find(kernel);
  const size_t allowed =
      std::max(kStaticSharedLimit,
               raised == g.max_dynamic_shared.end() ? size_t{0} : size_t(raised->second));
  const unsigned threads = block.x * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 ||
      grid.y > 65535 || grid.z == 0 || grid.z > 65535 || smem_bytes > allowed ||
      smem_bytes > kWindowBytes) {
    char text[256];
    std::snprintf(text, sizeof text,
                  "invalid launch: grid (%u, %u, %u), block (%u, %u, %u), %zu bytes of dynamic "
                  "shared memory (the kernel allows %zu, the window has %zu)",
                  grid.x, grid.y, grid.z, block.x, block.y, block.z, smem_bytes, allowed,
                  kWindowBytes);
    g.error = text;
    return cudaErrorInvalidConfiguration;
  }
  g.grid = grid;
  g.block = block;
  g.smem_bytes = smem_bytes;
  g.body = &body;
  g.launch_interval = g.interval + 1;  // the first CTA's
  g_global_shadow.clear();
  if (g.fibers.size() < threads) g.fibers.resize(threads);
  for (Fiber& f : g.fibers) f.stack.resize(kStackBytes);
  g.fibers.resize(threads);
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        g.block_idx = dim3(x, y, z);
        run_block();
        if (g.failed) return cudaErrorLaunchFailure;
      }
    }
  }
  return cudaSuccess;
}

const char* last_error() { return g.error.c_str(); }

}  // namespace simt

// For the Python side (tests/emu/__init__.py), through ctypes.
extern "C" {
const char* simt_error() { return simt::g.error.c_str(); }
// schedule: bit 0, cp.async lands when issued; bit 1, fibers run last thread first
void simt_reset(int schedule) {
  simt::g.failed = false;
  simt::g.error.clear();
  simt::g.land_at_issue = (schedule & 1) != 0;
  simt::g.reverse = (schedule & 2) != 0;
  simt::g.buffers.clear();
}
void simt_add_buffer(const void* base, size_t bytes) {
  simt::g.buffers.emplace_back(reinterpret_cast<uintptr_t>(base), bytes);
}
}

// The race check's hooks (see race_read): the calls -fsanitize=thread puts on a kernel TU's
// loads and stores (of shared memory or a registered buffer inside a launch: checked and
// recorded; of anything else, the kernel TU's host code too: ignored) and on its atomic
// loads and stores (std::atomic flags in launchers' host code: done as atomics). A kernel TU
// that needs another of ThreadSanitizer's entry points fails to load, naming it.
// `pc`: the kernel code making the access (for the memory profile).
namespace {
void hook_read(const void* p, size_t bytes, const void* pc) {
  if (simt::g.current) {
    simt::profiled(pc, p, bytes, simt::profile::Kind::kSharedLoad,
                   simt::profile::Kind::kGlobalLoad);
    simt::race_read(simt::accessor(), static_cast<const uint8_t*>(p), bytes, "load");
  }
}
void hook_write(void* p, size_t bytes, const void* pc) {
  if (simt::g.current) {
    simt::profiled(pc, p, bytes, simt::profile::Kind::kSharedStore,
                   simt::profile::Kind::kGlobalStore);
    simt::race_write(simt::accessor(), static_cast<uint8_t*>(p), bytes, false, false, "store");
  }
}
}  // namespace

#define SIMT_CALLER __builtin_return_address(0)
extern "C" {
void __tsan_init() {}
void __tsan_read_range(void* p, size_t bytes) { hook_read(p, bytes, SIMT_CALLER); }
void __tsan_write_range(void* p, size_t bytes) { hook_write(p, bytes, SIMT_CALLER); }
#define SIMT_ACCESS_HOOKS(N)                                                \
  void __tsan_read##N(void* p) { hook_read(p, N, SIMT_CALLER); }            \
  void __tsan_write##N(void* p) { hook_write(p, N, SIMT_CALLER); }          \
  void __tsan_unaligned_read##N(void* p) { hook_read(p, N, SIMT_CALLER); }  \
  void __tsan_unaligned_write##N(void* p) { hook_write(p, N, SIMT_CALLER); }
SIMT_ACCESS_HOOKS(1)
SIMT_ACCESS_HOOKS(2)
SIMT_ACCESS_HOOKS(4)
SIMT_ACCESS_HOOKS(8)
SIMT_ACCESS_HOOKS(16)
#undef SIMT_ACCESS_HOOKS
#undef SIMT_CALLER
#define SIMT_ATOMIC_HOOKS(N, T)                            \
  T __tsan_atomic##N##_load(const volatile T* a, int) {    \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);           \
  }                                                        \
  void __tsan_atomic##N##_store(volatile T* a, T v, int) { \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);              \
  }
SIMT_ATOMIC_HOOKS(8, char)
SIMT_ATOMIC_HOOKS(16, short)
SIMT_ATOMIC_HOOKS(32, int)
SIMT_ATOMIC_HOOKS(64, long)
#undef SIMT_ATOMIC_HOOKS
}
