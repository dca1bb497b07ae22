/* SPDX-License-Identifier: MIT */
/* test-client - libloader against the real daemon: lifetimes, fork, timeouts
 *
 * Starts loaderd (argv[1]) on a private socket and checks what the C API
 * promises: batches in order with exact contents, a batch kept after detach
 * stays mapped and unchanged, end of stream, timeouts, a handle used in a
 * forked child answers LDR_EFORKED without touching nng, writable
 * (copy-on-write) batches, a trainer holding every slot, and a clean error
 * when the daemon goes away. tests/test-keep.c checks copy-on-write and kept
 * batches in depth.
 */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loader/loader.h"
#include "test-daemon.h"

#define SEQ 16
#define NTOK (SEQ * 100 + 1)

static char tok_path[128];

static void write_tokens(void)
{
	FILE *f;
	uint16_t t;

	snprintf(tok_path, sizeof(tok_path), "%s/t.bin", dir);
	f = fopen(tok_path, "wb");
	assert(f);
	for (int i = 0; i < NTOK; i++) {
		t = (uint16_t)i;
		assert(fwrite(&t, sizeof(t), 1, f) == 1);
	}
	fclose(f);
}

static void create(struct ldr_client *c, const char *name, int batch, int epochs)
{
	char spec[512];

	snprintf(spec, sizeof(spec),
	         "{\"name\": \"%s\", \"source\": {\"kind\": \"tokens\", \"path\": \"%s\", \"seq_len\": %d},"
	         " \"batch_size\": %d, \"epochs\": %d, \"prefetch\": 4}",
	         name, tok_path, SEQ, batch, epochs);
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

static void test_timeout_and_errors(struct ldr_client *c)
{
	struct ldr_attachment *a;
	struct ldr_attach_opts o = { .mode = LDR_MODE_BROADCAST };
	struct ldr_batch *b;
	char spec[512];

	/* min_clients 2 and one client: nothing comes */
	snprintf(spec, sizeof(spec),
	         "{\"name\": \"held\", \"source\": {\"kind\": \"tokens\", \"path\": \"%s\", \"seq_len\": %d},"
	         " \"min_clients\": 2}", tok_path, SEQ);
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

static void test_daemon_gone(struct ldr_client *c)
{
	struct ldr_attachment *a;
	struct ldr_batch *b;
	int status, r;

	create(c, "gone", 5, 0);
	assert(ldr_attach(c, "gone", NULL, &a) == 0);
	assert(ldr_next(a, 10000, &b) == 0);
	ldr_release(b);
	kill(daemon_pid, SIGKILL);
	assert(waitpid(daemon_pid, &status, 0) == daemon_pid);
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
	write_tokens();
	assert(ldr_connect(&c, sock_path, "test-client") == 0);
	assert(ldr_client_id(c) > 0);
	test_stream_and_lifetime(c);
	test_timeout_and_errors(c);
	test_hoarding(c);
	test_fork(c);
	test_daemon_gone(c);
	ldr_close(c);
	unlink(tok_path);
	unlink(sock_path);
	unlink(fd_path);
	rmdir(dir);
	printf("test-client: ok\n");
	return 0;
}
