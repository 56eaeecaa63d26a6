// The synchronisation of b12x's producer-form sparse MLA kernels, reduced to what compute-sanitizer
// sees: 384 threads; warps 8-11 produce (fill a shared stage, bar.arrive FULL; bar.sync EMPTY
// before refilling it), warps 0-7 consume (bar.sync FULL, read, bar.arrive EMPTY), then the
// consumers alone stage a result in shared memory between two bar.sync 1, 256 and store it.
//   mode 0: the producer warps exit when their last stage is handed over (as the kernels do)
//   mode 1: the producer warps wait for the consumers at a last bar.sync 0 (nothing else differs)
//   mode 2: as 0, but the two consumer warpgroups run the epilogue from code of their own and meet
//           at the unaligned barrier.sync 1, 256 from different instructions (as the role forms do)
//   mode 3: as 2 with the aligned bar.sync 1, 256 (the kernels before named_sync)
//   mode 4: as 2, plus a per-tile hand-over from consumer warpgroup 0 to 1 on barrier 7 (arrive
//           by 0, sync by 1: the role forms' row maxima), as the s_one_warpgroup kernels do
// Run under `compute-sanitizer --tool racecheck` and `--tool synccheck`; the result is checked
// against the host's sum either way (docs/notes/sanitizers.md).
#include <cstdio>
#include <cstdlib>
#include <vector>

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }

constexpr int STAGES = 2, N = 1024, CONSUMERS = 256, THREADS = 384;

__global__ void pattern(float* out, int tiles, int mode) {
  __shared__ float buf[STAGES][N];
  int t = threadIdx.x;
  if (t >= CONSUMERS) {
    for (int i = 0; i < tiles; ++i) {
      int s = i % STAGES;
      if (i >= STAGES) bar_sync(4 + s, THREADS);            // EMPTY: the consumers read stage s
      for (int j = t - CONSUMERS; j < N; j += THREADS - CONSUMERS) buf[s][j] = float(i + j % 7);
      bar_arrive(2 + s, THREADS);                           // FULL
    }
    if (mode == 1) bar_sync(0, THREADS);
    return;
  }
  float acc = 0.f;
  for (int i = 0; i < tiles; ++i) {
    int s = i % STAGES;
    bar_sync(2 + s, THREADS);
    for (int j = t; j < N; j += CONSUMERS) acc += buf[s][j];
    if (mode == 4) {
      if (t < 128) bar_arrive(7, CONSUMERS);
      else bar_sync(7, CONSUMERS);
    }
    if (i + STAGES < tiles) bar_arrive(4 + s, THREADS);
  }
  if (mode >= 2) {                                          // one epilogue copy per warpgroup
    if (t < 128) {
      if (mode == 2 || mode == 4) asm volatile("barrier.sync 1, 256;" ::: "memory");
      else asm volatile("bar.sync 1, 256;" ::: "memory");
      buf[0][t] = acc;
      if (mode == 2 || mode == 4) asm volatile("barrier.sync 1, 256;" ::: "memory");
      else asm volatile("bar.sync 1, 256;" ::: "memory");
      out[blockIdx.x * CONSUMERS + t] = buf[0][(t + 37) % CONSUMERS];   // t >= 91 reads warpgroup 1's
    } else {
      if (mode == 2 || mode == 4) asm volatile("barrier.sync %0, %1;" ::"r"(1), "r"(CONSUMERS) : "memory");
      else asm volatile("bar.sync %0, %1;" ::"r"(1), "r"(CONSUMERS) : "memory");
      buf[0][t] = acc;
      if (mode == 2 || mode == 4) asm volatile("barrier.sync %0, %1;" ::"r"(1), "r"(CONSUMERS) : "memory");
      else asm volatile("bar.sync %0, %1;" ::"r"(1), "r"(CONSUMERS) : "memory");
      out[blockIdx.x * CONSUMERS + t] = buf[0][(t + 37) % CONSUMERS];
    }
    return;
  }
  bar_sync(1, CONSUMERS);                                   // every consumer is done with the stages
  buf[0][t] = acc;                                          // the staged epilogue
  bar_sync(1, CONSUMERS);
  out[blockIdx.x * CONSUMERS + t] = buf[0][(t + 37) % CONSUMERS];
  if (mode == 1) bar_sync(0, THREADS);
}

int main(int argc, char** argv) {
  int mode = argc > 1 ? atoi(argv[1]) : 0, tiles = 5, blocks = 4;
  float* d;
  cudaMalloc(&d, blocks * CONSUMERS * sizeof(float));
  pattern<<<blocks, THREADS>>>(d, tiles, mode);
  cudaError_t e = cudaDeviceSynchronize();
  std::vector<float> h(blocks * CONSUMERS);
  cudaMemcpy(h.data(), d, h.size() * sizeof(float), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < CONSUMERS; ++t) {
      int src = (t + 37) % CONSUMERS;
      float want = 0.f;
      for (int i = 0; i < tiles; ++i)
        for (int j = src; j < N; j += CONSUMERS) want += float(i + j % 7);
      bad += h[b * CONSUMERS + t] != want;
    }
  printf("mode %d: %s, %d wrong values\n", mode, cudaGetErrorString(e), bad);
  return bad != 0 || e != cudaSuccess;
}
