// SPDX-License-Identifier: MIT
// h2d-bw - the reference figure of docs/gpu.md: host-to-device copy bandwidth
// from pinned (cudaMallocHost) and from pageable memory, one stream, as a
// plain DataLoader(pin_memory=True) + .to("cuda", non_blocking=True) gets it.
//
// Usage: h2d-bw [MiB per copy (default 64)] [copies (default 32)]
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
	fprintf(stderr, "h2d-bw: %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static double run(void *host, void *dev, size_t bytes, int copies, cudaStream_t s)
{
	cudaEvent_t a, b;
	float ms = 0;

	CK(cudaEventCreate(&a));
	CK(cudaEventCreate(&b));
	CK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s)); /* warm-up */
	CK(cudaStreamSynchronize(s));
	CK(cudaEventRecord(a, s));
	for (int i = 0; i < copies; i++)
		CK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s));
	CK(cudaEventRecord(b, s));
	CK(cudaEventSynchronize(b));
	CK(cudaEventElapsedTime(&ms, a, b));
	cudaEventDestroy(a);
	cudaEventDestroy(b);
	return (double)bytes * copies / (ms / 1e3) / 1e9;
}

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
	int copies = argc > 2 ? atoi(argv[2]) : 32;
	size_t bytes = mib << 20;
	cudaDeviceProp prop;
	cudaStream_t s;
	void *pinned, *pageable, *dev;

	CK(cudaGetDeviceProperties(&prop, 0));
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaMalloc(&dev, bytes));
	CK(cudaMallocHost(&pinned, bytes));
	pageable = malloc(bytes);
	if (!pageable)
		return 1;
	memset(pinned, 1, bytes);
	memset(pageable, 1, bytes);
	printf("h2d-bw: %s, %zu MiB x %d copies\n", prop.name, mib, copies);
	printf("h2d-bw: pinned   %.2f GB/s\n", run(pinned, dev, bytes, copies, s));
	printf("h2d-bw: pageable %.2f GB/s\n", run(pageable, dev, bytes, copies, s));
	/* the size of one typical batch: what a per-batch copy costs */
	printf("h2d-bw: pinned 4 MiB copies %.2f GB/s\n", run(pinned, dev, 4 << 20, 256, s));
	free(pageable);
	cudaFreeHost(pinned);
	cudaFree(dev);
	return 0;
}
