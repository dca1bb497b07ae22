/* SPDX-License-Identifier: MIT */
/* test-workers - the daemon's worker threads (daemon/engine/workers.c)
 *
 * What workers.h promises: n >= 1 threads (0 is -EINVAL), every queued work
 * runs exactly once, any thread may submit, and workers_free() runs what is
 * queued before it joins (NULL is fine). What workers.c documents: one FIFO,
 * so a single worker runs works in submission order, and n workers run n
 * works at once, never more. The engine completes works on its libuv loop
 * (a done list and a uv_async, daemon/engine/stream.c); the last test drives that
 * pattern on a real loop, with works submitted from several threads at once
 * and freed by the loop, so that ASan sees any touch of a work after its fn.
 */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "workers.h"
#include "../test-proc.h"

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A gate works can wait on, with a timeout so that a broken pool fails
 * rather than hangs. */
struct gate {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool open;
	unsigned waiting;
};

static void gate_init(struct gate *g)
{
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->cond, NULL);
	g->open = false;
	g->waiting = 0;
}

static void gate_destroy(struct gate *g)
{
	pthread_cond_destroy(&g->cond);
	pthread_mutex_destroy(&g->lock);
}

static void gate_open(struct gate *g)
{
	pthread_mutex_lock(&g->lock);
	g->open = true;
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
}

/* Wait until the gate opens (true) or @ms pass (false). */
static bool gate_wait(struct gate *g, unsigned ms)
{
	struct timespec dl;
	bool ok;

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += ms / 1000;
	dl.tv_nsec += (long)(ms % 1000) * 1000000;
	if (dl.tv_nsec >= 1000000000) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&g->lock);
	g->waiting++;
	pthread_cond_broadcast(&g->cond);
	while (!g->open && pthread_cond_timedwait(&g->cond, &g->lock, &dl) != ETIMEDOUT)
		;
	ok = g->open;
	g->waiting--;
	pthread_mutex_unlock(&g->lock);
	return ok;
}

/* Wait until @n works wait at the gate; false after @ms. */
static bool gate_await_waiters(struct gate *g, unsigned n, unsigned ms)
{
	uint64_t end = now_ms() + ms;
	bool ok;

	pthread_mutex_lock(&g->lock);
	while (g->waiting < n && now_ms() < end) {
		pthread_mutex_unlock(&g->lock);
		usleep(1000);
		pthread_mutex_lock(&g->lock);
	}
	ok = g->waiting >= n;
	pthread_mutex_unlock(&g->lock);
	return ok;
}

/* Threads of this process: /proc/self/task. A pool's threads are the
 * count less what ran before it was made (main, a sanitizer's own). */
static unsigned count_threads(void)
{
	return proc_entries("/proc/self/task");
}

/* Wait until this process has @n threads (those asked to leave exit a
 * moment after their last work); false after @ms. */
static bool await_threads(unsigned n, unsigned ms)
{
	uint64_t end = now_ms() + ms;

	while (count_threads() != n && now_ms() < end)
		usleep(1000);
	return count_threads() == n;
}

/* Is thread @tid of this process asleep (blocked in a call)? */
static bool thread_sleeps(pid_t tid)
{
	char path[64], buf[512], *p;
	FILE *f;
	size_t len;

	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	f = fopen(path, "re");
	if (!f)
		return false;
	len = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[len] = 0;
	p = strrchr(buf, ')'); /* the state follows the name */
	return p && p[1] == ' ' && p[2] == 'S';
}

/* ---- 1. arguments, count, NULL ---- */

static void noop(struct work *w)
{
	(void)w;
}

static void test_new_args(void)
{
	struct workers *w = (struct workers *)0x1;

	assert(workers_new(&w, 0) == -EINVAL);
	assert(w == (struct workers *)0x1); /* untouched on failure */
	assert(workers_free(NULL) == NULL);
	for (unsigned n = 1; n <= 8; n *= 2) {
		assert(workers_new(&w, n) == 0);
		assert(workers_count(w) == n);
		assert(workers_free(w) == NULL); /* idle threads join at once */
	}
	/* a pool that never ran anything, freed right away, many times (no lost wake-up) */
	for (int i = 0; i < 200; i++) {
		struct work one = { .fn = noop };
		assert(workers_new(&w, 3) == 0);
		if (i % 2)
			workers_submit(w, &one);
		assert(workers_free(w) == NULL);
	}
	printf("new/count/free: ok\n");
}

/* ---- 2. one worker: FIFO order ---- */

struct seq_work {
	struct work work;
	unsigned id;
	unsigned *log;
	atomic_uint *pos;
	atomic_uint runs;
	bool next_was_null;
};

static void seq_run(struct work *w)
{
	struct seq_work *s = (struct seq_work *)w;

	s->next_was_null = w->next == NULL;
	s->log[atomic_fetch_add(s->pos, 1)] = s->id;
	atomic_fetch_add(&s->runs, 1);
}

#define NSEQ 5000

static void test_fifo_one_worker(void)
{
	static struct seq_work ws[NSEQ];
	static unsigned log[NSEQ];
	atomic_uint pos = 0;
	struct workers *w;

	assert(workers_new(&w, 1) == 0);
	for (unsigned i = 0; i < NSEQ; i++) {
		ws[i].work.fn = seq_run;
		ws[i].work.next = (struct work *)&ws[i]; /* garbage the pool must reset */
		ws[i].id = i;
		ws[i].log = log;
		ws[i].pos = &pos;
		atomic_init(&ws[i].runs, 0);
		workers_submit(w, &ws[i].work);
	}
	workers_free(w);
	assert(atomic_load(&pos) == NSEQ);
	for (unsigned i = 0; i < NSEQ; i++) {
		assert(log[i] == i);
		assert(atomic_load(&ws[i].runs) == 1);
		assert(ws[i].next_was_null);
	}
	printf("one worker runs in submission order: ok\n");
}

/* ---- 3. n workers: n at once, never more ---- */

struct conc {
	struct gate gate;
	atomic_uint active, max_active, ran;
	atomic_uint timeouts;
	pthread_t threads[16];
	atomic_uint nthreads;
	pthread_mutex_t tlock;
};

struct conc_work {
	struct work work;
	struct conc *c;
};

static void conc_run(struct work *w)
{
	struct conc *c = ((struct conc_work *)w)->c;
	unsigned a = atomic_fetch_add(&c->active, 1) + 1, m = atomic_load(&c->max_active);
	pthread_t self = pthread_self();
	bool known = false;

	while (a > m && !atomic_compare_exchange_weak(&c->max_active, &m, a))
		;
	pthread_mutex_lock(&c->tlock);
	for (unsigned i = 0; i < c->nthreads; i++)
		known |= pthread_equal(c->threads[i], self);
	if (!known && c->nthreads < 16)
		c->threads[c->nthreads++] = self;
	pthread_mutex_unlock(&c->tlock);
	if (!gate_wait(&c->gate, 10000))
		atomic_fetch_add(&c->timeouts, 1);
	atomic_fetch_sub(&c->active, 1);
	atomic_fetch_add(&c->ran, 1);
}

static void test_concurrency(unsigned n)
{
	struct conc c;
	struct conc_work ws[64] = { 0 };
	unsigned nw = 4 * n;
	struct workers *w;

	assert(nw <= 64);
	memset(&c, 0, sizeof(c));
	gate_init(&c.gate);
	pthread_mutex_init(&c.tlock, NULL);
	unsigned before = count_threads();
	assert(workers_new(&w, n) == 0);
	for (unsigned i = 0; i < nw; i++) {
		ws[i].work.fn = conc_run;
		ws[i].c = &c;
		workers_submit(w, &ws[i].work);
	}
	/* all n threads take one each and block: n run at once ... */
	assert(gate_await_waiters(&c.gate, n, 10000));
	/* ... and not one more, while the other 3n wait in the queue: the
	 * pool has n threads, and each of them is in a work at the gate */
	assert(count_threads() == before + n);
	pthread_mutex_lock(&c.tlock);
	assert(c.nthreads == n);
	pthread_mutex_unlock(&c.tlock);
	assert(atomic_load(&c.active) == n);
	assert(atomic_load(&c.ran) == 0);
	gate_open(&c.gate);
	workers_free(w);
	assert(atomic_load(&c.ran) == nw);
	assert(atomic_load(&c.max_active) == n);
	assert(atomic_load(&c.timeouts) == 0);
	assert(c.nthreads == n); /* each of the n threads ran works */
	pthread_mutex_destroy(&c.tlock);
	gate_destroy(&c.gate);
	printf("%u workers run %u works at once, never more: ok\n", n, n);
}

/* ---- 3b. resize: grow and shrink with works queued ---- */

/* Submit @nw blocking works to @w, a pool of @n threads (@others: the
 * process's threads besides the pool's), expect @n of them at once, release
 * them all; every work runs once. */
static void resize_round(struct workers *w, unsigned others, unsigned n, unsigned nw,
                         struct conc_work *ws, void (*between)(struct workers *))
{
	struct conc c, fence;
	struct conc_work fences[64] = { 0 };

	memset(&c, 0, sizeof(c));
	gate_init(&c.gate);
	pthread_mutex_init(&c.tlock, NULL);
	for (unsigned i = 0; i < nw; i++) {
		ws[i].work.fn = conc_run;
		ws[i].c = &c;
		workers_submit(w, &ws[i].work);
	}
	assert(gate_await_waiters(&c.gate, n, 10000));
	/* the pool is n threads, each in a work at the gate: none takes more */
	assert(await_threads(others + n, 30000));
	assert(atomic_load(&c.active) == n);
	if (between)
		between(w);
	gate_open(&c.gate);
	/* a fence: n works queued after them, each waiting until all n wait.
	 * The queue is one FIFO, so once every thread is in a fence, every
	 * work before them was taken and has run */
	memset(&fence, 0, sizeof(fence));
	gate_init(&fence.gate);
	pthread_mutex_init(&fence.tlock, NULL);
	unsigned nf = workers_count(w);
	for (unsigned i = 0; i < nf; i++) {
		fences[i].work.fn = conc_run;
		fences[i].c = &fence;
		workers_submit(w, &fences[i].work);
	}
	assert(gate_await_waiters(&fence.gate, nf, 10000));
	assert(atomic_load(&c.ran) == nw); /* each once: none twice, none left */
	assert(atomic_load(&c.timeouts) == 0);
	gate_open(&fence.gate);
	for (uint64_t end = now_ms() + 10000; atomic_load(&fence.ran) < nf && now_ms() < end;)
		usleep(1000);
	assert(atomic_load(&fence.ran) == nf && atomic_load(&fence.timeouts) == 0);
	pthread_mutex_destroy(&fence.tlock);
	gate_destroy(&fence.gate);
	pthread_mutex_destroy(&c.tlock);
	gate_destroy(&c.gate);
}

static void shrink_to_1(struct workers *w)
{
	/* the 6 running works finish; the queue goes on with one thread */
	assert(workers_resize(w, 1) == 0);
	assert(workers_count(w) == 1);
}

static void test_resize(void)
{
	struct conc_work ws[64];
	struct workers *w;
	unsigned others = count_threads();

	assert(workers_new(&w, 2) == 0);
	assert(workers_resize(w, 0) == -EINVAL);
	assert(workers_resize(w, WORKERS_MAX + 1) == -EINVAL);
	assert(workers_count(w) == 2);
	resize_round(w, others, 2, 8, ws, NULL);
	assert(workers_resize(w, 6) == 0);
	assert(workers_count(w) == 6);
	resize_round(w, others, 6, 24, ws, shrink_to_1);
	resize_round(w, others, 1, 4, ws, NULL);
	/* shrink and grow again before the leaving threads are joined */
	assert(workers_resize(w, 4) == 0 && workers_resize(w, 2) == 0 && workers_resize(w, 3) == 0);
	resize_round(w, others, 3, 9, ws, NULL);
	assert(workers_free(w) == NULL);
	printf("resize 2 -> 6 -> 1 -> 3 with works queued, each run once: ok\n");
}

/* ---- 4. shutdown with works queued ---- */

struct free_args {
	struct workers *w;
	atomic_int tid;       /* set just before workers_free() */
	atomic_bool returned;
};

static void *free_thread(void *arg)
{
	struct free_args *fa = arg;

	atomic_store(&fa->tid, (int)syscall(SYS_gettid));
	workers_free(fa->w);
	atomic_store(&fa->returned, true);
	return NULL;
}

struct block_work {
	struct work work;
	struct gate *gate;
	atomic_uint *ran;
	bool timed_out;
};

static void block_run(struct work *w)
{
	struct block_work *b = (struct block_work *)w;

	b->timed_out = !gate_wait(b->gate, 10000);
	atomic_fetch_add(b->ran, 1);
}

/* A work that submits a follow-up while the pool is stopping: still run. */
struct chain_work {
	struct work work;
	struct workers *w;
	unsigned left;
	atomic_uint *ran;
};

static void chain_run(struct work *w)
{
	struct chain_work *c = (struct chain_work *)w;

	atomic_fetch_add(c->ran, 1);
	if (c->left > 0) {
		c->left--;
		usleep(1000); /* let the other workers see an empty queue and exit */
		workers_submit(c->w, &c->work); /* the same work again: the pool is done with it */
	}
}

static void test_shutdown_with_queue(unsigned n)
{
	static struct seq_work ws[NSEQ];
	static unsigned log[NSEQ];
	struct block_work blockers[8];
	struct gate gate;
	atomic_uint pos = 0, blocked_ran = 0, chain_ran = 0;
	struct chain_work chain;
	struct free_args fa;
	pthread_t t;

	assert(n <= 8);
	gate_init(&gate);
	assert(workers_new(&fa.w, n) == 0);
	atomic_init(&fa.tid, 0);
	atomic_init(&fa.returned, false);
	/* every worker busy, then a long queue behind them */
	for (unsigned i = 0; i < n; i++) {
		blockers[i] = (struct block_work){ .work.fn = block_run, .gate = &gate, .ran = &blocked_ran };
		workers_submit(fa.w, &blockers[i].work);
	}
	assert(gate_await_waiters(&gate, n, 10000));
	for (unsigned i = 0; i < NSEQ; i++) {
		ws[i] = (struct seq_work){ .work.fn = seq_run, .id = i, .log = log, .pos = &pos };
		workers_submit(fa.w, &ws[i].work);
	}
	chain = (struct chain_work){ .work.fn = chain_run, .w = fa.w, .left = 20, .ran = &chain_ran };
	workers_submit(fa.w, &chain.work);

	assert(pthread_create(&t, NULL, free_thread, &fa) == 0);
	/* workers_free() is called and blocks (in its join: the workers take no
	 * lock it wants while they wait at the gate) */
	uint64_t end = now_ms() + 30000;
	while (!(atomic_load(&fa.tid) && thread_sleeps(atomic_load(&fa.tid))) && now_ms() < end)
		usleep(1000);
	assert(atomic_load(&fa.tid) && thread_sleeps(atomic_load(&fa.tid)));
	/* workers_free waits for the running works; nothing queued was dropped yet */
	assert(!atomic_load(&fa.returned));
	assert(atomic_load(&pos) == 0);
	gate_open(&gate);
	assert(pthread_join(t, NULL) == 0);
	assert(atomic_load(&fa.returned));
	/* everything queued before the stop ran, exactly once */
	assert(atomic_load(&blocked_ran) == n);
	for (unsigned i = 0; i < n; i++)
		assert(!blockers[i].timed_out);
	assert(atomic_load(&pos) == NSEQ);
	for (unsigned i = 0; i < NSEQ; i++)
		assert(atomic_load(&ws[i].runs) == 1);
	if (n == 1)
		for (unsigned i = 0; i < NSEQ; i++)
			assert(log[i] == i);
	/* and what a running work queued during the stop, too */
	assert(atomic_load(&chain_ran) == 21);
	assert(chain.left == 0);
	gate_destroy(&gate);
	printf("free with %u workers and %u queued runs them all: ok\n", n, NSEQ + 1);
}

/* ---- 5. completion on a libuv loop, submissions from many threads ---- */

#define NSUBMITTERS 3
#define PER_SUBMITTER 4000
#define FROM_LOOP 1000
#define NTOTAL (NSUBMITTERS * PER_SUBMITTER + FROM_LOOP)

struct loop_state {
	uv_loop_t loop;
	uv_async_t async;
	uv_timer_t kick;
	pthread_t loop_thread;
	struct workers *w;
	pthread_mutex_t done_lock;
	struct job *done_head;
	atomic_uint runs[NTOTAL];
	unsigned completions[NTOTAL];   /* loop thread only */
	unsigned ncompleted;            /* loop thread only */
	atomic_uint wrong_thread;
	atomic_uint bad_id;
	unsigned loop_submitted;
};

struct job {
	struct work work;
	struct job *done_next;
	struct loop_state *ls;
	unsigned id;
	uint64_t payload[8];
};

static void job_run(struct work *w)
{
	struct job *j = (struct job *)w;
	struct loop_state *ls = j->ls;

	if (pthread_equal(pthread_self(), ls->loop_thread))
		atomic_fetch_add(&ls->wrong_thread, 1);
	if (j->id >= NTOTAL) {
		atomic_fetch_add(&ls->bad_id, 1);
		return;
	}
	for (int i = 0; i < 8; i++)
		j->payload[i] = (uint64_t)j->id * 8 + (uint64_t)i;
	atomic_fetch_add(&ls->runs[j->id], 1);
	pthread_mutex_lock(&ls->done_lock);
	j->done_next = ls->done_head;
	ls->done_head = j;
	pthread_mutex_unlock(&ls->done_lock);
	uv_async_send(&ls->async);
}

static struct job *job_new(struct loop_state *ls, unsigned id)
{
	struct job *j = calloc(1, sizeof(*j));

	assert(j);
	j->work.fn = job_run;
	j->ls = ls;
	j->id = id;
	return j;
}

static void on_done(uv_async_t *a)
{
	struct loop_state *ls = a->data;
	struct job *list;

	assert(pthread_equal(pthread_self(), ls->loop_thread));
	pthread_mutex_lock(&ls->done_lock);
	list = ls->done_head;
	ls->done_head = NULL;
	pthread_mutex_unlock(&ls->done_lock);
	while (list) {
		struct job *j = list;
		list = j->done_next;
		for (int i = 0; i < 8; i++)
			assert(j->payload[i] == (uint64_t)j->id * 8 + (uint64_t)i);
		ls->completions[j->id]++;
		ls->ncompleted++;
		free(j); /* the pool must never touch a work after its fn (ASan) */
	}
	if (ls->ncompleted == NTOTAL) {
		uv_close((uv_handle_t *)&ls->async, NULL);
		uv_close((uv_handle_t *)&ls->kick, NULL);
	}
}

/* The loop submits too, a few at a time, as stream_start_batch() does. */
static void on_kick(uv_timer_t *t)
{
	struct loop_state *ls = t->data;

	for (int i = 0; i < 50 && ls->loop_submitted < FROM_LOOP; i++) {
		workers_submit(ls->w, &job_new(ls, NSUBMITTERS * PER_SUBMITTER + ls->loop_submitted)->work);
		ls->loop_submitted++;
	}
	if (ls->loop_submitted == FROM_LOOP)
		uv_timer_stop(t);
}

struct submitter {
	struct loop_state *ls;
	unsigned base;
};

static void *submit_main(void *arg)
{
	struct submitter *s = arg;

	for (unsigned i = 0; i < PER_SUBMITTER; i++) {
		workers_submit(s->ls->w, &job_new(s->ls, s->base + i)->work);
		if (i % 500 == 0)
			sched_yield();
	}
	return NULL;
}

static void test_loop_completion(unsigned n)
{
	struct loop_state *ls = calloc(1, sizeof(*ls));
	struct submitter subs[NSUBMITTERS];
	pthread_t th[NSUBMITTERS];
	uint64_t t0 = now_ms();

	assert(ls);
	assert(uv_loop_init(&ls->loop) == 0);
	ls->loop_thread = pthread_self();
	pthread_mutex_init(&ls->done_lock, NULL);
	assert(uv_async_init(&ls->loop, &ls->async, on_done) == 0);
	ls->async.data = ls;
	assert(uv_timer_init(&ls->loop, &ls->kick) == 0);
	ls->kick.data = ls;
	for (unsigned i = 0; i < NTOTAL; i++)
		atomic_init(&ls->runs[i], 0);
	assert(workers_new(&ls->w, n) == 0);
	for (unsigned i = 0; i < NSUBMITTERS; i++) {
		subs[i] = (struct submitter){ .ls = ls, .base = i * PER_SUBMITTER };
		assert(pthread_create(&th[i], NULL, submit_main, &subs[i]) == 0);
	}
	uv_timer_start(&ls->kick, on_kick, 0, 1);
	/* runs until every job completed on the loop and the handles closed */
	assert(uv_run(&ls->loop, UV_RUN_DEFAULT) == 0);
	for (unsigned i = 0; i < NSUBMITTERS; i++)
		assert(pthread_join(th[i], NULL) == 0);
	assert(ls->ncompleted == NTOTAL);
	for (unsigned i = 0; i < NTOTAL; i++) {
		assert(atomic_load(&ls->runs[i]) == 1);
		assert(ls->completions[i] == 1);
	}
	assert(atomic_load(&ls->wrong_thread) == 0);
	assert(atomic_load(&ls->bad_id) == 0);
	assert(ls->done_head == NULL);
	workers_free(ls->w);
	assert(uv_loop_close(&ls->loop) == 0);
	pthread_mutex_destroy(&ls->done_lock);
	free(ls);
	printf("%u workers: %u jobs from %u threads and the loop, each completed once on the loop "
	       "(%llu ms): ok\n", n, NTOTAL, NSUBMITTERS, (unsigned long long)(now_ms() - t0));
}

/* ---- queues share the pool ---- */

/* One worker, held by a blocker while queue a gets 4 works, queue b 3 and
 * the pool's own queue 1, none with a known cost: they take turns, a0 b0 c0
 * a1 b1 a2 b2 a3, not a's first. */
static void test_queues_take_turns(void)
{
	static struct work_queue qa, qb;
	struct seq_work ws[8];
	static const unsigned want[8] = { 0, 4, 7, 1, 5, 2, 6, 3 };
	struct work_queue *queue_of[8] = { &qa, &qa, &qa, &qa, &qb, &qb, &qb, NULL };
	unsigned log[8];
	atomic_uint pos = 0, ran = 0;
	struct block_work blocker;
	struct gate gate;
	struct workers *w;

	gate_init(&gate);
	assert(workers_new(&w, 1) == 0);
	blocker = (struct block_work){ .work.fn = block_run, .gate = &gate, .ran = &ran };
	workers_submit(w, &blocker.work);
	assert(gate_await_waiters(&gate, 1, 10000));
	for (unsigned i = 0; i < 8; i++) {
		ws[i] = (struct seq_work){ .work.fn = seq_run, .work.queue = queue_of[i], .id = i,
			.log = log, .pos = &pos };
		workers_submit(w, &ws[i].work);
	}
	gate_open(&gate);
	assert(workers_free(w) == NULL);
	assert(atomic_load(&pos) == 8 && !blocker.timed_out);
	for (unsigned i = 0; i < 8; i++)
		assert(log[i] == want[i]);
	/* drained, out of the ring: the same queues serve a new pool */
	assert(!qa.head && !qa.linked && !qb.head && !qb.linked);
	gate_destroy(&gate);
	printf("queues take turns, one work each: ok\n");
}

/* Queue a's works cost 1000 times b's: once a had a turn, b's works all run
 * before a's next one (fair by time, not by turns). */
static void test_queues_share_by_time(void)
{
	static struct work_queue qa, qb;
	struct seq_work ws[8];
	static const unsigned want[8] = { 0, 4, 5, 6, 7, 1, 2, 3 };
	unsigned log[8];
	atomic_uint pos = 0, ran = 0;
	struct block_work blocker;
	struct gate gate;
	struct workers *w;

	workers_queue_cost(&qa, 1000000);
	workers_queue_cost(&qb, 1000);
	gate_init(&gate);
	assert(workers_new(&w, 1) == 0);
	blocker = (struct block_work){ .work.fn = block_run, .gate = &gate, .ran = &ran };
	workers_submit(w, &blocker.work);
	assert(gate_await_waiters(&gate, 1, 10000));
	for (unsigned i = 0; i < 8; i++) {
		ws[i] = (struct seq_work){ .work.fn = seq_run, .work.queue = i < 4 ? &qa : &qb,
			.id = i, .log = log, .pos = &pos };
		workers_submit(w, &ws[i].work);
	}
	gate_open(&gate);
	assert(workers_free(w) == NULL);
	assert(atomic_load(&pos) == 8);
	for (unsigned i = 0; i < 8; i++)
		assert(log[i] == want[i]);
	assert(qa.vtime >= 4 * 1000000 && qb.vtime < 1000000);
	gate_destroy(&gate);
	printf("queues share the pool by time: ok\n");
}

int main(void)
{
	alarm(100); /* a hang fails here, before meson's timeout */
	test_new_args();
	test_fifo_one_worker();
	test_concurrency(1);
	test_concurrency(2);
	test_concurrency(8);
	test_resize();
	test_shutdown_with_queue(1);
	test_shutdown_with_queue(4);
	test_loop_completion(1);
	test_loop_completion(4);
	test_queues_take_turns();
	test_queues_share_by_time();
	printf("ok\n");
	return 0;
}
