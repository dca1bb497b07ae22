/* SPDX-License-Identifier: MIT */
/* attring - an attachment's batch ring (common/bring.h; docs/protocol.md,
 * "The batch ring")
 *
 * A host attachment whose client asked for one is delivered through shared
 * memory instead of Next replies: a pending request of the ring's own stays
 * parked at the attachment, deliver() writes what answers it into the ring
 * (attring_deliver()), and the ring parks it again on the next loop turn. The
 * client's releases come back through the ring, announced on its eventfd
 * when the loop sleeps, and go through attachment_next() as a Release's do.
 * Everything the client can write is checked (bring.c, and each lease here):
 * garbage fails that attachment, with the error in its client's next() and
 * in the log, and touches nothing else.
 */
#include <sys/eventfd.h>

#include "bring.h"
#include "base/log.h"
#include "engine-private.h"

#define RING_TAKE 64              /* releases taken per attachment_next() */

struct attring {
	struct pending pending;   /* the ring's request, parked while not answered */
	struct attachment *att;   /* NULL once the attachment is gone */
	struct bring br;
	int efd;
	uv_poll_t poll;
	uv_timer_t kick;          /* parks the request again, next loop turn */
	bool parked;
	bool stopped;             /* an End or Error waits in the ring for the client */
	uint64_t stop_at;         /* the ring position after it */
	bool failed;              /* garbage: nothing more is read */
	unsigned handles;         /* uv handles not yet closed */
};

static struct attring *attring_of(struct pending *p)
{
	return (struct attring *)((char *)p - offsetof(struct attring, pending));
}

/* Garbage in @r's ring: the attachment fails with @msg, and only it. */
static void attring_fail(struct attring *r, const char *msg)
{
	struct attachment *a = r->att;

	if (r->failed || !a)
		return;
	r->failed = true;
	uv_poll_stop(&r->poll);
	uv_timer_stop(&r->kick);
	log_event(LOG_WARNING, "client.ring_garbage", "pipeline=%s attachment=%" PRIu64 " client=%"
	          PRIu64 " pid=%d: %s; the attachment is detached", a->pl ? a->pl->spec->name : "-",
	          a->id, a->client_id, a->pid, msg);
	a->eng->hooks->ring_fail(a, EBADMSG, msg);
}

/* Park the ring's request again, when the ring can take what answers it. */
static void attring_park(struct attring *r)
{
	struct attachment *a = r->att;
	char err[256];
	uint32_t space;
	int rc;

	if (!a || r->failed || !a->pl)
		return;
	if (bring_daemon_tail(&r->br, err, sizeof(err)) < 0) {
		attring_fail(r, err);
		return;
	}
	if (r->parked)
		return;
	if (r->stopped) {
		/* the client takes the End or Error first, then wakes us */
		if (r->br.d_tail < r->stop_at)
			return;
		r->stopped = false;
	}
	/* the client's window (its credits) bounds the deliveries it has not
	 * taken, as its Next requests would: wait until it took half of them */
	uint64_t out = r->br.d_head - r->br.d_tail;
	if (out >= a->credits) {
		bring_daemon_want_room(&r->br, r->br.d_head - a->credits / 2);
		if (bring_daemon_tail(&r->br, err, sizeof(err)) < 0) {
			attring_fail(r, err);
			return;
		}
		out = r->br.d_head - r->br.d_tail;
		if (out >= a->credits)
			return; /* the client wakes us */
		bring_daemon_want_room(&r->br, 0);
	}
	space = bring_daemon_space(&r->br);
	if (space > a->credits - out)
		space = (uint32_t)(a->credits - out);
	if (space == 0)
		return; /* cannot be: deliveries not taken hold leases, the ring holds more */
	r->pending.max = space < DELIVER_MAX_BATCHES ? space : DELIVER_MAX_BATCHES;
	r->parked = true;
	rc = a->eng->hooks->ring_next(a, &r->pending, &(struct next_req){ 0 }, err, sizeof(err));
	if (rc < 0 && r->parked) {
		/* refused (the attachment is dead): say so in the ring */
		r->parked = false;
		struct bring_desc d = { .seq = a->deliver_no, .kind = BRING_ERROR, .err = -rc };
		snprintf(r->br.msg, BRING_MSG_BYTES, "%s", err);
		bring_daemon_put(&r->br, &d);
		r->stopped = true;
		r->stop_at = r->br.d_head;
		if (bring_daemon_publish(&r->br))
			bring_wake_client(&r->br);
	}
}

static void on_kick(uv_timer_t *t)
{
	attring_park(t->data);
}

/* The client's releases, each checked against the attachment's leases. */
static void attring_take(struct attring *r)
{
	uint64_t leases[RING_TAKE];
	char err[256];
	size_t n;

	for (bool slept = false;;) {
		struct attachment *a = r->att;
		if (!a || r->failed)
			return;
		if (bring_daemon_take(&r->br, leases, RING_TAKE, &n, err, sizeof(err)) < 0) {
			attring_fail(r, err);
			return;
		}
		bool live = a->pl && !a->left;
		int rc = n ? a->eng->hooks->ring_next(a, NULL, &(struct next_req){
		                             .releases = leases, .nreleases = n }, err, sizeof(err)) : 0;
		if (rc == -ENOENT && live) {
			char msg[320];
			snprintf(msg, sizeof(msg), "batch ring: %s (not delivered to it, or released "
			         "already)", err);
			attring_fail(r, msg);
			return;
		}
		if (rc < 0) {
			/* the attachment ended (its pipeline dropped, or it was set
			 * aside): refused, as a Release would be, and told */
			snprintf(r->br.sh->r_msg, sizeof(r->br.sh->r_msg), "%s", err);
			atomic_fetch_add_explicit(&r->br.sh->r_refused, 1, memory_order_release);
		}
		if (n == RING_TAKE)
			continue;
		if (slept)
			break;
		/* say we sleep, then look once more: a release published
		 * meanwhile is either seen now or announced on the eventfd */
		bring_daemon_sleep(&r->br);
		slept = true;
	}
	attring_park(r);
}

static void on_readable(uv_poll_t *p, int status, int events)
{
	struct attring *r = p->data;
	eventfd_t v;

	(void)events;
	if (status < 0)
		return;
	eventfd_read(r->efd, &v);
	attring_take(r);
}

void attring_deliver(struct pending *p, const struct delivery *d)
{
	struct attring *r = attring_of(p);
	struct bring_desc x = { .seq = d->seq };

	r->parked = false;
	switch (d->kind) {
	case DELIVER_BATCH:
		for (uint32_t i = 0; i < d->nbatches; i++) {
			const struct delivered_batch *b = &d->batches[i];
			x = (struct bring_desc){ .seq = b->seq, .lease = b->lease, .epoch = b->epoch,
				.index = b->index, .slot = b->slot, .rows = b->rows, .kind = BRING_BATCH,
				.share = d->share };
			if (b->err) {
				/* a failed batch, its delivery's last: its text waits
				 * in the ring until the client took it */
				x.kind = BRING_FAILED;
				x.err = b->err;
				snprintf(r->br.msg, BRING_MSG_BYTES, "%s", b->msg ? b->msg : "");
				r->stopped = true;
			}
			bring_daemon_put(&r->br, &x);
		}
		break;
	case DELIVER_END:
		x.kind = BRING_END;
		bring_daemon_put(&r->br, &x);
		r->stopped = true;
		break;
	case DELIVER_ERROR:
		x.kind = BRING_ERROR;
		x.err = d->err;
		snprintf(r->br.msg, BRING_MSG_BYTES, "%s", d->msg ? d->msg : "");
		bring_daemon_put(&r->br, &x);
		r->stopped = true;
		break;
	case DELIVER_REVOKE:
		break; /* only a watch is sent a Revoke */
	}
	if (r->stopped)
		r->stop_at = r->br.d_head;
	if (bring_daemon_publish(&r->br))
		bring_wake_client(&r->br);
	/* not from here: deliver() must not call back into the engine */
	if (!r->stopped && !r->failed && r->att)
		uv_timer_start(&r->kick, on_kick, 0, 0);
}

/* Round @n up to a power of two, from 8 to BRING_CAP_MAX. */
static uint32_t attring_cap(uint32_t n)
{
	uint32_t c = 8;

	while (c < n && c < BRING_CAP_MAX)
		c *= 2;
	return c;
}

int attring_open(struct attachment *a, char *err, size_t errlen)
{
	struct attring *r = calloc(1, sizeof(*r));
	/* a delivery not taken holds a lease, at most one per slot, and a
	 * release is of a lease: rings of more than the slots never fill */
	uint32_t cap = attring_cap(a->pl->nslots + 2);
	int rc;

	if (!r)
		return errfmt(-ENOMEM, err, errlen, "batch ring: out of memory");
	if ((rc = bring_create(&r->br, cap, cap, err, errlen)) < 0) {
		free(r);
		return rc;
	}
	r->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (r->efd < 0) {
		rc = errfmt(-errno, err, errlen, "batch ring: eventfd: %s", strerror(errno));
		bring_close(&r->br);
		free(r);
		return rc;
	}
	r->pending.ring = true;
	r->att = a;
	if ((rc = uv_poll_init(a->eng->loop, &r->poll, r->efd)) < 0) {
		rc = errfmt(rc, err, errlen, "batch ring: %s", uv_strerror(rc));
		close(r->efd);
		bring_close(&r->br);
		free(r);
		return rc;
	}
	uv_timer_init(a->eng->loop, &r->kick); /* libuv's cannot fail: it returns 0 */
	r->poll.data = r->kick.data = r;
	r->handles = 2;
	uv_poll_start(&r->poll, UV_READABLE, on_readable);
	bring_daemon_sleep(&r->br);
	a->ring = r;
	return 0;
}

void attring_start(struct attachment *a)
{
	if (a->ring)
		attring_park(a->ring);
}

uint64_t attring_bytes(const struct attachment *a)
{
	return a->ring ? a->ring->br.bytes : 0;
}

void attring_fds(const struct attachment *a, int *fd, int *efd)
{
	*fd = a->ring ? a->ring->br.fd : -1;
	*efd = a->ring ? a->ring->efd : -1;
}

static void on_closed(uv_handle_t *h)
{
	struct attring *r = h->data;

	if (--r->handles)
		return;
	bring_close(&r->br);
	close(r->efd);
	free(r);
}

void attring_close(struct attachment *a)
{
	struct attring *r = a->ring;

	if (!r)
		return;
	a->ring = NULL;
	r->att = NULL;
	uv_close((uv_handle_t *)&r->poll, on_closed);
	uv_close((uv_handle_t *)&r->kick, on_closed);
}

bool attring_stats(struct attachment *a, struct trainer_stats *st, uint64_t buckets[WAIT_BUCKETS])
{
	struct attring *r = a->ring;
	uint64_t v[3];

	if (!r || r->failed || bring_daemon_stats(&r->br, v, buckets) != 1)
		return false;
	*st = (struct trainer_stats){ .wait_ns = v[0], .compute_ns = v[1], .calls = v[2],
		.buckets = buckets, .nbuckets = WAIT_BUCKETS };
	return true;
}

uint32_t att_waiting(const struct attachment *a)
{
	const struct attring *r = a->ring;
	uint32_t n = a->npending;

	/* the client's tail is its word: it only colours its own figures */
	if (r && r->parked && n > 0 &&
	    atomic_load_explicit(&r->br.sh->d_tail, memory_order_relaxed) < r->br.d_head)
		n--;
	return n;
}
