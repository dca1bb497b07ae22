/* SPDX-License-Identifier: MIT */
/* settings - the daemon's settings: compiled-in defaults, a JSON file, options
 *
 * The file is JSON, like the specs it carries:
 *   {"socket": "/run/loaderd/loaderd.sock", "workers": 8,
 *    "memory_limit": "8G", "log_level": "info", "linger": 5,
 *    "socket_mode": "0660", "socket_group": "loaderd",
 *    "admin_group": "loaderd-admin", "max_connections_per_uid": 64,
 *    "slow_client_timeout": 60, "max_held_after_drop": "2G",
 *    "memory_limit_per_user": "4G", "max_pipelines_per_user": 64,
 *    "dataset_roots": ["/data", "/scratch/datasets"],
 *    "metrics_address": "127.0.0.1:9464",
 *    "store_endpoints": ["https://s3.eu-west-1.amazonaws.com"],
 *    "pipelines": [SPEC, ...]}
 * Drop-ins in conf.d/ beside the file (*.json, in name order) are read after
 * it: their values replace the file's, their pipelines are added. Command-line
 * options win over all of them. Unknown keys are errors, as in specs.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <sys/stat.h>
#include <grp.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "base/log.h"
#include "base/size.h"
#include "server/metrics.h"
#include "settings.h"

/* errfmt with the file's name in front ("PATH: "), and -EINVAL: every
 * settings error names the file it is in (common.h, the error idiom). */
__attribute__((format(printf, 4, 5)))
static int settings_fail(char *err, size_t errlen, const char *path, const char *fmt, ...)
{
	char prefix[4096 + 3];
	va_list ap;

	snprintf(prefix, sizeof(prefix), "%s: ", path);
	va_start(ap, fmt);
	verrfmt(-EINVAL, err, errlen, prefix, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* A size key of @path: bytes, or a string "8G" (@example); 0 is none. */
static int size_key(const char *path, const char *key, json_t *v, const char *example,
                    uint64_t *out, char *err, size_t errlen)
{
	uint64_t size = 0;
	int r = -EINVAL;

	if (json_is_integer(v) && json_integer_value(v) > 0) {
		*out = (uint64_t)json_integer_value(v);
		return 0;
	}
	if (json_is_string(v))
		r = size_parse(json_string_value(v), &size);
	if (r == -ERANGE)
		return settings_fail(err, errlen, path, "%s: \"%s\" is above the largest size, %" PRId64
		                     " bytes", key, json_string_value(v), (int64_t)SIZE_PARSE_MAX);
	if (r < 0 || !size)
		return settings_fail(err, errlen, path, "%s: must be bytes or a size like \"%s\"", key,
		                     example);
	*out = size;
	return 0;
}

/* A group by name or gid, for socket_group and admin_group. */
static int parse_group(const char *path, const char *key, json_t *v, unsigned *gid,
                       char *err, size_t errlen)
{
	struct group *g = NULL;
	char id[64];

	if (json_is_string(v) && *json_string_value(v))
		g = getgrnam(json_string_value(v));
	else if (json_is_integer(v) && json_integer_value(v) >= 0)
		g = getgrgid((gid_t)json_integer_value(v));
	else {
		return settings_fail(err, errlen, path, "%s: must be a group name or a gid", key);
	}
	if (!g) {
		if (json_is_string(v))
			snprintf(id, sizeof(id), "%s", json_string_value(v));
		else
			snprintf(id, sizeof(id), "%lld", (long long)json_integer_value(v));
		return settings_fail(err, errlen, path, "%s: no group %s on this machine", key, id);
	}
	*gid = (unsigned)g->gr_gid;
	return 0;
}

static void free_roots(char **roots)
{
	for (size_t i = 0; roots && roots[i]; i++)
		free(roots[i]);
	free(roots);
}

/* One "store_endpoints" entry: http(s)://HOST[:PORT][/], HOST a name (maybe
 * "*." first), an IPv4 address or [IPv6]. */
static bool endpoint_ok(const char *t)
{
	const char *p = !strncmp(t, "https://", 8) ? t + 8 : !strncmp(t, "http://", 7) ? t + 7 : NULL;
	size_t n;

	if (!p)
		return false;
	if (!strncmp(p, "*.", 2))
		p += 2;
	if (*p == '[') {
		n = strspn(p + 1, "0123456789abcdefABCDEF:.");
		if (n == 0 || p[n + 1] != ']')
			return false;
		p += n + 2;
	} else {
		n = strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-");
		if (n == 0 || p[0] == '.' || p[0] == '-' || p[n - 1] == '.')
			return false;
		p += n;
	}
	if (*p == ':') {
		char *end;
		long port;

		if (!(p[1] >= '0' && p[1] <= '9'))
			return false;
		port = strtol(p + 1, &end, 10);
		if (port < 1 || port > 65535)
			return false;
		p = end;
	}
	return !*p || !strcmp(p, "/");
}

/* "store_endpoints": the endpoints stores may reach; [] turns object
 * storage off. */
static int parse_endpoints(const char *path, json_t *v, char ***out, char *err, size_t errlen)
{
	size_t n = json_is_array(v) ? json_array_size(v) : 0;
	char **list;

	if (!json_is_array(v))
		return settings_fail(err, errlen, path, "store_endpoints: must be an array of "
		                     "\"http(s)://HOST[:PORT]\" strings");
	list = calloc(n + 1, sizeof(*list));
	if (!list)
		return errfmt(-ENOMEM, err, errlen, "%s: store_endpoints: out of memory", path);
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(v, i);
		const char *t = json_is_string(e) ? json_string_value(e) : NULL;

		if (!t || strlen(t) > 500 || !endpoint_ok(t)) {
			free_roots(list);
			return settings_fail(err, errlen, path, "store_endpoints[%zu]: must be "
			                     "http(s)://HOST[:PORT] (HOST may start with *.)%s%s%s", i,
			                     t ? ", not '" : "", t && strlen(t) <= 500 ? t : "", t ? "'" : "");
		}
		if (!(list[i] = strdup(t))) {
			free_roots(list);
			return errfmt(-ENOMEM, err, errlen, "%s: store_endpoints: out of memory", path);
		}
	}
	*out = list;
	return 0;
}

/* "dataset_roots": absolute directories, resolved once (realpath), so that a
 * dataset path is checked against what the root really is. */
static int parse_roots(const char *path, json_t *v, char ***out, char *err, size_t errlen)
{
	size_t n = json_is_array(v) ? json_array_size(v) : 0;
	char **roots;
	int r;

	if (!json_is_array(v) || n == 0)
		return settings_fail(err, errlen, path, "dataset_roots: must be a non-empty array of "
		                     "absolute directory paths");
	roots = calloc(n + 1, sizeof(*roots));
	if (!roots)
		return errfmt(-ENOMEM, err, errlen, "%s: dataset_roots: out of memory", path);
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(v, i);
		const char *t = json_is_string(e) ? json_string_value(e) : NULL;
		char real[PATH_MAX];
		struct stat st;

		if (!t || t[0] != '/') {
			r = settings_fail(err, errlen, path,
			                  "dataset_roots[%zu]: must be an absolute directory path", i);
			goto fail;
		}
		if (!realpath(t, real) || stat(real, &st) < 0) {
			r = settings_fail(err, errlen, path,
			                  "dataset_roots[%zu]: %s: %s", i, t, strerror(errno));
			goto fail;
		}
		if (!S_ISDIR(st.st_mode)) {
			r = settings_fail(err, errlen, path,
			                  "dataset_roots[%zu]: %s: not a directory", i, t);
			goto fail;
		}
		if (!(roots[i] = strdup(real))) {
			r = errfmt(-ENOMEM, err, errlen, "%s: dataset_roots: out of memory", path);
			goto fail;
		}
	}
	*out = roots;
	return 0;
fail:
	free_roots(roots);
	return r;
}

/* One file into @cfg: its values replace what is there; its pipelines are
 * appended. */
/* One top-level key @key of config file @path: 0, or a negative errno with
 * @err naming the file, the key and the rule. */
static int load_key(struct settings *cfg, const char *path, const char *key, json_t *v,
                    char *err, size_t errlen)
{
	int r;

	if (strcmp(key, "socket") == 0) {
		if (!json_is_string(v) || !*json_string_value(v))
			return settings_fail(err, errlen, path,
			                     "socket: must be a non-empty string");
		free(cfg->socket_path);
		cfg->socket_path = strdup(json_string_value(v));
		if (!cfg->socket_path)
			return errfmt(-ENOMEM, err, errlen, "%s: socket: out of memory", path);
	} else if (strcmp(key, "workers") == 0) {
		if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1024)
			return settings_fail(err, errlen, path,
			                     "workers: must be an integer in 1..1024");
		cfg->workers = (unsigned)json_integer_value(v);
	} else if (strcmp(key, "memory_limit") == 0) {
		if ((r = size_key(path, key, v, "8G", &cfg->memory_limit, err, errlen)) < 0)
			return r;
	} else if (strcmp(key, "max_held_after_drop") == 0) {
		if ((r = size_key(path, key, v, "1G", &cfg->max_held_after_drop, err, errlen)) < 0)
			return r;
	} else if (strcmp(key, "memory_limit_per_user") == 0) {
		if ((r = size_key(path, key, v, "4G", &cfg->memory_limit_per_user, err, errlen)) < 0)
			return r;
	} else if (strcmp(key, "max_pipelines_per_user") == 0) {
		if (!json_is_integer(v) || json_integer_value(v) < 1 ||
		    json_integer_value(v) > SETTINGS_PIPELINES_PER_USER_MAX)
			return settings_fail(err, errlen, path,
			                     "max_pipelines_per_user: must be an integer in 1..%d",
			                     SETTINGS_PIPELINES_PER_USER_MAX);
		cfg->max_pipelines_per_user = (unsigned)json_integer_value(v);
	} else if (strcmp(key, "log_level") == 0) {
		int lvl = json_is_string(v) ? log_level_from_name(json_string_value(v)) : -EINVAL;
		if (lvl < 0)
			return settings_fail(err, errlen, path,
			                     "log_level: must be one of error, warning, notice, info, debug");
		cfg->log_level = lvl;
	} else if (strcmp(key, "socket_mode") == 0) {
		const char *t = json_is_string(v) ? json_string_value(v) : "";
		char *end;
		unsigned long m = strtoul(t, &end, 8);
		if (!*t || *end || m > 0777 || strspn(t, "01234567") != strlen(t))
			return settings_fail(err, errlen, path,
			                     "socket_mode: must be an octal mode in a string, "
			                     "like \"0660\"");
		if (!(m & 0600))
			return settings_fail(err, errlen, path,
			                     "socket_mode: %s leaves the daemon's own user out "
			                     "(it must keep 0600)", t);
		cfg->has_socket_mode = true;
		cfg->socket_mode = (unsigned)m;
	} else if (strcmp(key, "socket_group") == 0) {
		if ((r = parse_group(path, key, v, &cfg->socket_gid, err, errlen)) < 0)
			return r;
		cfg->has_socket_group = true;
	} else if (strcmp(key, "slow_client_timeout") == 0) {
		double secs = json_is_number(v) ? json_number_value(v) : -1;
		if (!(secs >= 0.1) || secs > 86400)
			return settings_fail(err, errlen, path, "slow_client_timeout: must be a number of "
			                     "seconds in 0.1..86400");
		cfg->has_slow_timeout = true;
		cfg->slow_timeout_ms = (uint64_t)llround(secs * 1000.0);
	} else if (strcmp(key, "admin_group") == 0) {
		if ((r = parse_group(path, key, v, &cfg->admin_gid, err, errlen)) < 0)
			return r;
		cfg->has_admin_group = true;
	} else if (strcmp(key, "max_connections_per_uid") == 0) {
		if (!json_is_integer(v) || json_integer_value(v) < 1 ||
		    json_integer_value(v) > SETTINGS_CONN_MAX)
			return settings_fail(err, errlen, path,
			                     "max_connections_per_uid: must be an integer in 1..%d",
			                     SETTINGS_CONN_MAX);
		cfg->max_conn_per_uid = (unsigned)json_integer_value(v);
	} else if (strcmp(key, "dataset_roots") == 0) {
		char **roots = NULL;
		if ((r = parse_roots(path, v, &roots, err, errlen)) < 0)
			return r;
		free_roots(cfg->dataset_roots);
		cfg->dataset_roots = roots;
	} else if (strcmp(key, "linger") == 0) {
		double secs = json_is_number(v) ? json_number_value(v) : -1;
		if (!(secs >= 0) || secs > SETTINGS_LINGER_MAX_S)
			return settings_fail(err, errlen, path,
			                     "linger: must be a number of seconds in 0..%d",
			                     SETTINGS_LINGER_MAX_S);
		cfg->has_linger = true;
		cfg->linger_ms = (uint64_t)llround(secs * 1000.0);
	} else if (strcmp(key, "metrics_address") == 0) {
		struct metrics_addr addr;
		char why[512];
		if (!json_is_string(v) || !*json_string_value(v))
			return settings_fail(err, errlen, path, "metrics_address: must be a string, "
			                     "\"HOST:PORT\" or an absolute unix socket path");
		if (metrics_parse_address(json_string_value(v), &addr, why, sizeof(why)) < 0)
			return settings_fail(err, errlen, path, "metrics_address: %s", why);
		free(cfg->metrics_address);
		free(cfg->metrics_address_file);
		cfg->metrics_address_file = strdup(path);
		if (!(cfg->metrics_address = strdup(json_string_value(v))) || !cfg->metrics_address_file)
			return errfmt(-ENOMEM, err, errlen, "%s: metrics_address: out of memory", path);
	} else if (strcmp(key, "cache_dir") == 0) {
		if (!json_is_string(v) || json_string_value(v)[0] != '/' ||
		    strlen(json_string_value(v)) > 3800)
			return settings_fail(err, errlen, path,
			                     "cache_dir: must be an absolute directory path");
		free(cfg->cache_dir);
		if (!(cfg->cache_dir = strdup(json_string_value(v))))
			return errfmt(-ENOMEM, err, errlen, "%s: cache_dir: out of memory", path);
	} else if (strcmp(key, "cache_bytes") == 0) {
		if ((r = size_key(path, key, v, "10G", &cfg->cache_bytes, err, errlen)) < 0)
			return r;
	} else if (strcmp(key, "fetch_ahead") == 0) {
		if ((r = size_key(path, key, v, "256M", &cfg->fetch_ahead, err, errlen)) < 0)
			return r;
	} else if (strcmp(key, "store_retry_seconds") == 0) {
		double secs = json_is_number(v) ? json_number_value(v) : -1;
		if (!(secs >= 0.1) || secs > 3600)
			return settings_fail(err, errlen, path, "store_retry_seconds: must be a number of "
			                     "seconds in 0.1..3600");
		cfg->store_retry_s = secs;
	} else if (strcmp(key, "store_endpoints") == 0) {
		char **list = NULL;
		if ((r = parse_endpoints(path, v, &list, err, errlen)) < 0)
			return r;
		free_roots(cfg->store_endpoints);
		cfg->store_endpoints = list;
	} else if (strcmp(key, "pipelines") == 0) {
		if (!json_is_array(v))
			return settings_fail(err, errlen, path,
			                     "pipelines: must be an array of pipeline specs");
		if (!cfg->pipelines)
			cfg->pipelines = json_array();
		json_array_extend(cfg->pipelines, v);
	} else {
		return settings_fail(err, errlen, path, "unknown key \"%s\"", key);
	}
	return 0;
}

static int load_one(struct settings *cfg, const char *path, char *err, size_t errlen)
{
	json_error_t jerr;
	json_t *root, *v;
	const char *key;
	int r = -EINVAL;

	root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return settings_fail(err, errlen, path,
		                     "line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
	if (!json_is_object(root)) {
		r = settings_fail(err, errlen, path, "must be a JSON object");
		goto out;
	}
	json_object_foreach(root, key, v) {
		if ((r = load_key(cfg, path, key, v, err, errlen)) < 0)
			goto out;
	}
	r = 0;
out:
	json_decref(root);
	return r;
}

static int is_dropin(const struct dirent *e)
{
	size_t n = strlen(e->d_name);

	return e->d_name[0] != '.' && n > 5 && strcmp(e->d_name + n - 5, ".json") == 0;
}

int settings_load(struct settings *cfg, const char *path, bool keep_set, char *err, size_t errlen)
{
	struct settings file = { 0 };
	struct dirent **list = NULL;
	char dir[4096];
	const char *slash = strrchr(path, '/');
	int n, r;

	r = load_one(&file, path, err, errlen);
	/* drop-ins: conf.d/ *.json beside the file, in name order */
	if (slash)
		snprintf(dir, sizeof(dir), "%.*s/conf.d", (int)(slash - path), path);
	else
		snprintf(dir, sizeof(dir), "conf.d");
	n = r < 0 ? 0 : scandir(dir, &list, is_dropin, alphasort);
	for (int i = 0; i < n; i++) {
		char drop[4352];
		snprintf(drop, sizeof(drop), "%s/%s", dir, list[i]->d_name);
		if (r == 0)
			r = load_one(&file, drop, err, errlen);
		free(list[i]);
	}
	free(list);
	if (r < 0) {
		settings_clear(&file);
		return r;
	}
	/* what the command line set stays */
	if (file.socket_path && (!keep_set || !cfg->socket_path)) {
		free(cfg->socket_path);
		cfg->socket_path = file.socket_path;
		file.socket_path = NULL;
	}
	if (file.workers && (!keep_set || !cfg->workers))
		cfg->workers = file.workers;
	if (file.memory_limit && (!keep_set || !cfg->memory_limit))
		cfg->memory_limit = file.memory_limit;
	if (file.log_level && (!keep_set || !cfg->log_level))
		cfg->log_level = file.log_level;
	if (file.has_socket_mode) {
		cfg->has_socket_mode = true;
		cfg->socket_mode = file.socket_mode;
	}
	if (file.has_socket_group) {
		cfg->has_socket_group = true;
		cfg->socket_gid = file.socket_gid;
	}
	if (file.has_linger) {
		cfg->has_linger = true;
		cfg->linger_ms = file.linger_ms;
	}
	if (file.has_slow_timeout) {
		cfg->has_slow_timeout = true;
		cfg->slow_timeout_ms = file.slow_timeout_ms;
	}
	if (file.has_admin_group) {
		cfg->has_admin_group = true;
		cfg->admin_gid = file.admin_gid;
	}
	if (file.max_conn_per_uid)
		cfg->max_conn_per_uid = file.max_conn_per_uid;
	if (file.max_held_after_drop)
		cfg->max_held_after_drop = file.max_held_after_drop;
	if (file.memory_limit_per_user)
		cfg->memory_limit_per_user = file.memory_limit_per_user;
	if (file.max_pipelines_per_user)
		cfg->max_pipelines_per_user = file.max_pipelines_per_user;
	if (file.dataset_roots) {
		free_roots(cfg->dataset_roots);
		cfg->dataset_roots = file.dataset_roots;
		file.dataset_roots = NULL;
	}
	if (file.metrics_address) {
		free(cfg->metrics_address);
		cfg->metrics_address = file.metrics_address;
		file.metrics_address = NULL;
		free(cfg->metrics_address_file);
		cfg->metrics_address_file = file.metrics_address_file;
		file.metrics_address_file = NULL;
	}
	if (file.cache_dir && (!keep_set || !cfg->cache_dir)) {
		free(cfg->cache_dir);
		cfg->cache_dir = file.cache_dir;
		file.cache_dir = NULL;
	}
	if (file.cache_bytes)
		cfg->cache_bytes = file.cache_bytes;
	if (file.fetch_ahead)
		cfg->fetch_ahead = file.fetch_ahead;
	if (file.store_retry_s > 0)
		cfg->store_retry_s = file.store_retry_s;
	if (file.store_endpoints) {
		free_roots(cfg->store_endpoints);
		cfg->store_endpoints = file.store_endpoints;
		file.store_endpoints = NULL;
	}
	json_decref(cfg->pipelines);
	cfg->pipelines = file.pipelines;
	file.pipelines = NULL;
	free(cfg->path);
	cfg->path = strdup(path);
	settings_clear(&file);
	return 0;
}

void settings_clear(struct settings *cfg)
{
	free(cfg->path);
	free(cfg->socket_path);
	free(cfg->metrics_address);
	free(cfg->metrics_address_file);
	free(cfg->cache_dir);
	free_roots(cfg->dataset_roots);
	free_roots(cfg->store_endpoints);
	json_decref(cfg->pipelines);
	memset(cfg, 0, sizeof(*cfg));
}
