/* SPDX-License-Identifier: MIT */
/* test-alloc - libloader and the daemon where an allocation fails
 *
 * With test doubles, since a failed allocation cannot be caused for real:
 * LD_PRELOAD=failalloc.so (tests/integration-c/failalloc.c) for libloader,
 * and loaderd built with tests/integration-c/failevents.c (argv[2]) for the
 * daemon's pipe events.
 * Starts loaderd (argv[1]) on a private socket, then argv[2].
 */
#undef NDEBUG
#include <assert.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loader/loader.h"
#include "test-daemon.h"

#define SEQ 8
#define B 4
#define NBATCHES 300

/* Releases need no allocation once attached: with every realloc of
 * libloader failing, a trainer still gets all its batches, which it could
 * not once the daemon ran out of slots that were never given back. */
static void test_release_without_realloc(struct ldr_client *c)
{
	void (*failalloc_set)(bool) = (void (*)(bool))dlsym(RTLD_DEFAULT, "failalloc_set");
	struct ldr_attachment *a;
	struct ldr_batch *b;
	char spec[512];
	int n = 0, r;

	assert(failalloc_set); /* LD_PRELOAD=failalloc.so */
	snprintf(spec, sizeof(spec), "{\"name\": \"rel\", \"source\": {\"kind\": \"tokens\", \"path\": \"%s\","
	         " \"seq_len\": %d}, \"batch_size\": %d, \"epochs\": 1, \"prefetch\": 4}", token_file, SEQ, B);
	assert(ldr_create_pipeline(c, spec, 0, NULL, 0) == 1);
	assert(ldr_attach(c, "rel", NULL, &a) == 0);
	failalloc_set(true);
	while ((r = ldr_next(a, 20000, &b)) == 0) {
		n++;
		ldr_release(b);
	}
	failalloc_set(false);
	if (r != LDR_EOF || n != NBATCHES) {
		fprintf(stderr, "test-alloc: %d batches, then %d (%s)\n", n, r, ldr_client_error(c));
		abort();
	}
	assert(ldr_detach(a) == 0);
}

/* Every disconnect event is lost (argv[2]): a client that closes is
 * released by the sweep all the same, with its attachment and leases. */
static void test_lost_disconnect(void)
{
	struct ldr_client *gone, *c;
	struct ldr_attachment *a;
	struct ldr_batch *b;
	char spec[512], pat[64];
	char *json = NULL;
	bool listed = true;

	snprintf(spec, sizeof(spec), "{\"name\": \"lost\", \"source\": {\"kind\": \"tokens\", \"path\": \"%s\","
	         " \"seq_len\": %d}, \"batch_size\": %d, \"persist\": true}", token_file, SEQ, B);
	assert(ldr_connect(&gone, sock_path, "test-alloc-gone") == 0);
	assert(ldr_create_pipeline(gone, spec, 0, NULL, 0) == 1);
	assert(ldr_attach(gone, "lost", NULL, &a) == 0);
	assert(ldr_next(a, 20000, &b) == 0); /* held when it goes */
	snprintf(pat, sizeof(pat), "{\"id\":%" PRIu64 ",\"pid\"", ldr_client_id(gone));
	assert(ldr_connect(&c, sock_path, "test-alloc") == 0);
	assert(ldr_status_json(c, &json) == 0 && strstr(json, pat));
	ldr_free(json);
	ldr_close(gone); /* its batch and attachment go with it */
	for (int i = 0; i < 300 && listed; i++) {
		struct timespec ts = { 0, 100 * 1000 * 1000 };
		assert(ldr_status_json(c, &json) == 0);
		listed = strstr(json, pat) != NULL;
		if (!listed && !strstr(json, "\"slots_leased\":0,")) {
			fprintf(stderr, "test-alloc: client gone, its lease not: %s\n", json);
			abort();
		}
		ldr_free(json);
		if (listed)
			nanosleep(&ts, NULL);
	}
	if (listed) {
		fprintf(stderr, "test-alloc: client %s still listed after 30 s\n", pat);
		abort();
	}
	ldr_close(c);
}

int main(int argc, char **argv)
{
	struct ldr_client *c;

	if (argc < 3) {
		fprintf(stderr, "usage: test-alloc PATH-TO-LOADERD PATH-TO-LOADERD-FAILEVENTS\n");
		return 2;
	}
	/* socket batch path: through the batch ring a release is no allocation anyway */
	setenv("LOADERD_RING", "0", 1);
	start_daemon(argv[1], "alloc");
	write_tokens_n(SEQ * B * NBATCHES + 1);
	assert(ldr_connect(&c, sock_path, "test-alloc") == 0);
	test_release_without_realloc(c);
	ldr_close(c);
	unlink(token_file);
	stop_daemon();
	start_daemon(argv[2], "alloc-events");
	write_tokens_n(SEQ * B * NBATCHES + 1);
	test_lost_disconnect();
	unlink(token_file);
	stop_daemon();
	printf("test-alloc: ok\n");
	return 0;
}
