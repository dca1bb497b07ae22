/* SPDX-License-Identifier: MIT */
/* awscreds - a trainer's object-store credentials (see awscreds.h)
 *
 * Credentials are the client's, never the daemon's (docs/security.md): the
 * trainer's process reads them where its AWS tools would, so `aws s3 ls`
 * working in a shell means the same keys reach a pipeline. The order is
 * the AWS CLI's: the environment's key pair, else the profile in the
 * shared credentials file, else in the config file, else the profile's
 * credential_process (a command that prints them as JSON); the region and
 * the endpoint are looked up on their own, the environment first.
 *
 * The files are INI as botocore reads them: `[section]`, `key = value`,
 * comments from '#' or ';' at the start of a line, and a key with an empty
 * value opening a sub-section of indented lines (`s3 =` then
 * `  endpoint_url = ...`). Anything else is an error that names the file
 * and line: a typo must not silently mean "no credentials".
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "awscreds.h"
#include "common.h"

#define AWSCREDS_FILE_MAX (1 << 20)

/* @v into @dst (cap @cap) unless @dst is set already. */
static int fill(char *dst, size_t cap, const char *v, size_t vlen, const char *what, char *err, size_t errlen)
{
	if (dst[0])
		return 0;
	if (vlen >= cap)
		return errfmt(-EINVAL, err, errlen, "%s: longer than %zu bytes", what, cap - 1);
	memcpy(dst, v, vlen);
	dst[vlen] = '\0';
	return 0;
}

/* [s, e) without the blanks around it */
static void trim(const char **s, const char **e)
{
	while (*s < *e && isspace((unsigned char)**s))
		(*s)++;
	while (*e > *s && isspace((unsigned char)(*e)[-1]))
		(*e)--;
}

/* What one profile section holds, as spans of the text. */
struct section_vals {
	const char *v[7];
	size_t n[7];
};

enum { V_KEY, V_SECRET, V_TOKEN, V_REGION, V_ENDPOINT, V_S3_ENDPOINT, V_PROCESS };

static int value_index(const char *sub, const char *k, size_t kn)
{
	static const char *const names[] = { "aws_access_key_id", "aws_secret_access_key", "aws_session_token",
					     "region", "endpoint_url" };

	if (sub)
		return strcmp(sub, "s3") == 0 && kn == 12 && !memcmp(k, "endpoint_url", 12) ? V_S3_ENDPOINT : -1;
	if (kn == 18 && !memcmp(k, "credential_process", 18))
		return V_PROCESS;
	for (int i = 0; i < 5; i++)
		if (strlen(names[i]) == kn && !memcmp(k, names[i], kn))
			return i;
	return -1;
}

int awscreds_parse(struct awscreds *out, const char *text, const char *path, const char *section, int *found,
		   char *err, size_t errlen)
{
	struct section_vals sv;
	const char *line = text;
	char sub[16] = "";
	int in = 0, lineno = 0, r;
	char what[256];

	memset(&sv, 0, sizeof sv);
	*found = 0;
	while (*line) {
		const char *end = line + strcspn(line, "\n"), *s = line, *e = end, *eq;
		int indented = line < end && (*line == ' ' || *line == '\t');

		lineno++;
		trim(&s, &e);
		if (s == e || *s == '#' || *s == ';')
			goto next;
		if (*s == '[') {
			if (e[-1] != ']')
				return errfmt(-EINVAL, err, errlen, "%s:%d: a section without its ']'", path, lineno);
			s++, e--;
			trim(&s, &e);
			in = strlen(section) == (size_t)(e - s) && !memcmp(s, section, (size_t)(e - s));
			*found |= in;
			sub[0] = '\0';
			goto next;
		}
		eq = memchr(s, '=', (size_t)(e - s));
		if (!eq)
			return errfmt(-EINVAL, err, errlen, "%s:%d: not [section], key = value or a comment", path,
				      lineno);
		{
			const char *ks = s, *ke = eq, *vs = eq + 1, *ve = e;
			int i;

			trim(&ks, &ke);
			trim(&vs, &ve);
			if (ks == ke)
				return errfmt(-EINVAL, err, errlen, "%s:%d: a value without a key", path, lineno);
			if (!indented)
				sub[0] = '\0';
			if (!indented && vs == ve) {
				/* `s3 =`: the indented lines below belong to it */
				snprintf(sub, sizeof sub, "%.*s", (int)(ke - ks < 15 ? ke - ks : 15), ks);
				goto next;
			}
			if (!in)
				goto next;
			i = value_index(indented && sub[0] ? sub : NULL, ks, (size_t)(ke - ks));
			if (i >= 0 && !sv.v[i]) {
				sv.v[i] = vs;
				sv.n[i] = (size_t)(ve - vs);
			}
		}
next:
		line = *end ? end + 1 : end;
	}
	if (!*found)
		return 0;
	if (!sv.v[V_KEY] != !sv.v[V_SECRET])
		return errfmt(-EINVAL, err, errlen, "%s: [%s] has %s but no %s", path, section,
			      sv.v[V_KEY] ? "aws_access_key_id" : "aws_secret_access_key",
			      sv.v[V_KEY] ? "aws_secret_access_key" : "aws_access_key_id");
	snprintf(what, sizeof what, "%s: [%s]", path, section);
	if (sv.v[V_KEY] && !out->access_key[0]) {
		if ((r = fill(out->access_key, sizeof out->access_key, sv.v[V_KEY], sv.n[V_KEY], what, err, errlen)) < 0 ||
		    (r = fill(out->secret_key, sizeof out->secret_key, sv.v[V_SECRET], sv.n[V_SECRET], what, err,
			      errlen)) < 0 ||
		    (sv.v[V_TOKEN] && (r = fill(out->session_token, sizeof out->session_token, sv.v[V_TOKEN],
						sv.n[V_TOKEN], what, err, errlen)) < 0))
			return r;
		snprintf(out->source, sizeof out->source, "[%s] in %s", section, path);
	}
	/* a command that prints the keys, run when no source before gave any */
	if (sv.v[V_PROCESS] && !sv.v[V_KEY] && !out->access_key[0] && !out->process[0]) {
		if ((r = fill(out->process, sizeof out->process, sv.v[V_PROCESS], sv.n[V_PROCESS], what, err,
			      errlen)) < 0)
			return r;
		snprintf(out->source, sizeof out->source, "credential_process of [%s] in %s", section, path);
	}
	if (sv.v[V_REGION] &&
	    (r = fill(out->region, sizeof out->region, sv.v[V_REGION], sv.n[V_REGION], what, err, errlen)) < 0)
		return r;
	for (int i = V_S3_ENDPOINT; i >= V_ENDPOINT; i--)
		if (sv.v[i] && (r = fill(out->endpoint, sizeof out->endpoint, sv.v[i], sv.n[i], what, err, errlen)) < 0)
			return r;
	return 0;
}

/* @path's bytes, NUL-terminated, in *@text (NULL when it does not exist). */
static int read_file(const char *path, char **text, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	size_t got = 0;
	char *buf;

	*text = NULL;
	if (fd < 0)
		return errno == ENOENT ? 0 : errfmt(-errno, err, errlen, "%s: %s", path, strerror(errno));
	buf = malloc(AWSCREDS_FILE_MAX + 1);
	if (!buf) {
		close(fd);
		return errfmt(-ENOMEM, err, errlen, "%s: out of memory", path);
	}
	for (;;) {
		ssize_t n = read(fd, buf + got, AWSCREDS_FILE_MAX + 1 - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 || (got += (size_t)n) > AWSCREDS_FILE_MAX)
			break;
	}
	close(fd);
	if (got > AWSCREDS_FILE_MAX) {
		free(buf);
		return errfmt(-EFBIG, err, errlen, "%s: larger than %d bytes", path, AWSCREDS_FILE_MAX);
	}
	buf[got] = '\0';
	*text = buf;
	return 0;
}

/* One file's @section (and @alt, if not NULL) into @out; *@found |= there. */
static int load_file(struct awscreds *out, const char *path, const char *section, const char *alt, int *found,
		     char *err, size_t errlen)
{
	char *text;
	int r, f = 0;

	r = read_file(path, &text, err, errlen);
	if (r < 0 || !text)
		return r;
	r = awscreds_parse(out, text, path, section, &f, err, errlen);
	*found |= f;
	if (r == 0 && alt) {
		r = awscreds_parse(out, text, path, alt, &f, err, errlen);
		*found |= f;
	}
	free(text);
	return r;
}

int awscreds_time(const char *s, int64_t *out)
{
	int y, mo, d, h, mi, sec, n = 0, oh = 0, om = 0;
	int64_t days;

	if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &n) != 6 || n != 19)
		return -EINVAL;
	s += n;
	if (*s == '.')
		for (s++; isdigit((unsigned char)*s); s++)
			;
	if (*s == 'Z' || *s == 'z')
		s++;
	else if ((*s == '+' || *s == '-') && isdigit((unsigned char)s[1]) && isdigit((unsigned char)s[2]) &&
		 s[3] == ':' && isdigit((unsigned char)s[4]) && isdigit((unsigned char)s[5])) {
		oh = (s[1] - '0') * 10 + (s[2] - '0');
		om = (s[4] - '0') * 10 + (s[5] - '0');
		if (*s == '-')
			oh = -oh, om = -om;
		s += 6;
	} else {
		return -EINVAL;
	}
	if (*s || y < 1970 || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
		return -EINVAL;
	/* days from the civil date (Howard Hinnant's algorithm) */
	{
		int yy = y - (mo <= 2);
		int era = yy / 400, yoe = yy - era * 400;
		int doy = (153 * (mo + (mo > 2 ? -3 : 9)) + 2) / 5 + d - 1;
		int doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;

		days = (int64_t)era * 146097 + doe - 719468;
	}
	*out = days * 86400 + h * 3600 + mi * 60 + sec - oh * 3600 - om * 60;
	return 0;
}

/* ---- credential_process: a command that prints the keys as JSON ---- */

#define PROCESS_OUT_MAX (64 << 10)

/* One JSON string at *@p (after its '"') into @buf (cap @cap), *@p past its
 * closing quote. \\uXXXX of the BMP as UTF-8 (no surrogates: keys are ASCII). */
static int json_string(const char **p, char *buf, size_t cap)
{
	const char *s = *p;
	size_t n = 0;

	for (;;) {
		unsigned c = (unsigned char)*s++, u = 0;
		char tmp[4];
		size_t k = 1;

		if (c == '\0' || c < 0x20)
			return -1;
		if (c == '"')
			break;
		tmp[0] = (char)c;
		if (c == '\\') {
			switch (*s++) {
			case '"': tmp[0] = '"'; break;
			case '\\': tmp[0] = '\\'; break;
			case '/': tmp[0] = '/'; break;
			case 'b': tmp[0] = '\b'; break;
			case 'f': tmp[0] = '\f'; break;
			case 'n': tmp[0] = '\n'; break;
			case 'r': tmp[0] = '\r'; break;
			case 't': tmp[0] = '\t'; break;
			case 'u':
				for (int i = 0; i < 4; i++, s++) {
					if (!isxdigit((unsigned char)*s))
						return -1;
					u = u * 16 + (unsigned)(isdigit((unsigned char)*s) ? *s - '0'
							       : (tolower((unsigned char)*s) - 'a' + 10));
				}
				if (u == 0 || (u >= 0xd800 && u <= 0xdfff))
					return -1;
				if (u < 0x80) {
					tmp[0] = (char)u;
				} else if (u < 0x800) {
					tmp[0] = (char)(0xc0 | (u >> 6));
					tmp[1] = (char)(0x80 | (u & 0x3f));
					k = 2;
				} else {
					tmp[0] = (char)(0xe0 | (u >> 12));
					tmp[1] = (char)(0x80 | ((u >> 6) & 0x3f));
					tmp[2] = (char)(0x80 | (u & 0x3f));
					k = 3;
				}
				break;
			default:
				return -1;
			}
		}
		if (n + k >= cap)
			return -2;
		memcpy(buf + n, tmp, k);
		n += k;
	}
	buf[n] = '\0';
	*p = s;
	return 0;
}

static const char *json_ws(const char *p)
{
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	return p;
}

int awscreds_process_json(struct awscreds *out, const char *text, const char *what, char *err, size_t errlen)
{
	static const char *const names[] = { "AccessKeyId", "SecretAccessKey", "SessionToken", "Expiration" };
	char *dst[4] = { out->access_key, out->secret_key, out->session_token, NULL };
	size_t cap[4] = { sizeof out->access_key, sizeof out->secret_key, sizeof out->session_token, 0 };
	char key[64], val[4096], when[64] = "";
	const char *p = json_ws(text);
	int version = 0, seen = 0, r;

	if (*p++ != '{')
		return errfmt(-EINVAL, err, errlen, "%s: its output is not a JSON object", what);
	for (p = json_ws(p); *p != '}';) {
		int i;

		if (*p++ != '"' || (r = json_string(&p, key, sizeof key)) < 0)
			return errfmt(-EINVAL, err, errlen, "%s: its output is not a JSON object of strings", what);
		p = json_ws(p);
		if (*p++ != ':')
			return errfmt(-EINVAL, err, errlen, "%s: no ':' after \"%s\"", what, key);
		p = json_ws(p);
		if (*p == '"') {
			p++;
			if ((r = json_string(&p, val, sizeof val)) < 0)
				return errfmt(-EINVAL, err, errlen, "%s: \"%s\": %s", what, key,
					      r == -2 ? "longer than 4095 bytes" : "not a valid JSON string");
			for (i = 0; i < 4 && strcmp(key, names[i]); i++)
				;
			if (i == 3)
				snprintf(when, sizeof when, "%.63s", val);
			else if (i < 3 && (r = fill(dst[i], cap[i], val, strlen(val), key, err, errlen)) < 0)
				return r;
			if (i < 4)
				seen |= 1 << i;
		} else if (!strcmp(key, "Version") && *p == '1' && !isdigit((unsigned char)p[1])) {
			version = 1;
			p++;
		} else {
			return errfmt(-EINVAL, err, errlen, "%s: \"%s\": %s", what, key,
				      strcmp(key, "Version") ? "not a string" : "not 1 (the only version there is)");
		}
		p = json_ws(p);
		if (*p == ',')
			p = json_ws(p + 1);
		else if (*p != '}')
			return errfmt(-EINVAL, err, errlen, "%s: no ',' or '}' after \"%s\"", what, key);
	}
	if (*json_ws(p + 1))
		return errfmt(-EINVAL, err, errlen, "%s: more after its JSON object", what);
	if (!version)
		return errfmt(-EINVAL, err, errlen, "%s: no \"Version\": 1", what);
	if ((seen & 3) != 3 || !out->access_key[0] || !out->secret_key[0])
		return errfmt(-EINVAL, err, errlen, "%s: no \"%s\"", what,
			      (seen & 1) && out->access_key[0] ? names[1] : names[0]);
	explicit_bzero(val, sizeof val);
	if (when[0] && awscreds_time(when, &out->expires) < 0)
		return errfmt(-EINVAL, err, errlen, "%s: \"Expiration\": '%s' is not an ISO 8601 time", what, when);
	return 0;
}

/* Run @cmd with /bin/sh and read its output (at most PROCESS_OUT_MAX). */
static int run_process(const char *cmd, const char *const *env, const char *what, char **text, char *err,
		       size_t errlen)
{
	posix_spawn_file_actions_t fa;
	char *argv[] = { "sh", "-c", (char *)cmd, NULL }, *buf;
	int pfd[2], r, status;
	size_t got = 0;
	pid_t pid;

	*text = NULL;
	if (pipe2(pfd, O_CLOEXEC) < 0)
		return errfmt(-errno, err, errlen, "%s: %s", what, strerror(errno));
	if (!(buf = malloc(PROCESS_OUT_MAX + 1))) {
		close(pfd[0]);
		close(pfd[1]);
		return errfmt(-ENOMEM, err, errlen, "%s: out of memory", what);
	}
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, pfd[1], STDOUT_FILENO);
	r = posix_spawn(&pid, "/bin/sh", &fa, NULL, argv, (char *const *)env);
	posix_spawn_file_actions_destroy(&fa);
	close(pfd[1]);
	if (r != 0) {
		close(pfd[0]);
		free(buf);
		return errfmt(-r, err, errlen, "%s: cannot run /bin/sh: %s", what, strerror(r));
	}
	for (;;) {
		ssize_t n = read(pfd[0], buf + got, PROCESS_OUT_MAX + 1 - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 || (got += (size_t)n) > PROCESS_OUT_MAX)
			break;
	}
	close(pfd[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (got > PROCESS_OUT_MAX) {
		explicit_bzero(buf, PROCESS_OUT_MAX + 1);
		free(buf);
		return errfmt(-EFBIG, err, errlen, "%s: printed more than %d bytes", what, PROCESS_OUT_MAX);
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		explicit_bzero(buf, got);
		free(buf);
		if (WIFEXITED(status))
			return errfmt(-EIO, err, errlen, "%s: exited with status %d", what, WEXITSTATUS(status));
		return errfmt(-EIO, err, errlen, "%s: killed by signal %d", what, WTERMSIG(status));
	}
	buf[got] = '\0';
	*text = buf;
	return 0;
}

/* The profile's credential_process run, its keys into @out. */
static int load_process(struct awscreds *out, const char *const *env, char *err, size_t errlen)
{
	char what[1200], *text;
	int r;

	snprintf(what, sizeof what, "%s (%.200s)", out->source, out->process);
	if ((r = run_process(out->process, env, what, &text, err, errlen)) < 0)
		return r;
	r = awscreds_process_json(out, text, what, err, errlen);
	explicit_bzero(text, strlen(text));
	free(text);
	return r;
}

int awscreds_load(struct awscreds *out, const char *const *env, const char *home, char *err, size_t errlen)
{
	const char *ak = env_value(env, "AWS_ACCESS_KEY_ID"), *sk = env_value(env, "AWS_SECRET_ACCESS_KEY");
	const char *profile = env_value(env, "AWS_PROFILE"), *v;
	char cred_path[4096], conf_path[4096], section[256];
	int r, found = 0, named = profile != NULL;

	memset(out, 0, sizeof *out);
	if (!ak != !sk)
		return errfmt(-EINVAL, err, errlen, "%s is set but %s is not", ak ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
			      ak ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
	if (ak) {
		if ((r = fill(out->access_key, sizeof out->access_key, ak, strlen(ak), "AWS_ACCESS_KEY_ID", err, errlen)) < 0 ||
		    (r = fill(out->secret_key, sizeof out->secret_key, sk, strlen(sk), "AWS_SECRET_ACCESS_KEY", err,
			      errlen)) < 0)
			return r;
		v = env_value(env, "AWS_SESSION_TOKEN");
		if (v && (r = fill(out->session_token, sizeof out->session_token, v, strlen(v), "AWS_SESSION_TOKEN",
				   err, errlen)) < 0)
			return r;
		snprintf(out->source, sizeof out->source, "environment");
		/* botocore's and the SDKs' expiry of the environment's keys */
		v = env_value(env, "AWS_CREDENTIAL_EXPIRATION");
		if (v && *v && awscreds_time(v, &out->expires) < 0)
			return errfmt(-EINVAL, err, errlen, "AWS_CREDENTIAL_EXPIRATION: '%.64s' is not an ISO 8601 "
				      "time (2026-12-06T13:00:00Z)", v);
	}
	v = env_value(env, "AWS_REGION");
	if (!v)
		v = env_value(env, "AWS_DEFAULT_REGION");
	if (v && (r = fill(out->region, sizeof out->region, v, strlen(v), "AWS_REGION", err, errlen)) < 0)
		return r;
	v = env_value(env, "AWS_ENDPOINT_URL_S3");
	if (!v)
		v = env_value(env, "AWS_ENDPOINT_URL");
	if (v && (r = fill(out->endpoint, sizeof out->endpoint, v, strlen(v), "AWS_ENDPOINT_URL", err, errlen)) < 0)
		return r;

	if (!profile)
		profile = env_value(env, "AWS_DEFAULT_PROFILE");
	named |= profile != NULL;
	if (!profile)
		profile = "default";
	v = env_value(env, "AWS_SHARED_CREDENTIALS_FILE");
	if (!v && !home)
		return 0;
	snprintf(cred_path, sizeof cred_path, v ? "%s" : "%s/.aws/credentials", v ? v : home);
	v = env_value(env, "AWS_CONFIG_FILE");
	snprintf(conf_path, sizeof conf_path, v ? "%s" : "%s/.aws/config", v ? v : home ? home : "");
	if ((r = load_file(out, cred_path, profile, NULL, &found, err, errlen)) < 0)
		return r;
	snprintf(section, sizeof section, "profile %s", profile);
	if ((v || home) && (r = load_file(out, conf_path, section, strcmp(profile, "default") ? NULL : "default",
					  &found, err, errlen)) < 0)
		return r;
	if (named && !found)
		return errfmt(-EINVAL, err, errlen, "AWS_PROFILE: profile '%s' is in neither %s nor %s", profile,
			      cred_path, conf_path);
	if (!out->access_key[0] && out->process[0])
		return load_process(out, env, err, errlen);
	return 0;
}
