// Drives the managed allocator's C entry points the way PyTorch's pluggable allocator does and
// prints what happened, one "name value" line per fact, for tests/memory/test_memory_managed.py.
#include <cstdio>
#include <c10/util/Exception.h>
#include "cuda_runtime_api.h"

extern "C" {
void hopperlab_managed_configure(size_t cap, int advice, int prefetch);
void* hopperlab_managed_malloc(size_t size, int device, cudaStream_t stream);
void hopperlab_managed_free(void* ptr, size_t size, int device, cudaStream_t stream);
void hopperlab_managed_stats(size_t* out);
}

static void stats(const char* tag) {
  size_t s[7];
  hopperlab_managed_stats(s);
  std::printf("%s reserved=%zu in_use=%zu peak_reserved=%zu peak_in_use=%zu calls=%zu refusals=%zu cap=%zu\n",
              tag, s[0], s[1], s[2], s[3], s[4], s[5], s[6]);
}

int main() {
  const size_t MiB = 1 << 20;
  cudaStream_t s1 = reinterpret_cast<cudaStream_t>(0x1), s2 = reinterpret_cast<cudaStream_t>(0x2);
  hopperlab_managed_configure(8 * MiB, 3, 1);
  void* a = hopperlab_managed_malloc(3 * MiB, 0, s1);       // rounds to 4 MiB
  void* b = hopperlab_managed_malloc(100, 0, s1);           // rounds to 512 B
  stats("two");
  std::printf("advice_calls %d\n", fake_advice_calls());    // 2 advices + 1 prefetch per block
  hopperlab_managed_free(a, 3 * MiB, 0, s1);
  void* c = hopperlab_managed_malloc(4 * MiB, 0, s1);        // same stream, same class: reused
  std::printf("reused %d\n", c == a);
  stats("reuse");
  hopperlab_managed_free(c, 4 * MiB, 0, s1);
  void* d = hopperlab_managed_malloc(4 * MiB, 0, s2);        // other stream: not reused
  std::printf("other_stream_reused %d\n", d == a);
  stats("other_stream");
  try {
    hopperlab_managed_malloc(6 * MiB, 0, s1);                // 4 + 0.5K held + 6 > 8: refused
    std::printf("refused 0\n");
  } catch (const c10::OutOfMemoryError& e) {
    std::printf("refused 1\n");
    std::printf("message_has_cuda_oom %d\n", std::strstr(e.what(), "CUDA out of memory") != nullptr);
  }
  stats("after_refusal");
  hopperlab_managed_free(d, 4 * MiB, 0, s2);
  hopperlab_managed_free(b, 100, 0, s1);
  stats("end");
  return 0;
}
