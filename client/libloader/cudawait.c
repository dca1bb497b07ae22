/* SPDX-License-Identifier: MIT */
/* libloader: the CUDA waiter: ldr_release_after() gives a batch's lease back
 * once the event recorded on the trainer's stream completed.
 */
#include "libloader-private.h"
#include "devmap.h"

/* The waiter of a CUDA attachment: leases go back once their events completed. */
static void *waiter_main(void *arg)
{
	struct ldr_attachment *a = arg;
	struct ldr_client *c = a->c;

	pthread_mutex_lock(&c->lock);
	for (;;) {
		struct evwait *w;

		while (!a->ev_head && !a->waiter_stop)
			pthread_cond_wait(&a->ev_cond, &c->lock);
		if (!(w = a->ev_head))
			break;
		a->ev_head = w->next;
		if (!a->ev_head)
			a->ev_tail = NULL;
		pthread_mutex_unlock(&c->lock);
		devmap_wait(a->dev, w->event);
		pthread_mutex_lock(&c->lock);
		queue_release(a, w->lease);
		free(w);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

void ldr_release_after(struct ldr_batch *b, void *cuda_stream)
{
	struct ldr_attachment *a;
	struct ldr_client *c;
	struct evwait *w;
	bool queued = false;
	char err[256];
	void *ev;

	if (!b)
		return;
	a = b->att;
	c = a->c;
	if (!a->dev || c->pid != self_pid()) {
		ldr_release(b);
		return;
	}
	ev = devmap_record(a->dev, cuda_stream, err, sizeof(err));
	if (!ev) {
		/* a context that cannot record an event has stopped running work */
		ldr_release(b);
		return;
	}
	/* the host copy is not the device's: its pages can go now */
	batch_done(b, false);
	w = calloc(1, sizeof(*w));
	pthread_mutex_lock(&c->lock);
	if (w && !a->detached && !a->waiter_running && pthread_create(&a->waiter, NULL, waiter_main, a) == 0)
		a->waiter_running = true;
	if (w && !a->detached && a->waiter_running) {
		w->lease = b->lease;
		w->event = ev;
		if (a->ev_tail)
			a->ev_tail->next = w;
		else
			a->ev_head = w;
		a->ev_tail = w;
		pthread_cond_signal(&a->ev_cond);
		queued = true;
	}
	pthread_mutex_unlock(&c->lock);
	if (!queued) {
		/* detached (this may be the last reference: the slab is unmapped
		 * right after), or no thread to wait with: wait here */
		free(w);
		devmap_wait(a->dev, ev);
		ldr_release(b);
		return;
	}
	batch_free(b);
}
