/* SPDX-License-Identifier: MIT */
/* test-cuda - driver loading errors, device slab sizing
 *
 * Usage: test-cuda            pure tests and the no-driver error paths
 *        test-cuda stub PATH  the toolkit's stub libcuda.so at PATH (exit 77: none)
 *        test-cuda gpu        the real driver and device 0 (exit 77: no GPU here)
 */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudadev.h"
#include "loader/loader.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024)
#define GiB (1024ull * 1024 * 1024)
#define SKIP 77

static void test_round_up(void)
{
	uint64_t v = 7;

	assert(cuda_round_up(0, 4096, &v) == 0 && v == 0);
	assert(cuda_round_up(1, 4096, &v) == 0 && v == 4096);
	assert(cuda_round_up(4096, 4096, &v) == 0 && v == 4096);
	assert(cuda_round_up(4097, 4096, &v) == 0 && v == 8192);
	assert(cuda_round_up(10, 3, &v) == 0 && v == 12);
	v = 7;
	assert(cuda_round_up(UINT64_MAX, 2 * MiB, &v) == -EOVERFLOW && v == 7);
	assert(cuda_round_up(UINT64_MAX - 1, 2, &v) == 0 && v == UINT64_MAX - 1);
	assert(cuda_round_up(5, 0, &v) == -EINVAL);
}

static void test_layout(void)
{
	struct cuda_slab_layout l;

	/* a slot of exactly one granule: no waste */
	assert(cuda_slab_layout(2 * MiB, 8, 2 * MiB, 2 * MiB, &l) == 0);
	assert(l.slot_stride == 2 * MiB && l.slab_bytes == 16 * MiB && l.waste_bytes == 0);

	/* large slots take whole granules each */
	assert(cuda_slab_layout(3 * MiB, 4, 2 * MiB, 2 * MiB, &l) == 0);
	assert(l.slot_stride == 4 * MiB && l.slab_bytes == 16 * MiB && l.waste_bytes == 4 * MiB);
	assert(cuda_slab_layout(2 * MiB + 4096, 3, 2 * MiB, 0, &l) == 0);
	assert(l.slot_stride == 4 * MiB && l.slab_bytes == 12 * MiB);

	/* small slots pack CUDA_SLOT_ALIGN apart; the total is whole granules */
	assert(cuda_slab_layout(64 * KiB, 16, 2 * MiB, 2 * MiB, &l) == 0);
	assert(l.slot_stride == 64 * KiB && l.slab_bytes == 2 * MiB && l.waste_bytes == MiB);
	assert(cuda_slab_layout(100, 3, 2 * MiB, 2 * MiB, &l) == 0);
	assert(l.slot_stride == CUDA_SLOT_ALIGN && l.slab_bytes == 2 * MiB);
	assert(l.waste_bytes == 2 * MiB - 300);
	assert(cuda_slab_layout(4096 * 33, 100, 2 * MiB, 2 * MiB, &l) == 0);
	assert(l.slot_stride == 4096 * 33 && l.slab_bytes == 14 * MiB); /* 12.9 MiB in 7 granules */

	/* the recommended granularity rounds the total only */
	assert(cuda_slab_layout(3 * MiB, 3, 2 * MiB, 32 * MiB, &l) == 0);
	assert(l.slot_stride == 4 * MiB && l.slab_bytes == 32 * MiB);
	assert(cuda_slab_layout(3 * MiB, 9, 2 * MiB, 32 * MiB, &l) == 0);
	assert(l.slab_bytes == 64 * MiB);

	/* a real H100/H200 slab: 64 slots of 8 MiB + 4 KiB */
	assert(cuda_slab_layout(8 * MiB + 4096, 64, 2 * MiB, 2 * MiB, &l) == 0);
	assert(l.slot_stride == 10 * MiB && l.slab_bytes == 640 * MiB);

	/* bad arguments, overflow */
	assert(cuda_slab_layout(0, 4, 2 * MiB, 0, &l) == -EINVAL);
	assert(cuda_slab_layout(4096, 0, 2 * MiB, 0, &l) == -EINVAL);
	assert(cuda_slab_layout(4096, 4, 0, 0, &l) == -EINVAL);
	assert(cuda_slab_layout(4096, 4, 3 * MiB, 0, &l) == -EINVAL);
	assert(cuda_slab_layout(4096, 4, 2 * MiB, 3 * MiB, &l) == -EINVAL);
	assert(cuda_slab_layout(UINT64_MAX, 1, 2 * MiB, 0, &l) == -EOVERFLOW);
	assert(cuda_slab_layout(UINT64_MAX / 2, 3, 2 * MiB, 0, &l) == -EOVERFLOW);
}

static void test_names(void)
{
	assert(!strcmp(cuda_result_name(34), "CUDA_ERROR_STUB_LIBRARY"));
	assert(!strcmp(cuda_result_name(100), "CUDA_ERROR_NO_DEVICE"));
	assert(cuda_result_name(12345) == NULL);
}

static void test_no_driver(void)
{
	struct cuda_driver *d = (struct cuda_driver *)1;
	const char *want = "CUDA driver not found: /nonexistent/loaderd-test/libcuda.so.1: ";
	struct cuda_device_info info;
	char err[512];
	int r;

	r = cuda_driver_open(&d, "/nonexistent/loaderd-test/libcuda.so.1", err, sizeof(err));
	assert(r == -ENODEV);
	assert(d == NULL);
	printf("no driver: %s\n", err);
	assert(!strncmp(err, want, strlen(want)));
	assert(strstr(err, "No such file"));
	/* the library path appears once, not twice */
	assert(strstr(err + 25, "/nonexistent/loaderd-test/libcuda.so.1") == NULL);

	/* a shared library that is not a CUDA driver */
	r = cuda_driver_open(&d, "libm.so.6", err, sizeof(err));
	printf("not a driver: %s\n", err);
	assert(r == -ENODEV && d == NULL);
	assert(strstr(err, "is not a CUDA driver: it lacks cuInit"));

	assert(cuda_attach_device(LDR_DEVICE_HOST, 0, &info, err, sizeof(err)) == 0);
	assert(cuda_attach_device(7, 0, &info, err, sizeof(err)) == -EINVAL);
	assert(strstr(err, "unknown device kind 7"));
}

/* The process-wide driver, through $LOADERD_CUDA_LIBRARY, as the daemon opens it. */
static void test_attach_env(const char *path, const char *expect)
{
	struct cuda_device_info info;
	char err[512], err2[512];

	assert(setenv(CUDA_ENV_LIBRARY, path, 1) == 0);
	assert(cuda_attach_device(LDR_DEVICE_CUDA, 0, &info, err, sizeof(err)) == -ENODEV);
	printf("attach cuda:0: %s\n", err);
	assert(strstr(err, expect));
	/* opened once: the answer is remembered, whatever the environment says now */
	assert(setenv(CUDA_ENV_LIBRARY, "/nonexistent/other.so", 1) == 0);
	assert(cuda_attach_check(3, &info, err2, sizeof(err2)) == -ENODEV);
	assert(!strcmp(err, err2));
}

static int test_stub(const char *path)
{
	struct cuda_driver *d = NULL;
	char err[512], want[600];
	int r;

	if (access(path, R_OK) != 0) {
		printf("SKIP: no CUDA stub library at %s\n", path);
		return SKIP;
	}
	r = cuda_driver_open(&d, path, err, sizeof(err));
	printf("stub: %s\n", err);
	assert(r == -ENODEV && d == NULL);
	snprintf(want, sizeof(want), "the CUDA driver at %s is the toolkit's stub library, not a real driver", path);
	assert(!strncmp(err, want, strlen(want)));
	test_attach_env(path, "is the toolkit's stub library, not a real driver");
	return 0;
}

static int test_gpu(void)
{
	struct cuda_driver *d = NULL;
	struct cuda_device_info info;
	struct cuda_slab_layout l;
	char err[512];
	int r;

	r = cuda_driver_open(&d, NULL, err, sizeof(err));
	if (r == -ENOTSUP || r == -ENODEV) {
		printf("SKIP: needs a GPU and its driver: %s\n", err);
		return SKIP;
	}
	if (r < 0) {
		fprintf(stderr, "cuda_driver_open: %s\n", err);
		return 1;
	}
	r = cuda_driver_device(d, 0, &info, err, sizeof(err));
	if (r == -ENODEV) {
		printf("SKIP: %s\n", err);
		cuda_driver_free(d);
		return SKIP;
	}
	assert(r == 0);
	printf("driver %s %d, cuda:0 of %d: %s, cc %d.%d, %.1f GiB, vmm %d, posix fd %d, granularity %llu/%llu\n",
	       cuda_driver_path(d), info.driver_version, info.count, info.name, info.cc_major, info.cc_minor,
	       (double)info.total_mem / (double)GiB, info.vmm, info.vmm_posix_fd,
	       (unsigned long long)info.gran_min, (unsigned long long)info.gran_rec);
	assert(info.count >= 1 && info.driver_version > 0);
	r = cuda_driver_device(d, info.count, &info, err, sizeof(err));
	printf("out of range: %s\n", err);
	assert(r == -ENXIO && strstr(err, "requested,") && strstr(err, "present"));
	assert(cuda_driver_device(d, -1, &info, err, sizeof(err)) == -EINVAL);
	r = cuda_driver_device(d, 0, &info, err, sizeof(err));
	if (info.vmm) {
		assert(info.gran_min > 0 && (info.gran_min & (info.gran_min - 1)) == 0);
		assert(cuda_slab_layout(8 * MiB + 4096, 64, info.gran_min, info.gran_rec, &l) == 0);
		assert(l.slab_bytes % (info.gran_rec ? info.gran_rec : info.gran_min) == 0);
	}
	cuda_driver_free(d);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "stub"))
		return test_stub(argv[2]);
	if (argc == 2 && !strcmp(argv[1], "gpu"))
		return test_gpu();
	if (argc != 1) {
		fprintf(stderr, "usage: test-cuda [stub PATH | gpu]\n");
		return 2;
	}
	test_round_up();
	test_layout();
	test_names();
	test_no_driver();
	test_attach_env("/nonexistent/loaderd-test/libcuda.so.1", "CUDA driver not found: ");
	printf("ok\n");
	return 0;
}
