/* SPDX-License-Identifier: MIT */
/* awscreds - a trainer's object-store credentials, read where the AWS CLI
 * and boto3 read them (libloader's side of docs/storage.md) */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What awscreds_load() found; "" where nothing was. */
struct awscreds {
	char access_key[128];
	char secret_key[128];
	char session_token[4096];
	char region[64];
	char endpoint[512];
	char source[160];   /* where the keys came from: "environment", "PROFILE in FILE" */
	int64_t expires;    /* when the keys expire, Unix seconds (UTC); 0: not known */
	char process[1024]; /* the profile's credential_process, "" none (run by awscreds_load()) */
	/* the profile's role ("" none), assumed with a web identity token, or
	 * with the keys of another profile or of a credential_source */
	char role_arn[512];
	char web_token_file[1024];
	char source_profile[128];
	char credential_source[32];  /* Environment, Ec2InstanceMetadata, EcsContainer */
	char external_id[256];
	char role_session[128];
	char role_from[256];         /* "FILE: [SECTION]" of the role, for messages */
	/* "FILE: [SECTION] has KEY": a way to keys libloader does not read
	 * (assume-role from a source_profile or credential_source, SSO) */
	char unsupported[300];
};

/**
 * awscreds_load() - the credentials, region and endpoint of this process
 * @env: "NAME=VALUE" strings, NULL-terminated (environ)
 * @home: the home directory (~/.aws/ lies there); NULL: no files
 *
 * Keys: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN),
 * else the profile (AWS_PROFILE, else AWS_DEFAULT_PROFILE, else "default")
 * in the credentials file (AWS_SHARED_CREDENTIALS_FILE, else
 * ~/.aws/credentials), else in the config file (AWS_CONFIG_FILE, else
 * ~/.aws/config, section [profile NAME] or [default]). Region: AWS_REGION,
 * AWS_DEFAULT_REGION, the profile's region. Endpoint: AWS_ENDPOINT_URL_S3,
 * AWS_ENDPOINT_URL, the profile's `s3 =` sub-section's endpoint_url, the
 * profile's endpoint_url. No keys anywhere is not an error (public
 * objects). Expiry: AWS_CREDENTIAL_EXPIRATION (ISO 8601, as botocore and
 * the SDKs read it) with the environment's keys. Without keys in the
 * environment, a web identity (AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE,
 * or the profile's role_arn and web_identity_token_file) is exchanged at STS
 * before the files are looked at. A profile with no keys but a
 * credential_process: the command is run (/bin/sh -c, @env as its
 * environment) and its JSON read (awscreds_process_json()). Then a
 * container's endpoint, then the instance's role (awsroles.c). A profile's
 * role_arn with source_profile or credential_source: AssumeRole signed with
 * those keys, before the files' keys; SSO or mfa_serial: -ENOTSUP saying
 * what to do.
 *
 * Return: 0; -EINVAL with a message naming the variable, or the file and
 * line: one key of a pair without the other, a profile named explicitly
 * that neither file has, a line that is not `[section]`, `key = value` or
 * a comment, a value too long, an AWS_CREDENTIAL_EXPIRATION that is no
 * ISO 8601 time.
 */
int awscreds_load(struct awscreds *out, const char *const *env, const char *home, char *err, size_t errlen);
/* The same; @services false: the environment and the files only (no STS,
 * container or instance request: nothing will sign with what they give,
 * or the caller has keys of its own). */
int awscreds_load_from(struct awscreds *out, const char *const *env, const char *home, bool services, char *err,
		       size_t errlen);

/**
 * awscreds_meta_json() - the keys a container's endpoint or an instance's
 * metadata service answered: {"AccessKeyId", "SecretAccessKey", "Token"?,
 * "Expiration"?, "Code"? ("Success")}, other string keys ignored
 *
 * Return: 0 with the keys in @out; -EINVAL (-EACCES: a Code not Success)
 * naming @what. A fuzz target's entry (fuzz/fuzz-awscreds.c).
 */
int awscreds_meta_json(struct awscreds *out, const char *text, const char *what, char *err, size_t errlen);

/**
 * awscreds_sts_xml() - the keys in an STS AssumeRole* answer
 * (<Credentials><AccessKeyId>, <SecretAccessKey>, <SessionToken>?,
 * <Expiration>?), XML entities decoded
 *
 * Return: 0, or -EINVAL naming @what and the element missing or bad. A
 * fuzz target's entry (fuzz/fuzz-awscreds.c).
 */
int awscreds_sts_xml(struct awscreds *out, const char *text, const char *what, char *err, size_t errlen);

/* awskeys.c: @v (@vlen bytes) into @dst (cap @cap) unless @dst is set
 * already; -EINVAL naming @what when too long. */
int awscreds_fill(char *dst, size_t cap, const char *v, size_t vlen, const char *what, char *err, size_t errlen);
/* @path's bytes, NUL-terminated, into *@text (freed by the caller): at most
 * @max; -errno (-ENOENT when it does not exist), -EFBIG, naming @path. */
int awscreds_read_file(const char *path, size_t max, char **text, char *err, size_t errlen);
/* "CODE: MESSAGE" of an AWS XML error answer into @buf, "" when none. */
void awscreds_xml_error(const char *text, char *buf, size_t cap);

/* awsroles.c: the services, each filling @out (0 and nothing when the
 * instance has no metadata service or no role). */
int awsroles_web_identity(struct awscreds *out, const char *const *env, const char *role_arn, const char *token_file,
			  const char *session, char *err, size_t errlen);
int awsroles_container(struct awscreds *out, const char *const *env, char *err, size_t errlen);
/* AssumeRole of @out's role_arn (external_id, role_session), signed with
 * @from's keys (its source names them in messages); the keys into @out. */
int awsroles_assume_role(struct awscreds *out, const char *const *env, const struct awscreds *from, char *err,
			 size_t errlen);
int awsroles_imds(struct awscreds *out, const char *const *env, char *err, size_t errlen);

/**
 * awscreds_parse() - one INI file's profile @section into @out
 * @text: the file's bytes (NUL-terminated); @path names it in messages
 * @found: set to 1 when the section is there
 *
 * Fills what @out lacks (an earlier source wins). Used by
 * awscreds_load(); a fuzz target's entry (fuzz/fuzz-awscreds.c).
 */
int awscreds_parse(struct awscreds *out, const char *text, const char *path, const char *section, int *found,
		   char *err, size_t errlen);

/**
 * awscreds_time() - an ISO 8601 time (2026-12-06T13:00:00Z, with fractions
 * of a second or a +HH:MM offset) as Unix seconds
 *
 * Return: 0, or -EINVAL when @s is not one.
 */
int awscreds_time(const char *s, int64_t *out);

/**
 * awscreds_process_json() - the keys a credential_process printed
 * @text: its output (NUL-terminated): one JSON object, {"Version": 1,
 *        "AccessKeyId", "SecretAccessKey", "SessionToken"?, "Expiration"?}
 * @what: names the process in messages
 *
 * Return: 0 with the keys (and the expiry) in @out; -EINVAL naming @what
 * and what is wrong. A fuzz target's entry too (fuzz/fuzz-awscreds.c).
 */
int awscreds_process_json(struct awscreds *out, const char *text, const char *what, char *err, size_t errlen);
