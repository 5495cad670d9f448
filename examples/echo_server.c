// SPDX-License-Identifier: MIT
/*
 * urdma_echo_server [HOST:]PORT: an asynchronous echo server on the urdma
 * API.  One thread serves every client: the context's fd sits in epoll
 * (beside anything else the program would watch), and each message goes
 * straight back in the buffer it arrived in (zero-copy).
 */
#include <signal.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <urdma.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	stop = sig;
}

int main(int argc, char **argv)
{
	urdma_ctx *ctx = urdma_ctx_create(NULL);
	urdma_conn *lis = NULL;
	int ep, clients = 0;

	if (argc != 2) {
		fprintf(stderr, "usage: %s [HOST:]PORT\n", argv[0]);
		return 2;
	}
	if (ctx)
		lis = urdma_listen(ctx, argv[1], NULL, 0, NULL);
	if (!lis) {
		perror("urdma_echo_server");
		return 1;
	}
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	ep = epoll_create1(0);
	epoll_ctl(ep, EPOLL_CTL_ADD, urdma_ctx_fd(ctx),
		  &(struct epoll_event){ .events = EPOLLIN });
	printf("listening on port %d\n", urdma_conn_port(lis));
	fflush(stdout);
	while (!stop) {
		struct epoll_event pe;
		urdma_event ev[32];
		int n;

		if (epoll_wait(ep, &pe, 1, -1) < 1)
			continue;
		n = urdma_poll(ctx, ev, 32, 0);
		for (int i = 0; i < n; i++) {
			switch (ev[i].type) {
			case URDMA_EV_ACCEPTED:
				clients++;
				break;
			case URDMA_EV_RECV: /* echo it, in the same buffer */
				if (urdma_send(ev[i].conn, ev[i].buf,
					       ev[i].len, NULL) < 0) {
					urdma_buf_free(ctx, ev[i].buf);
					urdma_close(ev[i].conn);
				}
				break;
			case URDMA_EV_CLOSED:
				if (ev[i].conn == lis)
					stop = 1;
				else
					clients--;
				break;
			}
		}
	}
	printf("%d clients connected at the end\n", clients);
	urdma_ctx_destroy(ctx);
	return 0;
}
