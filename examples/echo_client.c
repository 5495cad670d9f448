// SPDX-License-Identifier: MIT
/*
 * urdma_echo_client HOST:PORT [MESSAGE]: connect, send a message, wait for
 * its echo and print it.  The blocking style: urdma_wait.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <urdma.h>

int main(int argc, char **argv)
{
	const char *msg = argc > 2 ? argv[2] : "hello, urdma";
	urdma_ctx *ctx = argc > 1 ? urdma_ctx_create(NULL) : NULL;
	urdma_conn *c = ctx ? urdma_connect(ctx, argv[1], NULL, 0, NULL) : NULL;
	urdma_event ev;
	int ret;

	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: %s HOST:PORT [MESSAGE]\n", argv[0]);
		return 2;
	}
	if (!c) {
		perror("urdma_echo_client");
		return 1;
	}
	ret = urdma_send(c, msg, strlen(msg), NULL); /* goes once connected */
	if (!ret)
		ret = urdma_wait(ctx, c, URDMA_EV_RECV, &ev, 5000);
	if (!ret && ev.type != URDMA_EV_RECV)
		ret = ev.status ? ev.status : -ECONNRESET;
	if (ret) {
		fprintf(stderr, "urdma_echo_client: %s\n", urdma_strerror(ret));
		urdma_ctx_destroy(ctx);
		return 1;
	}
	printf("%.*s\n", (int)ev.len, (char *)ev.buf);
	urdma_buf_free(ctx, ev.buf);
	urdma_close(c);
	urdma_wait(ctx, c, URDMA_EV_CLOSED, &ev, 2000);
	urdma_ctx_destroy(ctx);
	return 0;
}
