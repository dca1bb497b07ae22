/* SPDX-License-Identifier: MIT */
/* test-sched - the engine's slot sharing (sched.c), driven without a socket
 *
 * A real engine on a libuv loop, with a tokens source whose token i is i, so
 * a batch's contents name its place in the stream; the deliver op records
 * every answer. The rule under test is docs/protocol.md's "Sharing slots":
 * quotas per active stream, shares per attachment, reclaim, revoke/return.
 */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "loader/loader.h"
#include "engine.h"
#include "source.h"
#include "spec.h"

#define NTOK 4096
#define SEQ 16  /* tokens per sample: samples are seq_len 16, no shuffle */

/* One request as the server would hold it, and what answered it. */
struct req {
	struct pending p;
	bool answered;
	enum delivery_kind kind;
	uint32_t n;
	struct delivered_batch b[DELIVER_MAX_BATCHES];
	uint32_t share;
	uint64_t upto;
	uint32_t count;
	int err;
};

static uv_loop_t loop;
static struct engine *eng;
/* per process: the ASan, TSan and plain builds' suites may run at once on
 * one machine, and one's unlink must not pull the file from under another */
static char tok_path[64];
static struct principal daemon_self; /* principal_daemon() in main */

static void on_deliver(void *userdata, struct pending *p, const struct delivery *d)
{
	struct req *r = (struct req *)p;

	(void)userdata;
	assert(!r->answered);
	r->answered = true;
	r->kind = d->kind;
	r->n = d->kind == DELIVER_BATCH ? d->nbatches : 0;
	if (r->n)
		memcpy(r->b, d->batches, r->n * sizeof(r->b[0]));
	r->share = d->share;
	r->upto = d->upto_seq;
	r->count = d->count;
	r->err = d->err;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Run the loop until @r is answered (the workers complete on it). A deadline
 * in time, not in turns: the worker threads may get little CPU on a loaded
 * machine under a sanitizer. */
static void wait_answer(struct req *r)
{
	double end = now_s() + 60;

	while (!r->answered && now_s() < end) {
		uv_run(&loop, UV_RUN_NOWAIT);
		usleep(100);
	}
	assert(r->answered);
}

/* Pipeline @name's "batches_produced" in status. */
static json_int_t produced(const char *name)
{
	json_t *arr = engine_pipelines_json(eng, &daemon_self), *pl;
	json_int_t n = -1;
	size_t i;

	json_array_foreach(arr, i, pl)
		if (strcmp(json_string_value(json_object_get(pl, "name")), name) == 0)
			n = json_integer_value(json_object_get(pl, "batches_produced"));
	json_decref(arr);
	return n;
}

/* Run the loop a while after a test drops its pipeline (what its workers
 * still build finishes): no check depends on it, each waits for its state. */
static void settle(void)
{
	for (int i = 0; i < 300; i++) {
		uv_run(&loop, UV_RUN_NOWAIT);
		usleep(200);
	}
}

static struct attachment *attach(const char *name, int mode, uint32_t rank, uint32_t world)
{
	struct attach_params p = { .mode = mode, .rank = rank, .world = world, .credits = 8 };
	struct attachment *a;
	char err[512];
	int r = engine_attach(eng, name, &p, &a, err, sizeof(err));

	if (r < 0)
		fprintf(stderr, "attach: %s\n", err);
	assert(r == 0);
	return a;
}

static int next(struct attachment *a, struct req *r, uint32_t max, const uint64_t *rel, size_t nrel)
{
	char err[256];

	memset(r, 0, sizeof(*r));
	r->p.max = max;
	return attachment_next(a, &r->p, &(struct next_req){ .releases = rel, .nreleases = nrel }, err,
	                       sizeof(err));
}

static int watch(struct attachment *a, struct req *r, bool has_return, uint64_t from,
                 const uint64_t *ret, size_t nret, char *err)
{
	memset(r, 0, sizeof(*r));
	return attachment_next(a, &r->p, &(struct next_req){ .watch = true, .has_return = has_return,
		.return_from = from, .returned = ret, .nreturned = nret }, err, 256);
}

static void create(const char *name, uint32_t prefetch)
{
	char text[512], err[512];
	struct spec *spec;

	snprintf(text, sizeof(text),
	         "{\"name\": \"%s\", \"source\": {\"kind\": \"tokens\", \"path\": \"%s\","
	         " \"dtype\": \"uint16\", \"seq_len\": %d}, \"batch_size\": 2, \"prefetch\": %u,"
	         " \"shuffle\": false, \"epochs\": 0}", name, tok_path, SEQ, prefetch);
	assert(spec_parse(&spec, text, err, sizeof(err)) == 0);
	assert(engine_create(eng, spec, &daemon_self, 0, false, err, sizeof(err)) == 1);
}

static uint32_t status_share(struct attachment *a)
{
	json_t *o = attachment_json(a);
	uint32_t s = (uint32_t)json_integer_value(json_object_get(o, "share"));

	json_decref(o);
	return s;
}

/*
 * Two partition ranks: rank 1 attaches first and its window takes every slot
 * it may (its share is all 8); then rank 0 attaches. Rank 1 is sent a Revoke
 * (share 4), hands back its untaken deliveries, rank 0 gets batches at once,
 * and rank 1 gets the handed-back batches again, in order, the same ones.
 */
static void test_revoke_partition(void)
{
	struct attachment *r1, *r0;
	struct req w, n1[8], n0, again;
	char err[256] = "";
	uint64_t taken = 0, dno = 0, lease0;

	create("rv", 8);
	r1 = attach("rv", LDR_MODE_PARTITION, 1, 2);
	assert(watch(r1, &w, false, 0, NULL, 0, err) == 0);
	for (int i = 0; i < 8; i++)
		assert(next(r1, &n1[i], 1, NULL, 0) == 0);
	for (int i = 0; i < 8; i++) {
		wait_answer(&n1[i]);
		assert(n1[i].kind == DELIVER_BATCH && n1[i].n == 1 && n1[i].share == 8);
		assert(n1[i].b[0].seq == dno++ && n1[i].b[0].index == (uint64_t)i);
	}
	assert(attachment_leases(r1) == 8);
	lease0 = n1[0].b[0].lease;  /* the trainer took delivery 0, not 1..7 */
	taken = 1;

	r0 = attach("rv", LDR_MODE_PARTITION, 0, 2);
	assert(next(r0, &n0, 1, NULL, 0) == 0);
	wait_answer(&w);
	/* no slot free: rank 1 holds all 8 until it hands some back, below */
	assert(!n0.answered);
	assert(w.kind == DELIVER_REVOKE);
	assert(w.share == 4 && w.upto == 8 && w.count == 4);
	assert(status_share(r1) == 4 && status_share(r0) == 4);

	/* a return that is not a suffix of the deliveries is refused */
	uint64_t bad[2] = { n1[2].b[0].lease, n1[3].b[0].lease };
	assert(watch(r1, &w, true, 6, bad, 2, err) == -EPROTO);
	assert(strstr(err, "is not delivery 6") != NULL);
	/* that ended the revoke and parked no watch; the next watch gets it again */
	struct req w2;
	uint64_t ret[7];
	for (int i = 0; i < 7; i++)
		ret[i] = n1[1 + i].b[0].lease;
	assert(watch(r1, &w2, false, 0, NULL, 0, err) == 0);
	wait_answer(&w2);
	assert(w2.kind == DELIVER_REVOKE && w2.upto == 8);
	assert(watch(r1, &w, true, 8 - 7, ret, 7, err) == 0);
	assert(attachment_leases(r1) == taken);
	wait_answer(&n0);
	assert(n0.kind == DELIVER_BATCH && n0.b[0].index == 0 && n0.b[0].seq == 0);

	/* rank 1's next deliveries start at delivery 1 again, with the same batches */
	uint64_t rel[1] = { lease0 };
	assert(next(r1, &again, 7, rel, 1) == 0);
	wait_answer(&again);
	assert(again.kind == DELIVER_BATCH && again.n >= 1);
	for (uint32_t i = 0; i < again.n; i++) {
		assert(again.b[i].seq == 1 + i);
		assert(again.b[i].index == 1 + i);
	}
	assert(again.n <= 4);        /* its share now */
	attachment_detach(r0);
	attachment_detach(r1);
	assert(w.answered && w.kind == DELIVER_ERROR); /* the parked watch ends with the detach */
	assert(engine_drop(eng, "rv", &daemon_self, true, err, sizeof(err)) == 0);
	settle();
}

/*
 * Reclaim: a broadcast stream nobody is slow on filled all 8 slots ahead of
 * its one client (ready, not delivered); a partition rank attaches: it gets
 * its quota from the broadcast stream's newest batches, and the broadcast
 * client later gets those very batches (rebuilt), in order.
 */
static void test_reclaim(void)
{
	struct attachment *bc, *pt;
	struct req nb, np;
	char err[256];
	uint64_t rel = 0;

	struct attach_info info;
	const uint8_t *base;
	uint64_t size, dsize;
	int fd, dfd, rfd, refd;

	create("rc", 8);
	bc = attach("rc", LDR_MODE_BROADCAST, 0, 1);
	attachment_get_info(bc, &info);
	assert(strcmp(info.fields[0].name, "input") == 0 && info.fields[0].dtype == LDR_DTYPE_INT64);
	assert(engine_take_token(eng, info.token, getuid(), getpid(), &fd, &size, &dfd, &dsize, &rfd,
	                         &refd) == 0);
	base = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
	assert(base != MAP_FAILED);
	/* 8 batches built ahead, none asked for: waited for (a settle() may end
	 * before the workers have built them all on a loaded machine, and then
	 * nothing would be reclaimed) */
	double end = now_s() + 60;
	while (produced("rc") < 8 && now_s() < end) {
		uv_run(&loop, UV_RUN_NOWAIT);
		usleep(100);
	}
	assert(produced("rc") >= 8); /* counted as each is ready, on the loop (job_done()) */
	pt = attach("rc", LDR_MODE_PARTITION, 0, 1);
	assert(next(pt, &np, 4, NULL, 0) == 0);
	wait_answer(&np);
	assert(np.kind == DELIVER_BATCH && np.b[0].index == 0);
	for (uint64_t i = 0; i < 40; i++) {
		assert(next(bc, &nb, 1, rel ? &rel : NULL, rel ? 1 : 0) == 0);
		wait_answer(&nb);
		assert(nb.kind == DELIVER_BATCH && nb.n == 1);
		assert(nb.b[0].index == i && nb.b[0].seq == i);
		/* the same bytes whether built once or reclaimed and built again */
		const int64_t *in = (const int64_t *)(base + nb.b[0].slot * info.slot_bytes +
		                                      info.field_offsets[0]);
		for (int r = 0; r < 2; r++)
			for (int j = 0; j < SEQ; j++)
				assert(in[r * SEQ + j] == (int64_t)((i * 2 + r) * SEQ + j));
		rel = nb.b[0].lease;
	}
	munmap((void *)base, size);
	attachment_detach(pt);
	attachment_detach(bc);
	assert(engine_drop(eng, "rc", &daemon_self, true, err, sizeof(err)) == 0);
	settle();
}

/*
 * Dynamic returns nobody reads: client A's window holds 6 batches, B
 * attaches, A hands 5 back (they wait on the dynamic stream for whoever asks),
 * then both leave. A partition rank that comes later must still get every
 * slot of the pipeline: the orphaned returns give theirs up.
 */
static void test_orphan_returns(void)
{
	struct attachment *da, *db, *pt;
	struct req w, n[6], np[8];
	char err[256] = "";
	uint64_t ret[5];

	create("orph", 8);
	da = attach("orph", LDR_MODE_DYNAMIC, 0, 1);
	assert(watch(da, &w, false, 0, NULL, 0, err) == 0);
	for (int i = 0; i < 6; i++)
		assert(next(da, &n[i], 1, NULL, 0) == 0);
	for (int i = 0; i < 6; i++) {
		wait_answer(&n[i]);
		assert(n[i].kind == DELIVER_BATCH && n[i].n == 1);
	}
	db = attach("orph", LDR_MODE_DYNAMIC, 0, 1);
	wait_answer(&w);
	assert(w.kind == DELIVER_REVOKE && w.share == 4 && w.upto == 6);
	for (int i = 0; i < 5; i++)
		ret[i] = n[1 + i].b[0].lease;
	assert(watch(da, &w, true, 1, ret, 5, err) == 0);
	attachment_detach(da);
	attachment_detach(db);

	/* each of its nexts waits until a slot is there for it */
	pt = attach("orph", LDR_MODE_PARTITION, 0, 1);
	for (int i = 0; i < 8; i++) {
		assert(next(pt, &np[i], 1, NULL, 0) == 0);
		wait_answer(&np[i]);
		assert(np[i].kind == DELIVER_BATCH && np[i].b[0].index == (uint64_t)i);
	}
	assert(attachment_leases(pt) == 8);
	attachment_detach(pt);
	assert(engine_drop(eng, "orph", &daemon_self, true, err, sizeof(err)) == 0);
	settle();
}

/* One stream per slot at most: the attach after that is refused, by name. */
static void test_streams_above_slots_refused(void)
{
	struct attachment *a[4], *x;
	struct attach_params p = { .mode = LDR_MODE_PARTITION, .world = 5, .credits = 2 };
	char err[512];

	create("few", 4);
	for (uint32_t i = 0; i < 4; i++)
		a[i] = attach("few", LDR_MODE_PARTITION, i, 5);
	p.rank = 4;
	assert(engine_attach(eng, "few", &p, &x, err, sizeof(err)) == -ENOSPC);
	assert(strstr(err, "has 4 slots and 4 streams") && strstr(err, "prefetch of at least 5"));
	for (int i = 0; i < 4; i++)
		attachment_detach(a[i]);
	assert(engine_drop(eng, "few", &daemon_self, true, err, sizeof(err)) == 0);
	settle();
}

int main(void)
{
	static const struct engine_ops ops = { .deliver = on_deliver };
	FILE *f;
	uint16_t t[NTOK];
	principal_daemon(&daemon_self);

	for (int i = 0; i < NTOK; i++)
		t[i] = (uint16_t)i;
	snprintf(tok_path, sizeof(tok_path), "/tmp/test-sched-%d.bin", (int)getpid());
	f = fopen(tok_path, "wb");
	assert(f && fwrite(t, sizeof(t), 1, f) == 1 && fclose(f) == 0);
	assert(uv_loop_init(&loop) == 0);
	assert(engine_new(&eng, &loop, 2, 1u << 30, &ops, NULL) == 0);

	test_revoke_partition();
	test_reclaim();
	test_streams_above_slots_refused();
	test_orphan_returns();

	engine_shutdown(eng);
	eng = engine_free(eng);
	uv_run(&loop, UV_RUN_DEFAULT);
	assert(uv_loop_close(&loop) == 0);
	unlink(tok_path);
	printf("test-sched: ok\n");
	return 0;
}
