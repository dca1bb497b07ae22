/* SPDX-License-Identifier: MIT */
/* test-awscreds - the trainer's object-store credentials
 * (client/libloader/awscreds.c): the environment, profiles, the files */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "awscreds.h"

static char home[64];

static void write_file(const char *rel, const char *text)
{
	char path[256];
	FILE *f;

	snprintf(path, sizeof path, "%s/%s", home, rel);
	f = fopen(path, "w");
	assert(f);
	fputs(text, f);
	fclose(f);
}

static int load(struct awscreds *c, const char **env, char *err)
{
	err[0] = '\0';
	return awscreds_load(c, env, home, err, 256);
}

static void test_env_wins(void)
{
	struct awscreds c;
	char err[256];
	const char *env[] = { "AWS_ACCESS_KEY_ID=EK", "AWS_SECRET_ACCESS_KEY=ES", "AWS_SESSION_TOKEN=ET",
			      "AWS_DEFAULT_REGION=r-env", NULL };

	assert(load(&c, env, err) == 0);
	assert(!strcmp(c.access_key, "EK") && !strcmp(c.secret_key, "ES") && !strcmp(c.session_token, "ET"));
	/* the region from the environment, the endpoint from the default profile */
	assert(!strcmp(c.region, "r-env") && !strcmp(c.endpoint, "http://127.0.0.1:9000"));
	assert(!strcmp(c.source, "environment"));

	const char *half[] = { "AWS_ACCESS_KEY_ID=EK", NULL };
	assert(awscreds_load(&c, half, home, err, sizeof err) == -EINVAL);
	assert(!strcmp(err, "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not"));
}

static void test_profiles(void)
{
	struct awscreds c;
	char err[256], cred[128];
	const char *none[] = { NULL };
	const char *dev[] = { "AWS_PROFILE=dev", NULL };
	const char *cfgonly[] = { "AWS_PROFILE=cfgonly", NULL };
	const char *missing[] = { "AWS_PROFILE=nope", NULL };

	snprintf(cred, sizeof cred, "%s/.aws/credentials", home);
	assert(load(&c, none, err) == 0);
	assert(!strcmp(c.access_key, "DK") && !strcmp(c.secret_key, "D S=x") && c.session_token[0] == '\0');
	assert(!strcmp(c.region, "eu-central-1") && !strcmp(c.endpoint, "http://127.0.0.1:9000"));
	assert(!strcmp(c.source + strlen(c.source) - strlen(cred), cred));
	assert(!strncmp(c.source, "[default] in ", 13));

	assert(load(&c, dev, err) == 0);
	assert(!strcmp(c.access_key, "VK") && !strcmp(c.session_token, "VT"));
	/* the s3 sub-section's endpoint_url wins over the profile's */
	assert(!strcmp(c.region, "us-west-2") && !strcmp(c.endpoint, "https://s3.dev.example"));

	assert(load(&c, cfgonly, err) == 0);
	assert(!strcmp(c.access_key, "CK") && !strcmp(c.secret_key, "CS") && c.region[0] == '\0');

	assert(load(&c, missing, err) == -EINVAL);
	char want[512];
	snprintf(want, sizeof want, "AWS_PROFILE: profile 'nope' is in neither %s/.aws/credentials nor %s/.aws/config",
		 home, home);
	assert(!strcmp(err, want));
}

static void test_bad_files(void)
{
	struct awscreds c;
	char err[256];
	int found;

	memset(&c, 0, sizeof c);
	assert(awscreds_parse(&c, "[a]\nkey value\n", "F", "a", &found, err, sizeof err) == -EINVAL);
	assert(!strcmp(err, "F:2: not [section], key = value or a comment"));
	assert(awscreds_parse(&c, "# c\n\n[a\n", "F", "a", &found, err, sizeof err) == -EINVAL);
	assert(!strcmp(err, "F:3: a section without its ']'"));
	assert(awscreds_parse(&c, "[a]\n= v\n", "F", "a", &found, err, sizeof err) == -EINVAL);
	assert(!strcmp(err, "F:2: a value without a key"));
	assert(awscreds_parse(&c, "[a]\naws_access_key_id = K\n", "F", "a", &found, err, sizeof err) == -EINVAL);
	assert(!strcmp(err, "F: [a] has aws_access_key_id but no aws_secret_access_key"));
	/* a bad line in another section is still an error; a half pair there is not */
	assert(awscreds_parse(&c, "[b]\naws_secret_access_key = S\n[a]\nregion = r\n", "F", "a", &found, err,
			      sizeof err) == 0);
	assert(found && !strcmp(c.region, "r") && c.access_key[0] == '\0');
	assert(awscreds_parse(&c, "[x]\n", "F", "a", &found, err, sizeof err) == 0 && !found);

	char big[300];
	memset(big, 'r', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	char text[400];
	snprintf(text, sizeof text, "[a]\nregion = %s\n", big);
	memset(&c, 0, sizeof c);
	assert(awscreds_parse(&c, text, "F", "a", &found, err, sizeof err) == -EINVAL);
	assert(!strcmp(err, "F: [a]: longer than 63 bytes"));
}

/* AWS_CREDENTIAL_EXPIRATION: botocore's expiry of the environment's keys */
static void test_expiration(void)
{
	struct awscreds c;
	char err[256];
	int64_t t;
	const char *env[] = { "AWS_ACCESS_KEY_ID=EK", "AWS_SECRET_ACCESS_KEY=ES",
			      "AWS_CREDENTIAL_EXPIRATION=2026-12-06T13:00:00Z", NULL };
	const char *bad[] = { "AWS_ACCESS_KEY_ID=EK", "AWS_SECRET_ACCESS_KEY=ES",
			      "AWS_CREDENTIAL_EXPIRATION=tomorrow", NULL };
	const char *profile[] = { "AWS_PROFILE=dev", "AWS_CREDENTIAL_EXPIRATION=2026-12-06T13:00:00Z", NULL };

	assert(load(&c, env, err) == 0 && c.expires == 1796562000);
	assert(awscreds_time("1970-01-01T00:00:00Z", &t) == 0 && t == 0);
	assert(awscreds_time("2000-03-01T00:00:00.123456+00:00", &t) == 0 && t == 951868800);
	assert(awscreds_time("2026-12-06T15:30:00+02:30", &t) == 0 && t == 1796562000);
	assert(awscreds_time("2026-12-06T10:00:00-03:00", &t) == 0 && t == 1796562000);
	assert(awscreds_time("2024-02-29T12:00:00Z", &t) == 0 && t == 1709208000);
	assert(awscreds_time("2026-12-06 13:00:00Z", &t) == -EINVAL);
	assert(awscreds_time("2026-12-06T13:00:00", &t) == -EINVAL);
	assert(awscreds_time("2026-13-06T13:00:00Z", &t) == -EINVAL);
	assert(awscreds_time("2026-12-06T13:00:00Zx", &t) == -EINVAL);
	assert(load(&c, bad, err) == -EINVAL);
	assert(!strcmp(err, "AWS_CREDENTIAL_EXPIRATION: 'tomorrow' is not an ISO 8601 time (2026-12-06T13:00:00Z)"));
	/* the variable goes with the environment's keys only */
	assert(load(&c, profile, err) == 0 && !strcmp(c.access_key, "VK") && c.expires == 0);
}

/* credential_process: a command of the profile that prints the keys */
static void test_process(void)
{
	struct awscreds c;
	char err[256], cfg[256];
	const char *env[] = { cfg, "AWS_PROFILE=proc", NULL };
	const char *fail[] = { cfg, "AWS_PROFILE=fails", NULL };
	const char *junk[] = { cfg, "AWS_PROFILE=junk", NULL };
	const char *keys[] = { cfg, "AWS_PROFILE=keys", NULL };

	snprintf(cfg, sizeof cfg, "AWS_CONFIG_FILE=%s/proc-config", home);
	write_file("proc-config",
		   "[profile proc]\n"
		   "credential_process = printf '{\"Version\": 1, \"AccessKeyId\": \"PA\", "
		   "\"SecretAccessKey\": \"P\\\\u0053\", \"SessionToken\": \"PT\", "
		   "\"Expiration\": \"2026-12-06T13:00:00Z\"}'\n"
		   "region = r-proc\n"
		   "[profile fails]\n"
		   "credential_process = exit 3\n"
		   "[profile junk]\n"
		   "credential_process = echo nope\n"
		   "[profile keys]\n"
		   "aws_access_key_id = SK\n"
		   "aws_secret_access_key = SS\n"
		   "credential_process = exit 3\n");
	assert(load(&c, env, err) == 0);
	assert(!strcmp(c.access_key, "PA") && !strcmp(c.secret_key, "PS") && !strcmp(c.session_token, "PT"));
	assert(c.expires == 1796562000 && !strcmp(c.region, "r-proc"));
	assert(load(&c, fail, err) == -EIO);
	assert(strstr(err, "credential_process of [profile fails] in "));
	assert(strstr(err, "(exit 3): exited with status 3"));
	assert(load(&c, junk, err) == -EINVAL && strstr(err, "(echo nope): its output is not a JSON object"));
	/* static keys win over the command, which is not run */
	assert(load(&c, keys, err) == 0 && !strcmp(c.access_key, "SK"));

	memset(&c, 0, sizeof c);
	assert(awscreds_process_json(&c, "{\"Version\":1,\"AccessKeyId\":\"A\"}", "P", err, sizeof err) == -EINVAL);
	assert(!strcmp(err, "P: no \"SecretAccessKey\""));
	memset(&c, 0, sizeof c);
	assert(awscreds_process_json(&c, "{\"Version\":1,\"AccessKeyId\":\"\",\"SecretAccessKey\":\"S\"}", "P", err,
				     sizeof err) == -EINVAL && !strcmp(err, "P: no \"AccessKeyId\""));
	memset(&c, 0, sizeof c);
	assert(awscreds_process_json(&c, "{\"Version\":2}", "P", err, sizeof err) == -EINVAL);
	assert(!strcmp(err, "P: \"Version\": not 1 (the only version there is)"));
	memset(&c, 0, sizeof c);
	assert(awscreds_process_json(&c, "{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"S\"}", "P", err,
				     sizeof err) == -EINVAL && !strcmp(err, "P: no \"Version\": 1"));
	memset(&c, 0, sizeof c);
	assert(awscreds_process_json(&c, "{\"Version\":1,\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"S\","
				     "\"Expiration\":\"soon\"}", "P", err, sizeof err) == -EINVAL);
	assert(!strcmp(err, "P: \"Expiration\": 'soon' is not an ISO 8601 time"));
	memset(&c, 0, sizeof c);
	assert(awscreds_process_json(&c, " {\"Version\" : 1 , \"AccessKeyId\":\"A\",\"SecretAccessKey\":\"S\"} x",
				     "P", err, sizeof err) == -EINVAL && !strcmp(err, "P: more after its JSON object"));
	memset(&c, 0, sizeof c);
	assert(awscreds_process_json(&c, "{\"Version\":1,\"AccessKeyId\":\"A\\u00e9\",\"SecretAccessKey\":\"S\"}\n",
				     "P", err, sizeof err) == 0);
	assert(!strcmp(c.access_key, "A\xc3\xa9") && c.expires == 0);
}

/* What the services answer (awsroles.c): a metadata JSON, an STS XML;
 * a profile's role and the ways to keys not read. */
static void test_services(void)
{
	struct awscreds c;
	char err[512], cfg[256], want[512];
	const char *sso[] = { cfg, "AWS_PROFILE=sso", "AWS_EC2_METADATA_DISABLED=true", NULL };
	const char *src[] = { cfg, "AWS_PROFILE=src", "AWS_EC2_METADATA_DISABLED=true", NULL };
	const char *chain[] = { cfg, "AWS_PROFILE=chain", "AWS_EC2_METADATA_DISABLED=true", NULL };
	const char *bad[] = { cfg, "AWS_PROFILE=bad", "AWS_EC2_METADATA_DISABLED=true", NULL };
	const char *mfa[] = { cfg, "AWS_PROFILE=mfa", "AWS_EC2_METADATA_DISABLED=true", NULL };
	const char *half[] = { cfg, "AWS_PROFILE=half", "AWS_EC2_METADATA_DISABLED=true", NULL };
	const char *off[] = { "AWS_PROFILE=none", "AWS_CONFIG_FILE=/nonexistent", "AWS_EC2_METADATA_DISABLED=TRUE",
			      "AWS_SHARED_CREDENTIALS_FILE=/nonexistent", NULL };

	memset(&c, 0, sizeof c);
	assert(awscreds_meta_json(&c, "{\"Code\": \"Success\", \"Type\": \"AWS-HMAC\", \"AccessKeyId\": \"MA\", "
				  "\"SecretAccessKey\": \"MS\", \"Token\": \"MT\", \"Expiration\": "
				  "\"2026-12-06T13:00:00Z\"}", "M", err, sizeof err) == 0);
	assert(!strcmp(c.access_key, "MA") && !strcmp(c.secret_key, "MS") && !strcmp(c.session_token, "MT"));
	assert(c.expires == 1796562000);
	memset(&c, 0, sizeof c);
	assert(awscreds_meta_json(&c, "{\"Code\": \"AssumeRoleUnauthorizedAccess\", \"AccessKeyId\": \"\"}", "M", err,
				  sizeof err) == -EACCES && !strcmp(err, "M: \"Code\": \"AssumeRoleUnauthorizedAccess\""));
	memset(&c, 0, sizeof c);
	assert(awscreds_meta_json(&c, "{\"AccessKeyId\": \"A\", \"SecretAccessKey\": \"S\", \"Version\": 1}", "M", err,
				  sizeof err) == -EINVAL && !strcmp(err, "M: \"Version\": not a string"));

	memset(&c, 0, sizeof c);
	assert(awscreds_sts_xml(&c, "<R><Result><Credentials><SessionToken>T&amp;1</SessionToken>"
				"<SecretAccessKey>X&lt;S</SecretAccessKey><Expiration>2026-12-06T13:00:00.5Z"
				"</Expiration><AccessKeyId>ASIA1</AccessKeyId></Credentials></Result></R>", "S", err,
				sizeof err) == 0);
	assert(!strcmp(c.access_key, "ASIA1") && !strcmp(c.secret_key, "X<S") && !strcmp(c.session_token, "T&1"));
	assert(c.expires == 1796562000);
	memset(&c, 0, sizeof c);
	assert(awscreds_sts_xml(&c, "<ErrorResponse/>", "S", err, sizeof err) == -EINVAL);
	assert(!strcmp(err, "S: no <Credentials> in its answer"));
	memset(&c, 0, sizeof c);
	assert(awscreds_sts_xml(&c, "<Credentials><AccessKeyId>A</AccessKeyId><SecretAccessKey>S&bogus;"
				"</SecretAccessKey></Credentials>", "S", err, sizeof err) == -EINVAL);
	assert(!strcmp(err, "S: a bad or too long <SecretAccessKey> in its answer") && !c.access_key[0]);
	memset(&c, 0, sizeof c);
	assert(awscreds_sts_xml(&c, "<Credentials><AccessKeyId>A</AccessKeyId><SecretAccessKey>S</SecretAccessKey>"
				"<Expiration>later</Expiration></Credentials>", "S", err, sizeof err) == -EINVAL);
	assert(!strcmp(err, "S: <Expiration> is not an ISO 8601 time") && !c.access_key[0]);

	snprintf(cfg, sizeof cfg, "AWS_CONFIG_FILE=%s/svc-config", home);
	write_file("svc-config",
		   "[profile sso]\nsso_start_url = https://corp.awsapps.com/start\nregion = r\n"
		   "[profile src]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = nope\n"
		   "[profile chain]\nrole_arn = arn:aws:iam::1:role/c\nsource_profile = src\n"
		   "[profile bad]\nrole_arn = arn:aws:iam::1:role/r\ncredential_source = Laptop\n"
		   "[profile mfa]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = default\n"
		   "mfa_serial = arn:aws:iam::1:mfa/u\n"
		   "[profile half]\nrole_arn = arn:aws:iam::1:role/r\n");
	assert(awscreds_load(&c, sso, home, err, sizeof err) == -ENOTSUP);
	snprintf(want, sizeof want, "%s/svc-config: [profile sso] has sso_start_url, which libloader does not read "
		 "(SSO, a role behind an MFA code): give the profile `credential_process = aws configure "
		 "export-credentials --profile sso --format process` (AWS CLI v2), or export its keys", home);
	assert(!strcmp(err, want));
	assert(awscreds_load(&c, mfa, home, err, sizeof err) == -ENOTSUP && strstr(err, "[profile mfa] has mfa_serial, which"));
	/* assume-role: the source's errors, before any request */
	assert(awscreds_load(&c, src, home, err, sizeof err) == -EINVAL);
	snprintf(want, sizeof want, "%s/svc-config: [profile src]: source_profile 'nope' is in neither "
		 "%s/.aws/credentials nor %s/svc-config", home, home, home);
	assert(!strcmp(err, want));
	assert(awscreds_load(&c, chain, home, err, sizeof err) == -EINVAL);
	snprintf(want, sizeof want, "%s/svc-config: [profile chain]: source_profile 'src' has no keys (it is a role: "
		 "libloader assumes one role, not a chain)", home);
	assert(!strcmp(err, want));
	assert(awscreds_load(&c, bad, home, err, sizeof err) == -EINVAL);
	snprintf(want, sizeof want, "%s/svc-config: [profile bad]: credential_source 'Laptop' is none of Environment, "
		 "Ec2InstanceMetadata, EcsContainer", home);
	assert(!strcmp(err, want));
	assert(awscreds_load(&c, half, home, err, sizeof err) == -EINVAL);
	snprintf(want, sizeof want, "%s/svc-config: [profile half]: role_arn without web_identity_token_file, "
		 "source_profile or credential_source", home);
	assert(!strcmp(err, want));
	/* nothing anywhere, the instance's service off: no keys, no error */
	assert(awscreds_load(&c, off, NULL, err, sizeof err) == -EINVAL);
	assert(awscreds_load(&c, off + 2, NULL, err, sizeof err) == 0 && !c.access_key[0] && !c.source[0]);
}

int main(void)
{
	char dir[128];

	snprintf(home, sizeof home, "/tmp/ldr-awscreds-XXXXXX");
	assert(mkdtemp(home));
	snprintf(dir, sizeof dir, "%s/.aws", home);
	assert(mkdir(dir, 0700) == 0);
	write_file(".aws/credentials",
		   "# comment\n"
		   "[default]\n"
		   "aws_access_key_id = DK\n"
		   "aws_secret_access_key =  D S=x  \r\n"
		   "\n"
		   "; another comment\n"
		   "[dev]\n"
		   "aws_access_key_id=VK\n"
		   "aws_secret_access_key=VS\n"
		   "aws_session_token=VT\n");
	write_file(".aws/config",
		   "[default]\n"
		   "region = eu-central-1\n"
		   "endpoint_url = http://127.0.0.1:9000\n"
		   "[profile dev]\n"
		   "region = us-west-2\n"
		   "endpoint_url = https://general.dev.example\n"
		   "s3 =\n"
		   "  endpoint_url = https://s3.dev.example\n"
		   "  addressing_style = path\n"
		   "[profile cfgonly]\n"
		   "aws_access_key_id = CK\n"
		   "aws_secret_access_key = CS\n");
	test_env_wins();
	test_profiles();
	test_bad_files();
	test_expiration();
	test_process();
	test_services();
	{
		char cmd[200];

		snprintf(cmd, sizeof cmd, "rm -rf '%s'", home);
		assert(system(cmd) == 0);
	}
	printf("test-awscreds: ok\n");
	return 0;
}
