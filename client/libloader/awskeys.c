/* SPDX-License-Identifier: MIT */
/* awskeys - the formats keys come in (awscreds.h): a time, a
 * credential_process's or a metadata service's JSON, STS's XML; and the
 * small helpers awscreds.c and awsroles.c share
 *
 * Everything here parses bytes that another program wrote, so each is a
 * fuzz target's entry (fuzz/fuzz-awscreds.c): a value too long, a string
 * that is no JSON string, an element cut short is an error naming it, and
 * a failure leaves no half of a key pair behind.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "awscreds.h"
#include "common.h"

int awscreds_fill(char *dst, size_t cap, const char *v, size_t vlen, const char *what, char *err, size_t errlen)
{
	if (dst[0])
		return 0;
	if (vlen >= cap)
		return errfmt(-EINVAL, err, errlen, "%s: longer than %zu bytes", what, cap - 1);
	memcpy(dst, v, vlen);
	dst[vlen] = '\0';
	return 0;
}

int awscreds_read_file(const char *path, size_t max, char **text, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	size_t got = 0;
	char *buf;

	*text = NULL;
	if (fd < 0)
		return errfmt(-errno, err, errlen, "%s: %s", path, strerror(errno));
	buf = malloc(max + 1);
	if (!buf) {
		close(fd);
		return errfmt(-ENOMEM, err, errlen, "%s: out of memory", path);
	}
	for (;;) {
		ssize_t n = read(fd, buf + got, max + 1 - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 || (got += (size_t)n) > max)
			break;
	}
	close(fd);
	if (got > max) {
		explicit_bzero(buf, max + 1);
		free(buf);
		return errfmt(-EFBIG, err, errlen, "%s: larger than %zu bytes", path, max);
	}
	buf[got] = '\0';
	*text = buf;
	return 0;
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

/* The keys of a JSON object of strings: a credential_process's output
 * (@process: "Version": 1, "SessionToken") or a metadata service's
 * ("Token", and "Code": "Success" where it says one; other keys ignored). */
static int keys_json(struct awscreds *out, const char *text, const char *what, bool process, char *err,
		     size_t errlen)
{
	const char *names[] = { "AccessKeyId", "SecretAccessKey", process ? "SessionToken" : "Token", "Expiration",
				"Code" };
	char *dst[4] = { out->access_key, out->secret_key, out->session_token, NULL };
	size_t cap[4] = { sizeof out->access_key, sizeof out->secret_key, sizeof out->session_token, 0 };
	char key[64], val[4096], when[64] = "", code[64] = "";
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
			for (i = 0; i < 5 && strcmp(key, names[i]); i++)
				;
			if (i == 3)
				snprintf(when, sizeof when, "%.63s", val);
			else if (i == 4 && !process)
				snprintf(code, sizeof code, "%.63s", val);
			else if (i < 3 && (r = awscreds_fill(dst[i], cap[i], val, strlen(val), key, err, errlen)) < 0)
				return r;
			if (i < 4)
				seen |= 1 << i;
		} else if (process && !strcmp(key, "Version") && *p == '1' && !isdigit((unsigned char)p[1])) {
			version = 1;
			p++;
		} else {
			return errfmt(-EINVAL, err, errlen, "%s: \"%s\": %s", what, key,
				      !process || strcmp(key, "Version") ? "not a string"
				      : "not 1 (the only version there is)");
		}
		p = json_ws(p);
		if (*p == ',')
			p = json_ws(p + 1);
		else if (*p != '}')
			return errfmt(-EINVAL, err, errlen, "%s: no ',' or '}' after \"%s\"", what, key);
	}
	explicit_bzero(val, sizeof val);
	if (*json_ws(p + 1))
		return errfmt(-EINVAL, err, errlen, "%s: more after its JSON object", what);
	if (process && !version)
		return errfmt(-EINVAL, err, errlen, "%s: no \"Version\": 1", what);
	if (code[0] && strcmp(code, "Success"))
		return errfmt(-EACCES, err, errlen, "%s: \"Code\": \"%s\"", what, code);
	if ((seen & 3) != 3 || !out->access_key[0] || !out->secret_key[0])
		return errfmt(-EINVAL, err, errlen, "%s: no \"%s\"", what,
			      (seen & 1) && out->access_key[0] ? names[1] : names[0]);
	if (when[0] && awscreds_time(when, &out->expires) < 0)
		return errfmt(-EINVAL, err, errlen, "%s: \"Expiration\": '%s' is not an ISO 8601 time", what, when);
	return 0;
}

int awscreds_process_json(struct awscreds *out, const char *text, const char *what, char *err, size_t errlen)
{
	return keys_json(out, text, what, true, err, errlen);
}

int awscreds_meta_json(struct awscreds *out, const char *text, const char *what, char *err, size_t errlen)
{
	return keys_json(out, text, what, false, err, errlen);
}

/* ---- STS's XML answers ---- */

/* The text of the first <@tag>...</@tag> in [s, end), entities decoded,
 * into @buf: 1 found, 0 not there, -1 too long or not well formed. */
static int xml_text(const char *s, const char *end, const char *tag, char *buf, size_t cap)
{
	char open[64], close[64];
	const char *a, *b;
	size_t n = 0;

	snprintf(open, sizeof open, "<%s>", tag);
	snprintf(close, sizeof close, "</%s>", tag);
	a = memmem(s, (size_t)(end - s), open, strlen(open));
	if (!a)
		return 0;
	a += strlen(open);
	b = memmem(a, (size_t)(end - a), close, strlen(close));
	if (!b)
		return -1;
	while (a < b) {
		static const struct { const char *ent; char c; } ents[] = {
			{ "&amp;", '&' }, { "&lt;", '<' }, { "&gt;", '>' }, { "&quot;", '"' }, { "&apos;", '\'' },
		};
		char c = *a;
		size_t k = 1;

		if (c == '&') {
			size_t i;

			for (i = 0; i < 5; i++)
				if ((size_t)(b - a) >= strlen(ents[i].ent) && !memcmp(a, ents[i].ent, strlen(ents[i].ent)))
					break;
			if (i == 5)
				return -1;
			c = ents[i].c;
			k = strlen(ents[i].ent);
		} else if (c == '<') {
			return -1;
		}
		if (n + 1 >= cap)
			return -1;
		buf[n++] = c;
		a += k;
	}
	buf[n] = '\0';
	return 1;
}

int awscreds_sts_xml(struct awscreds *out, const char *text, const char *what, char *err, size_t errlen)
{
	static const char *const tags[] = { "AccessKeyId", "SecretAccessKey", "SessionToken" };
	char *dst[3] = { out->access_key, out->secret_key, out->session_token };
	size_t cap[3] = { sizeof out->access_key, sizeof out->secret_key, sizeof out->session_token };
	const char *s = text, *end = text + strlen(text), *c;
	char when[64];
	int r;

	c = memmem(s, (size_t)(end - s), "<Credentials>", 13);
	if (!c)
		return errfmt(-EINVAL, err, errlen, "%s: no <Credentials> in its answer", what);
	for (int i = 0; i < 3; i++) {
		r = xml_text(c, end, tags[i], dst[i], cap[i]);
		if (i == 2 && r == 0)
			break; /* STS always gives one; keys alone still sign */
		if (r <= 0 || !dst[i][0]) {
			out->access_key[0] = out->secret_key[0] = out->session_token[0] = '\0';
			return errfmt(-EINVAL, err, errlen, "%s: %s <%s> in its answer", what,
				      r < 0 ? "a bad or too long" : "no", tags[i]);
		}
	}
	r = xml_text(c, end, "Expiration", when, sizeof when);
	if (r < 0 || (r > 0 && awscreds_time(when, &out->expires) < 0)) {
		out->access_key[0] = out->secret_key[0] = out->session_token[0] = '\0';
		return errfmt(-EINVAL, err, errlen, "%s: <Expiration> is not an ISO 8601 time", what);
	}
	return 0;
}

void awscreds_xml_error(const char *text, char *buf, size_t cap)
{
	const char *end = text + strlen(text);
	char code[128], msg[512];

	buf[0] = '\0';
	if (xml_text(text, end, "Code", code, sizeof code) <= 0)
		return;
	if (xml_text(text, end, "Message", msg, sizeof msg) <= 0)
		msg[0] = '\0';
	snprintf(buf, cap, "%s%s%s", code, msg[0] ? ": " : "", msg);
}
