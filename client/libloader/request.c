/* SPDX-License-Identifier: MIT */
/* libloader: sending one of an attachment's requests (req_send()): a Next
 * with the releases and the trainer's figures it carries, a Release, or the
 * parked watch with the leases a Revoke hands back. Below the window, the
 * revoke, the ring's figures and the release queue that send; it calls only
 * stats.c (what the figures say) and rpc.c (packing).
 */
#include "libloader-private.h"

/* Called with c->lock held. @ask: batches a Next may bring back. */
int req_send(struct ldr_attachment *a, struct req *r, uint32_t ask)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Next next = LOADERD__NEXT__INIT;
	Loaderd__Release rel = LOADERD__RELEASE__INIT;
	Loaderd__TrainerStats st = LOADERD__TRAINER_STATS__INIT;
	nng_msg *msg;
	int e;

	if (r->is_watch) {
		/* no releases: they would wait with it until a Revoke */
		next.attach_id = a->id;
		next.watch = true;
		if (a->has_ret) {
			next.has_return = true;
			next.return_from = a->ret_from;
			next.n_returned = a->nret;
			next.returned = a->ret;
		}
		req.body_case = LOADERD__REQUEST__BODY_NEXT;
		req.next = &next;
	} else if (r->is_release) {
		rel.attach_id = a->id;
		rel.n_leases = a->nrel;
		rel.leases = a->rel;
		rel.stats = stats_report(a, &st, true);
		req.body_case = LOADERD__REQUEST__BODY_RELEASE;
		req.release = &rel;
	} else {
		next.attach_id = a->id;
		next.n_releases = a->nrel;
		next.releases = a->rel;
		next.max_batches = ask;
		next.stats = stats_report(a, &st, false);
		req.body_case = LOADERD__REQUEST__BODY_NEXT;
		req.next = &next;
	}
	if ((e = pack_msg(&req, &msg)) < 0)
		return e;
	if (r->is_watch) {
		a->has_ret = false;
		a->nret = 0;
	} else {
		a->nrel = 0;
	}
	nng_aio_set_msg(r->aio, msg);
	r->state = REQ_SENDING;
	if (!r->is_release && !r->is_watch) {
		r->asked = ask;
		a->outstanding++;
		a->requested += (int)ask;
	}
	nng_ctx_send(r->ctx, r->aio);
	return 0;
}
