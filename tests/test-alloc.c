/* SPDX-License-Identifier: MIT */
/* test-alloc - libloader and the daemon where an allocation fails
 *
 * Run with LD_PRELOAD=failalloc.so (tests/failalloc.c, a test double): a
 * failed allocation cannot be caused for real. Starts loaderd (argv[1]) on a
 * private socket.
 */
#undef NDEBUG
#include <assert.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(int argc, char **argv)
{
	struct ldr_client *c;

	if (argc < 2) {
		fprintf(stderr, "usage: test-alloc PATH-TO-LOADERD\n");
		return 2;
	}
	/* socket batch path: through the batch ring a release is no allocation anyway */
	setenv("LOADERD_RING", "0", 1);
	start_daemon(argv[1], "alloc");
	write_tokens_n(SEQ * B * NBATCHES + 1);
	assert(ldr_connect(&c, sock_path, "test-alloc") == 0);
	test_release_without_realloc(c);
	ldr_close(c);
	stop_daemon();
	printf("test-alloc: ok\n");
	return 0;
}
