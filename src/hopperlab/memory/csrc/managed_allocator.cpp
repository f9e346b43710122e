// hopperlab: every PyTorch CUDA allocation through cudaMallocManaged (unified memory).
//
// Loaded by torch.cuda.memory.CUDAPluggableAllocator, which calls
//   void* hopperlab_managed_malloc(size_t size, int device, cudaStream_t stream)
//   void  hopperlab_managed_free(void* ptr, size_t size, int device, cudaStream_t stream)
// The pluggable allocator has no cache of its own and does not check for a null return, so
// this file does both:
//  * a cache keyed by (stream, rounded size): a block freed on a stream is reused only by a later
//    allocation on that stream, which the stream orders after every earlier use (PyTorch's own
//    rule; record_stream is not forwarded to pluggable allocators, so cross-stream users must
//    keep their tensors alive themselves);
//  * a cap on the managed bytes held (in use + cached), set at install time from the GPU's free
//    memory: an allocation that would pass it first returns the cached blocks (cudaFree, which
//    synchronises) and, if it still would, throws c10::OutOfMemoryError (torch.OutOfMemoryError
//    in Python) instead of asking the driver for more than the GPU has.
#include <cuda_runtime_api.h>
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

constexpr size_t kSmall = size_t(1) << 20;     // below: round to 512 B
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t(2) << 20; // at or above: round to 2 MiB

enum Advice : int { kAdvisePreferredDevice = 1, kAdviseAccessedBy = 2 };

struct Key {
  cudaStream_t stream;
  size_t size;
  bool operator==(const Key& o) const { return stream == o.stream && size == o.size; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    return std::hash<uintptr_t>()(reinterpret_cast<uintptr_t>(k.stream)) * 31u ^ std::hash<size_t>()(k.size);
  }
};

struct State {
  std::mutex mu;
  size_t cap = 0;            // 0: no cap (Grace Hopper, or the site allows oversubscription)
  int advice = 0;
  int prefetch = 0;
  size_t reserved = 0;       // managed bytes held (in use + cached)
  size_t in_use = 0;
  size_t peak_reserved = 0;
  size_t peak_in_use = 0;
  size_t managed_calls = 0;  // cudaMallocManaged calls
  size_t refusals = 0;       // allocations refused by the cap
  std::unordered_map<Key, std::vector<void*>, KeyHash> cache;
  std::unordered_map<void*, size_t> block_size;  // rounded size of every live block
};

State& state() {
  static State* s = new State();  // never destroyed: frees may come during interpreter exit
  return *s;
}

size_t round_size(size_t size) {
  if (size == 0) size = 1;
  size_t unit = size < kSmall ? kSmallRound : kLargeRound;
  return (size + unit - 1) / unit * unit;
}

void release_cache_locked(State& s) {
  for (auto& entry : s.cache) {
    for (void* p : entry.second) {
      cudaFree(p);
      s.reserved -= s.block_size[p];
      s.block_size.erase(p);
    }
  }
  s.cache.clear();
}

void advise(State& s, void* p, size_t size, int device, cudaStream_t stream) {
#if CUDART_VERSION >= 13000
  cudaMemLocation loc{};
  loc.type = cudaMemLocationTypeDevice;
  loc.id = device;
  if (s.advice & kAdvisePreferredDevice) cudaMemAdvise(p, size, cudaMemAdviseSetPreferredLocation, loc);
  if (s.advice & kAdviseAccessedBy) cudaMemAdvise(p, size, cudaMemAdviseSetAccessedBy, loc);
  if (s.prefetch) cudaMemPrefetchAsync(p, size, loc, 0, stream);
#else
  if (s.advice & kAdvisePreferredDevice) cudaMemAdvise(p, size, cudaMemAdviseSetPreferredLocation, device);
  if (s.advice & kAdviseAccessedBy) cudaMemAdvise(p, size, cudaMemAdviseSetAccessedBy, device);
  if (s.prefetch) cudaMemPrefetchAsync(p, size, device, stream);
#endif
  cudaGetLastError();  // advice is a hint: a refusal must not poison the next runtime call
}

[[noreturn]] void refuse(State& s, size_t size, const char* why) {
  s.refusals += 1;
  std::string msg = "CUDA out of memory (hopperlab managed allocator): " + std::string(why) +
                    "; asked " + std::to_string(size) + " bytes with " + std::to_string(s.reserved) +
                    " held and a cap of " + std::to_string(s.cap) + " bytes";
  TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
  std::abort();  // unreachable: TORCH_CHECK_WITH throws
}

}  // namespace

extern "C" {

void hopperlab_managed_configure(size_t cap, int advice, int prefetch) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.cap = cap;
  s.advice = advice;
  s.prefetch = prefetch;
}

int hopperlab_managed_mem_get_info(int device, size_t* free_bytes, size_t* total_bytes) {
  if (cudaSetDevice(device) != cudaSuccess) return 1;
  return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess ? 0 : 2;
}

int hopperlab_managed_device_name(int device, char* out, int capacity) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return 1;
  std::strncpy(out, prop.name, capacity - 1);
  out[capacity - 1] = '\0';
  return 0;
}

// out: reserved, in_use, peak_reserved, peak_in_use, managed_calls, refusals, cap
void hopperlab_managed_stats(size_t* out) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  out[0] = s.reserved;
  out[1] = s.in_use;
  out[2] = s.peak_reserved;
  out[3] = s.peak_in_use;
  out[4] = s.managed_calls;
  out[5] = s.refusals;
  out[6] = s.cap;
}

void hopperlab_managed_empty_cache() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  release_cache_locked(s);
}

void* hopperlab_managed_malloc(size_t size, int device, cudaStream_t stream) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  size_t rounded = round_size(size);
  auto it = s.cache.find(Key{stream, rounded});
  void* p = nullptr;
  if (it != s.cache.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
  } else {
    if (s.cap && s.reserved + rounded > s.cap) release_cache_locked(s);
    if (s.cap && s.reserved + rounded > s.cap) refuse(s, rounded, "the cap set from the GPU's free memory");
    if (cudaSetDevice(device) != cudaSuccess ||
        cudaMallocManaged(&p, rounded, cudaMemAttachGlobal) != cudaSuccess) {
      cudaGetLastError();
      release_cache_locked(s);
      if (cudaMallocManaged(&p, rounded, cudaMemAttachGlobal) != cudaSuccess) {
        cudaGetLastError();
        refuse(s, rounded, "cudaMallocManaged failed");
      }
    }
    s.managed_calls += 1;
    s.reserved += rounded;
    if (s.reserved > s.peak_reserved) s.peak_reserved = s.reserved;
    s.block_size[p] = rounded;
    if (s.advice || s.prefetch) advise(s, p, rounded, device, stream);
  }
  s.in_use += rounded;
  if (s.in_use > s.peak_in_use) s.peak_in_use = s.in_use;
  return p;
}

void hopperlab_managed_free(void* ptr, size_t size, int device, cudaStream_t stream) {
  (void)size;
  (void)device;
  if (ptr == nullptr) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  size_t rounded = s.block_size[ptr];
  s.in_use -= rounded;
  s.cache[Key{stream, rounded}].push_back(ptr);
}

}  // extern "C"
