/* SPDX-License-Identifier: MIT */
/* settings - the daemon's settings: compiled-in defaults, a JSON file, options */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

struct settings {
	char *path;               /* the config file read, or NULL */
	char *socket_path;
	unsigned workers;         /* 0 = online CPUs */
	uint64_t memory_limit;    /* 0 = half of physical memory */
	int log_level;
	bool has_socket_mode;     /* "socket_mode" was given */
	unsigned socket_mode;     /* of both sockets, default 0660 */
	bool has_socket_group;    /* "socket_group" was given */
	unsigned socket_gid;      /* both sockets are chowned to it */
	bool has_linger;          /* "linger" was given */
	uint64_t linger_ms;       /* an unused client pipeline stays this long */
	bool has_slow_timeout;    /* "slow_client_timeout" was given */
	uint64_t slow_timeout_ms; /* a broadcast stream waits this long for a stopped client */
	bool has_admin_group;     /* "admin_group" was given */
	unsigned admin_gid;       /* its members may do what root may */
	unsigned max_conn_per_uid; /* connections one uid may hold; 0 = default */
	uint64_t max_held_after_drop; /* held slab bytes above which a uid may not attach; 0 = default */
	uint64_t memory_limit_per_user; /* one non-admin uid's bytes; 0 = memory_limit / 2 */
	unsigned max_pipelines_per_user; /* one non-admin uid's pipelines; 0 = default */
	char **dataset_roots;     /* NULL-terminated, or NULL: datasets anywhere */
	json_t *pipelines;        /* array of specs, or NULL */
	char *metrics_address;    /* "HOST:PORT" or a unix socket path; NULL: no /metrics */
	char *metrics_address_file; /* the file (or drop-in) that set it, for its errors */
	char *cache_dir;          /* what sources build and reuse (megatron indexes); NULL: default */
	uint64_t cache_bytes;     /* the object cache's bound (cache_dir/objects); 0: the default */
	uint64_t fetch_ahead;     /* what one streamed source fetches ahead; 0: the default */
	double store_retry_s;     /* how long a request to a store is retried; 0: the default */
	char **store_endpoints;   /* NULL-terminated, or NULL: stores may reach any endpoint */
};

/* Connections one uid may hold without "max_connections_per_uid": well below
 * the daemon's global limit (MAX_CLIENTS, 512), so one user cannot lock the
 * others out. */
#define SETTINGS_CONN_PER_UID_DEFAULT 64
#define SETTINGS_CONN_MAX 512

/* Pipelines one uid may own with "max_pipelines_per_user"; without it
 * ENGINE_PIPELINES_PER_USER_DEFAULT (engine.h). */
#define SETTINGS_PIPELINES_PER_USER_MAX 100000

/* The object cache's bound without "cache_bytes": 10 GiB. */
#define SETTINGS_CACHE_BYTES_DEFAULT (10ull << 30)

/* The linger without a "linger" key: 5 s. */
#define SETTINGS_LINGER_DEFAULT_MS 5000
#define SETTINGS_LINGER_MAX_S 31536000

/**
 * settings_load() - read a config file into @cfg (values already set win).
 * @err: names the file and the key, e.g. "/etc/loaderd/loaderd.json: workers:
 *       must be an integer in 1..1024"
 */
int settings_load(struct settings *cfg, const char *path, bool keep_set, char *err, size_t errlen);
void settings_clear(struct settings *cfg);
