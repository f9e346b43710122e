// A stand-in for the CUDA runtime header, for CPU-only CI: just enough to compile
// src/hopperlab/memory/csrc/managed_allocator.cpp, with host malloc standing in for managed
// memory and a settable "driver" limit, so that a test can exercise the cache and the cap.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>

#define CUDART_VERSION 13000
typedef int cudaError_t;
typedef struct CUstream_st* cudaStream_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 };
enum { cudaMemAttachGlobal = 1 };
enum cudaMemoryAdvise { cudaMemAdviseSetPreferredLocation = 3, cudaMemAdviseSetAccessedBy = 5 };
enum cudaMemLocationType { cudaMemLocationTypeDevice = 1 };
struct cudaMemLocation { cudaMemLocationType type; int id; };
struct cudaDeviceProp { char name[256]; };

inline size_t& fake_driver_left() { static size_t left = (size_t)1 << 40; return left; }
inline int& fake_advice_calls() { static int n = 0; return n; }

inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaMallocManaged(void** p, size_t size, unsigned) {
  if (size > fake_driver_left()) return cudaErrorMemoryAllocation;
  fake_driver_left() -= size;
  *p = std::malloc(size);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFree(void* p) { std::free(p); return cudaSuccess; }
inline cudaError_t cudaMemGetInfo(size_t* f, size_t* t) { *f = (size_t)6 << 30; *t = (size_t)8 << 30; return cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) { std::strcpy(p->name, "Fake GPU"); return cudaSuccess; }
inline cudaError_t cudaMemAdvise(const void*, size_t, cudaMemoryAdvise, cudaMemLocation) { ++fake_advice_calls(); return cudaSuccess; }
inline cudaError_t cudaMemPrefetchAsync(const void*, size_t, cudaMemLocation, unsigned, cudaStream_t) { ++fake_advice_calls(); return cudaSuccess; }
