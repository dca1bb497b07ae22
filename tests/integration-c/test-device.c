/* SPDX-License-Identifier: MIT */
/* test-device - CUDA delivery end to end: the real daemon, the real libloader, a driver
 *
 * Usage: test-device LOADERD             every check (it runs itself again,
 *                                        one process per daemon environment)
 *        test-device LOADERD ROLE ARGS   one of those processes
 *
 * The driver is the one both sides load: $LOADERD_CUDA_LIBRARY (meson points
 * it at tests/unit/gpu/fakecuda), else libcuda.so.1; with neither the test
 * is skipped (exit 77). Device memory is only ever read through that driver's
 * cuMemcpyDtoH in the device's primary context, never dereferenced, so the
 * same checks hold on a real GPU. What the fake alone can show (its call log,
 * a second device on a one-GPU machine) is checked only when the device's
 * name says it is the fake.
 *
 * Each daemon environment runs in a process of its own, started with exec, so
 * that the driver (which reads FAKECUDA_* when it loads) and nng (which cannot
 * start again in a forked child) both begin clean there:
 *   main   one device, VMM: broadcast to two CUDA clients and a host client
 *          with status after it; a CUDA client killed while holding leases; a
 *          device that is not there; the client's and the daemon's driver calls
 *   ipc    LOADERD_CUDA_IPC=1 (and, on the fake, a device without POSIX-fd
 *          handles): the same bytes over legacy IPC
 *   two    FAKECUDA_DEVICES=2: partition ranks on cuda:0 and cuda:1
 */
#undef NDEBUG
#include <assert.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <jansson.h>

#include "loader/loader.h"
#include "test-daemon.h"

#define SEQ 16
#define NSAMPLES 100
#define NTOK (SEQ * NSAMPLES + 1)
#define MAX_DEV 16
#define TIMEOUT_MS 10000

static const char *loaderd, *work;
static char tok_path[256];

/* --- the driver, for reading device memory back -------------------------- */

static struct {
	void *lib;
	__typeof__(cuInit) *Init;
	__typeof__(cuDeviceGetCount) *DeviceGetCount;
	__typeof__(cuDeviceGet) *DeviceGet;
	__typeof__(cuDeviceGetName) *DeviceGetName;
	__typeof__(cuDevicePrimaryCtxRetain) *PrimaryCtxRetain;
	__typeof__(cuCtxSetCurrent) *CtxSetCurrent;
	__typeof__(cuMemcpyDtoH) *MemcpyDtoH;
	CUcontext ctx[MAX_DEV];
	int ndev;
	bool fake;
	char name[128];
	char path[512];
} cu;

static const char *lib_env(void)
{
	const char *p = getenv("LOADERD_CUDA_LIBRARY");

	return p && *p ? p : NULL;
}

static void *sym(const char *name, char *why, size_t n)
{
	void *fn = dlsym(cu.lib, name);

	if (!fn)
		snprintf(why, n, "%s lacks %s", cu.path, name);
	return fn;
}

#define SYM(field, name)                                         \
	do {                                                     \
		void *fn_ = sym(name, why, n);                   \
		if (!fn_)                                        \
			return -1;                               \
		memcpy(&cu.field, &fn_, sizeof(fn_));            \
	} while (0)

/* Load the driver as the daemon and libloader do, cuInit, find device 0's name.
 * Return: 0; -1 the library is not there or not a driver; -2 cuInit or the
 * device count failed (a driver without a device); @why says which. */
static int drv_load(char *why, size_t n)
{
	const char *path = lib_env() ? lib_env() : "libcuda.so.1";
	Dl_info dli;
	CUdevice d;
	CUresult r;

	snprintf(cu.path, sizeof(cu.path), "%s", path);
	cu.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!cu.lib) {
		snprintf(why, n, "dlopen %s: %s", path, dlerror());
		return -1;
	}
	SYM(Init, "cuInit");
	SYM(DeviceGetCount, "cuDeviceGetCount");
	SYM(DeviceGet, "cuDeviceGet");
	SYM(DeviceGetName, "cuDeviceGetName");
	SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	SYM(CtxSetCurrent, "cuCtxSetCurrent");
	SYM(MemcpyDtoH, "cuMemcpyDtoH_v2");
	if (dladdr((void *)cu.Init, &dli) && dli.dli_fname)
		snprintf(cu.path, sizeof(cu.path), "%s", dli.dli_fname);
	if ((r = cu.Init(0)) != CUDA_SUCCESS) {
		snprintf(why, n, "%s: cuInit failed with CUresult %d", cu.path, (int)r);
		return -2;
	}
	if ((r = cu.DeviceGetCount(&cu.ndev)) != CUDA_SUCCESS || cu.ndev < 1) {
		snprintf(why, n, "%s: no CUDA device (cuDeviceGetCount: CUresult %d, %d devices)", cu.path, (int)r,
		         cu.ndev);
		return -2;
	}
	if (cu.ndev > MAX_DEV)
		cu.ndev = MAX_DEV;
	assert(cu.DeviceGet(&d, 0) == CUDA_SUCCESS);
	assert(cu.DeviceGetName(cu.name, (int)sizeof(cu.name), d) == CUDA_SUCCESS);
	cu.fake = strstr(cu.name, "fake") != NULL;
	return 0;
}

static void drv_load_or_die(void)
{
	char why[768];

	if (drv_load(why, sizeof(why)) < 0) {
		fprintf(stderr, "test-device: %s\n", why);
		exit(1);
	}
}

/* Copy @n bytes at device pointer @dptr of cuda:@dev into @buf, in that device's primary context. */
static void read_dev(int dev, const void *dptr, void *buf, size_t n)
{
	CUresult r;

	assert(dev >= 0 && dev < cu.ndev);
	if (!cu.ctx[dev]) {
		CUdevice d;

		assert(cu.DeviceGet(&d, dev) == CUDA_SUCCESS);
		assert(cu.PrimaryCtxRetain(&cu.ctx[dev], d) == CUDA_SUCCESS);
	}
	assert(cu.CtxSetCurrent(cu.ctx[dev]) == CUDA_SUCCESS);
	r = cu.MemcpyDtoH(buf, (CUdeviceptr)(uintptr_t)dptr, n);
	if (r != CUDA_SUCCESS) {
		fprintf(stderr, "cuMemcpyDtoH(cuda:%d, %p, %zu): CUresult %d\n", dev, dptr, n, (int)r);
		abort();
	}
}

/* --- pipelines, batches, status ------------------------------------------ */

static void write_tokens(void)
{
	FILE *f;
	uint16_t t;

	snprintf(tok_path, sizeof(tok_path), "%s/t.bin", work);
	f = fopen(tok_path, "wb");
	assert(f);
	for (int i = 0; i < NTOK; i++) {
		t = (uint16_t)i;
		assert(fwrite(&t, sizeof(t), 1, f) == 1);
	}
	assert(fclose(f) == 0);
}

static void create(struct ldr_client *c, const char *name, int batch, int epochs, int min_clients)
{
	char spec[768];

	snprintf(spec, sizeof(spec),
	         "{\"name\": \"%s\", \"source\": {\"kind\": \"tokens\", \"path\": \"%s\", \"seq_len\": %d},"
	         " \"batch_size\": %d, \"epochs\": %d, \"prefetch\": 4, \"min_clients\": %d}",
	         name, tok_path, SEQ, batch, epochs, min_clients);
	if (ldr_create_pipeline(c, spec, 0, NULL, 0) != 1) {
		fprintf(stderr, "create %s: %s\n", name, ldr_client_error(c));
		abort();
	}
}

static struct ldr_client *connect_as(const char *name)
{
	struct ldr_client *c;

	assert(ldr_connect(&c, sock_path, name) == 0);
	return c;
}

static struct ldr_attachment *attach(struct ldr_client *c, const char *pipeline, enum ldr_mode mode,
                                     uint32_t rank, uint32_t world, enum ldr_device_kind kind, int index)
{
	struct ldr_attach_opts o = { .size = sizeof(o), .mode = mode, .rank = rank, .world_size = world,
	                             .device_kind = kind, .device_index = index };
	struct ldr_attachment *a;
	int r, got;

	r = ldr_attach(c, pipeline, &o, &a);
	if (r != 0) {
		fprintf(stderr, "attach %s on %s:%d: %s: %s\n", pipeline, kind == LDR_DEVICE_CUDA ? "cuda" : "host",
		        index, ldr_strerror(r), ldr_client_error(c));
		abort();
	}
	got = 12345;
	assert(ldr_attachment_device(a, &got) == kind);
	assert(got == (kind == LDR_DEVICE_CUDA ? index : -1));
	return a;
}

/* The next batch, which must come. */
static struct ldr_batch *next(struct ldr_client *c, struct ldr_attachment *a)
{
	struct ldr_batch *b;
	int r = ldr_next(a, TIMEOUT_MS, &b);

	if (r != 0) {
		fprintf(stderr, "ldr_next: %s: %s\n", ldr_strerror(r), ldr_client_error(c));
		abort();
	}
	return b;
}

/*
 * The host fields of @b hold exactly what the spec says: row r of batch i of
 * rank @rank of @world is sample p = rank + world * (i * @batch_size + r)
 * (mod NSAMPLES, no shuffle), whose input is tokens p*SEQ.. and target one
 * more. Each row's sample is counted in @seen (may be NULL).
 */
static void check_host(const struct ldr_batch *b, int batch_size, uint32_t rank, uint32_t world, int *seen)
{
	struct ldr_field in, tg;

	assert(ldr_batch_nfields(b) == 2);
	assert(ldr_batch_field_host(b, 0, &in) == 0 && ldr_batch_field_host(b, 1, &tg) == 0);
	assert(!strcmp(in.name, "input") && !strcmp(tg.name, "target"));
	assert(in.dtype == LDR_DTYPE_INT64 && in.ndim == 2 && in.shape[1] == SEQ);
	assert(in.shape[0] == (int64_t)ldr_batch_rows(b));
	assert(in.nbytes == ldr_batch_rows(b) * SEQ * sizeof(int64_t) && tg.nbytes == in.nbytes);
	for (uint32_t r = 0; r < ldr_batch_rows(b); r++) {
		uint64_t p = (rank + (uint64_t)world * (ldr_batch_index(b) * batch_size + r)) % NSAMPLES;

		if (seen)
			seen[p]++;
		for (int k = 0; k < SEQ; k++) {
			int64_t want = (int64_t)p * SEQ + k;

			if (((const int64_t *)in.data)[r * SEQ + k] != want ||
			    ((const int64_t *)tg.data)[r * SEQ + k] != want + 1) {
				fprintf(stderr, "batch %lu row %u token %d: %ld/%ld, expected %ld/%ld\n",
				        (unsigned long)ldr_batch_index(b), r, k,
				        (long)((const int64_t *)in.data)[r * SEQ + k],
				        (long)((const int64_t *)tg.data)[r * SEQ + k], (long)want, (long)want + 1);
				abort();
			}
		}
	}
}

/*
 * Every field of CUDA batch @b, read back from cuda:@dev through the driver,
 * equals the same field in the host slab (ldr_batch_field_host) and, when
 * @ref is given, that field of host client's batch @ref.
 */
static void check_device(const struct ldr_batch *b, int dev, const struct ldr_batch *ref)
{
	for (int i = 0; i < ldr_batch_nfields(b); i++) {
		struct ldr_field d, h, r;
		void *buf;

		assert(ldr_batch_field(b, i, &d) == 0 && ldr_batch_field_host(b, i, &h) == 0);
		assert(!strcmp(d.name, h.name) && d.dtype == h.dtype && d.ndim == h.ndim && d.nbytes == h.nbytes);
		assert(!memcmp(d.shape, h.shape, (size_t)d.ndim * sizeof(d.shape[0])));
		assert(d.data && d.data != h.data);
		buf = malloc(d.nbytes);
		assert(buf);
		memset(buf, 0xee, d.nbytes);
		read_dev(dev, d.data, buf, d.nbytes);
		if (memcmp(buf, h.data, h.nbytes)) {
			fprintf(stderr, "cuda:%d batch %lu/%lu field %s: device bytes differ from the host slab\n", dev,
			        (unsigned long)ldr_batch_epoch(b), (unsigned long)ldr_batch_index(b), d.name);
			abort();
		}
		if (ref) {
			assert(ldr_batch_field(ref, i, &r) == 0);
			assert(r.nbytes == h.nbytes && !strcmp(r.name, h.name));
			assert(!memcmp(buf, r.data, r.nbytes));
		}
		free(buf);
	}
}

static json_t *status(struct ldr_client *c)
{
	json_error_t e;
	json_t *j;
	char *s;

	assert(ldr_status_json(c, &s) == 0);
	j = json_loads(s, 0, &e);
	if (!j) {
		fprintf(stderr, "status: %s in %s\n", e.text, s);
		abort();
	}
	ldr_free(s);
	return j;
}

static json_t *jget(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	if (!v) {
		char *s = json_dumps(o, JSON_COMPACT);
		fprintf(stderr, "no \"%s\" in %s\n", key, s);
		abort();
	}
	return v;
}

static long long jint(json_t *o, const char *key)
{
	json_t *v = jget(o, key);

	assert(json_is_integer(v));
	return json_integer_value(v);
}

static const char *jstr(json_t *o, const char *key)
{
	json_t *v = jget(o, key);

	assert(json_is_string(v));
	return json_string_value(v);
}

static json_t *pipeline_of(json_t *st, const char *name)
{
	json_t *p;
	size_t i;

	json_array_foreach(jget(st, "pipelines"), i, p)
		if (!strcmp(jstr(p, "name"), name))
			return p;
	fprintf(stderr, "no pipeline %s in status\n", name);
	abort();
}

/* The "devices" entry of @pl for cuda:@dev. */
static json_t *deventry(json_t *pl, int dev)
{
	char want[24];
	json_t *d;
	size_t i;

	snprintf(want, sizeof(want), "cuda:%d", dev);
	json_array_foreach(jget(pl, "devices"), i, d)
		if (!strcmp(jstr(d, "device"), want))
			return d;
	fprintf(stderr, "no %s in the pipeline's devices\n", want);
	abort();
}

/* The "cuda"."devices" entry of the daemon for cuda:@dev. */
static json_t *engine_of(json_t *st, int dev)
{
	json_t *cuda = jget(st, "cuda");
	char key[24];

	assert(!json_object_get(cuda, "error"));
	assert(!strcmp(jstr(cuda, "driver"), cu.path));
	snprintf(key, sizeof(key), "cuda:%d", dev);
	return jget(jget(cuda, "devices"), key);
}

/* --- other processes ------------------------------------------------------ */

/* Start this test again as @role with @a1 (may be NULL), "NAME=VALUE" pairs of
 * @env on top of ours, @keep_fd (>= 0) inherited. */
static pid_t spawn(const char *role, const char *a1, const char *const *env, int keep_fd)
{
	pid_t pid = fork();

	assert(pid >= 0);
	if (pid == 0) {
		for (; env && *env; env++)
			putenv((char *)*env);
		if (keep_fd >= 0)
			fcntl(keep_fd, F_SETFD, 0);
		execl("/proc/self/exe", "test-device", loaderd, role, work, sock_path, a1, (char *)NULL);
		_exit(127);
	}
	return pid;
}

static int wait_exit(pid_t pid)
{
	int status;

	assert(waitpid(pid, &status, 0) == pid);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int run_role(const char *role, const char *const *env)
{
	return wait_exit(spawn(role, NULL, env, -1));
}

/* Lines of @path equal to @name, or starting with it when @prefix. */
static int count_calls(const char *path, const char *name, bool prefix)
{
	char line[256];
	int n = 0;
	FILE *f = fopen(path, "r");

	assert(f);
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		n += prefix ? !strncmp(line, name, strlen(name)) : !strcmp(line, name);
	}
	fclose(f);
	return n;
}

/* --- main: one device, VMM ------------------------------------------------ */

#define BC_BATCH 8
#define BC_EPOCHS 2
#define BC_BPE 13                       /* 100 samples / 8 */

/* 1 and 2: two CUDA clients and a host client get every batch of a finite
 * broadcast, the same bytes everywhere; the two share one copy per batch. */
static void test_broadcast(void)
{
	struct ldr_client *c1 = connect_as("cuda-a"), *c2 = connect_as("cuda-b"), *ch = connect_as("host");
	struct ldr_attachment *a1, *a2, *ah;
	struct ldr_batch *b1, *b2, *bh;
	json_t *st, *pl, *d, *e;
	int n = 0;

	create(ch, "bc", BC_BATCH, BC_EPOCHS, 3);
	a1 = attach(c1, "bc", LDR_MODE_BROADCAST, 0, 0, LDR_DEVICE_CUDA, 0);
	a2 = attach(c2, "bc", LDR_MODE_BROADCAST, 0, 0, LDR_DEVICE_CUDA, 0);
	ah = attach(ch, "bc", LDR_MODE_BROADCAST, 0, 0, LDR_DEVICE_HOST, 0);
	assert(ldr_attachment_batches_per_epoch(a1) == BC_BPE && ldr_attachment_batches_per_epoch(a2) == BC_BPE);

	for (;;) {
		int r1 = ldr_next(a1, TIMEOUT_MS, &b1), r2 = ldr_next(a2, TIMEOUT_MS, &b2),
		    rh = ldr_next(ah, TIMEOUT_MS, &bh);

		if (r1 == LDR_EOF && r2 == LDR_EOF && rh == LDR_EOF)
			break;
		if (r1 || r2 || rh) {
			fprintf(stderr, "batch %d: %s / %s / %s (%s)\n", n, ldr_strerror(r1), ldr_strerror(r2),
			        ldr_strerror(rh), ldr_client_error(c1));
			abort();
		}
		assert(ldr_batch_epoch(bh) == (uint64_t)(n / BC_BPE) && ldr_batch_index(bh) == (uint64_t)(n % BC_BPE));
		assert(ldr_batch_epoch(b1) == ldr_batch_epoch(bh) && ldr_batch_index(b1) == ldr_batch_index(bh));
		assert(ldr_batch_epoch(b2) == ldr_batch_epoch(bh) && ldr_batch_index(b2) == ldr_batch_index(bh));
		assert(ldr_batch_rows(b1) == ldr_batch_rows(bh) && ldr_batch_rows(b2) == ldr_batch_rows(bh));
		check_host(bh, BC_BATCH, 0, 1, NULL);
		check_host(b1, BC_BATCH, 0, 1, NULL);
		check_host(b2, BC_BATCH, 0, 1, NULL);
		check_device(b1, 0, bh);
		check_device(b2, 0, bh);
		ldr_release_after(b1, NULL);
		ldr_release(b2);
		ldr_release(bh);
		n++;
	}
	assert(n == BC_EPOCHS * BC_BPE);

	/* 2: still attached (a VMM slab goes with its last client) */
	st = status(ch);
	pl = pipeline_of(st, "bc");
	assert(json_array_size(jget(pl, "devices")) == 1);
	d = deventry(pl, 0);
	assert(!strcmp(jstr(d, "memory"), "vmm"));
	assert(!strcmp(jstr(d, "name"), cu.name));
	assert(jint(d, "copies") == n);         /* one copy per batch for both clients */
	assert(jint(d, "clients") == 2 && jint(d, "copying") == 0);
	assert(json_is_null(jget(d, "error")));
	assert(jint(d, "slab_bytes") >= jint(pl, "slots_total") * jint(pl, "slot_bytes"));
	assert(jint(pl, "clients") == 3);
	e = engine_of(st, 0);
	assert(!strcmp(jstr(e, "name"), cu.name));
	assert(jint(e, "host_registered") == 1);
	assert(jint(e, "copies") == n);
	/* every row of every field of every batch, short last ones included */
	assert(jint(e, "bytes") == (long long)BC_EPOCHS * NSAMPLES * 2 * SEQ * sizeof(int64_t));
	assert(jint(e, "queued") == 0);
	json_decref(st);

	assert(ldr_detach(a1) == 0 && ldr_detach(a2) == 0 && ldr_detach(ah) == 0);
	ldr_close(c1);
	ldr_close(c2);
	ldr_close(ch);
	printf("test-device: broadcast to 2 CUDA + 1 host clients: %d batches, %d copies: ok\n", n, n);
}

/* 5: a CUDA client that dies holding leases loses them; the other goes on. */
#define KILL_BATCH 4
#define KILL_BPE 25

static int role_hog(const char *fd_s)
{
	struct ldr_client *c = connect_as("hog");
	struct ldr_attachment *a = attach(c, "kill", LDR_MODE_BROADCAST, 0, 0, LDR_DEVICE_CUDA, 0);
	struct ldr_batch *b[2];
	int fd = atoi(fd_s);

	for (int i = 0; i < 2; i++) {
		b[i] = next(c, a);
		assert(ldr_batch_index(b[i]) == (uint64_t)i);
		check_device(b[i], 0, NULL);
	}
	assert(write(fd, "R", 1) == 1);
	close(fd);
	for (;;)
		pause();
}

static void test_killed_client(void)
{
	struct ldr_client *c = connect_as("survivor");
	struct ldr_attachment *a;
	struct ldr_batch *b;
	json_t *st, *pl;
	char fd_s[16], ready;
	int pfd[2], n = 0, r, clients = 0;
	pid_t hog;

	create(c, "kill", KILL_BATCH, 1, 2);
	a = attach(c, "kill", LDR_MODE_BROADCAST, 0, 0, LDR_DEVICE_CUDA, 0);
	assert(pipe(pfd) == 0);
	snprintf(fd_s, sizeof(fd_s), "%d", pfd[1]);
	hog = spawn("hog", fd_s, NULL, pfd[1]);
	close(pfd[1]);
	assert(read(pfd[0], &ready, 1) == 1 && ready == 'R');
	close(pfd[0]);

	/* the hog holds batches 0 and 1; we take them too */
	for (; n < 2; n++) {
		b = next(c, a);
		assert(ldr_batch_index(b) == (uint64_t)n);
		check_host(b, KILL_BATCH, 0, 1, NULL);
		check_device(b, 0, NULL);
		ldr_release(b);
	}
	st = status(c);
	pl = pipeline_of(st, "kill");
	assert(jint(pl, "clients") == 2 && jint(deventry(pl, 0), "clients") == 2);
	assert(jint(pl, "slots_leased") >= 2);
	/* the stream cannot finish while any of its slots stays leased */
	assert(jint(pl, "slots_total") < KILL_BPE);
	json_decref(st);

	assert(kill(hog, SIGKILL) == 0);
	assert(wait_exit(hog) == 128 + SIGKILL);
	for (int i = 0; i < 250 && clients != 1; i++) {
		st = status(c);
		clients = (int)jint(pipeline_of(st, "kill"), "clients");
		json_decref(st);
		if (clients != 1)
			usleep(20000);
	}
	assert(clients == 1);

	while ((r = ldr_next(a, TIMEOUT_MS, &b)) == 0) {
		assert(ldr_batch_epoch(b) == 0 && ldr_batch_index(b) == (uint64_t)n);
		check_host(b, KILL_BATCH, 0, 1, NULL);
		check_device(b, 0, NULL);
		if (n % 2)
			ldr_release_after(b, NULL);
		else
			ldr_release(b);
		n++;
	}
	if (r != LDR_EOF)
		fprintf(stderr, "survivor after batch %d: %s: %s\n", n, ldr_strerror(r), ldr_client_error(c));
	assert(r == LDR_EOF && n == KILL_BPE);

	/* everything released: nothing leased, every batch copied once to the shared slab */
	for (int i = 0; i < 250; i++) {
		st = status(c);
		pl = pipeline_of(st, "kill");
		if (jint(pl, "slots_leased") == 0)
			break;
		json_decref(st);
		st = NULL;
		usleep(20000);
	}
	assert(st);
	assert(jint(pl, "slots_leased") == 0 && jint(pl, "clients") == 1);
	assert(jint(deventry(pl, 0), "clients") == 1 && jint(deventry(pl, 0), "copies") == KILL_BPE);
	json_decref(st);
	assert(ldr_detach(a) == 0);
	ldr_close(c);
	printf("test-device: CUDA client killed holding leases; the survivor got all %d batches: ok\n", n);
}

/* 6: a device that is not there; the daemon keeps serving. */
static void test_no_such_device(void)
{
	struct ldr_client *c = connect_as("errors");
	struct ldr_attach_opts o = { .size = sizeof(o), .device_kind = LDR_DEVICE_CUDA };
	struct ldr_attachment *a;
	struct ldr_batch *b;
	char want[96];
	json_t *st, *pl;

	create(c, "err", 8, 0, 1);
	o.device_index = cu.ndev > 7 ? cu.ndev : 7;
	snprintf(want, sizeof(want), "cuda:%d requested, %d device%s present", o.device_index, cu.ndev,
	         cu.ndev == 1 ? "" : "s");
	assert(ldr_attach(c, "err", &o, &a) == -ENXIO);
	if (!strstr(ldr_client_error(c), want)) {
		fprintf(stderr, "error '%s' does not say '%s'\n", ldr_client_error(c), want);
		abort();
	}

	a = attach(c, "err", LDR_MODE_BROADCAST, 0, 0, LDR_DEVICE_HOST, 0);
	for (int i = 0; i < 3; i++) {
		b = next(c, a);
		assert(ldr_batch_index(b) == (uint64_t)i);
		check_host(b, 8, 0, 1, NULL);
		ldr_release(b);
	}
	st = status(c);
	pl = pipeline_of(st, "err");
	assert(json_array_size(jget(pl, "devices")) == 0 && jint(pl, "clients") == 1);
	json_decref(st);
	assert(ldr_detach(a) == 0);
	assert(ldr_drop_pipeline(c, "err", 0) == 0);
	ldr_close(c);
	printf("test-device: %s refused, host delivery goes on: ok\n", want);
}

/* 7 (fake only): a client that maps two attachments, and what it asked the driver for. */
#define LOG_BPE 13

static int line_of(const char *path, int from, const char *name);

static int role_logclient(void)
{
	struct ldr_client *c = connect_as("logged");
	struct ldr_attachment *a[2];
	struct ldr_batch *b;
	int n[2] = { 0, 0 }, r;

	/* no driver call of our own here: the log is libloader's alone */
	a[0] = attach(c, "log1", LDR_MODE_BROADCAST, 0, 0, LDR_DEVICE_CUDA, 0);
	a[1] = attach(c, "log2", LDR_MODE_BROADCAST, 0, 0, LDR_DEVICE_CUDA, 0);
	for (int i = 0; i < 2; i++) {
		while ((r = ldr_next(a[i], TIMEOUT_MS, &b)) == 0) {
			struct ldr_field f;

			assert(ldr_batch_index(b) == (uint64_t)n[i]);
			check_host(b, 8, 0, 1, NULL);
			assert(ldr_batch_field(b, 0, &f) == 0 && f.data);
			if (i == 0)
				ldr_release_after(b, NULL);
			else
				ldr_release(b);
			n[i]++;
		}
		assert(r == LDR_EOF && n[i] == LOG_BPE);
	}
	assert(ldr_detach(a[0]) == 0 && ldr_detach(a[1]) == 0);

	/* a batch kept past its detach and released after a stream: the event is
	 * recorded and waited for before the slab goes (this is its last user) */
	{
		const char *log = getenv("FAKECUDA_LOG");
		struct ldr_attachment *a3 = attach(c, "log3", LDR_MODE_BROADCAST, 0, 0, LDR_DEVICE_CUDA, 0);
		int before, rec, sync, unmap;

		assert((r = ldr_next(a3, TIMEOUT_MS, &b)) == 0);
		assert(ldr_detach(a3) == 0);
		before = count_calls(log, "", true);
		ldr_release_after(b, NULL);
		rec = line_of(log, before, "cuEventRecord");
		sync = line_of(log, before, "cuEventSynchronize");
		unmap = line_of(log, before, "cuMemUnmap");
		if (!(rec >= 0 && sync > rec && unmap > sync)) {
			fprintf(stderr, "release after detach: cuEventRecord at %d, cuEventSynchronize at %d, "
			        "cuMemUnmap at %d (lines after %d): the slab went before the event\n", rec, sync,
			        unmap, before);
			abort();
		}
	}
	ldr_close(c);
	return 0;
}

/* The first line at or after line @from (0-based) of @path that is @name, or -1. */
static int line_of(const char *path, int from, const char *name)
{
	FILE *f = fopen(path, "r");
	char line[256];
	int n = 0, found = -1;

	assert(f);
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		if (n >= from && !strcmp(line, name)) {
			found = n;
			break;
		}
		n++;
	}
	fclose(f);
	return found;
}

static void test_driver_calls(struct ldr_client *c, const char *daemon_log)
{
	char client_log[300], env_log[320];
	const char *env[] = { env_log, NULL };
	int imports, maps, unmaps, copies, allocs, registers;

	snprintf(client_log, sizeof(client_log), "%s/client.log", work);
	snprintf(env_log, sizeof(env_log), "FAKECUDA_LOG=%s", client_log);
	unlink(client_log);
	create(c, "log1", 8, 1, 1);
	create(c, "log2", 8, 1, 1);
	create(c, "log3", 128, 1, 1); /* one batch */
	assert(run_role("logclient", env) == 0);

	imports = count_calls(client_log, "cuMemImportFromShareableHandle", false);
	maps = count_calls(client_log, "cuMemMap", false);
	unmaps = count_calls(client_log, "cuMemUnmap", false);
	copies = count_calls(client_log, "cuMemcpy", true);
	allocs = count_calls(client_log, "cuMemAlloc", true);
	registers = count_calls(client_log, "cuMemHostRegister", false);
	if (imports != 3 || maps != 3 || unmaps != 3 || copies || allocs || registers) {
		fprintf(stderr, "client driver calls: %d imports, %d maps, %d unmaps, %d cuMemcpy*, %d cuMemAlloc*, "
		        "%d cuMemHostRegister (expected 3, 3, 3, 0, 0, 0)\n", imports, maps, unmaps, copies, allocs,
		        registers);
		abort();
	}
	assert(count_calls(client_log, "cuInit", false) == 1);
	unlink(client_log);

	/* the daemon: bc, kill, log1, log2, log3 fed a GPU; each pinned its host
	 * slab once and had one device slab, whatever its number of CUDA clients */
	registers = count_calls(daemon_log, "cuMemHostRegister", false);
	int creates = count_calls(daemon_log, "cuMemCreate", false);
	if (registers != 5 || creates != 5) {
		fprintf(stderr, "daemon driver calls: %d cuMemHostRegister, %d cuMemCreate (expected 5, 5)\n",
		        registers, creates);
		abort();
	}
	assert(count_calls(daemon_log, "cuInit", false) == 1);
	assert(count_calls(daemon_log, "cuMemcpyHtoDAsync", false) == BC_EPOCHS * BC_BPE * 2 + KILL_BPE * 2 +
	       2 * LOG_BPE * 2 + 1 * 2);
	printf("test-device: driver calls: the client imported once per attach, copied nothing: ok\n");
}

static int role_main(void)
{
	char daemon_log[300];
	struct ldr_client *c;

	drv_load_or_die();
	/* the daemon's own call log; this process loaded the driver without one */
	snprintf(daemon_log, sizeof(daemon_log), "%s/daemon.log", work);
	if (cu.fake)
		setenv("FAKECUDA_LOG", daemon_log, 1);
	start_daemon(loaderd, "device");
	unsetenv("FAKECUDA_LOG");

	test_broadcast();
	test_killed_client();
	test_no_such_device();
	c = connect_as("main");
	if (cu.fake)
		test_driver_calls(c, daemon_log);
	else
		printf("test-device: %s is not the fake: driver call counts not checked\n", cu.name);
	ldr_close(c);
	stop_daemon();
	unlink(daemon_log);
	return 0;
}

/* --- ipc: legacy IPC handles ---------------------------------------------- */

static int role_ipc(void)
{
	struct ldr_client *c = NULL, *ch;
	struct ldr_attachment *a, *ah;
	struct ldr_batch *b, *bh;
	json_t *st, *pl;
	int n = 0, r;

	drv_load_or_die();
	start_daemon(loaderd, "device-ipc");
	c = connect_as("cuda-ipc");
	ch = connect_as("host");
	create(ch, "ipc", 8, 1, 2);
	a = attach(c, "ipc", LDR_MODE_BROADCAST, 0, 0, LDR_DEVICE_CUDA, 0);
	ah = attach(ch, "ipc", LDR_MODE_BROADCAST, 0, 0, LDR_DEVICE_HOST, 0);
	while ((r = ldr_next(a, TIMEOUT_MS, &b)) == 0) {
		bh = next(ch, ah);
		assert(ldr_batch_epoch(b) == 0 && ldr_batch_index(b) == (uint64_t)n);
		assert(ldr_batch_index(bh) == (uint64_t)n);
		check_host(bh, 8, 0, 1, NULL);
		check_host(b, 8, 0, 1, NULL);
		check_device(b, 0, bh);
		ldr_release_after(b, NULL);
		ldr_release(bh);
		n++;
	}
	assert(r == LDR_EOF && n == 13);
	assert(ldr_next(ah, TIMEOUT_MS, &bh) == LDR_EOF);

	st = status(ch);
	pl = pipeline_of(st, "ipc");
	assert(!strcmp(jstr(deventry(pl, 0), "memory"), "ipc"));
	assert(jint(deventry(pl, 0), "copies") == n && jint(deventry(pl, 0), "clients") == 1);
	assert(json_is_null(jget(deventry(pl, 0), "error")));
	assert(jint(engine_of(st, 0), "host_registered") == 1);
	json_decref(st);
	assert(ldr_detach(a) == 0 && ldr_detach(ah) == 0);
	ldr_close(c);
	ldr_close(ch);
	stop_daemon();
	printf("test-device: legacy IPC (%s): %d batches: ok\n",
	       getenv("LOADERD_CUDA_IPC") ? "LOADERD_CUDA_IPC=1" : "no POSIX-fd handles", n);
	return 0;
}

/* --- two: partition ranks on two devices ---------------------------------- */

static int role_two(void)
{
	struct ldr_client *c[2];
	struct ldr_attachment *a[2];
	struct ldr_batch *b;
	int seen[NSAMPLES] = { 0 }, n[2] = { 0, 0 }, r;
	json_t *st, *pl;

	drv_load_or_die();
	if (cu.ndev < 2) {
		printf("test-device: %d device: the two-device check is skipped\n", cu.ndev);
		return 77;
	}
	start_daemon(loaderd, "device-two");
	for (int k = 0; k < 2; k++)
		c[k] = connect_as(k ? "rank1" : "rank0");
	create(c[0], "part", 8, 1, 1);
	for (int k = 0; k < 2; k++) {
		a[k] = attach(c[k], "part", LDR_MODE_PARTITION, (uint32_t)k, 2, LDR_DEVICE_CUDA, k);
		assert(ldr_attachment_batches_per_epoch(a[k]) == 7); /* 50 samples per rank / 8 */
		assert(ldr_attachment_samples_per_epoch(a[k]) == NSAMPLES / 2);
	}
	/* alternate, so that both streams run at once */
	for (bool more = true; more;) {
		more = false;
		for (int k = 0; k < 2; k++) {
			r = ldr_next(a[k], TIMEOUT_MS, &b);
			if (r == LDR_EOF)
				continue;
			if (r) {
				fprintf(stderr, "rank %d: %s: %s\n", k, ldr_strerror(r), ldr_client_error(c[k]));
				abort();
			}
			more = true;
			assert(ldr_batch_epoch(b) == 0 && ldr_batch_index(b) == (uint64_t)n[k]);
			assert(ldr_batch_rows(b) == (n[k] == 6 ? 2u : 8u));
			check_host(b, 8, (uint32_t)k, 2, seen);
			check_device(b, k, NULL);
			if (k)
				ldr_release_after(b, NULL);
			else
				ldr_release(b);
			n[k]++;
		}
	}
	assert(n[0] == 7 && n[1] == 7);
	for (int i = 0; i < NSAMPLES; i++)
		assert(seen[i] == 1);

	st = status(c[0]);
	pl = pipeline_of(st, "part");
	assert(json_array_size(jget(pl, "devices")) == 2);
	/* one copy per batch, plus one per batch reclaimed after its copy (the
	 * first rank filled every slot before the second came) and built again */
	json_int_t copies = 0;
	for (int k = 0; k < 2; k++) {
		json_t *d = deventry(pl, k);

		assert(!strcmp(jstr(d, "memory"), "vmm"));
		assert(jint(d, "copies") >= 7 && jint(d, "clients") == 1);
		assert(json_is_null(jget(d, "error")));
		copies += jint(d, "copies");
	}
	assert(copies == 14 + jint(pl, "batches_reclaimed"));
	/* the host slab is pinned once, for every device (PORTABLE) */
	assert(jint(engine_of(st, 0), "host_registered") + jint(engine_of(st, 1), "host_registered") == 1);
	assert(jint(engine_of(st, 0), "copies") == jint(deventry(pl, 0), "copies") &&
	       jint(engine_of(st, 1), "copies") == jint(deventry(pl, 1), "copies"));
	json_decref(st);
	for (int k = 0; k < 2; k++) {
		assert(ldr_detach(a[k]) == 0);
		ldr_close(c[k]);
	}
	stop_daemon();
	printf("test-device: partition ranks on cuda:0 and cuda:1, 7 batches each: ok\n");
	return 0;
}

/* --- the whole ----------------------------------------------------------- */

/* Whatever this process forks (its daemon, a hog, a role) dies with it, so
 * that a failed assertion leaves no daemon holding meson's pipes open. */
static void die_with_parent(void)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
}

static int role(const char *name, int argc, char **argv)
{
	/* argv: the main daemon's socket (hog, logclient), an argument */
	snprintf(tok_path, sizeof(tok_path), "%s/t.bin", work);
	if (argc >= 1)
		snprintf(sock_path, sizeof(sock_path), "%s", argv[0]);
	if (!strcmp(name, "main"))
		return role_main();
	if (!strcmp(name, "ipc"))
		return role_ipc();
	if (!strcmp(name, "two"))
		return role_two();
	if (!strcmp(name, "hog")) {
		drv_load_or_die();
		assert(argc >= 2);
		return role_hog(argv[1]);
	}
	if (!strcmp(name, "logclient"))
		return role_logclient();
	fprintf(stderr, "test-device: unknown role %s\n", name);
	return 2;
}

int main(int argc, char **argv)
{
	static const char *const env_ipc[] = { "LOADERD_CUDA_IPC=1", NULL };
	static const char *const env_no_posix_fd[] = { "FAKECUDA_POSIX_FD=0", NULL };
	static const char *const env_two[] = { "FAKECUDA_DEVICES=2", NULL };
	char why[768], wdir[] = "/tmp/ldr-devtest-XXXXXX";
	struct timespec t0, t1;
	int r;

	if (argc < 2) {
		fprintf(stderr, "usage: test-device PATH-TO-LOADERD\n");
		return 2;
	}
	loaderd = argv[1];
	signal(SIGPIPE, SIG_IGN);
	pthread_atfork(NULL, NULL, die_with_parent);
	if (argc >= 4) {
		work = argv[3];
		return role(argv[2], argc - 4, argv + 4);
	}

	/* every role starts from the defaults; the log only where a role sets it */
	unsetenv("FAKECUDA_LOG");
	unsetenv("FAKECUDA_DEVICES");
	unsetenv("FAKECUDA_POSIX_FD");
	unsetenv("FAKECUDA_VMM");
	unsetenv("LOADERD_CUDA_IPC");
	r = drv_load(why, sizeof(why));
	if (r < 0 && !lib_env()) {
		printf("test-device: skipped: LOADERD_CUDA_LIBRARY is not set and %s\n", why);
		return 77;
	}
	if (r < 0) {
		fprintf(stderr, "test-device: LOADERD_CUDA_LIBRARY=%s: %s\n", lib_env(), why);
		return 1;
	}
	printf("test-device: driver %s, %d device%s, cuda:0 is %s\n", cu.path, cu.ndev, cu.ndev == 1 ? "" : "s",
	       cu.name);

	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert(mkdtemp(wdir));
	work = wdir;
	write_tokens();
	fflush(stdout);
	assert(run_role("main", NULL) == 0);
	assert(run_role("ipc", env_ipc) == 0);
	if (cu.fake)
		assert(run_role("ipc", env_no_posix_fd) == 0);
	r = run_role("two", env_two);
	assert(r == 0 || (r == 77 && !cu.fake));
	unlink(tok_path);
	assert(rmdir(wdir) == 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("test-device: ok (%.1f s)\n", (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
	return 0;
}
