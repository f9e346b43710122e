/* A stand-in libcudart for the ctypes binding (hopperlab.cuda.runtime), for CPU-only CI.
 * Device attributes come from the environment (FAKE_CUDA_ATTR_<number>=<value>, default 0), so
 * a test decides what the "device" reports; managed memory is host malloc; advice and prefetch
 * calls are counted (fake_calls). Built by tests/cuda/test_system_memory.py with the C compiler. */
#include <stdio.h>
#include <stdlib.h>

static int calls = 0;

int fake_calls(void) { return calls; }
const char* cudaGetErrorString(int err) { return err ? "fake error" : "no error"; }
int cudaRuntimeGetVersion(int* v) {
  const char* s = getenv("FAKE_CUDA_VERSION");
  *v = s ? atoi(s) : 13000;
  return 0;
}
int cudaDeviceGetAttribute(int* value, int attr, int device) {
  char name[64];
  if (device != 0) return 101; /* cudaErrorInvalidDevice */
  snprintf(name, sizeof name, "FAKE_CUDA_ATTR_%d", attr);
  const char* s = getenv(name);
  *value = s ? atoi(s) : 0;
  return 0;
}
int cudaMallocManaged(void** p, size_t n, unsigned flags) {
  (void)flags;
  *p = malloc(n);
  return *p ? 0 : 2;
}
int cudaFree(void* p) { free(p); return 0; }
int cudaHostAlloc(void** p, size_t n, unsigned flags) { (void)flags; *p = malloc(n); return *p ? 0 : 2; }
int cudaFreeHost(void* p) { free(p); return 0; }
int cudaDeviceSynchronize(void) { return 0; }
struct loc { int type; int id; };
int cudaMemPrefetchAsync(const void* p, size_t n, struct loc l, unsigned f, void* s) {
  (void)p; (void)n; (void)l; (void)f; (void)s; ++calls; return 0;
}
int cudaMemAdvise(const void* p, size_t n, int advice, struct loc l) {
  (void)p; (void)n; (void)l;
  ++calls;
  return (advice == 3 || advice == 5) ? 0 : 1;
}
