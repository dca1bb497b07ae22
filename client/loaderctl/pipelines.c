/* SPDX-License-Identifier: MIT */
/* pipelines - the commands create and drop */

#include "loaderctl.h"

#define SPEC_MAX (16u << 20) /* largest spec file we read */

/* Read all of @path ("-" = stdin) into a NUL-terminated buffer. */
static int read_spec(const char *path, char **out)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
	size_t len = 0, cap = 0;
	char *buf = NULL;
	int err = 0;

	if (!f)
		return -errno;
	for (;;) {
		size_t n;

		if (cap - len < 4096 + 1) {
			size_t ncap = cap ? cap * 2 : 8192;
			char *p;

			if (ncap > SPEC_MAX + 1) {
				err = -EFBIG;
				break;
			}
			p = realloc(buf, ncap);
			if (!p) {
				err = -ENOMEM;
				break;
			}
			buf = p;
			cap = ncap;
		}
		n = fread(buf + len, 1, cap - len - 1, f);
		len += n;
		if (n == 0) {
			if (ferror(f))
				err = -EIO;
			break;
		}
	}
	if (f != stdin)
		fclose(f);
	if (err) {
		free(buf);
		return err;
	}
	buf[len] = '\0';
	*out = buf;
	return 0;
}

int cmd_create(struct ctl *ctl, int argc, char **argv)
{
	struct ldr_client *client = NULL;
	char name[LDR_NAME_MAX + 1] = "";
	const char *shown = strcmp(ctl->spec, "-") ? ctl->spec : "<stdin>";
	json_error_t jerr;
	json_t *spec;
	char *text = NULL;
	int r;

	r = read_spec(ctl->spec, &text);
	if (r < 0) {
		warnx("create: cannot read %s: %s", shown, strerror(-r));
		return EXIT_FAILURE;
	}
	/* Catch a syntax error here, where we can still say where it is. */
	spec = json_loads(text, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
	if (!spec) {
		warnx("create: %s: line %d column %d: %s", shown, jerr.line, jerr.column, jerr.text);
		free(text);
		return EXIT_FAILURE;
	}
	/* An admin create has no job to scope the pipeline to: it persists
	 * unless --scoped, or the spec says how long it lives itself. */
	if (!ctl->scoped && json_is_object(spec) && !json_object_get(spec, "persist") &&
	    !json_object_get(spec, "ttl")) {
		char *with = NULL;
		if (json_object_set_new(spec, "persist", json_true()) == 0)
			with = json_dumps(spec, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
		if (!with) {
			warnx("create: out of memory");
			json_decref(spec);
			free(text);
			return EXIT_FAILURE;
		}
		free(text);
		text = with;
	}
	json_decref(spec);

	r = connect_daemon(ctl, "create", &client);
	if (r) {
		free(text);
		return r;
	}
	r = ctl->has_owner ? ldr_create_pipeline_of(client, text, ctl->owner, name, sizeof(name))
	                   : ldr_create_pipeline(client, text, ctl->exist_ok, name, sizeof(name));
	free(text);
	if (r < 0) {
		r = fail(client, "create", r);
		ldr_close(client);
		return r;
	}
	ldr_close(client);

	if (ctl->json)
		return print_json(json_pack("{sssb}", "name", name, "created", r == 1));
	if (r == 1)
		printf("created pipeline %s\n", name);
	else
		printf("pipeline %s exists\n", name);
	return 0;
}

/* loaderctl credentials NAME: this process's store keys to a running pipeline */
int cmd_credentials(struct ctl *ctl, int argc, char **argv)
{
	struct ldr_client *client = NULL;
	const char *name = argv[0];
	int r;

	(void)argc;
	r = connect_daemon(ctl, "credentials", &client);
	if (r)
		return r;
	r = ldr_set_store(client, name, NULL);
	if (r < 0) {
		r = fail(client, "credentials", r);
		ldr_close(client);
		return r;
	}
	ldr_close(client);
	if (ctl->json)
		return print_json(json_pack("{sssb}", "name", name, "handed", 1));
	printf("handed fresh credentials to pipeline %s\n", name);
	return 0;
}

int cmd_drop(struct ctl *ctl, int argc, char **argv)
{
	struct ldr_client *client = NULL;
	const char *name = argv[0];
	int r;

	r = connect_daemon(ctl, "drop", &client);
	if (r)
		return r;
	r = ldr_drop_pipeline(client, name, ctl->force);
	if (r < 0) {
		r = fail(client, "drop", r);
		ldr_close(client);
		return r;
	}
	ldr_close(client);
	if (ctl->json)
		return print_json(json_pack("{sssb}", "name", name, "dropped", 1));
	printf("dropped pipeline %s\n", name);
	return 0;
}
