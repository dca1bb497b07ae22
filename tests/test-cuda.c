/* SPDX-License-Identifier: MIT */
/* test-cuda - driver loading errors, device slab sizing, device slot bookkeeping
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

#include "cuda.h"
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

static void expect_slot(struct cuda_slots *s, uint32_t slot, enum cuda_slot_state st, uint32_t pins,
                        uint32_t holds, uint32_t waits)
{
	struct cuda_slot_info i;

	assert(cuda_slots_get(s, slot, &i) == 0);
	assert(i.state == st);
	assert(i.pins == pins && i.holds == holds && i.waits == waits);
}

static void test_slots_basic(void)
{
	struct cuda_slots *s;
	int a, b;

	assert(cuda_slots_new(&s, 0, 8) == -EINVAL);
	assert(cuda_slots_new(&s, 2, 0) == -EINVAL);
	assert(cuda_slots_new(&s, 2, 8) == 0);
	assert(cuda_slots_available(s) == 2);

	a = cuda_slots_acquire(s, 100);
	assert(a >= 0);
	assert(cuda_slots_acquire(s, 100) == -EEXIST);
	assert(cuda_slots_find(s, 100) == a);
	expect_slot(s, (uint32_t)a, CUDA_SLOT_FILLING, 1, 0, 0);
	/* nobody holds a slot whose copy is in flight */
	assert(cuda_slots_hold(s, (uint32_t)a, 1, 1) == -EINVAL);
	assert(cuda_slots_publish(s, (uint32_t)a) == 0);
	assert(cuda_slots_publish(s, (uint32_t)a) == -EINVAL);

	/* two clients on this device share one copy */
	assert(cuda_slots_hold(s, (uint32_t)a, 1, 10) == 0);
	assert(cuda_slots_hold(s, (uint32_t)a, 2, 20) == 0);
	assert(cuda_slots_hold(s, (uint32_t)a, 2, 20) == -EEXIST);
	expect_slot(s, (uint32_t)a, CUDA_SLOT_READY, 1, 2, 0);
	assert(cuda_slots_unpin(s, (uint32_t)a) == 0);       /* still held */
	assert(cuda_slots_unpin(s, (uint32_t)a) == -EINVAL);

	b = cuda_slots_acquire(s, 200);
	assert(b >= 0 && b != a);
	assert(cuda_slots_acquire(s, 300) == -EBUSY);      /* a held, b filling */
	assert(cuda_slots_available(s) == 0);

	assert(cuda_slots_release(s, 1, 10, 0) == 0);
	assert(cuda_slots_release(s, 1, 10, 0) == -ENOENT);  /* twice */
	assert(cuda_slots_release(s, 3, 20, 0) == -ENOENT);  /* someone else's lease id */
	assert(cuda_slots_release(s, 2, 20, 0) == 1);        /* last holder: idle */
	expect_slot(s, (uint32_t)a, CUDA_SLOT_READY, 0, 0, 0);
	assert(cuda_slots_available(s) == 1);
	/* still cached: a late client finds it */
	assert(cuda_slots_find(s, 100) == a);

	/* a failed copy gives the slot back */
	assert(cuda_slots_abort(s, (uint32_t)b) == 0);
	assert(cuda_slots_abort(s, (uint32_t)b) == -EINVAL);
	assert(cuda_slots_find(s, 200) == -ENOENT);
	expect_slot(s, (uint32_t)b, CUDA_SLOT_FREE, 0, 0, 0);

	/* a FREE slot goes before an idle cached one */
	assert(cuda_slots_acquire(s, 300) == b);
	assert(cuda_slots_find(s, 100) == a);
	/* now the idle one is evicted */
	assert(cuda_slots_acquire(s, 400) == a);
	assert(cuda_slots_find(s, 100) == -ENOENT);
	assert(cuda_slots_get(s, 2, &(struct cuda_slot_info){ 0 }) == -EINVAL);
	assert(cuda_slots_pin(s, 5) == -EINVAL);
	cuda_slots_free(s);
	assert(cuda_slots_free(NULL) == NULL);
}

static void test_slots_events(void)
{
	struct cuda_slots *s;
	struct cuda_slot_wait w;
	uint32_t cur = 0;
	int a;

	assert(cuda_slots_new(&s, 1, 4) == 0);
	a = cuda_slots_acquire(s, 7);
	assert(a == 0);
	assert(cuda_slots_publish(s, 0) == 0);
	assert(cuda_slots_hold(s, 0, 1, 11) == 0);
	assert(cuda_slots_hold(s, 0, 2, 21) == 0);
	assert(cuda_slots_unpin(s, 0) == 0);

	/* released with events: not reusable until both completed */
	assert(cuda_slots_release(s, 1, 11, 0xe1) == 0);
	assert(cuda_slots_release(s, 2, 21, 0xe2) == 0);
	expect_slot(s, 0, CUDA_SLOT_READY, 0, 0, 2);
	assert(cuda_slots_acquire(s, 8) == -EBUSY);
	assert(cuda_slots_release(s, 1, 11, 0) == -ENOENT);  /* already released */

	assert(cuda_slots_next_wait(s, &cur, &w) == 1);
	assert(w.slot == 0 && w.client == 1 && w.lease == 11 && w.event == 0xe1);
	assert(cuda_slots_next_wait(s, &cur, &w) == 1);
	assert(w.client == 2 && w.lease == 21 && w.event == 0xe2);
	assert(cuda_slots_next_wait(s, &cur, &w) == 0);
	assert(cuda_slots_next_wait(s, &cur, &w) == 0);

	assert(cuda_slots_event_done(s, 1, 11) == 0);
	assert(cuda_slots_event_done(s, 1, 11) == -ENOENT);
	assert(cuda_slots_event_done(s, 2, 21) == 1);
	cur = 0;
	assert(cuda_slots_next_wait(s, &cur, &w) == 0);
	assert(cuda_slots_acquire(s, 8) == 0);
	cuda_slots_free(s);
}

static void test_slots_client_dies(void)
{
	struct cuda_slots *s;
	struct cuda_slot_wait w;
	uint32_t cur = 0;

	assert(cuda_slots_new(&s, 3, 5) == 0);
	for (uint64_t k = 0; k < 3; k++) {
		assert(cuda_slots_acquire(s, k) == (int)k);
		assert(cuda_slots_publish(s, (uint32_t)k) == 0);
		assert(cuda_slots_hold(s, (uint32_t)k, 9, 100 + k) == 0);
		assert(cuda_slots_unpin(s, (uint32_t)k) == 0);
	}
	assert(cuda_slots_hold(s, 0, 4, 1) == 0);
	assert(cuda_slots_hold(s, 1, 4, 2) == 0);
	assert(cuda_slots_hold(s, 2, 4, 3) == -ENOSPC);    /* lease records are bounded */
	assert(cuda_slots_release(s, 9, 101, 0xabc) == 0);  /* client 9 waits on slot 1 */
	assert(cuda_slots_available(s) == 0);

	/* client 9 dies: its holds and its pending event vanish at once */
	assert(cuda_slots_drop_client(s, 9) == 3);
	assert(cuda_slots_drop_client(s, 9) == 0);
	assert(cuda_slots_next_wait(s, &cur, &w) == 0);
	expect_slot(s, 0, CUDA_SLOT_READY, 0, 1, 0);
	expect_slot(s, 1, CUDA_SLOT_READY, 0, 1, 0);
	expect_slot(s, 2, CUDA_SLOT_READY, 0, 0, 0);
	assert(cuda_slots_available(s) == 1);
	assert(cuda_slots_acquire(s, 50) == 2);
	/* freed records are reusable */
	assert(cuda_slots_release(s, 4, 1, 0) == 1);
	assert(cuda_slots_hold(s, 0, 5, 1) == 0);
	cuda_slots_free(s);
}

/* Least recently idle goes first, so the newest batches stay cached. */
static void test_slots_lru(void)
{
	struct cuda_slots *s;

	assert(cuda_slots_new(&s, 3, 8) == 0);
	for (uint64_t k = 0; k < 3; k++) {
		assert(cuda_slots_acquire(s, k) == (int)k);
		assert(cuda_slots_publish(s, (uint32_t)k) == 0);
		assert(cuda_slots_hold(s, (uint32_t)k, 1, k) == 0);
		assert(cuda_slots_unpin(s, (uint32_t)k) == 0);
	}
	assert(cuda_slots_release(s, 1, 2, 0) == 1);
	assert(cuda_slots_release(s, 1, 0, 0) == 1);
	assert(cuda_slots_release(s, 1, 1, 0) == 1);
	assert(cuda_slots_acquire(s, 10) == 2);
	assert(cuda_slots_acquire(s, 11) == 0);
	assert(cuda_slots_acquire(s, 12) == 1);
	cuda_slots_free(s);
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

	assert(cuda_attach_device(LDR_DEVICE_HOST, 0, err, sizeof(err)) == 0);
	assert(cuda_attach_device(7, 0, err, sizeof(err)) == -EINVAL);
	assert(strstr(err, "unknown device kind 7"));
}

/* The process-wide driver, through $LOADERD_CUDA_LIBRARY, as the daemon opens it. */
static void test_attach_env(const char *path, const char *expect)
{
	struct cuda_device_info info;
	char err[512], err2[512];

	assert(setenv(CUDA_ENV_LIBRARY, path, 1) == 0);
	assert(cuda_attach_device(LDR_DEVICE_CUDA, 0, err, sizeof(err)) == -ENODEV);
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
	test_slots_basic();
	test_slots_events();
	test_slots_client_dies();
	test_slots_lru();
	test_names();
	test_no_driver();
	test_attach_env("/nonexistent/loaderd-test/libcuda.so.1", "CUDA driver not found: ");
	printf("ok\n");
	return 0;
}
