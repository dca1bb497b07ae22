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
 * What no file holds comes from the services of awsroles.c (a web identity
 * at STS, a container's endpoint, the instance's role), in botocore's
 * place for each; the formats they and a credential_process answer in are
 * parsed in awskeys.c.
 *
 * The files are INI as botocore reads them: `[section]`, `key = value`,
 * comments from '#' or ';' at the start of a line, and a key with an empty
 * value opening a sub-section of indented lines (`s3 =` then
 * `  endpoint_url = ...`). Anything else is an error that names the file
 * and line: a typo must not silently mean "no credentials".
 */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
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

/* [s, e) without the blanks around it */
static void trim(const char **s, const char **e)
{
	while (*s < *e && isspace((unsigned char)**s))
		(*s)++;
	while (*e > *s && isspace((unsigned char)(*e)[-1]))
		(*e)--;
}

/* What one profile section holds, as spans of the text. */
enum { V_KEY, V_SECRET, V_TOKEN, V_REGION, V_ENDPOINT, V_ROLE_ARN, V_WEB_TOKEN, V_ROLE_SESSION,
       V_SOURCE_PROFILE, V_CRED_SOURCE, V_EXTERNAL_ID, V_MFA_SERIAL, V_SSO_SESSION, V_SSO_URL, V_PROCESS,
       V_S3_ENDPOINT, V_COUNT };

struct section_vals {
	const char *v[V_COUNT];
	size_t n[V_COUNT];
};

static const char *const value_names[V_PROCESS + 1] = {
	"aws_access_key_id", "aws_secret_access_key", "aws_session_token", "region", "endpoint_url", "role_arn",
	"web_identity_token_file", "role_session_name", "source_profile", "credential_source", "external_id",
	"mfa_serial", "sso_session", "sso_start_url", "credential_process",
};

static int value_index(const char *sub, const char *k, size_t kn)
{
	if (sub)
		return strcmp(sub, "s3") == 0 && kn == 12 && !memcmp(k, "endpoint_url", 12) ? V_S3_ENDPOINT : -1;
	for (int i = 0; i <= V_PROCESS; i++)
		if (strlen(value_names[i]) == kn && !memcmp(k, value_names[i], kn))
			return i;
	return -1;
}

/* A profile's role (role_arn and how to assume it) into @out, where no
 * source before gave keys nor a role. */
static int parse_role(struct awscreds *out, const struct section_vals *sv, const char *what, char *err,
		      size_t errlen)
{
	static const char *const sources[] = { "Environment", "Ec2InstanceMetadata", "EcsContainer" };
	int r, how;

	if (out->access_key[0] || out->role_arn[0] || out->unsupported[0])
		return 0;
	/* SSO, and a role behind an MFA code: not read (docs/storage.md) */
	for (int i = V_MFA_SERIAL; i <= V_SSO_URL; i++)
		if (sv->v[i] && (i != V_MFA_SERIAL || sv->v[V_ROLE_ARN])) {
			snprintf(out->unsupported, sizeof out->unsupported, "%.200s has %s", what, value_names[i]);
			return 0;
		}
	if (!sv->v[V_ROLE_ARN])
		return 0;
	how = sv->v[V_WEB_TOKEN] ? V_WEB_TOKEN : sv->v[V_SOURCE_PROFILE] ? V_SOURCE_PROFILE
	      : sv->v[V_CRED_SOURCE] ? V_CRED_SOURCE : -1;
	if (how < 0)
		return errfmt(-EINVAL, err, errlen, "%s: role_arn without web_identity_token_file, source_profile or "
			      "credential_source", what);
	if (how == V_CRED_SOURCE) {
		size_t i;

		for (i = 0; i < 3; i++)
			if (strlen(sources[i]) == sv->n[how] && !memcmp(sv->v[how], sources[i], sv->n[how]))
				break;
		if (i == 3)
			return errfmt(-EINVAL, err, errlen, "%s: credential_source '%.*s' is none of Environment, "
				      "Ec2InstanceMetadata, EcsContainer", what, (int)(sv->n[how] < 64 ? sv->n[how] : 64),
				      sv->v[how]);
	}
	if ((r = awscreds_fill(out->role_arn, sizeof out->role_arn, sv->v[V_ROLE_ARN], sv->n[V_ROLE_ARN], what, err,
			       errlen)) < 0 ||
	    (r = awscreds_fill(how == V_WEB_TOKEN ? out->web_token_file : how == V_SOURCE_PROFILE
			       ? out->source_profile : out->credential_source,
			       how == V_WEB_TOKEN ? sizeof out->web_token_file : how == V_SOURCE_PROFILE
			       ? sizeof out->source_profile : sizeof out->credential_source,
			       sv->v[how], sv->n[how], what, err, errlen)) < 0 ||
	    (sv->v[V_ROLE_SESSION] && (r = awscreds_fill(out->role_session, sizeof out->role_session,
							 sv->v[V_ROLE_SESSION], sv->n[V_ROLE_SESSION], what, err,
							 errlen)) < 0) ||
	    (sv->v[V_EXTERNAL_ID] && (r = awscreds_fill(out->external_id, sizeof out->external_id,
							sv->v[V_EXTERNAL_ID], sv->n[V_EXTERNAL_ID], what, err,
							errlen)) < 0))
		return r;
	snprintf(out->role_from, sizeof out->role_from, "%.200s", what);
	return 0;
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
		if ((r = awscreds_fill(out->access_key, sizeof out->access_key, sv.v[V_KEY], sv.n[V_KEY], what, err, errlen)) < 0 ||
		    (r = awscreds_fill(out->secret_key, sizeof out->secret_key, sv.v[V_SECRET], sv.n[V_SECRET], what, err,
			      errlen)) < 0 ||
		    (sv.v[V_TOKEN] && (r = awscreds_fill(out->session_token, sizeof out->session_token, sv.v[V_TOKEN],
						sv.n[V_TOKEN], what, err, errlen)) < 0))
			return r;
		snprintf(out->source, sizeof out->source, "[%s] in %s", section, path);
	}
	if (!sv.v[V_KEY] && (r = parse_role(out, &sv, what, err, errlen)) < 0)
		return r;
	/* a command that prints the keys, run when no source before gave any */
	if (sv.v[V_PROCESS] && !sv.v[V_KEY] && !out->access_key[0] && !out->process[0]) {
		if ((r = awscreds_fill(out->process, sizeof out->process, sv.v[V_PROCESS], sv.n[V_PROCESS], what, err,
			      errlen)) < 0)
			return r;
		snprintf(out->source, sizeof out->source, "credential_process of [%s] in %s", section, path);
	}
	if (sv.v[V_REGION] &&
	    (r = awscreds_fill(out->region, sizeof out->region, sv.v[V_REGION], sv.n[V_REGION], what, err, errlen)) < 0)
		return r;
	/* the s3 sub-section's endpoint_url before the profile's own */
	for (int k = 0, i = V_S3_ENDPOINT; k < 2; k++, i = V_ENDPOINT)
		if (sv.v[i] && (r = awscreds_fill(out->endpoint, sizeof out->endpoint, sv.v[i], sv.n[i], what, err, errlen)) < 0)
			return r;
	return 0;
}

/* One file's @section (and @alt, if not NULL) into @out; *@found |= there. */
static int load_file(struct awscreds *out, const char *path, const char *section, const char *alt, int *found,
		     char *err, size_t errlen)
{
	char *text;
	int r, f = 0;

	r = awscreds_read_file(path, AWSCREDS_FILE_MAX, &text, err, errlen);
	if (r == -ENOENT)
		return 0;
	if (r < 0)
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

/* ---- credential_process: a command that prints the keys as JSON ---- */

#define PROCESS_OUT_MAX (64 << 10)

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

/* What no file held, in botocore's order: a web identity (the environment's,
 * then the profile's), the profile's credential_process, a container's
 * endpoint, the instance's role. */
/* The files' @profile (the credentials file's [PROFILE], then the config
 * file's [profile PROFILE]) into @out, *@found when either has it; their
 * paths in @files ("" when there are no files: no home, no variable). */
static int load_profile(struct awscreds *out, const char *const *env, const char *home, const char *profile,
			int *found, char files[2][4096], char *err, size_t errlen)
{
	const char *v = env_value(env, "AWS_SHARED_CREDENTIALS_FILE"), *c = env_value(env, "AWS_CONFIG_FILE");
	char section[256];
	int r;

	*found = 0;
	files[0][0] = files[1][0] = '\0';
	if (!v && !home)
		return 0;
	snprintf(files[0], 4096, v ? "%s" : "%s/.aws/credentials", v ? v : home);
	snprintf(files[1], 4096, c ? "%s" : "%s/.aws/config", c ? c : home ? home : "");
	if ((r = load_file(out, files[0], profile, NULL, found, err, errlen)) < 0)
		return r;
	snprintf(section, sizeof section, "profile %s", profile);
	if ((c || home) && (r = load_file(out, files[1], section, strcmp(profile, "default") ? NULL : "default",
					  found, err, errlen)) < 0)
		return r;
	return 0;
}

/* The keys a role is assumed with, into @from: its source_profile's (keys or
 * credential_process; not a role of its own), or its credential_source's. */
static int role_source(const struct awscreds *out, struct awscreds *from, const char *const *env, const char *home,
		       char *err, size_t errlen)
{
	const char *ak = env_value(env, "AWS_ACCESS_KEY_ID"), *sk = env_value(env, "AWS_SECRET_ACCESS_KEY"), *tok;
	char files[2][4096];
	int r = 0, found = 0;

	if (out->source_profile[0]) {
		r = load_profile(from, env, home, out->source_profile, &found, files, err, errlen);
		if (r == 0 && !found)
			return errfmt(-EINVAL, err, errlen, "%s: source_profile '%s' is in neither %s nor %s", out->role_from,
				      out->source_profile, files[0], files[1]);
		if (r == 0 && !from->access_key[0] && from->process[0])
			r = load_process(from, env, err, errlen);
		if (r == 0 && !from->access_key[0])
			r = errfmt(-EINVAL, err, errlen, "%s: source_profile '%s' has no keys%s", out->role_from,
				   out->source_profile, from->role_arn[0] ? " (it is a role: libloader assumes one role, "
				   "not a chain)" : "");
		return r;
	}
	if (!strcmp(out->credential_source, "Environment")) {
		if (!ak || !sk || !*ak || !*sk)
			return errfmt(-EINVAL, err, errlen, "%s: credential_source Environment, but AWS_ACCESS_KEY_ID and "
				      "AWS_SECRET_ACCESS_KEY are not both set", out->role_from);
		tok = env_value(env, "AWS_SESSION_TOKEN");
		if ((r = awscreds_fill(from->access_key, sizeof from->access_key, ak, strlen(ak), "AWS_ACCESS_KEY_ID", err,
				       errlen)) < 0 ||
		    (r = awscreds_fill(from->secret_key, sizeof from->secret_key, sk, strlen(sk),
				       "AWS_SECRET_ACCESS_KEY", err, errlen)) < 0 ||
		    (tok && (r = awscreds_fill(from->session_token, sizeof from->session_token, tok, strlen(tok),
					      "AWS_SESSION_TOKEN", err, errlen)) < 0))
			return r;
		snprintf(from->source, sizeof from->source, "environment");
		return 0;
	}
	r = !strcmp(out->credential_source, "EcsContainer") ? awsroles_container(from, env, err, errlen)
	    : awsroles_imds(from, env, err, errlen);
	if (r == 0 && !from->access_key[0])
		r = errfmt(-EINVAL, err, errlen, "%s: credential_source %s gave no keys%s", out->role_from,
			   out->credential_source, strcmp(out->credential_source, "EcsContainer") ?
			   " (no instance metadata service, or no role on this instance)" :
			   " (no AWS_CONTAINER_CREDENTIALS_RELATIVE_URI nor _FULL_URI)");
	return r;
}

/* @out's role, assumed at STS with the keys of its source. */
static int assume_role(struct awscreds *out, const char *const *env, const char *home, char *err, size_t errlen)
{
	struct awscreds *from = calloc(1, sizeof(*from));
	int r;

	if (!from)
		return errfmt(-ENOMEM, err, errlen, "%s: out of memory", out->role_from);
	r = role_source(out, from, env, home, err, errlen);
	if (r == 0)
		r = awsroles_assume_role(out, env, from, err, errlen);
	explicit_bzero(from, sizeof(*from));
	free(from);
	return r;
}

static int load_service(struct awscreds *out, const char *const *env, const char *home, const char *profile,
			char *err, size_t errlen)
{
	const char *role = env_value(env, "AWS_ROLE_ARN"), *tokf = env_value(env, "AWS_WEB_IDENTITY_TOKEN_FILE");

	if (out->access_key[0])
		return 0;
	if (role && *role && tokf && *tokf)
		return awsroles_web_identity(out, env, role, tokf, env_value(env, "AWS_ROLE_SESSION_NAME"), err,
					     errlen);
	if (out->role_arn[0] && !out->web_token_file[0])
		return assume_role(out, env, home, err, errlen);
	if (out->role_arn[0])
		return awsroles_web_identity(out, env, out->role_arn, out->web_token_file, out->role_session, err,
					     errlen);
	if (out->process[0])
		return load_process(out, env, err, errlen);
	if (out->unsupported[0])
		return errfmt(-ENOTSUP, err, errlen, "%s, which libloader does not read (SSO, a role behind an MFA "
			      "code): give the profile `credential_process = aws configure export-credentials --profile "
			      "%.100s --format process` (AWS CLI v2), or export its keys", out->unsupported, profile);
	if (env_value(env, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") ||
	    env_value(env, "AWS_CONTAINER_CREDENTIALS_FULL_URI"))
		return awsroles_container(out, env, err, errlen);
	return awsroles_imds(out, env, err, errlen);
}

int awscreds_load_from(struct awscreds *out, const char *const *env, const char *home, bool services, char *err,
		       size_t errlen)
{
	const char *ak = env_value(env, "AWS_ACCESS_KEY_ID"), *sk = env_value(env, "AWS_SECRET_ACCESS_KEY");
	const char *profile = env_value(env, "AWS_PROFILE"), *v;
	char files[2][4096];
	int r, found = 0, named = profile != NULL;

	memset(out, 0, sizeof *out);
	if (!ak != !sk)
		return errfmt(-EINVAL, err, errlen, "%s is set but %s is not", ak ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
			      ak ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
	if (ak) {
		if ((r = awscreds_fill(out->access_key, sizeof out->access_key, ak, strlen(ak), "AWS_ACCESS_KEY_ID", err, errlen)) < 0 ||
		    (r = awscreds_fill(out->secret_key, sizeof out->secret_key, sk, strlen(sk), "AWS_SECRET_ACCESS_KEY", err,
			      errlen)) < 0)
			return r;
		v = env_value(env, "AWS_SESSION_TOKEN");
		if (v && (r = awscreds_fill(out->session_token, sizeof out->session_token, v, strlen(v), "AWS_SESSION_TOKEN",
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
	if (v && (r = awscreds_fill(out->region, sizeof out->region, v, strlen(v), "AWS_REGION", err, errlen)) < 0)
		return r;
	v = env_value(env, "AWS_ENDPOINT_URL_S3");
	if (!v)
		v = env_value(env, "AWS_ENDPOINT_URL");
	if (v && (r = awscreds_fill(out->endpoint, sizeof out->endpoint, v, strlen(v), "AWS_ENDPOINT_URL", err, errlen)) < 0)
		return r;

	if (!profile)
		profile = env_value(env, "AWS_DEFAULT_PROFILE");
	named |= profile != NULL;
	if (!profile)
		profile = "default";
	if ((r = load_profile(out, env, home, profile, &found, files, err, errlen)) < 0)
		return r;
	if (named && !found && files[0][0])
		return errfmt(-EINVAL, err, errlen, "AWS_PROFILE: profile '%s' is in neither %s nor %s", profile,
			      files[0], files[1]);
	return services ? load_service(out, env, home, profile, err, errlen) : 0;
}

int awscreds_load(struct awscreds *out, const char *const *env, const char *home, char *err, size_t errlen)
{
	return awscreds_load_from(out, env, home, true, err, errlen);
}
