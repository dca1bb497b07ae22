/* SPDX-License-Identifier: MIT */
/* loaderd - the data-loading daemon */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <nng/nng.h>
#include <protobuf-c/protobuf-c.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "common.h"
#include "config.h"
#include "base/creds.h"
#include "sources/source.h"
#include "base/log.h"
#include "base/size.h"
#include "server/metrics.h"
#include "notify.h"
#include "engine/engine.h"
#include "reload.h"
#include "server/server.h"
#include "settings.h"
#include "sources/spec.h"

#define DEFAULT_CONFIG "/etc/loaderd/loaderd.json"

struct daemon {
	uv_loop_t loop;
	uv_signal_t sigterm, sigint, sighup;
	uv_timer_t watchdog;
	struct server *srv;
	struct metrics *metrics;      /* /metrics, NULL without metrics_address */
	struct settings cfg;
	struct config_run run;        /* the config as it runs: reload.c */
	const char *cli_config;
	bool check_config;            /* --check-config: validate and exit */
	const char *check_file;       /* its FILE, or NULL: the one loaderd would read */
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: loaderd [OPTION]...\n"
		"Serve ready batches to training processes over a local socket.\n"
		"\n"
		"  -c, --config FILE        read settings and pipelines from FILE (JSON), then\n"
		"                           the drop-ins conf.d/*.json beside it, in name order;\n"
		"                           default $LOADERD_CONFIG, else " DEFAULT_CONFIG " if it exists\n"
		"  -s, --socket PATH        listen on PATH; default $LOADERD_SOCKET, else\n"
		"                           $RUNTIME_DIRECTORY/loaderd.sock, else\n"
		"                           $XDG_RUNTIME_DIR/loaderd.sock, else /run/loaderd/loaderd.sock\n"
		"  -w, --workers N          worker threads (default: online CPUs)\n"
		"  -m, --memory-limit SIZE  most memory for batch slots and image caches, e.g. 4G\n"
		"                           (default: half of RAM)\n"
		"  -l, --log-level LEVEL    error, warning, notice, info (default) or debug\n"
		"      --cache-dir DIR      where indexes built from datasets (megatron sources)\n"
		"                           and the node's object cache (s3:// and https://\n"
		"                           objects, config cache_bytes) are kept and reused;\n"
		"                           default $CACHE_DIRECTORY, else\n"
		"                           /var/cache/loaderd as root, else $XDG_CACHE_HOME/loaderd\n"
		"                           or ~/.cache/loaderd\n"
		"      --check-config[=FILE]  check FILE (default: the config loaderd would\n"
		"                           read, as above) and its pipelines' specs, say what\n"
		"                           is wrong or \"ok\", and exit (0 ok, 1 not)\n"
		"  -h, --help               show this help\n"
		"  -V, --version            show versions of loaderd and its libraries\n"
		"\n"
		"Signals: SIGTERM/SIGINT stop cleanly. SIGHUP (or `loaderctl reload`) re-reads\n"
		"the config file and its drop-ins and applies what can change live: workers,\n"
		"memory_limit, log_level, linger and the rest; pipelines it adds are created,\n"
		"removed ones drain (their clients finish the epoch), changed ones are replaced\n"
		"for new attachments. It names the keys that need a restart (socket,\n"
		"dataset_roots, ...) and keeps everything as it is when the file is invalid\n"
		"(docs/config.md).\n"
		"`loaderctl set` tunes workers, prefetch and log-level at once. The fd channel\n"
		"listens on PATH.fds.\n"
		"\n"
		"Pipelines a client creates belong to its job: once no client reads one and the\n"
		"connection that created it is closed, it lingers (config key linger, default\n"
		"5 s; a spec's ttl) and is dropped. A spec with \"persist\": true, `loaderctl\n"
		"create` and the config's pipelines stay until dropped (docs/spec.md). A dropped\n"
		"pipeline's slab stays in the memory limit while clients still map it; a uid\n"
		"that maps more such memory than max_held_after_drop (config key, default a\n"
		"quarter of the limit) may not attach meanwhile (docs/security.md).\n"
		"Each user that is no admin may own at most max_pipelines_per_user pipelines\n"
		"(default 64) of at most memory_limit_per_user bytes (default half the limit);\n"
		"the daemon's last file descriptors (1/16 of RLIMIT_NOFILE, at least 64) are\n"
		"kept for admins (docs/security.md, \"Bounds per user\").\n"
		"\n"
		"Metrics: with config key metrics_address (\"127.0.0.1:9464\", \"[::1]:9464\" or a\n"
		"unix socket path) Prometheus metrics are served at http://ADDR/metrics\n"
		"(docs/metrics.md); read at start only.\n"
		"\n"
		"GPU delivery: the CUDA driver is loaded on the first client that asks for a\n"
		"device (cuda:N), from $LOADERD_CUDA_LIBRARY, else libcuda.so.1; without one,\n"
		"such clients are told why and host delivery goes on. $LOADERD_CUDA_IPC=1 uses\n"
		"legacy CUDA IPC instead of VMM file descriptors for device slabs.\n");
}

static void version(void)
{
	printf("loaderd %s\n", LOADERD_VERSION);
	printf("protocol %d\n", LDR_PROTOCOL_VERSION);
	printf("libuv %s (built with %d.%d.%d)\n", uv_version_string(), UV_VERSION_MAJOR,
	       UV_VERSION_MINOR, UV_VERSION_PATCH);
	printf("nng %s (built with %s)\n", nng_version(), NNG_MAJOR_VERSION == 1 ? "1.x" : "?");
	printf("protobuf-c %s (built with %s)\n", protobuf_c_version(), PROTOBUF_C_VERSION);
	printf("jansson %s\n", JANSSON_VERSION);
	if (metrics_version())
		printf("libmicrohttpd %s\n", metrics_version());
	else
		printf("libmicrohttpd: not built in (no /metrics)\n");
}

static uint64_t default_memory_limit(void);

/* --check-config: every error of the file and of its pipelines' specs. */
static int check_config(const char *file, uint64_t cli_memory_limit)
{
	struct settings cfg = { 0 };
	char err[1024];
	size_t i, n = 0, bad = 0;
	uint64_t limit;
	json_t *spec_json;

	if (!file) {
		fprintf(stderr, "loaderd: --check-config: no config file: none given, $LOADERD_CONFIG "
		        "unset and no " DEFAULT_CONFIG "\n");
		return 1;
	}
	if (settings_load(&cfg, file, true, err, sizeof(err)) < 0) {
		fprintf(stderr, "loaderd: %s\n", err);
		settings_clear(&cfg);
		return 1;
	}
	/* what the daemon resolves only at start (metrics_new()): a reload
	 * checks the syntax alone, to keep the resolver off the loop */
	if (cfg.metrics_address) {
		struct metrics_addr addr;
		if (metrics_parse_address(cfg.metrics_address, &addr, err, sizeof(err)) < 0 ||
		    metrics_resolve_address(&addr, err, sizeof(err)) < 0) {
			fprintf(stderr, "loaderd: %s: metrics_address: %s\n", cfg.metrics_address_file, err);
			bad++;
		}
	}
	limit = cli_memory_limit ? cli_memory_limit
	        : cfg.memory_limit ? cfg.memory_limit : default_memory_limit();
	if (cfg.pipelines)
		json_array_foreach(cfg.pipelines, i, spec_json) {
			struct spec *spec = NULL;
			n++;
			/* a cache above the limit the daemon would run with, as create says */
			if (config_spec(spec_json, &spec, err, sizeof(err)) < 0 ||
			    source_check_limit(spec, limit, err, sizeof(err)) < 0) {
				fprintf(stderr, "loaderd: %s: pipelines[%zu]: %s\n", cfg.path ? cfg.path : file,
				        i, err);
				bad++;
			}
			spec_free(spec);
		}
	if (!bad)
		printf("%s: ok: %zu pipeline%s\n", cfg.path ? cfg.path : file, n, n == 1 ? "" : "s");
	settings_clear(&cfg);
	return bad ? 1 : 0;
}

static void on_stopped(void *userdata)
{
	struct daemon *d = userdata;
	uv_close((uv_handle_t *)&d->sigterm, NULL);
	uv_close((uv_handle_t *)&d->sigint, NULL);
	uv_close((uv_handle_t *)&d->sighup, NULL);
	uv_close((uv_handle_t *)&d->watchdog, NULL);
}

/* Half the interval systemd gave us, from the loop: a wedged loop stops it. */
static void on_watchdog(uv_timer_t *t)
{
	notify_send("WATCHDOG=1");
}

/* /metrics reads the status as the Status request does. */
static json_t *metrics_status(void *userdata)
{
	return server_status_json(userdata);
}

/* metrics_address, once the control socket is ours: a second loaderd is
 * told about the control socket first, not about the port. */
static int start_metrics(struct daemon *d, const struct server_config *sc, char *err, size_t errlen)
{
	struct metrics_addr addr;
	int r;

	if (!d->cfg.metrics_address)
		return 0;
	r = metrics_parse_address(d->cfg.metrics_address, &addr, err, errlen);
	if (r == 0)
		r = metrics_new(&d->metrics, &d->loop, &addr, sc->socket_mode, sc->socket_gid, err, errlen);
	if (r == 0)
		metrics_set_source(d->metrics, metrics_status, d->srv);
	return r;
}

static void sighup_done(void *ctx, int r, json_t *report, const char *err)
{
	(void)ctx;
	(void)r;
	(void)err;
	json_decref(report);
}

static void on_signal(uv_signal_t *h, int signum)
{
	struct daemon *d = h->data;

	if (signum == SIGHUP) {
		/* what it did or why not is in the log (reload.c); `loaderctl
		 * reload` gets the same as its reply */
		config_reload(&d->run, "SIGHUP", sighup_done, NULL);
		return;
	}
	log_notice("%s received", strsignal(signum));
	notify_send("STOPPING=1\nSTATUS=stopping");
	metrics_close(d->metrics);
	d->metrics = NULL;
	server_stop(d->srv, on_stopped, d);
}

/* SIGTERM, SIGINT, SIGHUP and the watchdog's timer; on failure none is left
 * on the loop. */
static int start_signals(struct daemon *d)
{
	uv_signal_t *sigs[] = { &d->sigterm, &d->sigint, &d->sighup };
	static const int signums[] = { SIGTERM, SIGINT, SIGHUP };
	size_t n;
	int r = 0;

	for (n = 0; n < ARRAY_SIZE(sigs); n++) {
		if ((r = uv_signal_init(&d->loop, sigs[n])) < 0)
			break;
		sigs[n]->data = d;
	}
	if (r == 0 && (r = uv_timer_init(&d->loop, &d->watchdog)) == 0) {
		for (n = 0; n < ARRAY_SIZE(sigs); n++)
			uv_signal_start(sigs[n], on_signal, signums[n]);
		return 0;
	}
	while (n-- > 0)   /* the ones initialised */
		uv_close((uv_handle_t *)sigs[n], NULL);
	return r;
}

static int parse_args(struct daemon *d, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "socket", required_argument, NULL, 's' },
		{ "workers", required_argument, NULL, 'w' },
		{ "memory-limit", required_argument, NULL, 'm' },
		{ "log-level", required_argument, NULL, 'l' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ "check-config", optional_argument, NULL, 'C' },
		{ "cache-dir", required_argument, NULL, 'D' },
		{ 0 },
	};
	int c;

	while ((c = getopt_long(argc, argv, "c:s:w:m:l:hV", opts, NULL)) != -1) {
		char *end;
		long n;
		switch (c) {
		case 'c':
			d->cli_config = optarg;
			break;
		case 's':
			free(d->cfg.socket_path);
			d->cfg.socket_path = strdup(optarg);
			break;
		case 'w':
			errno = 0;
			n = strtol(optarg, &end, 10);
			if (errno || *end || n < 1 || n > 1024) {
				fprintf(stderr, "loaderd: invalid worker count -- '%s' (1..1024)\n", optarg);
				return 2;
			}
			d->cfg.workers = (unsigned)n;
			break;
		case 'm':
			if (size_parse(optarg, &d->cfg.memory_limit) == -ERANGE) {
				fprintf(stderr, "loaderd: memory limit above the largest size, %" PRId64
				        " bytes -- '%s'\n", (int64_t)SIZE_PARSE_MAX, optarg);
				return 2;
			}
			if (size_parse(optarg, &d->cfg.memory_limit) < 0 || !d->cfg.memory_limit) {
				fprintf(stderr, "loaderd: invalid memory limit -- '%s' (bytes, or like 512M, 4G)\n", optarg);
				return 2;
			}
			break;
		case 'l':
			if ((d->cfg.log_level = log_level_from_name(optarg)) < 0) {
				fprintf(stderr, "loaderd: invalid log level -- '%s'\n", optarg);
				return 2;
			}
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			version();
			return 0;
		case 'D':
			if (optarg[0] != '/') {
				fprintf(stderr, "loaderd: --cache-dir must be an absolute path -- '%s'\n",
				        optarg);
				return 2;
			}
			free(d->cfg.cache_dir);
			d->cfg.cache_dir = strdup(optarg);
			break;
		case 'C':
			d->check_config = true;
			d->check_file = optarg;
			break;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "loaderd: unexpected argument -- '%s'\n", argv[optind]);
		return 2;
	}
	return -1;
}

/* Without --cache-dir or cache_dir: systemd's CacheDirectory= (the first of
 * $CACHE_DIRECTORY), else /var/cache/loaderd for root, else the user's cache. */
static int apply_cache_dir(const char *set)
{
	const char *env = getenv("CACHE_DIRECTORY"), *home;
	char buf[4096];

	if (set)
		return source_set_cache_dir(set);
	if (env && env[0] == '/') {
		snprintf(buf, sizeof(buf), "%.*s", (int)strcspn(env, ":"), env);
		return source_set_cache_dir(buf);
	}
	if (geteuid() == 0)
		return source_set_cache_dir("/var/cache/loaderd");
	if ((home = getenv("XDG_CACHE_HOME")) && home[0] == '/')
		snprintf(buf, sizeof(buf), "%s/loaderd", home);
	else if ((home = getenv("HOME")) && home[0] == '/')
		snprintf(buf, sizeof(buf), "%s/.cache/loaderd", home);
	else
		return source_set_cache_dir(NULL);
	return source_set_cache_dir(buf);
}

/* Without --memory-limit or memory_limit: half of the RAM. */
static uint64_t default_memory_limit(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);

	return pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize / 2 : 1ull << 30;
}

int main(int argc, char **argv)
{
	struct daemon d = { 0 };
	struct server_config sc;
	struct settings cli = { 0 };
	char path[108], err[1024] = "";
	const char *cfgfile;
	long ncpu;
	int r;

	if ((r = parse_args(&d, argc, argv)) >= 0) {
		settings_clear(&d.cfg);
		return r;
	}
	cfgfile = d.cli_config ? d.cli_config : getenv("LOADERD_CONFIG");
	if (!cfgfile && access(DEFAULT_CONFIG, F_OK) == 0)
		cfgfile = DEFAULT_CONFIG;
	if (d.check_config) {
		uint64_t limit = d.cfg.memory_limit;   /* --memory-limit wins, as when it runs */
		settings_clear(&d.cfg);
		return check_config(d.check_file ? d.check_file : cfgfile, limit);
	}
	/* what the command line set wins over the file, also on a reload */
	cli.workers = d.cfg.workers;
	cli.memory_limit = d.cfg.memory_limit;
	cli.log_level = d.cfg.log_level;
	cli.socket_path = d.cfg.socket_path ? (char *)"" : NULL;
	cli.cache_dir = d.cfg.cache_dir ? (char *)"" : NULL;
	if (cfgfile && settings_load(&d.cfg, cfgfile, true, err, sizeof(err)) < 0) {
		fprintf(stderr, "loaderd: %s\n", err);
		settings_clear(&d.cfg);
		return 1;
	}
	if (d.cfg.log_level)
		log_max_level = d.cfg.log_level;
	if (sockpath_resolve(path, sizeof(path), d.cfg.socket_path) < 0) {
		fprintf(stderr, "loaderd: socket path too long\n");
		settings_clear(&d.cfg);
		return 1;
	}
	ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	sc.socket_path = path;
	sc.workers = d.cfg.workers ? d.cfg.workers : (unsigned)(ncpu > 0 ? ncpu : 1);
	sc.memory_limit = d.cfg.memory_limit ? d.cfg.memory_limit : default_memory_limit();
	sc.socket_mode = d.cfg.has_socket_mode ? d.cfg.socket_mode : 0660;
	sc.socket_gid = d.cfg.has_socket_group ? (int)d.cfg.socket_gid : -1;
	sc.admin_gid = d.cfg.has_admin_group ? (int)d.cfg.admin_gid : -1;
	sc.max_conn_per_uid = d.cfg.max_conn_per_uid ? d.cfg.max_conn_per_uid
	                                             : SETTINGS_CONN_PER_UID_DEFAULT;
	sc.max_held_after_drop = d.cfg.max_held_after_drop;
	sc.memory_limit_per_user = d.cfg.memory_limit_per_user;
	sc.max_pipelines_per_user = d.cfg.max_pipelines_per_user;

	if (apply_cache_dir(d.cfg.cache_dir) < 0) {
		fprintf(stderr, "loaderd: out of memory\n");
		settings_clear(&d.cfg);
		return 1;
	}
	{
		char dir[4096];

		source_set_fetch_ahead(d.cfg.fetch_ahead);
		source_set_store_retry(d.cfg.store_retry_s);
		if (source_set_store_endpoints(d.cfg.store_endpoints, err, sizeof(err)) < 0) {
			fprintf(stderr, "loaderd: %s\n", err);
			settings_clear(&d.cfg);
			return 1;
		}
		if (source_cache_dir(dir, sizeof(dir)) &&
		    source_set_object_cache(dir, d.cfg.cache_bytes ? d.cfg.cache_bytes : SETTINGS_CACHE_BYTES_DEFAULT,
		                            err, sizeof(err)) < 0) {
			fprintf(stderr, "loaderd: %s\n", err);
			settings_clear(&d.cfg);
			return 1;
		}
	}
	if (ds_set_roots(d.cfg.dataset_roots, err, sizeof(err)) < 0) {
		fprintf(stderr, "loaderd: %s\n", err);
		settings_clear(&d.cfg);
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	if ((r = uv_loop_init(&d.loop)) < 0) {
		fprintf(stderr, "loaderd: cannot set up the event loop: %s\n", uv_strerror(r));
		settings_clear(&d.cfg);
		ds_clear_roots();
		return 1;
	}
	r = server_new(&d.srv, &d.loop, &sc, err, sizeof(err));
	if (r < 0) {
		/* server_new always says why; strerror is the fallback of last resort */
		fprintf(stderr, "loaderd: %s\n", err[0] ? err : strerror(-r));
		/* let the handles server_new closed finish closing, which frees it */
		uv_run(&d.loop, UV_RUN_DEFAULT);
		if ((r = uv_loop_close(&d.loop)) < 0)
			log_warn("loop closed with handles left: %s", uv_strerror(r));
		settings_clear(&d.cfg);
		ds_clear_roots();
		return 1;
	}
	if (start_metrics(&d, &sc, err, sizeof(err)) < 0) {
		fprintf(stderr, "loaderd: %s\n", err);
		server_stop(d.srv, NULL, NULL);
		uv_run(&d.loop, UV_RUN_DEFAULT);
		uv_loop_close(&d.loop);
		settings_clear(&d.cfg);
		ds_clear_roots();
		return 1;
	}
	if (config_run_init(&d.run, d.srv, &d.cfg, &cli, path, (unsigned)(ncpu > 0 ? ncpu : 1),
	                    default_memory_limit()) < 0) {
		fprintf(stderr, "loaderd: out of memory\n");
		return 1;
	}
	engine_set_linger(server_engine(d.srv), d.run.linger_ms);
	engine_set_slow_timeout(server_engine(d.srv), d.run.slow_ms);
	server_set_reload(d.srv, config_reload, &d.run);
	if (d.cfg.pipelines && config_run_pipelines(&d.run, &d.cfg) < 0)
		log_warn("some pipelines of %s were not created", d.cfg.path);
	if ((r = start_signals(&d)) < 0) {
		fprintf(stderr, "loaderd: cannot catch signals: %s\n", uv_strerror(r));
		metrics_close(d.metrics);
		server_stop(d.srv, NULL, NULL);
		uv_run(&d.loop, UV_RUN_DEFAULT);
		uv_loop_close(&d.loop);
		settings_clear(&d.cfg);
		config_run_clear(&d.run);
		ds_clear_roots();
		return 1;
	}
	if (notify_init() && notify_watchdog_usec()) {
		uint64_t ms = notify_watchdog_usec() / 2000;
		uv_timer_start(&d.watchdog, on_watchdog, ms ? ms : 1, ms ? ms : 1);
	}
	log_notice("listening on %s (%u workers, memory limit %" PRIu64 " bytes)", path, sc.workers,
	           sc.memory_limit);
	{
		char st[256];
		snprintf(st, sizeof(st), "READY=1\nSTATUS=serving on %s\nMAINPID=%d", path, (int)getpid());
		notify_send(st);
	}

	uv_run(&d.loop, UV_RUN_DEFAULT);
	r = uv_loop_close(&d.loop);
	if (engine_workers_abandoned()) {
		/* the engine is left to the stuck threads: nothing to free */
		log_notice("stopped");
		fflush(NULL);
		_exit(0);
	}
	if (r < 0)
		log_warn("loop closed with handles left: %s", uv_strerror(r));
	settings_clear(&d.cfg);
	config_run_clear(&d.run);
	ds_clear_roots();
	log_notice("stopped");
	if (server_nng_leaked()) {
		/* what nng keeps of a replaced listener is not ours to free, and
		 * a leak checker at exit would only report nng's bug #1518 */
		fflush(NULL);
		_exit(0);
	}
	return 0;
}
