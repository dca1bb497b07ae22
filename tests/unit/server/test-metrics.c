/* SPDX-License-Identifier: MIT */
/* test-metrics - metrics_text() over a status JSON of docs/protocol.md's
 * shape (with stall accounting), and metrics_parse_address() */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "metrics.h"

static const char status_text[] =
	"{\"version\": \"9.8.7\", \"protocol\": 2, \"uptime_s\": 12, \"workers\": 4,"
	" \"memory_limit\": 1000, \"memory_used\": 600, \"memory_held_after_drop\": 0,"
	" \"clients_released_by_sweep\": 1, \"probes_released_by_sweep\": 2,"
	" \"nng_fds_closed_by_sweep\": 3,"
	" \"pipelines\": ["
	"  {\"name\": \"tok\", \"state\": \"running\", \"slots_total\": 8, \"slots_in_use\": 5,"
	"   \"slots_leased\": 2, \"slot_bytes\": 4096, \"samples\": 100, \"batch_size\": 10,"
	"   \"batches_per_epoch\": 10, \"clients\": 1, \"batches_produced\": 7,"
	"   \"batches_reclaimed\": 0, \"skipped\": 0, \"backpressure_ms\": 1500,"
	"   \"slow_clients_detached\": 0,"
	"   \"stats\": {\"batches_total\": 7, \"samples_total\": 70, \"bytes_total\": 28672,"
	"    \"worker_seconds_total\": 0.5, \"workers_busy\": 0.25, \"workers\": 4, \"jobs\": 1,"
	"    \"stage_seconds_total\": {\"read\": 0.125, \"decode\": 0, \"transform\": 0, \"collate\": 0.375},"
	"    \"slots_ready\": 3, \"slots_leased\": 2, \"slots_free\": 2,"
	"    \"errors_total\": 0, \"skipped_total\": 0, \"limited_by\": \"workers\"}},"
	"  {\"name\": \"private\", \"owner\": {\"uid\": 5}}"
	" ],"
	" \"clients\": ["
	"  {\"id\": 3, \"pid\": 99, \"uid\": 1000, \"name\": \"tr\\\"ain\\\\er\\n\","
	"   \"attachments\": [{\"id\": 1, \"pipeline\": \"tok\", \"mode\": \"broadcast\","
	"    \"leases\": 2, \"delivered\": 5, \"pending\": 1,"
	"    \"stats\": {\"batches_total\": 5, \"samples_total\": 50, \"bytes_total\": 20480,"
	"     \"wait_fraction\": 0.75, \"wait_seconds_total\": 0.003, \"compute_seconds_total\": 0.001,"
	"     \"next_calls_total\": 6, \"lag_batches\": 0, \"starving\": true, \"bad_reports\": 0,"
	"     \"wait_histogram\": {\"le\": [0.001, 0.01, 1], \"counts\": [2, 0, 3, 1],"
	"      \"sum_s\": 12.5, \"count\": 6}}}]},"
	"  {\"id\": 4, \"pid\": 98, \"uid\": 1001, \"name\": \"idle\", \"attachments\": []}"
	" ]}";

static void expect_line(const char *text, const char *line)
{
	const char *p = text;
	size_t n = strlen(line);

	for (; (p = strstr(p, line)); p += n)
		if ((p == text || p[-1] == '\n') && p[n] == '\n')
			return;
	fprintf(stderr, "missing line: %s\n--- text:\n%s", line, text);
	abort();
}

/* the client of status_text's labels */
#define CL "pipeline=\"tok\",client=\"3\",client_name=\"tr\\\"ain\\\\er\\n\",uid=\"1000\",attachment=\"1\""

/* its histogram: counts 2, 0, 3, 1 made cumulative, +Inf equal to _count */
static void expect_buckets(const char *t)
{
	expect_line(t, "loaderd_client_wait_seconds_bucket{" CL ",le=\"0.001\"} 2");
	expect_line(t, "loaderd_client_wait_seconds_bucket{" CL ",le=\"0.01\"} 2");
	expect_line(t, "loaderd_client_wait_seconds_bucket{" CL ",le=\"1\"} 5");
	expect_line(t, "loaderd_client_wait_seconds_bucket{" CL ",le=\"+Inf\"} 6");
	expect_line(t, "loaderd_client_wait_seconds_count{" CL "} 6");
}

static void test_text(void)
{
	json_error_t jerr;
	json_t *st = json_loads(status_text, 0, &jerr);
	size_t len;
	char *t;

	assert(st);
	t = metrics_text(st, &len);
	assert(t && strlen(t) == len);
	expect_line(t, "loaderd_build_info{version=\"9.8.7\",protocol=\"2\"} 1");
	expect_line(t, "# TYPE loaderd_build_info gauge");
	expect_line(t, "loaderd_clients 2");
	expect_line(t, "loaderd_sweep_released_total{what=\"nng_fds\"} 3");
	expect_line(t, "loaderd_pipeline_state{pipeline=\"tok\",state=\"running\"} 1");
	expect_line(t, "loaderd_pipeline_state{pipeline=\"tok\",state=\"done\"} 0");
	/* slots from the stats; filling is the rest */
	expect_line(t, "loaderd_pipeline_slots{pipeline=\"tok\",state=\"ready\"} 3");
	expect_line(t, "loaderd_pipeline_slots{pipeline=\"tok\",state=\"leased\"} 2");
	expect_line(t, "loaderd_pipeline_slots{pipeline=\"tok\",state=\"free\"} 2");
	expect_line(t, "loaderd_pipeline_slots{pipeline=\"tok\",state=\"filling\"} 1");
	expect_line(t, "loaderd_pipeline_backpressure_seconds_total{pipeline=\"tok\"} 1.5");
	expect_line(t, "loaderd_pipeline_samples_total{pipeline=\"tok\"} 70");
	expect_line(t, "loaderd_pipeline_workers_busy_ratio{pipeline=\"tok\"} 0.25");
	expect_line(t, "loaderd_pipeline_workers{pipeline=\"tok\"} 4");
	expect_line(t, "loaderd_pipeline_stage_seconds_total{pipeline=\"tok\",stage=\"collate\"} 0.375");
	expect_line(t, "loaderd_pipeline_limited_by{pipeline=\"tok\",reason=\"workers\"} 1");
	expect_line(t, "loaderd_pipeline_limited_by{pipeline=\"tok\",reason=\"consumers\"} 0");
	expect_line(t, "# TYPE loaderd_client_wait_seconds histogram");
	/* a pipeline the status only names has no series */
	assert(!strstr(t, "pipeline=\"private\""));

	expect_line(t, "loaderd_client_batches_total{" CL "} 5");
	expect_line(t, "loaderd_client_leases{" CL "} 2");
	expect_line(t, "loaderd_client_pending_requests{" CL "} 1");
	expect_line(t, "loaderd_client_starving{" CL "} 1");
	expect_line(t, "loaderd_client_bad_reports_total{" CL "} 0");
	expect_line(t, "loaderd_client_wait_ratio{" CL "} 0.75");
	expect_buckets(t);
	expect_line(t, "loaderd_client_wait_seconds_sum{" CL "} 12.5");
	free(t);

	/* before the stall accounting: the totals the status has anyway */
	json_object_del(json_array_get(json_object_get(st, "pipelines"), 0), "stats");
	t = metrics_text(st, &len);
	assert(t);
	expect_line(t, "loaderd_pipeline_batches_total{pipeline=\"tok\"} 7");
	expect_line(t, "loaderd_pipeline_slots{pipeline=\"tok\",state=\"ready\"} 3");
	expect_line(t, "loaderd_pipeline_slots{pipeline=\"tok\",state=\"free\"} 3");
	expect_line(t, "loaderd_pipeline_slots{pipeline=\"tok\",state=\"filling\"} 0");
	assert(!strstr(t, "loaderd_pipeline_limited_by{"));
	free(t);
	json_decref(st);
}

/* A reload replaced "tok" (generation 0) while a client still reads it: the
 * successor (generation 1) has its name, and every series of the two differs
 * by the generation label. */
static const char replaced_text[] =
	"{\"version\": \"1\", \"protocol\": 2, \"pipelines\": ["
	"  {\"name\": \"tok\", \"generation\": 1, \"state\": \"running\", \"clients\": 0,"
	"   \"batches_produced\": 2},"
	"  {\"name\": \"tok\", \"generation\": 0, \"state\": \"replaced\", \"clients\": 1,"
	"   \"batches_produced\": 9},"
	"  {\"name\": \"gone\", \"generation\": 0, \"state\": \"draining\", \"clients\": 1}"
	" ], \"clients\": []}";

static void test_replaced(void)
{
	json_t *st = json_loads(replaced_text, 0, NULL);
	size_t len;
	char *t;

	assert(st);
	t = metrics_text(st, &len);
	assert(t);
	expect_line(t, "loaderd_pipeline_batches_total{pipeline=\"tok\",generation=\"1\"} 2");
	expect_line(t, "loaderd_pipeline_batches_total{pipeline=\"tok\",generation=\"0\"} 9");
	expect_line(t, "loaderd_pipeline_clients{pipeline=\"tok\",generation=\"0\"} 1");
	expect_line(t, "loaderd_pipeline_state{pipeline=\"tok\",generation=\"0\",state=\"replaced\"} 1");
	expect_line(t, "loaderd_pipeline_state{pipeline=\"tok\",generation=\"0\",state=\"running\"} 0");
	expect_line(t, "loaderd_pipeline_state{pipeline=\"tok\",generation=\"1\",state=\"running\"} 1");
	expect_line(t, "loaderd_pipeline_state{pipeline=\"tok\",generation=\"1\",state=\"replaced\"} 0");
	expect_line(t, "loaderd_pipeline_state{pipeline=\"gone\",generation=\"0\",state=\"draining\"} 1");
	free(t);
	json_decref(st);
}

/* A counter that would render negative is left out; a histogram's negative
 * bucket counts count as none, so its buckets still only rise. */
static void test_negative_counters(void)
{
	json_t *st = json_loads(status_text, 0, NULL);
	json_t *pl, *pst, *ast, *h;
	size_t len;
	char *t;

	assert(st);
	pl = json_array_get(json_object_get(st, "pipelines"), 0);
	pst = json_object_get(pl, "stats");
	ast = json_object_get(json_array_get(json_object_get(json_array_get(
		json_object_get(st, "clients"), 0), "attachments"), 0), "stats");
	h = json_object_get(ast, "wait_histogram");
	json_object_set_new(pst, "samples_total", json_integer(-70));
	json_object_set_new(json_object_get(pst, "stage_seconds_total"), "read", json_real(-0.5));
	json_object_set_new(pl, "backpressure_ms", json_integer(-3));
	json_object_set_new(ast, "compute_seconds_total", json_real(-1.25));
	json_object_set_new(ast, "next_calls_total", json_integer(-6));
	json_object_set_new(st, "probes_released_by_sweep", json_integer(-2));
	json_object_set_new(h, "counts", json_pack("[i, i, i, i]", 2, -5, 3, 1));
	json_object_set_new(h, "sum_s", json_real(-12.5));
	t = metrics_text(st, &len);
	assert(t);
	assert(!strstr(t, "loaderd_pipeline_samples_total{"));
	assert(!strstr(t, "stage=\"read\""));
	assert(!strstr(t, "loaderd_pipeline_backpressure_seconds_total{"));
	assert(!strstr(t, "loaderd_client_compute_seconds_total{"));
	assert(!strstr(t, "loaderd_client_next_calls_total{"));
	assert(!strstr(t, "what=\"probes\""));
	assert(!strstr(t, "} -"));
	expect_line(t, "# TYPE loaderd_pipeline_samples_total counter");
	expect_line(t, "loaderd_pipeline_stage_seconds_total{pipeline=\"tok\",stage=\"collate\"} 0.375");
	expect_line(t, "loaderd_sweep_released_total{what=\"nng_fds\"} 3");
	expect_buckets(t);
	expect_line(t, "loaderd_client_wait_seconds_sum{" CL "} 0");
	free(t);
	json_decref(st);
}

static void expect_addr_error(const char *text, const char *needle)
{
	struct metrics_addr a;
	char err[512] = "";

	if (metrics_parse_address(text, &a, err, sizeof(err)) != -EINVAL || !strstr(err, needle)) {
		fprintf(stderr, "%s: want an error with \"%s\", got \"%s\"\n", text, needle, err);
		abort();
	}
}

static void test_addresses(void)
{
	struct metrics_addr a;
	char err[512];

	assert(metrics_parse_address("127.0.0.1:9464", &a, err, sizeof(err)) == 0);
	assert(!a.is_unix && strcmp(a.host, "127.0.0.1") == 0 && strcmp(a.port, "9464") == 0);
	assert(metrics_parse_address("[::1]:80", &a, err, sizeof(err)) == 0);
	assert(!a.is_unix && strcmp(a.host, "::1") == 0 && strcmp(a.port, "80") == 0);
	assert(metrics_parse_address("localhost:65535", &a, err, sizeof(err)) == 0);
	assert(metrics_parse_address("/run/loaderd/m.sock", &a, err, sizeof(err)) == 0);
	assert(a.is_unix && strcmp(a.path, "/run/loaderd/m.sock") == 0);
	{
		char path[110];
		memset(path, 'x', sizeof(path));
		path[0] = '/';
		path[103] = '\0';
		assert(metrics_parse_address(path, &a, err, sizeof(err)) == 0);
		path[103] = 'x';
		path[104] = '\0';
		expect_addr_error(path, "socket path too long (most 103 bytes)");
	}
	expect_addr_error("127.0.0.1", "no port");
	expect_addr_error("127.0.0.1:", "the port must be a number in 1..65535");
	expect_addr_error("127.0.0.1:+80", "the port must be a number in 1..65535");
	expect_addr_error("127.0.0.1:65536", "the port must be a number in 1..65535");
	expect_addr_error(":80", "no host");
	expect_addr_error("[]:80", "no host");
	expect_addr_error("fe80::1:80", "an IPv6 address goes in brackets");
	expect_addr_error("[::1]80", "an IPv6 address needs the form [ADDR]:PORT");

	/* the syntax only: resolving is metrics_resolve_address()'s (and the
	 * start's), never a reload's */
	assert(metrics_parse_address("no-such-host.invalid:9464", &a, err, sizeof(err)) == 0);
	assert(metrics_resolve_address(&a, err, sizeof(err)) == -EINVAL);
	assert(strstr(err, "\"no-such-host.invalid:9464\": host no-such-host.invalid: "));
	assert(metrics_parse_address("127.0.0.1:9464", &a, err, sizeof(err)) == 0);
	assert(metrics_resolve_address(&a, err, sizeof(err)) == 0);
	assert(metrics_parse_address("/run/m.sock", &a, err, sizeof(err)) == 0);
	assert(metrics_resolve_address(&a, err, sizeof(err)) == 0);
}

int main(void)
{
	test_text();
	test_replaced();
	test_negative_counters();
#if HAVE_MICROHTTPD
	test_addresses();
#endif
	printf("ok\n");
	return 0;
}
