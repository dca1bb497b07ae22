/* SPDX-License-Identifier: MIT */
/* store-tool - daemon/store's client from the command line, for
 * tests/integration/test_store.py (a real S3 server and a fault proxy).
 *
 *   store-tool [-r RETRY_S] [-s STALL_S] head URL          size=N etag=E
 *   store-tool ... get URL [ETAG]                          the bytes
 *   store-tool ... range URL OFFSET LEN [ETAG]             the bytes
 *   store-tool ... list URL                                KEY<TAB>SIZE<TAB>ETAG lines
 *   store-tool ... headget URL                             HEAD, then a GET with its ETag
 *                                                          after a line on stdin
 *   store-tool ... threads N URL...                        N threads GET each URL 3 times,
 *                                                          print "URL SIZE" once per URL
 *
 * The endpoint, region and keys come from this process's environment
 * (store_config_from_env(): AWS_ENDPOINT_URL etc.), as the client's will.
 * An error: its message on stderr, exit 1.
 */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store.h"

extern char **environ;

static struct store *st;

static int fail(const char *err)
{
	fprintf(stderr, "%s\n", err);
	return 1;
}

static int print_key(void *arg, const char *key, uint64_t size, const char *etag)
{
	(void)arg;
	printf("%s\t%" PRIu64 "\t%s\n", key, size, etag);
	return 0;
}

struct job {
	const char *url;
	void *data;
	size_t size;
	int rc;
	char err[1024];
};

static void *thread_main(void *arg)
{
	struct job *jobs = arg;

	for (int round = 0; round < 3; round++) {
		for (struct job *j = jobs; j->url; j++) {
			void *d;
			size_t n;

			j->rc = store_get(st, j->url, NULL, 1 << 30, &d, &n, j->err, sizeof j->err);
			if (j->rc < 0)
				return NULL;
			if (j->data && (n != j->size || memcmp(d, j->data, n))) {
				j->rc = -EIO;
				snprintf(j->err, sizeof j->err, "%s: two GETs gave different bytes", j->url);
			}
			free(d);
		}
	}
	return NULL;
}

/* @n threads each GET every URL three times; the bytes must agree. */
static int threads(int n, char **urls, int nurls)
{
	pthread_t tid[64];
	struct job *jobs[64];
	int rc = 0;

	assert(n > 0 && n <= 64);
	for (int t = 0; t < n; t++) {
		jobs[t] = calloc((size_t)nurls + 1, sizeof **jobs);
		for (int u = 0; u < nurls; u++)
			jobs[t][u].url = urls[u];
	}
	/* the reference bytes: one GET each, before the threads */
	for (int u = 0; u < nurls; u++) {
		char err[1024];
		void *d;
		size_t sz;

		if (store_get(st, urls[u], NULL, 1 << 30, &d, &sz, err, sizeof err) < 0) {
			rc = fail(err);
			d = NULL;
			sz = 0;
		}
		for (int t = 0; t < n; t++) {
			jobs[t][u].data = d;
			jobs[t][u].size = sz;
		}
	}
	for (int t = 0; t < n && rc == 0; t++)
		assert(!pthread_create(&tid[t], NULL, thread_main, jobs[t]));
	for (int t = 0; t < n && rc == 0; t++)
		pthread_join(tid[t], NULL);
	for (int t = 0; t < n && rc == 0; t++)
		for (int u = 0; u < nurls && rc == 0; u++)
			if (jobs[t][u].rc < 0)
				rc = fail(jobs[t][u].err);
	for (int u = 0; u < nurls && rc == 0; u++)
		printf("%s %zu\n", urls[u], jobs[0][u].size);
	for (int u = 0; u < nurls; u++)
		free(jobs[0][u].data);
	for (int t = 0; t < n; t++)
		free(jobs[t]);
	return rc;
}

/* One command of the tool on the store @st: 0, or 1 with the error printed. */
static int command(int argc, char **argv)
{
	struct store_object obj;
	char err[2048];

	if (!strcmp(argv[0], "head")) {
		if (store_head(st, argv[1], &obj, err, sizeof err) < 0)
			return fail(err);
		printf("size=%" PRIu64 " etag=%s\n", obj.size, obj.etag);
	} else if (!strcmp(argv[0], "get")) {
		void *d;
		size_t n;

		if (store_get(st, argv[1], argc > 2 ? argv[2] : NULL, 1 << 30, &d, &n, err, sizeof err) < 0)
			return fail(err);
		fwrite(d, 1, n, stdout);
		free(d);
	} else if (!strcmp(argv[0], "range") && argc >= 4) {
		size_t len = strtoull(argv[3], NULL, 10);
		char *buf = malloc(len ? len : 1);
		int r = store_get_range(st, argv[1], argc > 4 ? argv[4] : NULL, strtoull(argv[2], NULL, 10), len,
					buf, err, sizeof err);

		if (r == 0)
			fwrite(buf, 1, len, stdout);
		free(buf);
		if (r < 0)
			return fail(err);
	} else if (!strcmp(argv[0], "list")) {
		if (store_list(st, argv[1], print_key, NULL, err, sizeof err) < 0)
			return fail(err);
	} else if (!strcmp(argv[0], "headget")) {
		char line[64];
		void *d;
		size_t n;

		if (store_head(st, argv[1], &obj, err, sizeof err) < 0)
			return fail(err);
		printf("etag=%s\n", obj.etag);
		fflush(stdout);
		if (!fgets(line, sizeof line, stdin))
			return fail("store-tool: no line on stdin");
		if (store_get(st, argv[1], obj.etag, 1 << 30, &d, &n, err, sizeof err) < 0)
			return fail(err);
		fwrite(d, 1, n, stdout);
		free(d);
	} else if (!strcmp(argv[0], "threads") && argc >= 3) {
		return threads(atoi(argv[1]), argv + 2, argc - 2);
	} else {
		return fail("store-tool: unknown command");
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct store_config cfg;
	char err[2048];
	int opt, rc;

	store_config_init(&cfg);
	if (store_config_from_env(&cfg, (const char *const *)environ, err, sizeof err) < 0)
		return fail(err);
	while ((opt = getopt(argc, argv, "+r:s:")) != -1) {
		if (opt == 'r')
			cfg.retry_seconds = atof(optarg);
		else if (opt == 's')
			cfg.stall_seconds = atof(optarg);
		else
			return 2;
	}
	argc -= optind;
	argv += optind;
	if (argc < 2)
		return fail("usage: store-tool [-r S] [-s S] head|get|range|list|headget|threads ...");
	if (store_new(&st, &cfg, err, sizeof err) < 0)
		return fail(err);
	rc = command(argc, argv);
	store_free(st);
	return rc;
}
