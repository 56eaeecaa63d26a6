// The ceiling of the fp8_ds_mla record gather on this GPU: B x 2048 random 656-byte records out
// of a 1.4 GB pool (the sparse MLA decode benchmark's distribution), read with 16-byte loads and
// nothing else done with them. Variants: plain loads with U records in flight per warp, and the
// same after an L2 bulk prefetch of each record (cp.async.bulk.prefetch.L2) issued D records
// ahead. Build and run on the GPU box: nvcc -O3 -arch=sm_90a gather_ceiling.cu -o g && ./g
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <random>
#include <cuda_runtime.h>

constexpr int REC = 656, CHUNKS = REC / 16;  // 41

template <int U, int D>
__global__ void gather(const uint8_t* __restrict__ pool, const int* __restrict__ idx, int n, uint4* out) {
  int lane = threadIdx.x & 31;
  int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  int nwarps = (gridDim.x * blockDim.x) >> 5;
  uint4 acc = make_uint4(0, 0, 0, 0);
  // warp w takes records w, w + nwarps, ... U at a time
  for (int base = warp * U; base < n; base += nwarps * U) {
    if (D > 0 && lane < U) {
      int p = base + nwarps * U * D + lane;
      if (p < n) {
        const uint8_t* a = pool + (size_t)idx[p] * REC;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(a), "r"(REC) : "memory");
      }
    }
    uint4 v[U][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int r = base + u;
      const uint4* rec = reinterpret_cast<const uint4*>(pool + (size_t)idx[min(r, n - 1)] * REC);
      v[u][0] = __ldg(rec + lane);
      v[u][1] = lane + 32 < CHUNKS ? __ldg(rec + 32 + lane) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h) { acc.x ^= v[u][h].x; acc.y ^= v[u][h].y; acc.z ^= v[u][h].z; acc.w ^= v[u][h].w; }
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) out[0] = acc;
}

template <int U, int D>
float run(const uint8_t* pool, const int* idx_sets, int sets, int n, uint4* out, int blocks, int threads) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) gather<U, D><<<blocks, threads>>>(pool, idx_sets, n, out);
  const int iters = 64;
  cudaEventRecord(a);
  for (int i = 0; i < iters; ++i) gather<U, D><<<blocks, threads>>>(pool, idx_sets + (size_t)(i % sets) * n, n, out);
  cudaEventRecord(b); cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b);
  return ms * 1000.f / iters;
}

int main() {
  const size_t slots = 32768ull * 64;
  uint8_t* pool; cudaMalloc(&pool, slots * REC); cudaMemset(pool, 1, slots * REC);
  uint4* out; cudaMalloc(&out, 64);
  const int sets = 8, maxn = 128 * 2048;
  std::vector<int> h((size_t)sets * maxn);
  std::mt19937 g(0); std::uniform_int_distribution<int> d(0, (int)slots - 1);
  for (auto& x : h) x = d(g);
  int* idx; cudaMalloc(&idx, h.size() * 4); cudaMemcpy(idx, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  printf("%-6s %-14s %9s %8s\n", "B", "variant", "us", "TB/s");
  for (int B : {1, 4, 8, 32, 128}) {
    int n = B * 2048;
    double bytes = (double)n * REC;
    auto show = [&](const char* name, float us) { printf("%-6d %-14s %9.2f %8.2f\n", B, name, us, bytes / us / 1e6); };
    show("u2_1k", run<2, 0>(pool, idx, sets, n, out, sms * 8, 256));
    show("u4_2k", run<4, 0>(pool, idx, sets, n, out, sms * 8, 256));
    show("u8_2k", run<8, 0>(pool, idx, sets, n, out, sms * 8, 256));
    show("u4_pf2", run<4, 2>(pool, idx, sets, n, out, sms * 8, 256));
    show("u4_pf4", run<4, 4>(pool, idx, sets, n, out, sms * 8, 256));
  }
  return 0;
}
