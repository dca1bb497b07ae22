/* SPDX-License-Identifier: MIT */
/* bench-client - delivered bandwidth and next() latency against a live loaderd
 *
 *   bench-client --socket PATH --pipeline NAME throughput [--batches N] [--skip-epochs K]
 *                [--augment-seed S]
 *   bench-client --socket PATH --pipeline NAME latency [--calls N] [--work-us U]
 *   bench-client memcpy [--mib M]
 *
 * throughput: receive and release batches as fast as possible, touching one
 * byte per 4 KiB page of every field (so the pages are really mapped), and
 * report delivered GB/s; with --skip-epochs K, over the batches of epochs K and
 * later only (the first ones are the warm-up: worker start, first touch of
 * the slots), timed from the arrival of epoch K-1's last batch.
 * latency: time each ldr_next() call; between calls spend --work-us of busy
 * time (a trainer's step), so the pipeline runs ahead as it does in training.
 * memcpy: single-thread memcpy bandwidth of buffers far larger than the caches.
 * Output is one JSON object per run, for bench/run-core to tabulate.
 */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loader/loader.h"

static double clock_s(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double now_s(void)
{
	return clock_s(CLOCK_MONOTONIC);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static int bench_memcpy(long mib)
{
	size_t n = (size_t)mib << 20;
	char *a = malloc(n), *b = malloc(n);
	double best = 0;

	if (!a || !b)
		return 1;
	memset(a, 1, n);
	memset(b, 2, n);
	for (int rep = 0; rep < 5; rep++) {
		double t0 = now_s();
		memcpy(rep & 1 ? a : b, rep & 1 ? b : a, n);
		double gbs = (double)n / (now_s() - t0) / 1e9;
		if (gbs > best)
			best = gbs;
	}
	printf("{\"bench\":\"memcpy\",\"bytes\":%zu,\"gb_per_s\":%.3f,\"check\":%d}\n", n, best, a[n / 2] + b[n / 3]);
	free(a);
	free(b);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "pipeline", required_argument, NULL, 'p' },
		{ "batches", required_argument, NULL, 'b' },
		{ "calls", required_argument, NULL, 'n' },
		{ "work-us", required_argument, NULL, 'w' },
		{ "inflight", required_argument, NULL, 'i' },
		{ "mib", required_argument, NULL, 'm' },
		{ "skip-epochs", required_argument, NULL, 'k' },
		{ "augment-seed", required_argument, NULL, 'a' },
		{ 0 },
	};
	const char *sock = NULL, *pipeline = NULL, *what;
	long batches = -1, calls = 100000, work_us = 0, mib = 512, skip_epochs = 0;
	struct ldr_attach_opts ao = { .size = sizeof(ao), .mode = LDR_MODE_BROADCAST };
	struct ldr_client *c;
	struct ldr_attachment *a;
	int ch, r;

	while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (ch) {
		case 's': sock = optarg; break;
		case 'p': pipeline = optarg; break;
		case 'b': batches = atol(optarg); break;
		case 'n': calls = atol(optarg); break;
		case 'w': work_us = atol(optarg); break;
		case 'i': ao.inflight = (uint32_t)atoi(optarg); break;
		case 'm': mib = atol(optarg); break;
		case 'k': skip_epochs = atol(optarg); break;
		case 'a':
			ao.has_augment_seed = 1;
			ao.augment_seed = strtoull(optarg, NULL, 10);
			break;
		default:
			fprintf(stderr, "usage: bench-client [--socket P --pipeline N] throughput|latency|memcpy\n");
			return 2;
		}
	}
	if (optind >= argc) {
		fprintf(stderr, "bench-client: which bench? throughput, latency or memcpy\n");
		return 2;
	}
	what = argv[optind];
	if (strcmp(what, "memcpy") == 0)
		return bench_memcpy(mib);
	if (!pipeline) {
		fprintf(stderr, "bench-client: --pipeline is required\n");
		return 2;
	}
	if ((r = ldr_connect(&c, sock, "bench-client")) < 0) {
		fprintf(stderr, "bench-client: %s\n", ldr_client_error(NULL));
		return 1;
	}
	if ((r = ldr_attach(c, pipeline, &ao, &a)) < 0) {
		fprintf(stderr, "bench-client: attach: %s\n", ldr_client_error(c));
		return 1;
	}

	if (strcmp(what, "throughput") == 0) {
		double t0 = now_s(), t_prev = t0;
		/* the consumer thread's own CPU time (not libloader's threads), as
		 * bench/python_overhead.py compares it with the Python loader's */
		double cpu0 = clock_s(CLOCK_THREAD_CPUTIME_ID), cpu_prev = cpu0;
		double lib_cpu = 0; /* of that, in ldr_next() and ldr_release() */
		unsigned long long bytes = 0, n = 0, samples = 0;
		volatile unsigned char sink = 0;
		bool counting = skip_epochs <= 0;
		while (batches < 0 || (long)n < batches) {
			struct ldr_batch *b;
			double c0 = clock_s(CLOCK_THREAD_CPUTIME_ID), c1;
			r = ldr_next(a, 60000, &b);
			c1 = clock_s(CLOCK_THREAD_CPUTIME_ID);
			if (r == LDR_EOF)
				break;
			if (r < 0) {
				fprintf(stderr, "bench-client: next: %s\n", ldr_client_error(c));
				return 1;
			}
			if (!counting && ldr_batch_epoch(b) >= (uint64_t)skip_epochs) {
				counting = true;
				t0 = t_prev;
				cpu0 = cpu_prev;
			}
			for (int f = 0; f < ldr_batch_nfields(b); f++) {
				struct ldr_field fd;
				ldr_batch_field(b, f, &fd);
				for (size_t off = 0; off < fd.nbytes; off += 4096)
					sink ^= ((const unsigned char *)fd.data)[off];
				if (counting)
					bytes += fd.nbytes;
			}
			if (counting) {
				samples += ldr_batch_rows(b);
				n++;
			}
			double c2 = clock_s(CLOCK_THREAD_CPUTIME_ID);
			ldr_release(b);
			t_prev = now_s();
			cpu_prev = clock_s(CLOCK_THREAD_CPUTIME_ID);
			if (counting)
				lib_cpu += (c1 - c0) + (cpu_prev - c2);
		}
		double dt = now_s() - t0, cpu = cpu_prev - cpu0;
		printf("{\"bench\":\"throughput\",\"batches\":%llu,\"samples\":%llu,\"bytes\":%llu,"
		       "\"seconds\":%.4f,\"gb_per_s\":%.3f,\"samples_per_s\":%.1f,\"thread_cpu_s\":%.4f,\"lib_cpu_s\":%.4f}\n",
		       n, samples, bytes, dt, (double)bytes / dt / 1e9, (double)samples / dt, cpu, lib_cpu);
	} else if (strcmp(what, "latency") == 0) {
		double *lat = malloc(sizeof(double) * (size_t)calls);
		long got = 0;
		struct ldr_batch *prev = NULL;
		for (long i = 0; i < calls; i++) {
			struct ldr_batch *b;
			double t0 = now_s();
			r = ldr_next(a, 60000, &b);
			double t1 = now_s();
			if (r == LDR_EOF)
				break;
			if (r < 0) {
				fprintf(stderr, "bench-client: next: %s\n", ldr_client_error(c));
				return 1;
			}
			lat[got++] = (t1 - t0) * 1e6;
			if (prev)
				ldr_release(prev);
			prev = b;
			if (work_us) {
				double until = now_s() + (double)work_us * 1e-6;
				while (now_s() < until)
					;
			}
		}
		ldr_release(prev);
		qsort(lat, (size_t)got, sizeof(double), cmp_double);
		printf("{\"bench\":\"latency\",\"calls\":%ld,\"work_us\":%ld,\"p50_us\":%.2f,\"p90_us\":%.2f,"
		       "\"p99_us\":%.2f,\"max_us\":%.2f}\n", got, work_us,
		       got ? lat[got / 2] : 0, got ? lat[got * 9 / 10] : 0, got ? lat[got * 99 / 100] : 0,
		       got ? lat[got - 1] : 0);
		free(lat);
	} else {
		fprintf(stderr, "bench-client: unknown bench '%s'\n", what);
		return 2;
	}
	ldr_detach(a);
	ldr_close(c);
	return 0;
}
