/* SPDX-License-Identifier: MIT */
/* fuzz-wire - loaderd.Request messages, decoded and acted on as the daemon does
 *
 * The socket is open to every local user, so each request is untrusted. The
 * input is one connection's requests: frames of a 2-byte little-endian length
 * and that many bytes of a loaderd.Request. Each frame goes through what
 * handlers.c does with it, against a real engine with its workers and no
 * network: protobuf-c's unpack, then spec_parse() and engine_create() for a
 * Create, engine_attach() for an Attach, attachment_next() for Next and
 * Release, engine_drop(), the status JSON. Only the nng replies are left
 * out (handlers.c's functions take an nng context; what they check before
 * calling the engine is repeated here, marked "as handlers.c"). Object
 * stores are off (no network: store_endpoints is empty), so an s3:// or
 * https:// source fails at once (fuzz/regress/wire/s3-create-no-network).
 * Each frame that unpacks must also pack back to bytes that unpack and pack
 * the same.
 *
 * The engine lives across inputs, with a tokens pipeline "fuzz" of the
 * daemon's (any client may attach: "access": "all") on a small file in
 * /tmp/loaderd-fuzz-wire/ (a fixed path, so that the seed corpus can name
 * it); at the end of an input its connection goes: what it attached is
 * detached and what it created is dropped. The workers run in threads, so a
 * run is not exactly reproducible; the deliveries are drained after every
 * frame.
 */
#include <sys/stat.h>

#include "fuzz.h"

#include "loader.pb-c.h"
#include "log.h"
#include "engine.h"
#include "spec.h"
#include "source.h"

#define FUZZ_DIR "/tmp/loaderd-fuzz-wire"
#define FUZZ_TOKENS FUZZ_DIR "/tokens.bin"
#define MAX_ATTACH 16         /* as MAX_ATTACH_PER_CLIENT (server-private.h) */
#define MAX_RELEASES 4096     /* as server-private.h */
#define MAX_CREATED 8
#define CLIENT_ID 7

static uv_loop_t loop;
static struct engine *eng;
static struct principal daemon_self, client;

struct parked {
	struct pending p;             /* first: the engine hands this back */
	uint32_t answers;
};

static void on_deliver(void *userdata, struct pending *p, const struct delivery *d)
{
	struct parked *pk = (struct parked *)p;

	(void)userdata;
	if (d->kind == DELIVER_BATCH && (d->nbatches == 0 || d->nbatches > DELIVER_MAX_BATCHES ||
					 d->nbatches > p->max)) {
		fprintf(stderr, "a delivery of %u batches to a Next of at most %u\n", d->nbatches,
			p->max);
		abort();
	}
	if (pk->answers++) {
		fprintf(stderr, "a parked request answered twice\n");
		abort();
	}
	free(pk);
}

static void make_dataset(void)
{
	uint16_t tok[4096];
	FILE *f;

	for (size_t i = 0; i < 4096; i++)
		tok[i] = (uint16_t)(i * 7919u);
	if (mkdir(FUZZ_DIR, 0755) < 0 && errno != EEXIST) {
		perror(FUZZ_DIR);
		abort();
	}
	f = fopen(FUZZ_DIR "/tokens.tmp", "wb");
	if (!f || fwrite(tok, sizeof(tok), 1, f) != 1 || fclose(f) != 0 ||
	    rename(FUZZ_DIR "/tokens.tmp", FUZZ_TOKENS) < 0) {
		perror(FUZZ_TOKENS);
		abort();
	}
}

static void create_base(void)
{
	static const char text[] =
		"{\"name\": \"fuzz\", \"source\": {\"kind\": \"tokens\", \"path\": \"" FUZZ_TOKENS "\","
		" \"dtype\": \"uint16\", \"seq_len\": 16}, \"batch_size\": 4, \"prefetch\": 4,"
		" \"shuffle\": true, \"epochs\": 2, \"access\": \"all\"}";
	struct spec *spec;
	char err[512];

	if (spec_parse(&spec, text, err, sizeof(err)) < 0 ||
	    engine_create(eng, spec, &daemon_self, 0, false, err, sizeof(err)) != 1) {
		fprintf(stderr, "fuzz-wire: the base pipeline: %s\n", err);
		abort();
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	static const struct engine_ops ops = { .deliver = on_deliver };

	static char *no_endpoint[] = { NULL };
	char err[256];

	log_max_level = LOG_ERR;  /* not a line per pipeline created */
	/* no network here: a Create naming s3:// or https:// fails at once, as
	 * under a config with "store_endpoints": [] (else the store would
	 * retry an unreachable AWS for store_retry_seconds: a timeout) */
	if (source_set_store_endpoints(no_endpoint, err, sizeof(err)) < 0) {
		fprintf(stderr, "fuzz-wire: %s\n", err);
		abort();
	}
	make_dataset();
	principal_daemon(&daemon_self);
	creds_self(&client.creds);
	client.admin = false;
	if (uv_loop_init(&loop) != 0 || engine_new(&eng, &loop, 1, 64u << 20, &ops, NULL) < 0)
		abort();
	create_base();
	return 0;
}

struct conn {
	struct attachment *atts[MAX_ATTACH];
	unsigned natts;
	char created[MAX_CREATED][LDR_NAME_MAX + 1];
	unsigned ncreated;
};

static struct attachment *conn_att(struct conn *c, uint64_t id, unsigned *index)
{
	for (unsigned i = 0; i < c->natts; i++)
		if (attachment_id(c->atts[i]) == id) {
			if (index)
				*index = i;
			return c->atts[i];
		}
	return NULL;
}

static void check_repack(const Loaderd__Request *req)
{
	size_t n = loaderd__request__get_packed_size(req), n2;
	uint8_t *a = malloc(n ? n : 1), *b;
	Loaderd__Request *again;

	if (!a)
		return;
	if (loaderd__request__pack(req, a) != n)
		abort();
	again = loaderd__request__unpack(NULL, n, a);
	if (!again) {
		/* protobuf-c 1.4 accepts field number 0 in an overlong varint tag
		 * (80 00) as an unknown field and packs it back canonically (00),
		 * which it refuses: its quirk, harmless here, for the daemon never
		 * packs a request (fuzz/regress/wire/unknown-field-0) */
		free(a);
		return;
	}
	n2 = loaderd__request__get_packed_size(again);
	b = malloc(n2 ? n2 : 1);
	if (b && (n2 != n || loaderd__request__pack(again, b) != n || memcmp(a, b, n) != 0)) {
		fprintf(stderr, "a request packs differently after a round trip\n");
		abort();
	}
	free(b);
	loaderd__request__free_unpacked(again, NULL);
	free(a);
}

static void do_create(struct conn *c, const Loaderd__CreatePipeline *m)
{
	struct spec *spec;
	char err[1024], name[LDR_NAME_MAX + 1];
	int r;

	if (spec_parse(&spec, m->spec_json, err, sizeof(err)) < 0)
		return;
	snprintf(name, sizeof(name), "%s", spec->name);
	r = engine_create(eng, spec, &client, CLIENT_ID, m->exist_ok, err, sizeof(err));
	if (r == 1 && c->ncreated < MAX_CREATED)
		snprintf(c->created[c->ncreated++], LDR_NAME_MAX + 1, "%s", name);
}

static void do_attach(struct conn *c, const Loaderd__Attach *m)
{
	struct attach_params p = {
		.mode = (int)m->mode, .rank = m->rank, .world = m->world_size,
		.has_start = m->has_start, .start_epoch = m->start_epoch, .start_batch = m->start_batch,
		.credits = m->credits, .client_id = CLIENT_ID, .uid = client.creds.uid, .who = &client,
	};
	struct attachment *a;
	struct attach_info info;
	char err[512];
	json_t *j;

	/* a CUDA attach needs a driver: not here */
	if (m->device_kind != 0 || c->natts >= MAX_ATTACH)
		return;
	if (engine_attach(eng, m->pipeline, &p, &a, err, sizeof(err)) < 0)
		return;
	c->atts[c->natts++] = a;
	attachment_get_info(a, &info);
	j = attachment_json(a);
	json_decref(j);
}

static void do_next(struct conn *c, const Loaderd__Next *m)
{
	struct attachment *a = conn_att(c, m->attach_id, NULL);
	struct parked *pk;
	char err[256];

	if (!a || m->n_releases > MAX_RELEASES || m->n_returned > MAX_RELEASES)
		return;
	pk = calloc(1, sizeof(*pk));
	if (!pk)
		return;
	pk->p.max = m->max_batches;   /* as handlers.c */
	if (attachment_next(a, &pk->p, &(struct next_req){ .releases = m->releases,
		.nreleases = m->n_releases, .watch = m->watch, .has_return = m->has_return,
		.return_from = m->return_from, .returned = m->returned, .nreturned = m->n_returned },
		err, sizeof(err)) < 0)
		free(pk);               /* refused: answered with the error, never parked */
}

static void do_release(struct conn *c, const Loaderd__Release *m)
{
	struct attachment *a = conn_att(c, m->attach_id, NULL);
	char err[256];

	if (a && m->n_leases <= MAX_RELEASES)
		(void)attachment_next(a, NULL, &(struct next_req){ .releases = m->leases,
			.nreleases = m->n_leases }, err, sizeof(err));
}

static void do_detach(struct conn *c, const Loaderd__Detach *m)
{
	unsigned i;
	struct attachment *a = conn_att(c, m->attach_id, &i);

	if (!a)
		return;
	c->atts[i] = c->atts[--c->natts];
	attachment_detach(a);
}

static void do_request(struct conn *c, const uint8_t *data, size_t size)
{
	Loaderd__Request *req = loaderd__request__unpack(NULL, size, data);
	char err[256];

	if (!req)
		return;               /* "malformed request" */
	check_repack(req);
	switch (req->body_case) {
	case LOADERD__REQUEST__BODY_HELLO:
		break;
	case LOADERD__REQUEST__BODY_CREATE:
		do_create(c, req->create);
		break;
	case LOADERD__REQUEST__BODY_DROP:
		(void)engine_drop(eng, req->drop->name, &client, req->drop->force, err, sizeof(err));
		break;
	case LOADERD__REQUEST__BODY_LIST:
	case LOADERD__REQUEST__BODY_STATUS:
		json_decref(engine_pipelines_json(eng, &client));
		json_decref(engine_pipelines_json(eng, &daemon_self));
		break;
	case LOADERD__REQUEST__BODY_ATTACH:
		do_attach(c, req->attach);
		break;
	case LOADERD__REQUEST__BODY_NEXT:
		do_next(c, req->next);
		break;
	case LOADERD__REQUEST__BODY_RELEASE:
		do_release(c, req->release);
		break;
	case LOADERD__REQUEST__BODY_DETACH:
		do_detach(c, req->detach);
		break;
	default:
		break;
	}
	loaderd__request__free_unpacked(req, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct conn c = { 0 };
	char err[256];
	size_t off = 0;

	while (off + 2 <= size) {
		size_t n = data[off] | (size_t)data[off + 1] << 8;

		off += 2;
		if (n > size - off)
			n = size - off;
		do_request(&c, data + off, n);
		off += n;
		uv_run(&loop, UV_RUN_NOWAIT);
	}
	/* the connection closes (session.c's client_free) */
	while (c.natts)
		attachment_detach(c.atts[--c.natts]);
	engine_client_gone(eng, CLIENT_ID);
	for (unsigned i = 0; i < c.ncreated; i++)
		(void)engine_drop(eng, c.created[i], &daemon_self, true, err, sizeof(err));
	if (!engine_has(eng, "fuzz"))
		create_base();
	uv_run(&loop, UV_RUN_NOWAIT);
	return 0;
}
