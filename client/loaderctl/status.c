/* SPDX-License-Identifier: MIT */
/* status - the commands status, pipelines and clients */

#include "loaderctl.h"

/* Connect, run @call, parse its JSON reply; 0 or the exit status. */
int json_request(struct ctl *ctl, const char *verb, json_t **out,
               int (*call)(struct ldr_client *, void *, char **), void *arg)
{
	struct ldr_client *client = NULL;
	char *text = NULL;
	int r;

	if ((r = connect_daemon(ctl, verb, &client)))
		return r;
	r = call(client, arg, &text);
	if (r < 0) {
		r = fail(client, verb, r);
		ldr_close(client);
		return r;
	}
	ldr_close(client);
	*out = parse_reply(verb, text);
	return *out ? 0 : EXIT_FAILURE;
}

static int call_status(struct ldr_client *client, void *arg, char **text)
{
	(void)arg;
	return ldr_status_json(client, text);
}

static int get_status(struct ctl *ctl, const char *verb, json_t **out)
{
	return json_request(ctl, verb, out, call_status, NULL);
}

int cmd_status(struct ctl *ctl, int argc, char **argv)
{
	json_t *st = NULL;
	int r;

	r = get_status(ctl, "status", &st);
	if (r)
		return r;
	if (ctl->json)
		return print_json(st);

	{
		const json_t *pipelines = json_object_get(st, "pipelines");
		const json_t *clients = json_object_get(st, "clients");
		struct lines l = { 0 };
		char line[512], socket[CELL_MAX];

		fmt_daemon_line(line, sizeof(line), st);
		fmt_key(socket, sizeof(socket), st, "socket");
		printf("%s  socket %s\n", line, socket);
		print_cuda_lines(st);
		printf("\n");
		if (figures_pipelines(&l, pipelines, clients, SORT_ID) < 0)
			l.oom = true;
		r = lines_print(&l);
		if (!r) {
			print_pipeline_notes(pipelines);
			if (json_array_size(pipelines))
				printf("\n");
			r = print_pipelines(pipelines, true);
		}
		if (!r) {
			printf("\n");
			r = print_clients(clients);
		}
	}
	json_decref(st);
	return r;
}

int cmd_pipelines(struct ctl *ctl, int argc, char **argv)
{
	struct ldr_client *client = NULL;
	char *text = NULL;
	json_t *v;
	int r;

	r = connect_daemon(ctl, "pipelines", &client);
	if (r)
		return r;
	r = ldr_pipelines_json(client, &text);
	if (r < 0) {
		r = fail(client, "pipelines", r);
		ldr_close(client);
		return r;
	}
	ldr_close(client);
	v = parse_reply("pipelines", text);
	if (!v)
		return EXIT_FAILURE;
	if (!json_is_array(json_object_get(v, "pipelines")))
		json_object_set_new(v, "pipelines", json_array());
	if (ctl->json)
		return print_json(v);
	r = print_pipelines(json_object_get(v, "pipelines"), false);
	json_decref(v);
	return r;
}

int cmd_clients(struct ctl *ctl, int argc, char **argv)
{
	json_t *st = NULL, *clients;
	int r;

	r = get_status(ctl, "clients", &st);
	if (r)
		return r;
	clients = json_object_get(st, "clients");
	if (ctl->json) {
		json_t *o = json_pack("{so}", "clients",
		                      json_is_array(clients) ? json_incref(clients) : json_array());

		json_decref(st);
		return print_json(o);
	}
	r = print_clients(clients);
	json_decref(st);
	return r;
}
