/* SPDX-License-Identifier: MIT */
/* libloader: the client handle: its allocation, its references (the handle
 * and every attachment not yet freed) and its end, and the Hello on its
 * socket. Below connect.c (ldr_connect(), ldr_close()), attach.c (an
 * attachment holds a reference) and reconnect.c (a new connection's Hello),
 * so that none of those calls back up into another.
 */
#include "libloader-private.h"

struct ldr_client *client_alloc(pid_t self, const char *path, const char *name)
{
	struct ldr_client *c = calloc(1, sizeof(*c));
	pthread_condattr_t ca;

	if (!c)
		return NULL;
	c->pid = self;
	atomic_init(&c->refs, 1);
	pthread_mutex_init(&c->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cond, &ca);
	pthread_cond_init(&c->flush_cond, &ca);
	pthread_condattr_destroy(&ca);
	snprintf(c->path, sizeof(c->path), "%s", path);
	snprintf(c->name, sizeof(c->name), "%s", name);
	return c;
}

void client_free(struct ldr_client *c)
{
	while (c->specs) {
		struct spec_rec *sr = c->specs;
		c->specs = sr->next;
		free(sr->json);
		free(sr);
	}
	while (c->keys_sent) {
		struct keys_sent *ks = c->keys_sent;
		c->keys_sent = ks->next;
		free(ks);
	}
	pthread_cond_destroy(&c->flush_cond);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* Shake hands on the client's socket; sets c->id. */
int hello_call(struct ldr_client *c, int timeout_ms, bool internal)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Hello hello = LOADERD__HELLO__INIT;
	Loaderd__Reply *rep;
	int r;

	hello.protocol = LDR_PROTOCOL_VERSION;
	hello.client_name = c->name;
	req.body_case = LOADERD__REQUEST__BODY_HELLO;
	req.hello = &hello;
	/* a daemon refused (whose.c) hears nothing, not even our name */
	if ((r = daemon_refused(c, 0)) < 0)
		return r;
	r = call_gen(c, &req, &rep, LOADERD__REPLY__BODY_HELLO, timeout_ms, internal);
	if (r < 0)
		r = daemon_refused(c, r);
	if (r < 0)
		return r == -EPROTONOSUPPORT ? LDR_EVERSION : r;
	pthread_mutex_lock(&c->lock);
	c->id = rep->hello->client_id;
	pthread_mutex_unlock(&c->lock);
	loaderd__reply__free_unpacked(rep, NULL);
	return 0;
}

void client_unref(struct ldr_client *c)
{
	if (atomic_fetch_sub(&c->refs, 1) != 1)
		return;
	client_free(c);
}
