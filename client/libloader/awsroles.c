/* SPDX-License-Identifier: MIT */
/* awsroles - keys a trainer's AWS tools get from a service, not a file
 * (awscreds.h)
 *
 * Where boto3 and the AWS CLI would, in their order: a web identity token
 * exchanged at STS (AssumeRoleWithWebIdentity: a Kubernetes service
 * account's token, EKS's IRSA) before the shared files; after them a
 * container's credentials endpoint (ECS, EKS Pod Identity) and last an EC2
 * instance's role (IMDSv2, IMDSv1 where the token is refused). Each gives
 * session keys with an expiry; libloader reads them again when they have
 * expired (docs/storage.md, "Fresh credentials"), as it reads the files.
 *
 * HTTP through libcurl, opened with dlopen() the first time one of these is
 * asked: libloader links no libcurl, and a trainer that never meets them
 * never loads it. The instance's metadata service answers nothing off EC2:
 * there, as in botocore, its failures are no keys (one second at most),
 * never an error; the others are asked for because a variable or a profile
 * says so, and their failures are errors that name them.
 */
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "awscreds.h"
#include "common.h"
#include "config.h"

#ifdef LDR_HAVE_CURL
#include <curl/curl.h>
#endif

#define ANSWER_MAX (64 << 10)
#define TOKEN_FILE_MAX (64 << 10)

/* ---- HTTP: libcurl, opened at the first use ---- */

#ifdef LDR_HAVE_CURL
static struct {
	void *lib;
	CURL *(*easy_init)(void);
	CURLcode (*easy_setopt)(CURL *, CURLoption, ...);
	CURLcode (*easy_perform)(CURL *);
	CURLcode (*easy_getinfo)(CURL *, CURLINFO, ...);
	void (*easy_cleanup)(CURL *);
	const char *(*easy_strerror)(CURLcode);
	struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
	void (*slist_free_all)(struct curl_slist *);
	char why[256];
} cu;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_open(void)
{
	void *lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
	void **fns[] = { (void **)&cu.easy_init, (void **)&cu.easy_setopt, (void **)&cu.easy_perform,
			 (void **)&cu.easy_getinfo, (void **)&cu.easy_cleanup, (void **)&cu.easy_strerror,
			 (void **)&cu.slist_append, (void **)&cu.slist_free_all };
	static const char *const names[] = { "curl_easy_init", "curl_easy_setopt", "curl_easy_perform",
					     "curl_easy_getinfo", "curl_easy_cleanup", "curl_easy_strerror",
					     "curl_slist_append", "curl_slist_free_all" };

	if (!lib) {
		snprintf(cu.why, sizeof cu.why, "libcurl.so.4 (Debian: libcurl4) cannot be loaded: %s", dlerror());
		return;
	}
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		*fns[i] = dlsym(lib, names[i]);
		if (!*fns[i]) {
			snprintf(cu.why, sizeof cu.why, "libcurl.so.4 has no %s", names[i]);
			dlclose(lib);
			return;
		}
	}
	cu.lib = lib;
}

struct answer {
	char *buf;
	size_t len;
	bool over;
};

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
	struct answer *a = arg;
	size_t len = size * n;

	if (a->len + len > ANSWER_MAX) {
		a->over = true;
		return 0;
	}
	memcpy(a->buf + a->len, p, len);
	a->len += len;
	a->buf[a->len] = '\0';
	return len;
}

/* Keys to sign a request with (SigV4, libcurl's CURLOPT_AWS_SIGV4). */
struct http_sign {
	const char *provider;   /* "aws:amz:REGION:SERVICE" */
	const char *userpwd;    /* "ACCESS_KEY:SECRET" */
};

/*
 * One request: @method to @url with the headers @hdrs (NULL-terminated),
 * the form @post (POST) or none; @direct: never through a proxy (the
 * link-local and loopback services); @sign: signed with those keys, or
 * NULL. *@status and the answer's text in *@text (freed by the caller) on
 * 0; a transport failure is -EIO with libcurl's words.
 */
static int http(const char *method, const char *url, const char *const *hdrs, const char *post, long timeout_ms,
		bool direct, const struct http_sign *sign, long *status, char **text, char *err, size_t errlen)
{
	struct curl_slist *list = NULL;
	struct answer a = { 0 };
	CURLcode rc;
	CURL *h;

	*text = NULL;
	pthread_once(&cu_once, cu_open);
	if (!cu.lib)
		return errfmt(-ENOSYS, err, errlen, "%s", cu.why);
	if (!(a.buf = malloc(ANSWER_MAX + 1)) || !(h = cu.easy_init())) {
		free(a.buf);
		return errfmt(-ENOMEM, err, errlen, "out of memory");
	}
	a.buf[0] = '\0';
	for (size_t i = 0; hdrs && hdrs[i]; i++)
		list = cu.slist_append(list, hdrs[i]);
	cu.easy_setopt(h, CURLOPT_URL, url);
	cu.easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	cu.easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	cu.easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
	cu.easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
	cu.easy_setopt(h, CURLOPT_USERAGENT, "libloader (loaderd)");
	cu.easy_setopt(h, CURLOPT_HTTPHEADER, list);
	cu.easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	cu.easy_setopt(h, CURLOPT_WRITEDATA, &a);
	if (direct)
		cu.easy_setopt(h, CURLOPT_NOPROXY, "*");
	if (sign) {
		/* libcurl hashes the form it posts into the signature */
		cu.easy_setopt(h, CURLOPT_AWS_SIGV4, sign->provider);
		cu.easy_setopt(h, CURLOPT_USERPWD, sign->userpwd);
	}
	if (post)
		cu.easy_setopt(h, CURLOPT_POSTFIELDS, post);
	else if (strcmp(method, "GET"))
		cu.easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
	rc = cu.easy_perform(h);
	cu.easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
	cu.easy_cleanup(h);
	cu.slist_free_all(list);
	if (rc != CURLE_OK) {
		int r = errfmt(-EIO, err, errlen, "%s %s: %s", method, url,
			       a.over ? "an answer of more than 64 KiB" : cu.easy_strerror(rc));

		explicit_bzero(a.buf, a.len);
		free(a.buf);
		return r;
	}
	*text = a.buf;
	return 0;
}
#else
static int http(const char *method, const char *url, const char *const *hdrs, const char *post, long timeout_ms,
		bool direct, const struct http_sign *sign, long *status, char **text, char *err, size_t errlen)
{
	*text = NULL;
	return errfmt(-ENOSYS, err, errlen, "%s %s: libloader was built without libcurl's headers", method, url);
}
#endif

static void drop_text(char *text)
{
	if (text) {
		explicit_bzero(text, strlen(text));
		free(text);
	}
}

/* @path's bytes (a token), blanks around them removed, into *@out
 * (freed by the caller): one line of at most TOKEN_FILE_MAX bytes. */
static int read_token(const char *path, const char *what, char **out, char *err, size_t errlen)
{
	char why[600], *buf;
	size_t got;
	int r;

	*out = NULL;
	if ((r = awscreds_read_file(path, TOKEN_FILE_MAX, &buf, why, sizeof why)) < 0)
		return errfmt(r, err, errlen, "%s: %s", what, why);
	got = strlen(buf);
	while (got && isspace((unsigned char)buf[got - 1]))
		buf[--got] = '\0';
	if (!got || strpbrk(buf, "\r\n")) {
		drop_text(buf);
		return errfmt(-EINVAL, err, errlen, "%s: %s: %s", what, path, !got ? "empty" : "more than one line");
	}
	*out = buf;
	return 0;
}

/* @s form-encoded (RFC 3986's unreserved kept) at the end of @buf. */
static int form_add(char **buf, size_t *len, size_t *cap, const char *key, const char *s)
{
	size_t need = *len + strlen(key) + 2 + 3 * strlen(s) + 1;

	if (need > *cap) {
		char *nb = realloc(*buf, need * 2);

		if (!nb)
			return -ENOMEM;
		*buf = nb;
		*cap = need * 2;
	}
	*len += (size_t)sprintf(*buf + *len, "%s%s=", *len ? "&" : "", key);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~')
			(*buf)[(*len)++] = (char)c;
		else
			*len += (size_t)sprintf(*buf + *len, "%%%02X", c);
	}
	(*buf)[*len] = '\0';
	return 0;
}

/* ---- AssumeRoleWithWebIdentity ---- */

/* STS's URL: AWS_ENDPOINT_URL_STS, AWS_ENDPOINT_URL (every service's), else
 * the region's endpoint (the global one without a region), as botocore. */
static void sts_url(const struct awscreds *out, const char *const *env, char *buf, size_t cap)
{
	const char *v = env_value(env, "AWS_ENDPOINT_URL_STS");

	if (!v || !*v)
		v = env_value(env, "AWS_ENDPOINT_URL");
	if (v && *v)
		snprintf(buf, cap, "%s", v);
	else if (out->region[0])
		snprintf(buf, cap, "https://sts.%s.amazonaws.com%s", out->region,
			 strncmp(out->region, "cn-", 3) ? "" : ".cn");
	else
		snprintf(buf, cap, "https://sts.amazonaws.com");
}

/* POST @form to STS at @url (signed with @sign, or not), its keys into
 * @out; errors name @what and STS's words. */
static int sts_post(struct awscreds *out, const char *url, const char *const *hdrs, const char *form,
		    const struct http_sign *sign, const char *what, char *err, size_t errlen)
{
	char why[600], whose[1000], *text = NULL;
	long status = 0;
	int r;

	r = http("POST", url, hdrs, form, 30000, false, sign, &status, &text, why, sizeof why);
	if (r < 0)
		return errfmt(r, err, errlen, "%s: STS: %s", what, why);
	if (status != 200) {
		awscreds_xml_error(text, why, sizeof why);
		r = errfmt(status == 403 || status == 400 ? -EACCES : -EIO, err, errlen, "%s: STS %s: %s (HTTP %ld)",
			   what, url, why[0] ? why : "no AWS error in its answer", status);
	} else {
		snprintf(whose, sizeof whose, "%.600s: STS %.300s", what, url);
		r = awscreds_sts_xml(out, text, whose, err, errlen);
	}
	drop_text(text);
	return r;
}

int awsroles_web_identity(struct awscreds *out, const char *const *env, const char *role_arn, const char *token_file,
			  const char *session, char *err, size_t errlen)
{
	static const char *const hdrs[] = { "Accept: application/xml",
					    "Content-Type: application/x-www-form-urlencoded; charset=utf-8", NULL };
	char what[1100], url[600], sess[80];
	char *token = NULL, *form = NULL;
	size_t len = 0, cap = 0;
	int r;

	snprintf(what, sizeof what, "web identity (role %.300s, token %.300s)", role_arn, token_file);
	if ((r = read_token(token_file, what, &token, err, errlen)) < 0)
		return r;
	if (session && *session)
		snprintf(sess, sizeof sess, "%.64s", session);
	else
		snprintf(sess, sizeof sess, "loaderd-session-%lld", (long long)time(NULL));
	sts_url(out, env, url, sizeof url);
	if (form_add(&form, &len, &cap, "Action", "AssumeRoleWithWebIdentity") < 0 ||
	    form_add(&form, &len, &cap, "RoleArn", role_arn) < 0 ||
	    form_add(&form, &len, &cap, "RoleSessionName", sess) < 0 ||
	    form_add(&form, &len, &cap, "Version", "2011-06-15") < 0 ||
	    form_add(&form, &len, &cap, "WebIdentityToken", token) < 0) {
		r = errfmt(-ENOMEM, err, errlen, "%s: out of memory", what);
		goto out;
	}
	r = sts_post(out, url, hdrs, form, NULL, what, err, errlen);
	if (r == 0)
		snprintf(out->source, sizeof out->source, "web identity (role %.130s)", role_arn);
out:
	drop_text(token);
	drop_text(form);
	return r;
}

/* ---- AssumeRole, signed with other keys ---- */

int awsroles_assume_role(struct awscreds *out, const char *const *env, const struct awscreds *from, char *err,
			 size_t errlen)
{
	static const char *const base[] = { "Accept: application/xml",
					    "Content-Type: application/x-www-form-urlencoded; charset=utf-8" };
	const char *hdrs[4] = { base[0], base[1], NULL, NULL };
	char what[800], url[600], sess[80], provider[128], *userpwd = NULL, *tokhdr = NULL;
	char *form = NULL;
	size_t len = 0, cap = 0;
	int r;

	snprintf(what, sizeof what, "role %.300s (assumed with the keys of %.300s)", out->role_arn, from->source);
	if (out->role_session[0])
		snprintf(sess, sizeof sess, "%.64s", out->role_session);
	else
		snprintf(sess, sizeof sess, "loaderd-session-%lld", (long long)time(NULL));
	sts_url(out, env, url, sizeof url);
	snprintf(provider, sizeof provider, "aws:amz:%.60s:sts", out->region[0] ? out->region : "us-east-1");
	if (asprintf(&userpwd, "%s:%s", from->access_key, from->secret_key) < 0 ||
	    (from->session_token[0] && asprintf(&tokhdr, "X-Amz-Security-Token: %s", from->session_token) < 0) ||
	    form_add(&form, &len, &cap, "Action", "AssumeRole") < 0 ||
	    (out->external_id[0] && form_add(&form, &len, &cap, "ExternalId", out->external_id) < 0) ||
	    form_add(&form, &len, &cap, "RoleArn", out->role_arn) < 0 ||
	    form_add(&form, &len, &cap, "RoleSessionName", sess) < 0 ||
	    form_add(&form, &len, &cap, "Version", "2011-06-15") < 0) {
		r = errfmt(-ENOMEM, err, errlen, "%s: out of memory", what);
		goto out;
	}
	hdrs[2] = tokhdr;
	{
		struct http_sign sign = { provider, userpwd };

		r = sts_post(out, url, hdrs, form, &sign, what, err, errlen);
	}
	if (r == 0)
		snprintf(out->source, sizeof out->source, "role %.140s", out->role_arn);
out:
	drop_text(userpwd);
	drop_text(tokhdr);
	drop_text(form);
	return r;
}

/* ---- a container's endpoint (ECS, EKS Pod Identity) ---- */

/* Whether @url may carry a container's keys: https anywhere; http only to
 * loopback or ECS's and EKS's link-local addresses (botocore's rule). */
static bool container_url_ok(const char *url)
{
	static const char *const hosts[] = { "169.254.170.2", "169.254.170.23", "[fd00:ec2::23]", "localhost",
					     "[::1]" };
	const char *h, *e;
	size_t n;

	if (!strncasecmp(url, "https://", 8))
		return true;
	if (strncasecmp(url, "http://", 7))
		return false;
	h = url + 7;
	e = h[0] == '[' ? strchr(h, ']') : h + strcspn(h, ":/?#");
	if (!e)
		return false;
	n = (size_t)(e - h) + (h[0] == '[');
	if (h[0] != '[' && n > 4 && !strncmp(h, "127.", 4) && strspn(h, "0123456789.") == n)
		return true;
	for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++)
		if (strlen(hosts[i]) == n && !strncasecmp(h, hosts[i], n))
			return true;
	return false;
}

int awsroles_container(struct awscreds *out, const char *const *env, char *err, size_t errlen)
{
	const char *rel = env_value(env, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
	const char *full = env_value(env, "AWS_CONTAINER_CREDENTIALS_FULL_URI");
	const char *tf = env_value(env, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
	const char *tv = env_value(env, "AWS_CONTAINER_AUTHORIZATION_TOKEN");
	char url[1200], what[1300], why[600], *token = NULL, *auth = NULL, *text = NULL;
	const char *hdrs[3] = { "Accept: application/json", NULL, NULL };
	long status = 0;
	int r = 0;

	if (rel && *rel)
		snprintf(url, sizeof url, "http://169.254.170.2%s%.1000s", rel[0] == '/' ? "" : "/", rel);
	else if (full && *full)
		snprintf(url, sizeof url, "%.1100s", full);
	else
		return 0;
	snprintf(what, sizeof what, "container credentials (%s)", url);
	if (!(rel && *rel) && !container_url_ok(url))
		return errfmt(-EINVAL, err, errlen, "AWS_CONTAINER_CREDENTIALS_FULL_URI: %s: not https, nor http to "
			      "loopback, 169.254.170.2, 169.254.170.23 or fd00:ec2::23", url);
	if (tf && *tf && (r = read_token(tf, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", &token, err, errlen)) < 0)
		return r;
	if ((token || (tv && *tv))) {
		const char *t = token ? token : tv;

		if (strpbrk(t, "\r\n")) {
			drop_text(token);
			return errfmt(-EINVAL, err, errlen, "AWS_CONTAINER_AUTHORIZATION_TOKEN: more than one line");
		}
		if (asprintf(&auth, "Authorization: %s", t) < 0) {
			drop_text(token);
			return errfmt(-ENOMEM, err, errlen, "%s: out of memory", what);
		}
		hdrs[1] = auth;
	}
	/* botocore's: 2 s a try, 3 tries */
	for (int tries = 0; tries < 3; tries++) {
		drop_text(text);
		r = http("GET", url, hdrs, NULL, 2000, true, NULL, &status, &text, why, sizeof why);
		if (r == 0 && status < 500)
			break;
	}
	if (r < 0)
		r = errfmt(r, err, errlen, "%s", why);
	else if (status != 200)
		r = errfmt(-EACCES, err, errlen, "%s: HTTP %ld: %.200s", what, status, text);
	else if ((r = awscreds_meta_json(out, text, what, err, errlen)) == 0)
		snprintf(out->source, sizeof out->source, "container credentials (%.130s)", url);
	drop_text(token);
	drop_text(auth);
	drop_text(text);
	return r;
}

/* ---- an EC2 instance's role (IMDS) ---- */

int awsroles_imds(struct awscreds *out, const char *const *env, char *err, size_t errlen)
{
	const char *v = env_value(env, "AWS_EC2_METADATA_DISABLED"), *mode;
	char base[600], url[1200], what[1300], role[256], tokhdr[200], why[600], *token = NULL, *text = NULL;
	const char *hdrs[2] = { NULL, NULL };
	long status = 0;
	size_t n;
	int r;

	if (v && !strcasecmp(v, "true"))
		return 0;
	v = env_value(env, "AWS_EC2_METADATA_SERVICE_ENDPOINT");
	mode = env_value(env, "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE");
	snprintf(base, sizeof base, "%.500s",
		 v && *v ? v : mode && !strcasecmp(mode, "IPv6") ? "http://[fd00:ec2::254]" : "http://169.254.169.254");
	n = strlen(base);
	while (n && base[n - 1] == '/')
		base[--n] = '\0';
	/* IMDSv2's token; refused (403, 404, 405): IMDSv1, as botocore */
	snprintf(url, sizeof url, "%s/latest/api/token", base);
	hdrs[0] = "X-aws-ec2-metadata-token-ttl-seconds: 21600";
	if (http("PUT", url, hdrs, NULL, 1000, true, NULL, &status, &token, why, sizeof why) < 0)
		return 0; /* no instance metadata here: no keys */
	if (status == 200 && token[0] && !strpbrk(token, "\r\n") && strlen(token) < 150) {
		snprintf(tokhdr, sizeof tokhdr, "X-aws-ec2-metadata-token: %s", token);
		hdrs[0] = tokhdr;
	} else if (status == 403 || status == 404 || status == 405) {
		hdrs[0] = NULL;
	} else {
		drop_text(token);
		return 0;
	}
	drop_text(token);
	snprintf(url, sizeof url, "%s/latest/meta-data/iam/security-credentials/", base);
	r = http("GET", url, hdrs, NULL, 1000, true, NULL, &status, &text, why, sizeof why);
	if (r < 0 || status != 200 || !text[0]) {
		drop_text(text);
		explicit_bzero(tokhdr, sizeof tokhdr);
		return 0; /* no role on this instance */
	}
	snprintf(role, sizeof role, "%.*s", (int)strcspn(text, "\r\n"), text);
	drop_text(text);
	snprintf(url, sizeof url, "%s/latest/meta-data/iam/security-credentials/%s", base, role);
	snprintf(what, sizeof what, "the instance's role %.200s (%.800s)", role, url);
	r = http("GET", url, hdrs, NULL, 1000, true, NULL, &status, &text, why, sizeof why);
	explicit_bzero(tokhdr, sizeof tokhdr);
	if (r < 0 || status != 200) {
		drop_text(text);
		return 0;
	}
	r = awscreds_meta_json(out, text, what, err, errlen);
	if (r == 0)
		snprintf(out->source, sizeof out->source, "instance role %.80s (%.60s)", role, base);
	drop_text(text);
	return r;
}
