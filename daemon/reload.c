/* SPDX-License-Identifier: MIT */
/* reload - the config as the daemon runs it: at start, on SIGHUP, on `loaderctl reload`
 *
 * A reload makes the daemon what a start with the new file would make it, as
 * far as that can change without a restart (docs/config.md lists which keys
 * can): the command line still wins over the file, a key the file no longer
 * has goes back to its default, and values `loaderctl set` changed are set
 * again from the file. The file and every pipeline spec in it are checked
 * first; an invalid one changes nothing, and the reply and the log say
 * "FILE: key: why". The keys that need a restart (the sockets, their mode
 * and group, dataset_roots, metrics_address) are compared with what the daemon started with
 * and named on each reload for as long as they differ.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "base/config-change.h"
#include "base/creds.h"
#include "base/log.h"
#include "notify.h"
#include "engine/engine.h"
#include "reload.h"
#include "server/server.h"
#include "sources/source.h"

int config_spec(json_t *spec_json, struct spec **out, char *err, size_t errlen)
{
	struct spec *spec;
	int r = spec_from_json(&spec, spec_json, err, errlen);

	/* the config's pipelines persist, always */
	if (r == 0 && (spec->has_ttl || (spec->has_persist && !spec->persist))) {
		r = errfmt(-EINVAL, err, errlen, "%s: pipelines of the config persist always "
		           "(persist and ttl are for pipelines that clients create)",
		           spec->has_ttl ? "ttl" : "persist: false");
		spec_free(spec);
	}
	if (r == 0)
		*out = spec;
	return r;
}

static char **roots_dup(char *const *roots)
{
	size_t n = 0;
	char **out;

	if (!roots)
		return NULL;
	while (roots[n])
		n++;
	if (!(out = calloc(n + 1, sizeof(*out))))
		return NULL;
	for (size_t i = 0; i < n; i++)
		out[i] = strdup(roots[i]);
	return out;
}

static void roots_free(char **roots)
{
	for (size_t i = 0; roots && roots[i]; i++)
		free(roots[i]);
	free(roots);
}

static bool roots_equal(char *const *a, char *const *b)
{
	size_t i = 0;

	for (; a && b && a[i] && b[i]; i++)
		if (strcmp(a[i], b[i]) != 0)
			return false;
	return (!a || !a[i]) && (!b || !b[i]);
}

static json_t *roots_json(char *const *roots)
{
	json_t *a;

	if (!roots)
		return json_null();
	a = json_array();
	for (size_t i = 0; roots[i]; i++)
		json_array_append_new(a, json_string(roots[i]));
	return a;
}

/* The live settings of @cfg that the daemon keeps nowhere else. */
static void remember_live(struct config_run *cr, const struct settings *cfg)
{
	cr->linger_ms = cfg->has_linger ? cfg->linger_ms : SETTINGS_LINGER_DEFAULT_MS;
	cr->slow_ms = cfg->has_slow_timeout ? cfg->slow_timeout_ms : ENGINE_SLOW_TIMEOUT_DEFAULT_MS;
	cr->max_held = cfg->max_held_after_drop;
	cr->user_memory = cfg->memory_limit_per_user;
	cr->max_pipelines = cfg->max_pipelines_per_user;
	cr->admin_gid = cfg->has_admin_group ? (int)cfg->admin_gid : -1;
	cr->max_conn = cfg->max_conn_per_uid ? cfg->max_conn_per_uid : SETTINGS_CONN_PER_UID_DEFAULT;
}

int config_run_init(struct config_run *cr, struct server *srv, const struct settings *cfg,
                    const struct settings *cli, const char *socket, unsigned default_workers,
                    uint64_t default_memory_limit)
{
	*cr = (struct config_run){
		.srv = srv,
		.cli_workers = cli->workers,
		.cli_memory_limit = cli->memory_limit,
		.cli_log_level = cli->log_level,
		.cli_socket = cli->socket_path != NULL,
		.cli_cache_dir = cli->cache_dir != NULL,
		.default_workers = default_workers,
		.default_memory_limit = default_memory_limit,
		.socket_mode = cfg->has_socket_mode ? cfg->socket_mode : 0660,
		.socket_gid = cfg->has_socket_group ? (int)cfg->socket_gid : -1,
	};
	snprintf(cr->socket, sizeof(cr->socket), "%s", socket);
	if ((cfg->path && !(cr->path = strdup(cfg->path))) ||
	    (cfg->dataset_roots && !(cr->roots = roots_dup(cfg->dataset_roots))) ||
	    (cfg->metrics_address && !(cr->metrics_address = strdup(cfg->metrics_address))))
		return -ENOMEM;
	remember_live(cr, cfg);
	return 0;
}

void config_run_clear(struct config_run *cr)
{
	free(cr->path);
	free(cr->metrics_address);
	roots_free(cr->roots);
	memset(cr, 0, sizeof(*cr));
}

int config_run_pipelines(struct config_run *cr, const struct settings *cfg)
{
	struct engine *eng = server_engine(cr->srv);
	size_t i;
	json_t *spec_json;
	int failed = 0;

	json_array_foreach(cfg->pipelines, i, spec_json) {
		struct spec *spec = NULL;
		char err[1024];
		int r = config_spec(spec_json, &spec, err, sizeof(err));
		if (r == 0)
			r = engine_config_apply(eng, spec, NULL, "start", err, sizeof(err));
		if (r < 0 || r == CONFIG_UNCHANGED) {
			/* at start, "unchanged" is a name the file has twice */
			log_err("%s: pipelines[%zu]: %s", cfg->path, i, err);
			failed++;
		}
	}
	return failed ? -EINVAL : 0;
}

/* --- a reload ----------------------------------------------------------- */

struct reload_job {
	struct reload_job *next;  /* in cr->queued */
	struct config_run *cr;
	char who[256];
	server_reload_done done;
	void *ctx;
	json_t *changed;          /* [{"key", "old", "new"[, "note"]}] */
	json_t *restart;          /* [{"key", "running", "file"}] */
	struct settings fresh;    /* the file, checked */
	struct spec **specs;      /* its pipelines, n of them */
	struct reload_open *opens;
	size_t n;
	size_t opening;           /* opens not done yet, +1 while they are started */
};

/* A pipeline's files, opened for a reload (engine_open_async()). */
struct reload_open {
	struct reload_job *j;
	struct config_open op;
};

#define RELOAD_QUEUE_MAX 16

/* "by=WHO", quoted, for a config.change line. */
static const char *by_field(char *buf, size_t len, const char *who)
{
	char q[LOG_QUOTE_MAX];

	snprintf(buf, len, "by=%s", log_quote(q, who));
	return buf;
}

/* @key (of @pipeline, or NULL) went from @old to @new (both taken): into the
 * report and the log, unless they are equal. */
static void change(struct reload_job *j, const char *key, const char *pipeline, json_t *old,
                   json_t *new, const char *note)
{
	char by[LOG_QUOTE_MAX + 3];
	json_t *e;

	if (json_equal(old, new)) {
		json_decref(old);
		json_decref(new);
		return;
	}
	e = config_change("config.change", key, pipeline, old, new, note,
	                  by_field(by, sizeof(by), j->who));
	json_array_append_new(j->changed, e);
}

/* @key differs from what the daemon started with (both taken). */
static void needs_restart(struct reload_job *j, const char *key, json_t *running, json_t *file)
{
	if (json_equal(running, file)) {
		json_decref(running);
		json_decref(file);
		return;
	}
	char r[LOG_QUOTE_MAX], f[LOG_QUOTE_MAX], path[LOG_QUOTE_MAX];

	log_event(LOG_WARNING, "config.restart_needed", "key=%s running=%s file=%s config=%s "
	          "why=\"it takes effect when loaderd restarts\"", key, config_log_value(r, running),
	          config_log_value(f, file), log_quote(path, j->cr->path));
	json_array_append_new(j->restart, json_pack("{s:s, s:o, s:o}", "key", key, "running", running,
	                                            "file", file));
}

static json_t *secs(uint64_t ms)
{
	return ms % 1000 ? json_real((double)ms / 1000.0) : json_integer((json_int_t)(ms / 1000));
}

static json_t *gid_json(int gid)
{
	return gid < 0 ? json_null() : json_integer(gid);
}

static int apply_settings(struct reload_job *j, const struct settings *f, char *err, size_t errlen)
{
	struct config_run *cr = j->cr;
	struct engine *eng = server_engine(cr->srv);
	unsigned workers = cr->cli_workers ? cr->cli_workers : f->workers ? f->workers : cr->default_workers;
	uint64_t limit = cr->cli_memory_limit ? cr->cli_memory_limit
	               : f->memory_limit ? f->memory_limit : cr->default_memory_limit;
	int level = cr->cli_log_level ? cr->cli_log_level : f->log_level ? f->log_level : LOG_INFO;
	unsigned old_workers = engine_workers(eng);
	uint64_t old_limit = engine_memory_limit(eng), used = engine_memory_used(eng);
	int r;
	char note[256], by[LOG_QUOTE_MAX + 3];
	struct config_run was = *cr;

	if (workers != old_workers && (r = engine_set_workers(eng, workers, err, errlen)) < 0)
		return r;
	change(j, "workers", NULL, json_integer(old_workers), json_integer(workers), NULL);
	engine_set_memory_limit(eng, limit);
	change(j, "memory_limit", NULL, json_integer((json_int_t)old_limit),
	       json_integer((json_int_t)limit), memory_limit_note(note, sizeof(note), limit, used));
	if (level != log_max_level)
		json_array_append_new(j->changed, config_change_log_level(level, "config.change",
		                                                          by_field(by, sizeof(by), j->who)));

	remember_live(cr, f);
	engine_set_linger(eng, cr->linger_ms);
	change(j, "linger", NULL, secs(was.linger_ms), secs(cr->linger_ms),
	       "for pipelines unused from now on");
	engine_set_slow_timeout(eng, cr->slow_ms);
	change(j, "slow_client_timeout", NULL, secs(was.slow_ms), secs(cr->slow_ms),
	       "for pipelines created from now on");
	engine_set_max_held(eng, cr->max_held);
	change(j, "max_held_after_drop", NULL,
	       was.max_held ? json_integer((json_int_t)was.max_held) : json_null(), cr->max_held ? json_integer((json_int_t)cr->max_held) : json_null(), NULL);
	engine_set_user_bounds(eng, cr->user_memory, cr->max_pipelines);
	change(j, "memory_limit_per_user", NULL,
	       was.user_memory ? json_integer((json_int_t)was.user_memory) : json_null(),
	       cr->user_memory ? json_integer((json_int_t)cr->user_memory) : json_null(),
	       "for creates from now on");
	change(j, "max_pipelines_per_user", NULL,
	       json_integer(was.max_pipelines ? was.max_pipelines : ENGINE_PIPELINES_PER_USER_DEFAULT),
	       json_integer(cr->max_pipelines ? cr->max_pipelines : ENGINE_PIPELINES_PER_USER_DEFAULT),
	       "for creates from now on");
	server_set_access(cr->srv, cr->admin_gid, cr->max_conn);
	change(j, "admin_group", NULL, gid_json(was.admin_gid), gid_json(cr->admin_gid),
	       "for requests from now on; members' groups are those of their connection");
	change(j, "max_connections_per_uid", NULL, json_integer(was.max_conn), json_integer(cr->max_conn),
	       "for connections from now on");
	return 0;
}

static void check_restart_keys(struct reload_job *j, const struct settings *f)
{
	struct config_run *cr = j->cr;
	char path[108], mode[2][16];

	if (!cr->cli_socket && sockpath_resolve(path, sizeof(path), f->socket_path) == 0)
		needs_restart(j, "socket", json_string(cr->socket), json_string(path));
	snprintf(mode[0], sizeof(mode[0]), "%04o", cr->socket_mode);
	snprintf(mode[1], sizeof(mode[1]), "%04o", f->has_socket_mode ? f->socket_mode : 0660);
	/* as the config writes it, "0660" */
	needs_restart(j, "socket_mode", json_string(mode[0]), json_string(mode[1]));
	needs_restart(j, "socket_group", gid_json(cr->socket_gid),
	              gid_json(f->has_socket_group ? (int)f->socket_gid : -1));
	if (!roots_equal(cr->roots, f->dataset_roots))
		needs_restart(j, "dataset_roots", roots_json(cr->roots), roots_json(f->dataset_roots));
	if (!cr->cli_cache_dir && f->cache_dir) {
		char dir[4096];

		if (!source_cache_dir(dir, sizeof(dir)))
			dir[0] = '\0';
		needs_restart(j, "cache_dir", json_string(dir), json_string(f->cache_dir));
	}
	{
		json_t *oc = source_object_cache_json();
		json_int_t running = json_integer_value(json_object_get(oc, "cache_bytes"));

		json_int_t ahead = json_integer_value(json_object_get(oc, "fetch_ahead"));
		uint64_t want = f->fetch_ahead ? f->fetch_ahead : SOURCE_FETCH_AHEAD_DEFAULT;

		json_decref(oc);
		if (running)
			needs_restart(j, "cache_bytes", json_integer(running),
			              json_integer((json_int_t)(f->cache_bytes ? f->cache_bytes
			                                                        : SETTINGS_CACHE_BYTES_DEFAULT)));
		/* the bound in force is at most half of cache_bytes */
		if (running && (uint64_t)ahead != (want > (uint64_t)running / 2 ? (uint64_t)running / 2 : want))
			needs_restart(j, "fetch_ahead", json_integer(ahead), json_integer((json_int_t)want));
	}
	needs_restart(j, "store_retry_seconds", json_real(source_store_retry()),
	              json_real(f->store_retry_s > 0 ? f->store_retry_s : SOURCE_STORE_RETRY_DEFAULT));
	needs_restart(j, "store_endpoints", source_store_endpoints_json(), roots_json(f->store_endpoints));
	needs_restart(j, "metrics_address", cr->metrics_address ? json_string(cr->metrics_address) : json_null(),
	              f->metrics_address ? json_string(f->metrics_address) : json_null());
}

/* Every pipeline spec of @f, checked, into @specs (n of them): all or none. */
static int check_specs(const struct settings *f, struct spec **specs, size_t n, char *err, size_t errlen)
{
	json_t *spec_json;
	size_t i;
	int r;

	json_array_foreach(f->pipelines, i, spec_json) {
		char why[1024];
		if ((r = config_spec(spec_json, &specs[i], why, sizeof(why))) < 0)
			return errfmt(r, err, errlen, "%s: pipelines[%zu]: %s", f->path, i, why);
		for (size_t k = 0; k < i; k++)
			if (strcmp(specs[k]->name, specs[i]->name) == 0)
				return errfmt(-EINVAL, err, errlen, "%s: pipelines[%zu]: name '%s' is "
				              "pipelines[%zu]'s already", f->path, i, specs[i]->name, k);
	}
	(void)n;
	return 0;
}

static json_t *apply_pipelines(struct reload_job *j, const struct settings *f, struct spec **specs,
                               size_t n)
{
	struct reload_open *opens = j->opens;
	struct engine *eng = server_engine(j->cr->srv);
	json_t *created = json_array(), *replaced = json_array(), *same = json_array();
	json_t *failed = json_array(), *keep = json_array();
	char why[320];

	snprintf(why, sizeof(why), "reload by %s", j->who);
	for (size_t i = 0; i < n; i++) {
		char err[1024] = "", name[LDR_NAME_MAX + 1];
		uint32_t was, now;
		int r;
		snprintf(name, sizeof(name), "%s", specs[i]->name);
		json_array_append_new(keep, json_string(name));
		r = engine_config_apply(eng, specs[i], opens ? &opens[i].op : NULL, why, err, sizeof(err));
		specs[i] = NULL;
		if (r == CONFIG_CREATED)
			json_array_append_new(created, json_string(name));
		else if (r == CONFIG_UNCHANGED)
			json_array_append_new(same, json_string(name));
		else if (r == CONFIG_REPLACED)
			json_array_append_new(replaced, json_pack("{s:s, s:s}", "name", name, "changed", err));
		else {
			char qp[LOG_QUOTE_MAX], qe[LOG_QUOTE_MAX];
			log_event(LOG_ERR, "config.pipeline_failed", "config=%s index=%zu pipeline=%s error=%s",
			          log_quote(qp, f->path), i, name, log_quote(qe, err));
			json_array_append_new(failed, json_pack("{s:s, s:s}", "name", name, "error", err));
		}
		/* a live set lasts until the reload: the spec's prefetch again */
		if (r == CONFIG_UNCHANGED && engine_config_prefetch_reset(eng, name, &was, &now))
			change(j, "prefetch", name, json_integer(was), json_integer(now), NULL);
	}
	json_t *drained = engine_config_drain(eng, keep, why);
	json_decref(keep);
	return json_pack("{s:o, s:o, s:o, s:o, s:o}", "created", created, "replaced", replaced,
	                 "draining", drained, "unchanged", same, "failed", failed);
}

static void reload_start(struct reload_job *j);

/* @j is done: it answers, it goes, the next one queued starts. */
static void reload_end(struct reload_job *j, int r, json_t *report, const char *err)
{
	struct config_run *cr = j->cr;

	for (size_t i = 0; j->specs && i < j->n; i++)
		spec_free(j->specs[i]);
	for (size_t i = 0; j->opens && i < j->n; i++)
		source_free(j->opens[i].op.src);
	free(j->specs);
	free(j->opens);
	settings_clear(&j->fresh);
	if (cr->reloading == j)
		cr->reloading = NULL;
	j->done(j->ctx, r, report, err);
	free(j);
	if (!cr->reloading && (j = cr->queued)) {
		cr->queued = j->next;
		cr->nqueued--;
		reload_start(j);
	}
}

static void reload_invalid(struct reload_job *j, int r, const char *why)
{
	char qw[LOG_QUOTE_MAX], qe[LOG_QUOTE_MAX], err[2048];

	log_event(LOG_ERR, "config.invalid", "by=%s error=%s kept=\"the running config\"",
	          log_quote(qw, j->who), log_quote(qe, why));
	notify_send("READY=1\nSTATUS=reload failed, serving with the previous config");
	errfmt(r, err, sizeof(err), "%s; the running config is kept", why);
	reload_end(j, r, NULL, err);
}

/* The daemon stops: @j changes nothing. */
static void reload_stopping(struct reload_job *j)
{
	const char *why = "the daemon is stopping: the reload was not applied";
	char qw[LOG_QUOTE_MAX], qe[LOG_QUOTE_MAX];

	log_event(LOG_NOTICE, "config.reload", "by=%s error=%s", log_quote(qw, j->who),
	          log_quote(qe, why));
	reload_end(j, -ESHUTDOWN, NULL, why);
}

/* Every file is open (or could not be): the reload applies, in this turn. */
static void reload_apply(struct reload_job *j)
{
	struct config_run *cr = j->cr;
	json_t *pipelines, *report;
	char why[1536], qp[LOG_QUOTE_MAX], qw[LOG_QUOTE_MAX];
	int r;

	if (engine_stopping(server_engine(cr->srv))) {
		/* it stopped while the files opened: nothing more to change */
		reload_stopping(j);
		return;
	}
	j->changed = json_array();
	j->restart = json_array();
	if ((r = apply_settings(j, &j->fresh, why, sizeof(why))) < 0) {
		json_decref(j->changed);
		json_decref(j->restart);
		reload_invalid(j, r, why);
		return;
	}
	check_restart_keys(j, &j->fresh);
	pipelines = apply_pipelines(j, &j->fresh, j->specs, j->n);
	log_event(LOG_NOTICE, "config.reload", "config=%s by=%s changed=%zu restart_needed=%zu "
	          "created=%zu replaced=%zu draining=%zu failed=%zu", log_quote(qp, cr->path),
	          log_quote(qw, j->who), json_array_size(j->changed), json_array_size(j->restart),
	           json_array_size(json_object_get(pipelines, "created")),
	           json_array_size(json_object_get(pipelines, "replaced")),
	           json_array_size(json_object_get(pipelines, "draining")),
	           json_array_size(json_object_get(pipelines, "failed")));
	report = json_pack("{s:s, s:s, s:o, s:o, s:o}", "file", cr->path, "by", j->who,
	                   "changed", j->changed, "restart_needed", j->restart, "pipelines", pipelines);
	notify_send("READY=1\nSTATUS=serving");
	if (report)
		reload_end(j, 0, report, NULL);
	else
		reload_end(j, -ENOMEM, NULL, "reload: out of memory for the report");
}

static void reload_opened(void *userdata, struct source *src, int r, const char *err)
{
	struct reload_open *o = userdata;
	struct reload_job *j = o->j;

	o->op.src = src;
	o->op.r = r;
	snprintf(o->op.err, sizeof(o->op.err), "%s", err ? err : "");
	if (--j->opening == 0)
		reload_apply(j);
}

/* Read and check the file, then open the files of the pipelines it builds
 * on the pool: the loop serves everyone meanwhile. */
static void reload_start(struct reload_job *j)
{
	struct config_run *cr = j->cr;
	struct engine *eng = server_engine(cr->srv);
	struct principal self;
	char why[1536];
	int r;

	cr->reloading = j;
	if (engine_stopping(eng)) {
		reload_stopping(j);
		return;
	}
	notify_reloading();
	if ((r = settings_load(&j->fresh, cr->path, false, why, sizeof(why))) < 0) {
		reload_invalid(j, r, why);
		return;
	}
	j->n = j->fresh.pipelines ? json_array_size(j->fresh.pipelines) : 0;
	if (j->n && (!(j->specs = calloc(j->n, sizeof(*j->specs))) ||
	             !(j->opens = calloc(j->n, sizeof(*j->opens))))) {
		reload_invalid(j, -ENOMEM, "out of memory");
		return;
	}
	if (j->n && (r = check_specs(&j->fresh, j->specs, j->n, why, sizeof(why))) < 0) {
		reload_invalid(j, r, why);
		return;
	}
	/* the config's pipelines are the daemon's, read with its rights */
	principal_daemon(&self);
	j->opening = 1;
	for (size_t i = 0; i < j->n; i++) {
		j->opens[i].j = j;
		if (!engine_config_needs_open(eng, j->specs[i]))
			continue;
		j->opening++;
		engine_open_async(eng, j->specs[i], &self, reload_opened, &j->opens[i]);
	}
	if (--j->opening == 0)
		reload_apply(j);
}

void config_reload(void *userdata, const char *who, server_reload_done done, void *ctx)
{
	struct config_run *cr = userdata;
	struct reload_job *j, **pp;
	char by[LOG_QUOTE_MAX], qr[LOG_QUOTE_MAX];

	if (!cr->path) {
		log_event(LOG_NOTICE, "config.reload", "by=%s error=\"no config file to reload\"",
		          log_quote(by, who));
		done(ctx, -ENOENT, NULL, "loaderd runs without a config file (--config, "
		     "$LOADERD_CONFIG, /etc/loaderd/loaderd.json): nothing to reload");
		return;
	}
	if (cr->nqueued >= RELOAD_QUEUE_MAX) {
		char msg[160];
		snprintf(msg, sizeof(msg), "a reload is in progress and %d more wait for it: try "
		         "again once they are done", RELOAD_QUEUE_MAX);
		done(ctx, -EBUSY, NULL, msg);
		return;
	}
	if (!(j = calloc(1, sizeof(*j)))) {
		done(ctx, -ENOMEM, NULL, "reload: out of memory");
		return;
	}
	j->cr = cr;
	j->done = done;
	j->ctx = ctx;
	snprintf(j->who, sizeof(j->who), "%s", who);
	if (!cr->reloading) {
		reload_start(j);
		return;
	}
	/* the file may have changed after the running one read it: read again */
	log_event(LOG_NOTICE, "config.reload", "by=%s queued=%s", log_quote(by, who),
	          log_quote(qr, "a reload is in progress: this one follows it"));
	for (pp = &cr->queued; *pp; pp = &(*pp)->next)
		;
	*pp = j;
	cr->nqueued++;
}
