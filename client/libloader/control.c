/* SPDX-License-Identifier: MIT */
/* libloader: the control calls: create and drop pipelines (remembered, to create
 * them again in a restarted daemon), status, list, set, reload.
 */
#include "awscreds.h"
#include "libloader-private.h"

/*
 * Remember the spec of pipeline @name, created (or found) by this client, so
 * that reconnect_run() creates it again in a restarted daemon; the newest
 * spec of a name wins. Without memory it is just not remembered.
 */
static void spec_remember(struct ldr_client *c, const char *name, const char *json,
                          const Loaderd__CreatePipelineReply *cr)
{
	struct spec_rec *sr;
	char *copy = strdup(json);

	if (!copy)
		return;
	pthread_mutex_lock(&c->lock);
	for (sr = c->specs; sr; sr = sr->next)
		if (strcmp(sr->name, name) == 0)
			break;
	if (!sr && (sr = calloc(1, sizeof(*sr)))) {
		snprintf(sr->name, sizeof(sr->name), "%s", name);
		sr->next = c->specs;
		c->specs = sr;
	}
	if (sr) {
		free(sr->json);
		sr->json = copy;
		sr->has_owner = cr->has_owner;
		sr->owner = (uid_t)cr->owner;
	} else {
		free(copy);
	}
	pthread_mutex_unlock(&c->lock);
}

/* A dropped pipeline is not created again. */
static void spec_forget(struct ldr_client *c, const char *name)
{
	pthread_mutex_lock(&c->lock);
	for (struct spec_rec **pp = &c->specs; *pp; pp = &(*pp)->next)
		if (strcmp((*pp)->name, name) == 0) {
			struct spec_rec *sr = *pp;
			*pp = sr->next;
			free(sr->json);
			free(sr);
			break;
		}
	pthread_mutex_unlock(&c->lock);
}

/* @sc pointing into @ac */
static void store_creds_msg(struct awscreds *ac, Loaderd__StoreCredentials *sc)
{
	loaderd__store_credentials__init(sc);
	sc->access_key_id = ac->access_key;
	sc->secret_access_key = ac->secret_key;
	sc->session_token = ac->session_token;
	sc->region = ac->region;
	sc->endpoint = ac->endpoint;
	sc->expires = ac->expires;
}

int store_creds(const char *spec_json, struct awscreds *ac, Loaderd__StoreCredentials *sc)
{
	extern char **environ;
	char err[512];

	/* a JSON string that starts with a URL: a path in a store */
	if (!strstr(spec_json, "\"s3://") && !strstr(spec_json, "\"https://") && !strstr(spec_json, "\"http://"))
		return 0;
	/* only an s3:// object is signed: a spec of http(s):// URLs alone asks
	 * no credential service (an instance's, off EC2, can take a second) */
	if (awscreds_load_from(ac, (const char *const *)environ, getenv("HOME"), strstr(spec_json, "\"s3://") != NULL,
			       err, sizeof(err)) < 0)
		return set_err(-EINVAL, "object-store credentials: %s", err);
	store_creds_msg(ac, sc);
	return 1;
}

/* FNV-1a 64 of the key pair and token: tells fresh keys from the same ones */
static uint64_t keys_fp(const struct awscreds *ac)
{
	const char *parts[3] = { ac->access_key, ac->secret_key, ac->session_token };
	uint64_t h = 0xcbf29ce484222325ull;

	for (int i = 0; i < 3; i++)
		for (const char *p = parts[i];; p++) {
			h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
			if (!*p)
				break;
		}
	return h;
}

static struct keys_sent *keys_sent_find(struct ldr_client *c, const char *name)
{
	struct keys_sent *ks;

	for (ks = c->keys_sent; ks; ks = ks->next)
		if (!strcmp(ks->name, name))
			break;
	return ks;
}

void keys_sent_note(struct ldr_client *c, const char *name, const struct awscreds *ac)
{
	struct keys_sent *ks;

	pthread_mutex_lock(&c->lock);
	if (!(ks = keys_sent_find(c, name)) && (ks = calloc(1, sizeof(*ks)))) {
		snprintf(ks->name, sizeof(ks->name), "%s", name);
		ks->next = c->keys_sent;
		c->keys_sent = ks;
	}
	if (ks)
		ks->fp = keys_fp(ac);
	pthread_mutex_unlock(&c->lock);
}

void store_creds_clear(struct awscreds *ac)
{
	explicit_bzero(ac, sizeof(*ac));
}

/* ldr_create_pipeline(), and with @has_owner the uid whose pipeline exist_ok may join. */
static int create_call(struct ldr_client *c, const char *spec_json, int exist_ok, bool has_owner,
                       uint32_t owner, char *name_out, size_t name_size)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__CreatePipeline cp = LOADERD__CREATE_PIPELINE__INIT;
	Loaderd__StoreCredentials sc;
	struct awscreds ac;
	Loaderd__Reply *rep;
	int r;

	CHECK_PID(c);
	if (!spec_json)
		return set_err(-EINVAL, "no spec");
	if ((r = store_creds(spec_json, &ac, &sc)) < 0)
		return r;
	cp.store = r ? &sc : NULL;
	cp.spec_json = (char *)spec_json;
	cp.exist_ok = exist_ok != 0;
	cp.has_owner = has_owner;
	cp.owner = owner;
	req.body_case = LOADERD__REQUEST__BODY_CREATE;
	req.create = &cp;
	r = call(c, &req, &rep, LOADERD__REPLY__BODY_CREATE);
	if (cp.store && r == 0)
		keys_sent_note(c, rep->create->name, &ac);
	if (cp.store)
		store_creds_clear(&ac);
	if (r < 0)
		return r;
	if (name_out && name_size)
		snprintf(name_out, name_size, "%s", rep->create->name);
	spec_remember(c, rep->create->name, spec_json, rep->create);
	r = rep->create->created ? 1 : 0;
	loaderd__reply__free_unpacked(rep, NULL);
	return r;
}

int ldr_create_pipeline(struct ldr_client *c, const char *spec_json, int exist_ok, char *name_out,
                        size_t name_size)
{
	return create_call(c, spec_json, exist_ok, false, 0, name_out, name_size);
}

int ldr_create_pipeline_of(struct ldr_client *c, const char *spec_json, uint32_t owner_uid,
                           char *name_out, size_t name_size)
{
	return create_call(c, spec_json, 1, true, owner_uid, name_out, name_size);
}

/* @o's field @f, or 0 where the caller's struct ends before it */
#define STORE_OPT(o, f) ((o) && ((o)->size == 0 || (o)->size >= offsetof(struct ldr_store_opts, f) + \
				    sizeof((o)->f)) ? (o)->f : 0)

int ldr_set_store(struct ldr_client *c, const char *name, const struct ldr_store_opts *opts)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__SetStore ss = LOADERD__SET_STORE__INIT;
	Loaderd__StoreCredentials sc;
	const char *ak = STORE_OPT(opts, access_key_id), *sk = STORE_OPT(opts, secret_access_key);
	const char *tok = STORE_OPT(opts, session_token);
	struct keys_sent *was;
	struct awscreds ac;
	Loaderd__Reply *rep;
	char err[512];
	int r;

	CHECK_PID(c);
	if (!name || !*name)
		return set_err(-EINVAL, "no pipeline name");
	if (opts && opts->size && opts->size < sizeof(size_t))
		return set_err(-EINVAL, "ldr_store_opts: size %zu is too small", opts->size);
	if (!ak != !sk)
		return set_err(-EINVAL, "ldr_store_opts: access_key_id and secret_access_key, both or neither");
	/* what a create would send now: the region and endpoint always, the
	 * keys unless the caller gives its own */
	extern char **environ;
	if (awscreds_load_from(&ac, (const char *const *)environ, getenv("HOME"), !ak, err, sizeof(err)) < 0) {
		store_creds_clear(&ac);
		return set_err(-EINVAL, "object-store credentials: %s", err);
	}
	if (ak) {
		if (strlen(ak) >= sizeof(ac.access_key) || strlen(sk) >= sizeof(ac.secret_key) ||
		    (tok && strlen(tok) >= sizeof(ac.session_token))) {
			store_creds_clear(&ac);
			return set_err(-EINVAL, "ldr_store_opts: a key or token too long");
		}
		snprintf(ac.access_key, sizeof(ac.access_key), "%s", ak);
		snprintf(ac.secret_key, sizeof(ac.secret_key), "%s", sk);
		snprintf(ac.session_token, sizeof(ac.session_token), "%s", tok ? tok : "");
		ac.expires = STORE_OPT(opts, expires);
	}
	if (STORE_OPT(opts, if_changed)) {
		pthread_mutex_lock(&c->lock);
		was = keys_sent_find(c, name);
		r = was && was->fp == keys_fp(&ac);
		pthread_mutex_unlock(&c->lock);
		if (r) {
			store_creds_clear(&ac);
			return 0;
		}
	}
	store_creds_msg(&ac, &sc);
	ss.name = (char *)name;
	ss.store = &sc;
	req.body_case = LOADERD__REQUEST__BODY_SET_STORE;
	req.set_store = &ss;
	r = call(c, &req, &rep, LOADERD__REPLY__BODY_OK);
	if (r == 0) {
		keys_sent_note(c, name, &ac);
		loaderd__reply__free_unpacked(rep, NULL);
	}
	store_creds_clear(&ac);
	return r < 0 ? r : 1;
}

int ldr_drop_pipeline(struct ldr_client *c, const char *name, int force)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__DropPipeline dp = LOADERD__DROP_PIPELINE__INIT;
	Loaderd__Reply *rep;
	int r;

	CHECK_PID(c);
	dp.name = (char *)name;
	dp.force = force != 0;
	req.body_case = LOADERD__REQUEST__BODY_DROP;
	req.drop = &dp;
	r = call(c, &req, &rep, LOADERD__REPLY__BODY_OK);
	if (r == 0) {
		loaderd__reply__free_unpacked(rep, NULL);
		if (name)
			spec_forget(c, name);
	}
	return r;
}

int ldr_status_json(struct ldr_client *c, char **json_out)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Status st = LOADERD__STATUS__INIT;

	CHECK_PID(c);
	req.body_case = LOADERD__REQUEST__BODY_STATUS;
	req.status = &st;
	return json_call(c, &req, json_out);
}

int ldr_pipelines_json(struct ldr_client *c, char **json_out)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__ListPipelines lp = LOADERD__LIST_PIPELINES__INIT;

	CHECK_PID(c);
	req.body_case = LOADERD__REQUEST__BODY_LIST;
	req.list = &lp;
	return json_call(c, &req, json_out);
}

int ldr_set(struct ldr_client *c, const char *key, const char *pipeline, const char *value,
            char **json_out)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Set st = LOADERD__SET__INIT;

	CHECK_PID(c);
	if (!key || !value || !json_out)
		return set_err(-EINVAL, "set: no key or value");
	st.key = (char *)key;
	st.value = (char *)value;
	st.pipeline = (char *)(pipeline ? pipeline : "");
	req.body_case = LOADERD__REQUEST__BODY_SET;
	req.set = &st;
	return json_call(c, &req, json_out);
}

int ldr_reload(struct ldr_client *c, char **json_out)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Reload rl = LOADERD__RELOAD__INIT;

	CHECK_PID(c);
	if (!json_out)
		return set_err(-EINVAL, "reload: no json_out");
	req.body_case = LOADERD__REQUEST__BODY_RELOAD;
	req.reload = &rl;
	/* the reply comes once the new pipelines' files are open and indexed */
	return json_call_timeout(c, &req, json_out, RELOAD_TIMEOUT_MS);
}
