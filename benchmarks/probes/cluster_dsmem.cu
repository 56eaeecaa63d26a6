// Cluster occupancy and distributed-shared-memory store throughput (session 9 design probe).
// Build and run on the GPU box: nvcc -arch=sm_90a -O3 -o /tmp/cluster_dsmem benchmarks/probes/cluster_dsmem.cu && /tmp/cluster_dsmem
#include <cstdio>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

__global__ void dsmem_kernel(int bytes_per_cta, long long* t, int reps) {
  extern __shared__ __align__(16) unsigned char smem[];
  cg::cluster_group cl = cg::this_cluster();
  unsigned n = cl.num_blocks();
  unsigned me = cl.block_rank();
  cl.sync();
  long long t0 = clock64();
  // each CTA sends bytes_per_cta, split evenly to all ranks, 16 B per store
  int chunks = bytes_per_cta / 16;
  for (int r = 0; r < reps; ++r) {
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
      unsigned dst = c % n;
      uint4* remote = (uint4*)cl.map_shared_rank((void*)(smem + 65536 + (size_t)(me * (chunks / n) + c / n) % 4096 * 16), dst);
      *remote = make_uint4(c, r, me, 1);
    }
    cl.sync();
  }
  long long t1 = clock64();
  if (threadIdx.x == 0) t[blockIdx.x] = t1 - t0;
}

int main() {
  int smem = 200 * 1024;
  cudaFuncSetAttribute(dsmem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(dsmem_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  for (int cs : {2, 4, 8, 16}) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(128, 1, 1); cfg.blockDim = dim3(384, 1, 1); cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute a[1]; a[0].id = cudaLaunchAttributeClusterDimension;
    a[0].val.clusterDim.x = cs; a[0].val.clusterDim.y = 1; a[0].val.clusterDim.z = 1;
    cfg.attrs = a; cfg.numAttrs = 1;
    int n = -1; cudaError_t e = cudaOccupancyMaxActiveClusters(&n, dsmem_kernel, &cfg);
    printf("cluster %2d: max active clusters %d (%d CTAs) %s\n", cs, n, n * cs, cudaGetErrorString(e));
    long long* t; cudaMalloc(&t, 128 * sizeof(long long));
    for (int bytes : {65536}) {
      int reps = 20;
      cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
      cudaLaunchKernelEx(&cfg, dsmem_kernel, bytes, t, 1);
      cudaEventRecord(e0);
      cudaLaunchKernelEx(&cfg, dsmem_kernel, bytes, t, reps);
      cudaEventRecord(e1); cudaError_t le = cudaEventSynchronize(e1);
      float ms; cudaEventElapsedTime(&ms, e0, e1);
      long long h[128]; cudaMemcpy(h, t, sizeof(h), cudaMemcpyDeviceToHost);
      long long mx = 0; for (int i = 0; i < 128; ++i) mx = h[i] > mx ? h[i] : mx;
      printf("   %d B/CTA x %d reps: %.2f us/rep (event), max %lld clk/rep  %s\n", bytes, reps, ms * 1000 / reps, mx / reps, cudaGetErrorString(le));
    }
  }
  return 0;
}
