// SPDX-License-Identifier: MIT
/*
 * urdma_echo_server_uv [HOST:]PORT: the echo server on a libuv loop.  The
 * context's fd is one more handle in the loop (uv_poll_t), beside whatever
 * else the program watches (here signals).  When it is readable,
 * urdma_poll makes progress and hands back the events.
 */
#include <stdio.h>
#include <urdma.h>
#include <uv.h>

static urdma_ctx *ctx;
static urdma_conn *lis;
static uv_poll_t poller;
static uv_signal_t sigs[2];

static void on_urdma(uv_poll_t *h, int status, int events)
{
	urdma_event ev[32];
	int n;

	(void)status, (void)events;
	while ((n = urdma_poll(ctx, ev, 32, 0)) > 0) {
		for (int i = 0; i < n; i++) {
			if (ev[i].type == URDMA_EV_RECV &&
			    urdma_send(ev[i].conn, ev[i].buf, ev[i].len, NULL)) {
				urdma_buf_free(ctx, ev[i].buf);
				urdma_close(ev[i].conn);
			} else if (ev[i].type == URDMA_EV_CLOSED &&
				   ev[i].conn == lis) {
				uv_stop(h->loop);
				return;
			}
		}
	}
}

/* The handles stay open to the end: closing a signal handle gives the
 * signal back its default action, and a second SIGTERM (as timeout(1)
 * sends one to the process and one to its group) would then kill us. */
static void on_signal(uv_signal_t *h, int sig)
{
	(void)sig;
	uv_stop(h->loop);
}

int main(int argc, char **argv)
{
	uv_loop_t *loop = uv_default_loop();

	if (argc != 2) {
		fprintf(stderr, "usage: %s [HOST:]PORT\n", argv[0]);
		return 2;
	}
	ctx = urdma_ctx_create(NULL);
	lis = ctx ? urdma_listen(ctx, argv[1], NULL, 0, NULL) : NULL;
	if (!lis) {
		perror("urdma_echo_server_uv");
		return 1;
	}
	uv_poll_init(loop, &poller, urdma_ctx_fd(ctx));
	uv_poll_start(&poller, UV_READABLE, on_urdma);
	uv_signal_init(loop, &sigs[0]);
	uv_signal_start(&sigs[0], on_signal, SIGINT);
	uv_signal_init(loop, &sigs[1]);
	uv_signal_start(&sigs[1], on_signal, SIGTERM);
	printf("listening on port %d (libuv)\n", urdma_conn_port(lis));
	fflush(stdout);
	uv_run(loop, UV_RUN_DEFAULT);
	urdma_ctx_destroy(ctx);
	return 0;
}
