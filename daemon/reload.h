/* SPDX-License-Identifier: MIT */
/* reload - the config as the daemon runs it: at start, on SIGHUP, on `loaderctl reload` */
#pragma once

#include <jansson.h>
#include <stdint.h>

#include "settings.h"
#include "server/server.h"
#include "sources/spec.h"

struct server;

struct config_run {
	struct server *srv;
	char *path;                   /* the config file, NULL: none */
	/* what the command line set (0: nothing): it wins over the file */
	unsigned cli_workers;
	uint64_t cli_memory_limit;
	int cli_log_level;
	bool cli_socket;
	bool cli_cache_dir;           /* --cache-dir was given */
	/* without the command line and the file */
	unsigned default_workers;
	uint64_t default_memory_limit;
	/* the settings that need a restart, as the daemon started with them */
	char socket[108];
	unsigned socket_mode;
	int socket_gid;               /* -1: the daemon's group */
	char **roots;                 /* dataset_roots, NULL-terminated, or NULL */
	char *metrics_address;        /* NULL: no /metrics */
	/* the live settings of the file last applied that nobody else keeps */
	uint64_t linger_ms, slow_ms, max_held, user_memory;
	unsigned max_pipelines;       /* max_pipelines_per_user, 0: the default */
	int admin_gid;                /* -1: none */
	unsigned max_conn;
	/* the reload running (its files open off the loop), and those asked
	 * for meanwhile, in turn */
	struct reload_job *reloading, *queued;
	unsigned nqueued;
};

/* Pipeline @spec_json of a config as a spec, checked as the daemon creates it
 * (the config's pipelines persist: no "ttl", no "persist": false). */
int config_spec(json_t *spec_json, struct spec **out, char *err, size_t errlen);

/**
 * config_run_init() - remember how the daemon started.
 * @cfg: the settings loaded at start (file and command line)
 * @cli: what the command line alone set
 * @socket: the socket path it listens on
 */
int config_run_init(struct config_run *cr, struct server *srv, const struct settings *cfg,
                    const struct settings *cli, const char *socket, unsigned default_workers,
                    uint64_t default_memory_limit);
/* Create the config's pipelines at start; each failure is logged. -EINVAL
 * when any failed. */
int config_run_pipelines(struct config_run *cr, const struct settings *cfg);
/**
 * config_reload() - re-read the file and its drop-ins and apply them.
 * @userdata: the struct config_run
 * @who: who asked, for the log ("SIGHUP", "alice (uid 1001), pid 42")
 *
 * Every setting that can change live changes (old -> new, logged); those
 * that need a restart are named; the config's pipelines are created, left,
 * replaced or drained (retire.c). An invalid file or spec changes nothing.
 * The files of new and changed pipelines are opened on libuv's pool; once
 * all are, everything is applied in one loop turn and @done gets what it did
 * (docs/config.md, "Reload"), or an error "FILE: key: why; the running config
 * is kept". A reload asked for while one runs follows it.
 */
void config_reload(void *userdata, const char *who, server_reload_done done, void *ctx);
void config_run_clear(struct config_run *cr);
