// SPDX-License-Identifier: MIT
/*
 * One-sided operations on the urdma API: a shared counter and a board.
 *
 *   urdma_counter serve [HOST:]PORT   expose a counter and a 4 KiB board
 *   urdma_counter HOST:PORT [N]       add 1 to the counter N times (10),
 *                                     write a line on the board, read it back
 *
 * The server registers its memory and hands the descriptor to every client
 * in the listener's hello; after that it never touches the data path: the
 * clients' fetch-and-adds, writes and reads are served without it.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <urdma.h>

struct shared {
	uint64_t counter; /* 8-byte aligned: atomics need it */
	char board[4096];
};

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	stop = sig;
}

static int serve(urdma_ctx *ctx, const char *port)
{
	static struct shared mem;
	urdma_rmem desc;
	urdma_conn *lis = NULL;

	if (urdma_reg(ctx, &mem, sizeof(mem),
		      URDMA_REMOTE_READ | URDMA_REMOTE_WRITE |
			      URDMA_REMOTE_ATOMIC, &desc))
		lis = urdma_listen(ctx, port, &desc, sizeof(desc), NULL);
	if (!lis)
		return -errno;
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	printf("listening on port %d\n", urdma_conn_port(lis));
	fflush(stdout);
	while (!stop) {
		urdma_event ev;

		if (urdma_poll(ctx, &ev, 1, 200) == 1 &&
		    ev.type == URDMA_EV_CLOSED && ev.conn != lis) {
			printf("a client left: counter %llu, board \"%.64s\"\n",
			       (unsigned long long)mem.counter, mem.board);
			fflush(stdout);
		}
	}
	return 0;
}

/* Post an operation, then wait for its event (the user pointer is the
 * operation's number, so the event is ours). */
static int done(urdma_ctx *ctx, urdma_conn *c, int type, urdma_event *ev,
		int posted)
{
	int ret = posted ? posted : urdma_wait(ctx, c, type, ev, 5000);

	return ret ? ret : ev->type == type ? ev->status : -ECONNRESET;
}

static int client(urdma_ctx *ctx, const char *addr, int n)
{
	urdma_conn *c = urdma_connect(ctx, addr, NULL, 0, NULL);
	char *line = urdma_buf_alloc(ctx); /* registered: a pool buffer */
	uint64_t first = 0, last = 0;
	urdma_rmem rm;
	urdma_event ev;
	int ret;

	if (!c || !line)
		return -errno;
	ret = urdma_wait(ctx, c, URDMA_EV_CONNECTED, &ev, 5000);
	if (!ret && (ev.type != URDMA_EV_CONNECTED || ev.len != sizeof(rm)))
		ret = ev.status ? ev.status : -EPROTO;
	if (ret)
		return ret;
	memcpy(&rm, ev.buf, sizeof(rm)); /* the server's descriptor */
	for (int i = 0; i < n && !ret; i++) {
		ret = done(ctx, c, URDMA_EV_ATOMIC, &ev,
			   urdma_atomic(c, URDMA_FADD, &rm, 0, 1, 0, NULL));
		first = i ? first : ev.value;
		last = ev.value;
	}
	snprintf(line, urdma_buf_size(ctx), "process %d was here", (int)getpid());
	if (!ret)
		ret = done(ctx, c, URDMA_EV_WRITE, &ev,
			   urdma_write(c, line, strlen(line) + 1, &rm,
				       offsetof(struct shared, board), line));
	memset(line, 0, 64);
	if (!ret)
		ret = done(ctx, c, URDMA_EV_READ, &ev,
			   urdma_read(c, line, 64, &rm,
				      offsetof(struct shared, board), NULL));
	if (!ret) {
		printf("counter: %llu -> %llu after %d fetch-and-adds\n",
		       (unsigned long long)first, (unsigned long long)last + 1,
		       n);
		printf("board: \"%.63s\"\n", line);
	}
	urdma_buf_free(ctx, line);
	urdma_close(c);
	urdma_wait(ctx, c, URDMA_EV_CLOSED, &ev, 2000);
	return ret;
}

int main(int argc, char **argv)
{
	bool serving = argc == 3 && !strcmp(argv[1], "serve");
	urdma_ctx *ctx;
	int ret;

	if (argc < 2 || (!serving && argc > 3)) {
		fprintf(stderr, "usage: %s serve [HOST:]PORT\n"
				"       %s HOST:PORT [N]\n", argv[0], argv[0]);
		return 2;
	}
	ctx = urdma_ctx_create(NULL);
	if (!ctx) {
		perror("urdma_counter");
		return 1;
	}
	ret = serving ? serve(ctx, argv[2]) :
			client(ctx, argv[1], argc > 2 ? atoi(argv[2]) : 10);
	if (ret)
		fprintf(stderr, "urdma_counter: %s\n", urdma_strerror(ret));
	urdma_ctx_destroy(ctx);
	return ret ? 1 : 0;
}
