// The emulator's memory profile (see profile.h), with the memory model of NVIDIA's recent
// GPUs (sm_80 and later; CUDA C++ Programming Guide, "Shared Memory" of compute capability
// 5.x on, and the Best Practices Guide's coalescing rules):
// - shared memory has 32 banks of 4-byte words, and a warp's request is served in phases of
//   128 bytes (32 lanes of up to 4 bytes, 16 lanes of 8, 8 lanes of 16; ldmatrix .x4: each
//   matrix's 8 rows of 16 bytes). A phase takes as many wavefronts as the most distinct words
//   any one bank holds (lanes reading one word share it), and could take one for each 32
//   distinct words it touches. Atomics serialize on a word, so there every lane's word counts.
// - global memory moves in 32-byte sectors: a request takes one per distinct sector its lanes
//   touch, and could take one per 32 distinct bytes.
#include "profile.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace simt {
namespace profile {
namespace {

constexpr int kBanks = 32;
constexpr uintptr_t kWordBytes = 4, kSectorBytes = 32;

bool g_enabled = false;

// One warp-wide request: the lanes that took part and what each accessed.
struct Request {
  uint32_t lanes = 0;
  uintptr_t address[32];
  uint32_t bytes[32];
};

// A warp's accesses at one code address: lane l's n-th is in requests[n].
struct Stream {
  uint32_t count[32] = {};
  std::vector<Request> requests;
};

struct Key {
  const void* pc;
  Kind kind;
  unsigned warp;
  bool operator==(const Key& o) const { return pc == o.pc && kind == o.kind && warp == o.warp; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    return std::hash<const void*>()(k.pc) ^ (static_cast<size_t>(k.kind) << 56) ^
           (static_cast<size_t>(k.warp) << 40);
  }
};

struct Site {
  uint64_t requests = 0, cost = 0, ideal = 0;
  uint32_t min_bytes = ~0u, max_bytes = 0;
};

std::unordered_map<Key, Stream, KeyHash> g_streams;  // this CTA's
std::unordered_map<Key, Site, KeyHash> g_sites;      // since the profile started (warp 0)
std::string g_report;

bool is_shared(Kind k) {
  return k == Kind::kSharedLoad || k == Kind::kSharedStore || k == Kind::kSharedAtomic ||
         k == Kind::kCpAsyncToShared || k == Kind::kLdmatrix;
}

// Wavefronts of the lanes [first, first + count) of `r` (and the fewest possible).
std::pair<uint64_t, uint64_t> shared_phase(const Request& r, int first, int count, bool atomic) {
  std::vector<uintptr_t> words;
  for (int l = first; l < first + count; ++l) {
    if (!(r.lanes >> l & 1)) continue;
    const uintptr_t first_word = r.address[l] / kWordBytes;
    const uintptr_t last_word = (r.address[l] + r.bytes[l] - 1) / kWordBytes;
    for (uintptr_t w = first_word; w <= last_word; ++w) words.push_back(w);
  }
  if (words.empty()) return {0, 0};
  std::sort(words.begin(), words.end());
  int per_bank[kBanks] = {};
  size_t distinct = 0;
  for (size_t i = 0; i < words.size(); ++i) {
    const bool repeat = i > 0 && words[i] == words[i - 1];
    distinct += !repeat;
    if (atomic || !repeat) ++per_bank[words[i] % kBanks];  // a repeated word is shared
  }
  return {static_cast<uint64_t>(*std::max_element(per_bank, per_bank + kBanks)),
          (distinct + kBanks - 1) / kBanks};
}

std::pair<uint64_t, uint64_t> shared_cost(const Request& r, Kind kind) {
  uint32_t widest = 0;
  for (int l = 0; l < 32; ++l) {
    if (r.lanes >> l & 1) widest = std::max(widest, r.bytes[l]);
  }
  // lanes a phase: 128 bytes of the widest access (ldmatrix: a matrix's 8 rows)
  const int lanes = kind == Kind::kLdmatrix ? 8 : widest <= 4 ? 32 : widest <= 8 ? 16 : 8;
  uint64_t cost = 0, ideal = 0;
  for (int first = 0; first < 32; first += lanes) {
    const auto [c, i] = shared_phase(r, first, lanes, kind == Kind::kSharedAtomic);
    cost += c;
    ideal += i;
  }
  return {cost, ideal};
}

std::pair<uint64_t, uint64_t> global_cost(const Request& r) {
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  std::vector<uintptr_t> sectors;
  for (int l = 0; l < 32; ++l) {
    if (!(r.lanes >> l & 1)) continue;
    const uintptr_t begin = r.address[l], end = begin + r.bytes[l];
    ranges.emplace_back(begin, end);
    for (uintptr_t s = begin / kSectorBytes; s * kSectorBytes < end; ++s) sectors.push_back(s);
  }
  std::sort(sectors.begin(), sectors.end());
  std::sort(ranges.begin(), ranges.end());
  uint64_t bytes = 0;
  uintptr_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    if (end > std::max(begin, covered)) bytes += end - std::max(begin, covered);
    covered = std::max(covered, end);
  }
  const auto distinct = std::unique(sectors.begin(), sectors.end()) - sectors.begin();
  return {static_cast<uint64_t>(distinct), (bytes + kSectorBytes - 1) / kSectorBytes};
}

void count(const Key& key, const Request& r) {
  Site& site = g_sites[Key{key.pc, key.kind, 0}];
  const auto [cost, ideal] = is_shared(key.kind) ? shared_cost(r, key.kind) : global_cost(r);
  ++site.requests;
  site.cost += cost;
  site.ideal += ideal;
  for (int l = 0; l < 32; ++l) {
    if (!(r.lanes >> l & 1)) continue;
    site.min_bytes = std::min(site.min_bytes, r.bytes[l]);
    site.max_bytes = std::max(site.max_bytes, r.bytes[l]);
  }
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kSharedLoad:
      return "shared load";
    case Kind::kSharedStore:
      return "shared store";
    case Kind::kSharedAtomic:
      return "shared atomic";
    case Kind::kLdmatrix:
      return "ldmatrix";
    case Kind::kCpAsyncToShared:
      return "cp.async to shared";
    case Kind::kGlobalLoad:
      return "global load";
    case Kind::kGlobalStore:
      return "global store";
    case Kind::kGlobalAtomic:
      return "global atomic";
    case Kind::kCpAsyncFromGlobal:
      return "cp.async from global";
  }
  return "?";
}

}  // namespace

bool enabled() { return g_enabled; }

void access(Kind kind, const void* pc, unsigned tid, const void* address, size_t bytes) {
  Stream& s = g_streams[Key{pc, kind, tid / 32}];
  const unsigned lane = tid % 32;
  const uint32_t n = s.count[lane]++;
  if (n >= s.requests.size()) s.requests.resize(n + 1);
  Request& r = s.requests[n];
  r.lanes |= 1u << lane;
  r.address[lane] = reinterpret_cast<uintptr_t>(address);
  r.bytes[lane] = static_cast<uint32_t>(bytes);
}

void ldmatrix(const void* pc, unsigned warp, const uint8_t* const rows[32]) {
  Request r;
  r.lanes = 0xffffffffu;
  for (int l = 0; l < 32; ++l) {
    r.address[l] = reinterpret_cast<uintptr_t>(rows[l]);
    r.bytes[l] = 16;
  }
  count(Key{pc, Kind::kLdmatrix, warp}, r);
}

void flush() {
  for (const auto& [key, stream] : g_streams) {
    for (const Request& r : stream.requests) count(key, r);
  }
  g_streams.clear();
}

}  // namespace profile
}  // namespace simt

// For the Python side (tests/emu/profile.py), through ctypes.
extern "C" {
void simt_profile_start() {
  simt::profile::g_streams.clear();
  simt::profile::g_sites.clear();
  simt::profile::g_enabled = true;
}
void simt_profile_stop() {
  simt::profile::g_streams.clear();
  simt::profile::g_enabled = false;
}
// A line a site: the library holding its code, the code's offset in it, the kind, the
// fewest and most bytes a lane accessed, requests, wavefronts or sectors, and the fewest.
const char* simt_profile_report() {
  using namespace simt::profile;
  g_report.clear();
  for (const auto& [key, site] : g_sites) {
    Dl_info info{};
    const bool found = dladdr(key.pc, &info) != 0 && info.dli_fname;
    const uintptr_t offset = reinterpret_cast<uintptr_t>(key.pc) -
                             (found ? reinterpret_cast<uintptr_t>(info.dli_fbase) : 0);
    char line[1024];
    std::snprintf(line, sizeof line, "%s\t%#zx\t%s\t%u\t%u\t%llu\t%llu\t%llu\n",
                  found ? info.dli_fname : "?", static_cast<size_t>(offset), kind_name(key.kind),
                  site.min_bytes, site.max_bytes, static_cast<unsigned long long>(site.requests),
                  static_cast<unsigned long long>(site.cost),
                  static_cast<unsigned long long>(site.ideal));
    g_report += line;
  }
  return g_report.c_str();
}
}
