/* SPDX-License-Identifier: MIT */
/* test-client - libloader against the real daemon: lifetimes, fork, timeouts
 *
 * Starts loaderd (argv[1]) on a private socket and checks what the C API
 * promises: batches in order with exact contents, a batch kept after detach
 * stays mapped and unchanged, end of stream, timeouts, a handle used in a
 * forked child answers LDR_EFORKED without touching nng, writable
 * (copy-on-write) batches, a trainer holding every slot, and a clean error
 * when the daemon goes away (every synchronous call in flight, however many,
 * returns), versioned attach options, and a refused release being counted.
 * tests/integration-c/test-keep.c checks copy-on-write and kept
 * batches in depth. ldr_next_described() says what ldr_next() and the
 * per-value calls say, in one call.
 */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loader/loader.h"
#include "test-daemon.h"

#define SEQ 16
#define NTOK (SEQ * 100 + 1)

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void create(struct ldr_client *c, const char *name, int batch, int epochs)
{
	char spec[512];

	snprintf(spec, sizeof(spec),
	         "{\"name\": \"%s\", \"source\": {\"kind\": \"tokens\", \"path\": \"%s\", \"seq_len\": %d},"
	         " \"batch_size\": %d, \"epochs\": %d, \"prefetch\": 4}",
	         name, token_file, SEQ, batch, epochs);
	assert(ldr_create_pipeline(c, spec, 0, NULL, 0) == 1);
}

/* Row r of field 0 (input) of sequential batch b: tokens (b*batch + r)*SEQ... */
static void check_batch(struct ldr_batch *b, int batch_size)
{
	struct ldr_field in, tg;

	assert(ldr_batch_nfields(b) == 2);
	assert(ldr_batch_field(b, 0, &in) == 0 && ldr_batch_field(b, 1, &tg) == 0);
	assert(strcmp(in.name, "input") == 0 && strcmp(tg.name, "target") == 0);
	assert(in.dtype == LDR_DTYPE_INT64 && in.ndim == 2 && in.shape[1] == SEQ);
	assert(in.shape[0] == (int64_t)ldr_batch_rows(b));
	for (uint32_t r = 0; r < ldr_batch_rows(b); r++)
		for (int k = 0; k < SEQ; k++) {
			int64_t first = ((int64_t)ldr_batch_index(b) * batch_size + r) * SEQ + k;
			assert(((const int64_t *)in.data)[r * SEQ + k] == first);
			assert(((const int64_t *)tg.data)[r * SEQ + k] == first + 1);
		}
}

static void test_stream_and_lifetime(struct ldr_client *c)
{
	struct ldr_attachment *a;
	struct ldr_batch *b;
	struct ldr_batch *volatile kept = NULL;
	struct ldr_field f;
	int64_t copy[SEQ];
	int n = 0, r;

	create(c, "seq", 8, 1);
	assert(ldr_attach(c, "seq", NULL, &a) == 0);
	assert(ldr_attachment_batches_per_epoch(a) == 13); /* 100 samples / 8 */
	while ((r = ldr_next(a, 10000, &b)) == 0) {
		assert((int)ldr_batch_index(b) == n && ldr_batch_epoch(b) == 0);
		assert(ldr_batch_rows(b) == (n == 12 ? 4u : 8u));
		check_batch(b, 8);
		if (n == 3)
			kept = b;
		else
			ldr_release(b);
		n++;
	}
	if (r != LDR_EOF || n != 13)
		fprintf(stderr, "r=%d (%s) n=%d\n", r, ldr_client_error(c), n);
	assert(r == LDR_EOF && n == 13);
	assert(ldr_next(a, 0, &b) == LDR_EOF);

	/* batches are copy-on-write: writing works, and is this process's own */
	ldr_batch_field(kept, 0, &f);
	((int64_t *)f.data)[0] = 42;
	assert(((int64_t *)f.data)[0] == 42);

	/* a batch held past detach stays mapped and unchanged (kept) */
	memcpy(copy, f.data, sizeof(copy));
	assert(ldr_detach(a) == 0);
	assert(ldr_batch_is_kept(kept));
	assert(memcmp(copy, f.data, sizeof(copy)) == 0);
	((int64_t *)f.data)[0] = 3 * 8 * SEQ; /* batch 3, row 0 again */
	check_batch(kept, 8);
	ldr_release(kept);
	assert(ldr_drop_pipeline(c, "seq", 0) == 0);
}

/* @x and @y describe the same field the same way (the shape entries past ndim are unset) */
static bool same_field(const struct ldr_field *x, const struct ldr_field *y)
{
	if (x->name != y->name || x->dtype != y->dtype || x->ndim != y->ndim ||
	    x->data != y->data || x->nbytes != y->nbytes)
		return false;
	for (int d = 0; d < x->ndim; d++)
		if (x->shape[d] != y->shape[d])
			return false;
	return true;
}

/* ldr_next_described(): what ldr_next() and the per-value calls say, in one call */
static void test_described(struct ldr_client *c)
{
	struct ldr_attachment *a;
	struct ldr_batch *b, *held = NULL;
	struct ldr_batch_info info;
	struct ldr_field fs[2], f;
	int n = 0, r;

	create(c, "desc", 8, 1);
	assert(ldr_attach(c, "desc", NULL, &a) == 0);
	/* a count of fields out of range is refused, naming it, and takes nothing */
	assert(ldr_next_described(a, 1000, &b, &info, fs, 3) == -EINVAL);
	assert(strcmp(ldr_client_error(c), "describe 3 fields: the attachment has 2") == 0);
	assert(ldr_next_described(a, 1000, &b, &info, fs, -1) == -EINVAL);
	assert(ldr_next_described(a, 1000, &b, &info, NULL, 1) == -EINVAL);
	while ((r = ldr_next_described(a, 10000, &b, &info, fs, 2)) == 0) {
		assert(info.epoch == ldr_batch_epoch(b) && info.epoch == 0);
		assert(info.index == ldr_batch_index(b) && (int)info.index == n);
		assert(info.rows == ldr_batch_rows(b) && info.rows == (n == 12 ? 4u : 8u));
		assert(info.nfields == 2);
		assert(info.held == (held ? 2u : 1u) && info.held == ldr_attachment_held(a));
		assert(info.share == ldr_attachment_share(a) && info.share >= 2);
		assert(info.kept_batches == 0 && info.kept_bytes == 0);
		for (int i = 0; i < 2; i++) {
			assert(ldr_batch_field(b, i, &f) == 0);
			assert(same_field(&f, &fs[i]));
		}
		check_batch(b, 8);
		/* ldr_batch_describe() of a batch taken earlier: the same, counters now */
		if (held) {
			struct ldr_batch_info hi;
			struct ldr_field hf;

			assert(ldr_batch_describe(held, &hi, &hf, 1) == 0);
			assert(hi.index == (uint64_t)n - 1 && hi.rows == 8 && hi.held == 2);
			assert(ldr_batch_field(held, 0, &f) == 0 && same_field(&f, &hf));
			assert(ldr_batch_describe(held, &hi, &hf, 3) == -EINVAL);
			assert(strcmp(ldr_client_error(c), "describe 3 fields: the batch has 2") == 0);
			assert(ldr_batch_describe(held, &hi, NULL, 0) == 0 && hi.nfields == 2);
			ldr_release(held);
			held = NULL;
		}
		if (n % 2 == 0)
			held = b;
		else
			ldr_release(b);
		n++;
	}
	assert(r == LDR_EOF && n == 13);
	/* the counters come with the end of the stream too */
	assert(held && info.held == 1 && info.nfields == 2 && info.kept_batches == 0);
	ldr_release(held);
	assert(ldr_next_described(a, 0, &b, &info, fs, 2) == LDR_EOF && info.held == 0);
	assert(ldr_detach(a) == 0);
	assert(ldr_drop_pipeline(c, "desc", 0) == 0);
}

static void test_timeout_and_errors(struct ldr_client *c)
{
	struct ldr_attachment *a;
	struct ldr_attach_opts o = { .size = sizeof(o), .mode = LDR_MODE_BROADCAST };
	struct ldr_batch *b;
	char spec[512];

	/* min_clients 2 and one client: nothing comes */
	snprintf(spec, sizeof(spec),
	         "{\"name\": \"held\", \"source\": {\"kind\": \"tokens\", \"path\": \"%s\", \"seq_len\": %d},"
	         " \"min_clients\": 2}", token_file, SEQ);
	assert(ldr_create_pipeline(c, spec, 0, NULL, 0) == 1);
	assert(ldr_create_pipeline(c, spec, 1, NULL, 0) == 0); /* exist_ok, same spec */
	assert(ldr_create_pipeline(c, spec, 0, NULL, 0) == -EEXIST);
	assert(ldr_attach(c, "held", &o, &a) == 0);
	assert(ldr_next(a, 200, &b) == -ETIMEDOUT);
	assert(strstr(ldr_client_error(c), "200 ms"));
	assert(ldr_detach(a) == 0);

	assert(ldr_attach(c, "nope", NULL, &a) == -ENOENT);
	assert(strstr(ldr_client_error(c), "no pipeline named 'nope'"));
	o.mode = LDR_MODE_BROADCAST;
	o.rank = 1;
	assert(ldr_attach(c, "held", &o, &a) == -EINVAL);
	assert(strstr(ldr_client_error(c), "partition mode only"));
	assert(ldr_create_pipeline(c, "{\"name\": \"x\"}", 0, NULL, 0) == -EINVAL);
	assert(strstr(ldr_client_error(c), "source"));
	assert(strcmp(ldr_strerror(LDR_EOF), "end of stream") == 0);
	assert(ldr_drop_pipeline(c, "held", 0) == 0);
}

static void test_hoarding(struct ldr_client *c)
{
	struct ldr_attachment *a;
	struct ldr_batch *held[6], *b;
	uint64_t nkept, bytes;

	create(c, "hoard", 4, 0); /* prefetch 4 */
	assert(ldr_attach(c, "hoard", NULL, &a) == 0);
	assert(ldr_attachment_share(a) >= 1 && ldr_attachment_share(a) <= 4);
	for (int i = 0; i < 4; i++)
		assert(ldr_next(a, 10000, &held[i]) == 0);
	assert(ldr_attachment_held(a) == 4);
	/* all four slots are ours: the oldest batch is kept to make room */
	for (int i = 4; i < 6; i++)
		assert(ldr_next(a, 10000, &held[i]) == 0);
	assert(ldr_batch_is_kept(held[0]) && ldr_batch_is_kept(held[1]));
	assert(ldr_attachment_held(a) == 4);
	assert(ldr_attachment_kept(a, &nkept, &bytes) == 0 && nkept == 2 && bytes > 0);
	for (int i = 0; i < 6; i++) {
		assert((int)ldr_batch_index(held[i]) == i);
		check_batch(held[i], 4);
	}
	for (int i = 0; i < 6; i++)
		ldr_release(held[i]);
	assert(ldr_attachment_held(a) == 0);
	for (int i = 0; i < 10; i++) {
		assert(ldr_next(a, 10000, &b) == 0);
		check_batch(b, 4);
		ldr_release(b);
	}
	assert(ldr_detach(a) == 0);
	assert(ldr_drop_pipeline(c, "hoard", 0) == 0);
}

/* sizeof(struct ldr_attach_opts) in the V1 header: V1 padded to its alignment */
#define ALIGN_V1 ((LDR_ATTACH_OPTS_SIZE_V1 + 7) / 8 * 8)

/* ldr_attach_opts is versioned by its size: fields beyond it are not read. */
static void test_opts_size(struct ldr_client *c)
{
	struct ldr_attach_opts o = LDR_ATTACH_OPTS_INIT, *small;
	struct ldr_attachment *a;
	unsigned char big[sizeof(o) + 16];
	int idx;

	create(c, "opts", 4, 0);
	assert(o.size == sizeof(o));
	o.inflight = LDR_INFLIGHT_MAX + 1;
	assert(ldr_attach(c, "opts", &o, &a) == -EINVAL);
	assert(strstr(ldr_client_error(c), "inflight"));
	o.size = 0; /* 0: the first layout, which has inflight */
	assert(ldr_attach(c, "opts", &o, &a) == -EINVAL);
	o.size = 4;
	assert(ldr_attach(c, "opts", &o, &a) == -EINVAL);

	/* a caller of the layout before the device fields: a CUDA device and
	 * an impossible window past its size are not read, the defaults are */
	o.size = offsetof(struct ldr_attach_opts, device_kind);
	o.inflight = 8;
	o.device_kind = LDR_DEVICE_CUDA;
	o.device_index = 7;
	assert(ldr_attach(c, "opts", &o, &a) == 0);
	assert(ldr_attachment_device(a, &idx) == LDR_DEVICE_HOST && idx == -1);
	assert(ldr_detach(a) == 0);

	/* an older, smaller struct, exactly its size (ASan sees a read past it) */
	o.size = offsetof(struct ldr_attach_opts, inflight);
	o.mode = LDR_MODE_BROADCAST;
	small = malloc(o.size);
	assert(small);
	memcpy(small, &o, o.size);
	assert(ldr_attach(c, "opts", small, &a) == 0);
	assert(ldr_attachment_device(a, NULL) == LDR_DEVICE_HOST);
	assert(ldr_detach(a) == 0);
	free(small);

	/* a caller built against the V1 header passes its sizeof: V1 rounded up
	 * to 8, the padding (where has_augment_seed now lies) never written:
	 * garbage there is not read as a seed, which a dynamic attach refuses */
	memset(big, 0xab, sizeof(big));
	o = (struct ldr_attach_opts)LDR_ATTACH_OPTS_INIT;
	o.mode = LDR_MODE_DYNAMIC;
	memcpy(big, &o, LDR_ATTACH_OPTS_SIZE_V1);
	((struct ldr_attach_opts *)(void *)big)->size = ALIGN_V1;
	assert(ldr_attach(c, "opts", (struct ldr_attach_opts *)(void *)big, &a) == 0);
	assert(ldr_detach(a) == 0);

	/* a newer, larger struct: fine while what this library does not know is 0 */
	memset(big, 0, sizeof(big));
	o = (struct ldr_attach_opts)LDR_ATTACH_OPTS_INIT;
	o.size = sizeof(big);
	memcpy(big, &o, sizeof(o));
	assert(ldr_attach(c, "opts", (struct ldr_attach_opts *)(void *)big, &a) == 0);
	assert(ldr_detach(a) == 0);
	big[sizeof(o) + 3] = 1;
	assert(ldr_attach(c, "opts", (struct ldr_attach_opts *)(void *)big, &a) == -E2BIG);
	assert(ldr_drop_pipeline(c, "opts", 0) == 0);
}

/* Sample ids (token / SEQ of row r's first input token) of @n batches of
 * @a, counted into @count; the batches' epoch and first index checked. */
static void read_ids(struct ldr_attachment *a, int n, uint64_t epoch, uint64_t first,
                     unsigned *count)
{
	struct ldr_batch *b;
	struct ldr_field in;

	for (int i = 0; i < n; i++) {
		assert(ldr_next(a, 10000, &b) == 0);
		assert(ldr_batch_epoch(b) == epoch && ldr_batch_index(b) == first + (uint64_t)i);
		assert(ldr_batch_field(b, 0, &in) == 0);
		for (uint32_t r = 0; r < ldr_batch_rows(b); r++)
			count[((const int64_t *)in.data)[r * SEQ] / SEQ]++;
		ldr_release(b);
	}
}

/*
 * Elastic resume (docs/spec.md, "Partition"): 8 ranks read 2 batches of 3
 * in lockstep (positions [0, 48) of 100), then 6 ranks take the tail from
 * position 48: 52 samples, 9 per rank padded by positions 0 and 1 of the
 * epoch, as the last 3 of the 6 batches of its epoch; the next epoch is
 * the plain share. Bad starts are refused with the reason.
 */
static void test_elastic(struct ldr_client *c)
{
	struct ldr_attach_opts o = LDR_ATTACH_OPTS_INIT;
	struct ldr_attachment *a[8];
	unsigned count[100] = { 0 };

	create(c, "elastic", 3, 2);
	o.mode = LDR_MODE_PARTITION;
	o.world_size = 8;
	for (uint32_t r = 0; r < 8; r++) {
		o.rank = r;
		assert(ldr_attach(c, "elastic", &o, &a[r]) == 0);
		assert(ldr_attachment_batches_per_epoch(a[r]) == 5); /* 13 samples */
		read_ids(a[r], 2, 0, 0, count);
		assert(ldr_detach(a[r]) == 0);
	}
	for (int i = 0; i < 100; i++)
		assert(count[i] == (i < 48));
	o.world_size = 6;
	o.has_start = 1;
	o.has_start_position = 1;
	o.start_position = 48;
	for (uint32_t r = 0; r < 6; r++) {
		unsigned next[100] = { 0 };

		o.rank = r;
		assert(ldr_attach(c, "elastic", &o, &a[r]) == 0);
		/* 17 samples, 6 batches; the tail's 9: its last 3 */
		assert(ldr_attachment_batches_per_epoch(a[r]) == 6);
		read_ids(a[r], 3, 0, 3, count);
		/* then epoch 1, the plain share of rank r of 6 */
		read_ids(a[r], 6, 1, 0, next);
		for (int i = 0; i < 100; i++)
			assert((int)next[i] == (i % 6 == (int)r) + (i < 2 && i + 4 == (int)r));
		assert(ldr_detach(a[r]) == 0);
	}
	for (int i = 0; i < 100; i++)
		assert(count[i] == 1u + (i < 2));

	/* a tail with nothing for these ranks: the next epoch at once */
	o.world_size = 2;
	o.rank = 1;
	o.start_position = 100;
	assert(ldr_attach(c, "elastic", &o, &a[0]) == 0);
	memset(count, 0, sizeof(count));
	read_ids(a[0], 1, 1, 0, count);
	assert(count[1] == 1 && count[3] == 1 && count[5] == 1);
	assert(ldr_detach(a[0]) == 0);

	/* a caller built against the V4 header passes V4 rounded up to 8:
	 * has_start_position lies in that padding, and garbage there is not
	 * read (read, it would be refused: a start_position without has_start) */
	{
		unsigned char v4[sizeof(o)];
		struct ldr_attach_opts *p4 = (struct ldr_attach_opts *)(void *)v4;

		memset(v4, 0xab, sizeof(v4));
		memcpy(v4, &o, LDR_ATTACH_OPTS_SIZE_V4);
		p4->size = (LDR_ATTACH_OPTS_SIZE_V4 + 7) / 8 * 8;
		p4->has_start = 0;
		assert(ldr_attach(c, "elastic", p4, &a[0]) == 0);
		assert(ldr_detach(a[0]) == 0);
	}
	o.start_position = 101;
	assert(ldr_attach(c, "elastic", &o, &a[0]) == -EINVAL);
	assert(strstr(ldr_client_error(c), "start_position 101 is past the end of the epoch: "
	                                   "pipeline 'elastic' has 100 samples"));
	o.start_position = 5;
	o.has_start = 0;
	assert(ldr_attach(c, "elastic", &o, &a[0]) == -EINVAL);
	assert(strstr(ldr_client_error(c), "start_position needs has_start"));
	o.mode = LDR_MODE_BROADCAST;
	o.world_size = 1;
	o.rank = 0;
	assert(ldr_attach(c, "elastic", &o, &a[0]) == -EINVAL);
	assert(strstr(ldr_client_error(c), "apply to partition mode only"));
	assert(ldr_drop_pipeline(c, "elastic", 0) == 0);
}

/* A release the daemon refuses is counted and its message kept. */
static void test_refused_release(struct ldr_client *c)
{
	struct ldr_attachment *a;
	struct ldr_batch *b, *b2;
	char msg[256];
	uint64_t n = 0;
	int r, got = 0;

	create(c, "refuse", 4, 0);
	assert(ldr_attach(c, "refuse", NULL, &a) == 0);
	assert(ldr_next(a, 10000, &b) == 0);
	ldr_release(b);
	assert(ldr_next(a, 10000, &b) == 0);
	assert(ldr_attachment_release_refused(a, msg, sizeof(msg)) == 0 && msg[0] == '\0');
	/* the pipeline goes from under the attachment: its lease is no more */
	assert(ldr_drop_pipeline(c, "refuse", 1) == 0);
	for (int i = 0; i < 100; i++) {
		r = ldr_next(a, 5000, &b2);
		if (r != 0)
			break;
		ldr_release(b2);
		got++;
	}
	assert(r < 0);
	ldr_release(b);
	/* b, and any batch of the window that arrived before the drop (b2):
	 * their leases are gone, so each Release request carrying them is
	 * refused; how many requests that takes depends on when the flusher
	 * sends (one for all, or one each: slower under a sanitizer) */
	for (int i = 0; i < 500 && (n = ldr_attachment_release_refused(a, msg, sizeof(msg))) == 0; i++)
		usleep(10000);
	if (n < 1 || n > 1 + (uint64_t)got)
		fprintf(stderr, "refused releases: %llu (%d more batches after the drop)\n",
		        (unsigned long long)n, got);
	assert(n >= 1 && n <= 1 + (uint64_t)got);
	assert(msg[0] != '\0');
	ldr_detach(a);
}

static void test_fork(struct ldr_client *c)
{
	struct ldr_attachment *a;
	struct ldr_batch *b;
	pid_t pid;
	int status;

	create(c, "forked", 10, 0);
	assert(ldr_attach(c, "forked", NULL, &a) == 0);
	assert(ldr_next(a, 10000, &b) == 0);
	pid = fork();
	assert(pid >= 0);
	if (pid == 0) {
		char *json;
		struct ldr_batch *cb;
		/* the parent's handles: an error, no nng call, no crash */
		if (ldr_status_json(c, &json) != LDR_EFORKED)
			_exit(1);
		if (!strstr(ldr_client_error(c), "forked"))
			_exit(2);
		if (ldr_next(a, 100, &cb) != LDR_EFORKED)
			_exit(3);
		ldr_release(b);  /* quietly nothing */
		if (ldr_detach(a) != LDR_EFORKED)
			_exit(4);
		ldr_close(c);    /* leaves the parent's nng state alone */
		/* nng cannot start again in a forked child: a clear error, no panic */
		struct ldr_client *c2;
		if (ldr_connect(&c2, sock_path, "child") != LDR_EFORKED)
			_exit(5);
		if (!strstr(ldr_client_error(NULL), "spawn"))
			_exit(6);
		_exit(0);
	}
	assert(waitpid(pid, &status, 0) == pid);
	assert(WIFEXITED(status));
	if (WEXITSTATUS(status) != 0)
		fprintf(stderr, "child failed at step %d\n", WEXITSTATUS(status));
	assert(WEXITSTATUS(status) == 0);
	/* the parent goes on */
	ldr_release(b);
	for (int i = 0; i < 5; i++) {
		assert(ldr_next(a, 10000, &b) == 0);
		ldr_release(b);
	}
	assert(ldr_detach(a) == 0);
}

#define NSYNC 12

struct sync_calls {
	struct ldr_client *c;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int started, done;
	int result[NSYNC];
};

static struct sync_calls sync_calls = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.cond = PTHREAD_COND_INITIALIZER,
};

static void *sync_call_main(void *arg)
{
	int i = (int)(intptr_t)arg, r;
	char *json = NULL;

	pthread_mutex_lock(&sync_calls.lock);
	sync_calls.started++;
	pthread_cond_broadcast(&sync_calls.cond);
	pthread_mutex_unlock(&sync_calls.lock);
	if (i < 2) {
		/* a request larger than the socket's buffer: the stopped daemon
		 * never reads it, so the requests after it wait in nng's queue,
		 * which a lost connection does not fail by itself; under the
		 * 1 MiB a message may be, which libloader refuses to send */
		static char big[2][1 << 19];
		memset(big[i], ' ', sizeof(big[i]) - 1);
		memcpy(big[i], "{\"name\": \"x\"}", 13);
		r = ldr_create_pipeline(sync_calls.c, big[i], 0, NULL, 0);
	} else {
		r = ldr_status_json(sync_calls.c, &json);
		if (r == 0)
			ldr_free(json);
	}
	pthread_mutex_lock(&sync_calls.lock);
	sync_calls.result[i] = r;
	sync_calls.done++;
	pthread_cond_broadcast(&sync_calls.cond);
	pthread_mutex_unlock(&sync_calls.lock);
	return NULL;
}

/*
 * The daemon SIGKILLed and another started on the same socket: the client
 * reconnects, creates its pipeline again, and the attachment goes on at its
 * next batch; the batch held across the restart keeps its bytes.
 */
/* A signal storm while attaching: the handler is installed without
 * SA_RESTART (as Python's and torch's DataLoader's SIGCHLD handler are), so
 * every blocking call of the attach, the fd channel's included, keeps being
 * interrupted; each attach must still succeed and read its first batch. */
static volatile sig_atomic_t storm_hits;
static atomic_int storm_on;

static void on_storm(int sig)
{
	(void)sig;
	storm_hits++;
}

static void *storm(void *arg)
{
	pthread_t main_thread = *(pthread_t *)arg;
	struct timespec ts = { 0, 20000 };

	while (atomic_load(&storm_on)) {
		pthread_kill(main_thread, SIGUSR1);
		nanosleep(&ts, NULL);
	}
	return NULL;
}

static void test_signals(struct ldr_client *c)
{
	struct sigaction sa = { .sa_handler = on_storm }; /* no SA_RESTART */
	struct ldr_attachment *a;
	struct ldr_batch *b;
	pthread_t self = pthread_self(), th;
	int r;

	create(c, "storm", 8, 0);
	sigemptyset(&sa.sa_mask);
	assert(sigaction(SIGUSR1, &sa, NULL) == 0);
	atomic_store(&storm_on, 1);
	assert(pthread_create(&th, NULL, storm, &self) == 0);
	for (int i = 0; i < 200; i++) {
		if ((r = ldr_attach(c, "storm", NULL, &a)) != 0) {
			fprintf(stderr, "attach %d under signals: %d (%s)\n", i, r, ldr_client_error(c));
			abort();
		}
		if ((r = ldr_next(a, 10000, &b)) != 0) {
			fprintf(stderr, "next %d under signals: %d (%s)\n", i, r, ldr_client_error(c));
			abort();
		}
		check_batch(b, 8);
		ldr_release(b);
		assert(ldr_detach(a) == 0);
	}
	atomic_store(&storm_on, 0);
	pthread_join(th, NULL);
	signal(SIGUSR1, SIG_DFL);
	assert(storm_hits > 200);
	assert(ldr_drop_pipeline(c, "storm", 1) == 0);
}

static void test_daemon_restart(struct ldr_client *c, const char *exe)
{
	struct ldr_attach_opts o = LDR_ATTACH_OPTS_INIT;
	struct ldr_attachment *a, *t;
	struct ldr_batch *b, *held = NULL;
	struct ldr_field in;
	int status, r, n = 0;
	int64_t id = 11;

	create(c, "rs", 8, 1);
	assert(ldr_attach(c, "rs", NULL, &a) == 0);
	/* an elastic resume's tail follows the restart too: rank 1 of 2 from
	 * position 10 reads 11, 13 .. 99, as batches 1..6 of its epoch */
	o.mode = LDR_MODE_PARTITION;
	o.rank = 1;
	o.world_size = 2;
	o.has_start = o.has_start_position = 1;
	o.start_position = 10;
	assert(ldr_attach(c, "rs", &o, &t) == 0);
	for (uint64_t i = 1; i <= 2; i++) {
		assert(ldr_next(t, 10000, &b) == 0 && ldr_batch_index(b) == i);
		assert(ldr_batch_field(b, 0, &in) == 0 && ldr_batch_rows(b) == 8);
		for (uint32_t row = 0; row < 8; row++, id += 2)
			assert(((const int64_t *)in.data)[row * SEQ] == id * SEQ);
		ldr_release(b);
	}
	for (; n < 5; n++) {
		assert(ldr_next(a, 10000, &b) == 0 && (int)ldr_batch_index(b) == n);
		if (n == 4)
			held = b;
		else
			ldr_release(b);
	}
	kill(daemon_pid, SIGKILL);
	assert(waitpid(daemon_pid, &status, 0) == daemon_pid);
	daemon_pid = fork();
	assert(daemon_pid >= 0);
	if (daemon_pid == 0) {
		execl(exe, exe, "--socket", sock_path, "--workers", "2", "--log-level", "warning", (char *)NULL);
		_exit(127);
	}
	/* next() waits while the client reconnects, then goes on at batch 5 */
	while ((r = ldr_next(a, 30000, &b)) == 0) {
		assert((int)ldr_batch_index(b) == n && ldr_batch_epoch(b) == 0);
		check_batch(b, 8);
		ldr_release(b);
		n++;
	}
	if (r != LDR_EOF || n != 13)
		fprintf(stderr, "r=%d (%s) n=%d\n", r, ldr_client_error(c), n);
	assert(r == LDR_EOF && n == 13);
	while ((r = ldr_next(t, 30000, &b)) == 0) {
		assert(ldr_batch_field(b, 0, &in) == 0 && ldr_batch_epoch(b) == 0);
		for (uint32_t row = 0; row < ldr_batch_rows(b); row++, id += 2)
			assert(((const int64_t *)in.data)[row * SEQ] == id * SEQ);
		ldr_release(b);
	}
	assert(r == LDR_EOF && id == 101);
	assert(ldr_detach(t) == 0);
	check_batch(held, 8); /* the old daemon's slab, still mapped */
	assert(ldr_batch_index(held) == 4);
	ldr_release(held);
	assert(ldr_client_reconnects(c) == 1); /* a new client id (a new daemon counts from 1 again) */
	assert(ldr_attachment_release_refused(a, NULL, 0) == 0);
	assert(ldr_detach(a) == 0);
	assert(ldr_drop_pipeline(c, "rs", 0) == 0);
}

static void test_daemon_gone(struct ldr_client *c)
{
	struct ldr_attachment *a;
	struct ldr_batch *b;
	pthread_t t[NSYNC];
	struct timespec deadline;
	int status, r;

	/* without reconnecting (0): the daemon going away fails everything
	 * (tests/integration/test_reconnect.py has the reconnections) */
	assert(ldr_client_reconnect_timeout(c) == 60000);
	assert(ldr_client_set_reconnect(c, -1) == -EINVAL);
	assert(ldr_client_set_reconnect(c, 0) == 0 && ldr_client_reconnect_timeout(c) == 0);
	create(c, "gone", 5, 0);
	assert(ldr_attach(c, "gone", NULL, &a) == 0);
	assert(ldr_next(a, 10000, &b) == 0);
	ldr_release(b);
	/* more synchronous calls than any fixed registry (libloader had 8):
	 * every one waits on a stopped daemon, and every one returns once the
	 * daemon is gone (libloader cancels them; nng fails only those sent) */
	kill(daemon_pid, SIGSTOP);
	assert(waitpid(daemon_pid, &status, WUNTRACED) == daemon_pid && WIFSTOPPED(status));
	sync_calls.c = c;
	for (int i = 0; i < NSYNC; i++)
		assert(pthread_create(&t[i], NULL, sync_call_main, (void *)(intptr_t)i) == 0);
	pthread_mutex_lock(&sync_calls.lock);
	while (sync_calls.started < NSYNC)
		pthread_cond_wait(&sync_calls.cond, &sync_calls.lock);
	pthread_mutex_unlock(&sync_calls.lock);
	/* all into their calls, answered by nobody: libloader counts them (far
	 * less than the calls' own timeout, 60 s, when they would come back) */
	for (double end = now_s() + 30; ldr_client_calls_in_flight(c) < NSYNC && now_s() < end;)
		usleep(1000);
	if (ldr_client_calls_in_flight(c) != NSYNC)
		fprintf(stderr, "%u of %d synchronous calls in flight\n", ldr_client_calls_in_flight(c), NSYNC);
	assert(ldr_client_calls_in_flight(c) == NSYNC);
	pthread_mutex_lock(&sync_calls.lock);
	assert(sync_calls.done == 0);
	pthread_mutex_unlock(&sync_calls.lock);
	kill(daemon_pid, SIGKILL);
	assert(waitpid(daemon_pid, &status, 0) == daemon_pid);
	/* far less than the calls' own timeout (60 s) */
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += 20;
	pthread_mutex_lock(&sync_calls.lock);
	while (sync_calls.done < NSYNC &&
	       pthread_cond_timedwait(&sync_calls.cond, &sync_calls.lock, &deadline) == 0)
		;
	if (sync_calls.done != NSYNC)
		fprintf(stderr, "%d of %d synchronous calls returned\n", sync_calls.done, NSYNC);
	assert(sync_calls.done == NSYNC);
	pthread_mutex_unlock(&sync_calls.lock);
	for (int i = 0; i < NSYNC; i++) {
		assert(pthread_join(t[i], NULL) == 0);
		assert(sync_calls.result[i] == LDR_EDISCONNECTED);
	}
	/* batches already here may still come out; then a clean error */
	for (int i = 0; i < 100; i++) {
		r = ldr_next(a, 5000, &b);
		if (r != 0)
			break;
		ldr_release(b);
	}
	assert(r == LDR_EDISCONNECTED);
	assert(ldr_detach(a) == 0);
}

int main(int argc, char **argv)
{
	struct ldr_client *c;

	if (argc < 2) {
		fprintf(stderr, "usage: test-client PATH-TO-LOADERD\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	start_daemon(argv[1], "client");
	write_tokens_n(NTOK);
	assert(ldr_connect(&c, sock_path, "test-client") == 0);
	assert(ldr_client_id(c) > 0);
	test_stream_and_lifetime(c);
	test_described(c);
	test_timeout_and_errors(c);
	test_hoarding(c);
	test_opts_size(c);
	test_elastic(c);
	test_refused_release(c);
	test_fork(c);
	test_signals(c);
	test_daemon_restart(c, argv[1]);
	test_daemon_gone(c);
	ldr_close(c);
	unlink(token_file);
	unlink(sock_path);
	unlink(fd_path);
	rmdir(dir);
	printf("test-client: ok\n");
	return 0;
}
