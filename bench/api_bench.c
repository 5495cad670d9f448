// SPDX-License-Identifier: MIT
/*
 * The echo of the urdma API next to the same echo over kernel TCP sockets,
 * for bench/bench.sh.
 *
 *   api_bench serve  urdma|tcp|rs PORT
 *   api_bench lat    urdma|tcp|rs HOST:PORT SIZE N  one-way latency: half
 *                                                   the mean round trip, us
 *   api_bench rate   urdma|tcp|rs HOST:PORT SIZE N  echoes per second (in
 *                                                   millions), WINDOW in
 *                                                   flight
 *   api_bench stream urdma HOST:PORT 8 N            one-way messages per
 *                                                   second (millions)
 *
 * API_CONNS=C (lat, urdma; both sides): the client opens C connections
 * and takes the round trips over each in turn, as an event-driven server
 * with many clients sees them; each connection's queue is 4 deep then,
 * its buffers 4 KiB.
 *
 * tcp is kernel sockets, rs the same code on rsockets (<rdma/rsocket.h>).
 * Both sides block in the library's own waits (urdma_poll with a timeout;
 * read/write on blocking sockets with TCP_NODELAY).  The last line of a
 * client's output is "result: VALUE".
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>
#include <rdma/rsocket.h>
#include <urdma.h>

#define MAX_SIZE (64 * 1024)
#define WINDOW 32
#define STREAM_MARK 1 /* a stream's messages start with it: not echoed
			* (an echo's are zeros) */

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int die(const char *what)
{
	perror(what);
	exit(1);
}

static urdma_cfg cfg = { .buf_size = MAX_SIZE, .buf_count = 1024 };
static int nconns = 1;

static void cfg_conns(void)
{
	const char *e = getenv("API_CONNS");

	nconns = e && atoi(e) > 1 ? atoi(e) : 1;
	if (nconns > 1)
		cfg = (urdma_cfg){ .queue_depth = 4, .buf_size = 4096,
				   .buf_count = 8 * (uint32_t)nconns + 1024 };
}

/* ---- urdma ---- */

static void urdma_serve(const char *port)
{
	urdma_ctx *ctx = urdma_ctx_create(&cfg);
	urdma_conn *lis = ctx ? urdma_listen(ctx, port, NULL, 0, NULL) : NULL;

	if (!lis)
		die("urdma_listen");
	for (;;) {
		urdma_event ev[32];
		int n = urdma_poll(ctx, ev, 32, -1);

		for (int i = 0; i < n; i++) {
			urdma_event *e = &ev[i];

			if (e->type != URDMA_EV_RECV)
				continue;
			/* a stream's messages are only counted; its end
			 * (empty) is answered */
			if (e->len && *(char *)e->buf == STREAM_MARK) {
				urdma_buf_free(ctx, e->buf);
				continue;
			}
			if (urdma_send(e->conn, e->buf, e->len, NULL))
				urdma_buf_free(ctx, e->buf);
		}
	}
}

static double urdma_run(const char *addr, size_t size, long n, int window)
{
	urdma_ctx *ctx = urdma_ctx_create(&cfg);
	urdma_conn **c = calloc((size_t)nconns, sizeof(*c));
	char *msg = calloc(1, size);
	long sent = 0, got = 0, warm = n / 10;
	double t0 = 0;
	urdma_event ev[32];

	for (int i = 0; ctx && c && i < nconns; i++) {
		c[i] = urdma_connect(ctx, addr, NULL, 0, NULL);
		if (!c[i] || urdma_wait(ctx, c[i], URDMA_EV_CONNECTED, ev, 20000) ||
		    ev[0].type != URDMA_EV_CONNECTED)
			die("urdma_connect");
	}
	if (!ctx || !c)
		die("urdma_ctx_create");
	while (got < n + warm) {
		while (sent - got < window && sent < n + warm) {
			if (urdma_send(c[sent % nconns], msg, size, NULL))
				die("urdma_send");
			sent++;
		}
		int k = urdma_poll(ctx, ev, 32, 5000);

		if (k <= 0)
			die("urdma_poll");
		for (int i = 0; i < k; i++) {
			if (ev[i].type == URDMA_EV_CLOSED)
				die("closed");
			if (ev[i].type != URDMA_EV_RECV)
				continue;
			urdma_buf_free(ctx, ev[i].buf);
			if (++got == warm)
				t0 = now_s();
		}
	}
	t0 = now_s() - t0;
	for (int i = 0; i < nconns; i++) {
		urdma_close(c[i]);
		urdma_wait(ctx, c[i], URDMA_EV_CLOSED, ev, 2000);
	}
	urdma_ctx_destroy(ctx);
	return t0;
}

/* One-way: N messages as fast as credits allow (the server takes each
 * and gives its buffer back), then an empty one that it echoes; the time
 * from the warm-up's end to that echo. */
static double urdma_stream(const char *addr, size_t size, long n)
{
	urdma_ctx *ctx = urdma_ctx_create(&cfg);
	urdma_conn *c = ctx ? urdma_connect(ctx, addr, NULL, 0, NULL) : NULL;
	char *msg = calloc(1, size);
	long warm = n / 10, sent = 0;
	double t0 = 0;
	urdma_event ev[32];
	bool done = false;

	if (!c || urdma_wait(ctx, c, URDMA_EV_CONNECTED, ev, 5000) ||
	    ev[0].type != URDMA_EV_CONNECTED)
		die("urdma_connect");
	msg[0] = STREAM_MARK;
	while (!done) {
		int r = 0, k;

		while (sent <= n + warm && !r) {
			r = urdma_send(c, msg, sent < n + warm ? size : 0, NULL);
			sent += !r;
			if (sent == warm)
				t0 = now_s();
		}
		if (r && r != -EAGAIN)
			die("urdma_send");
		k = urdma_poll(ctx, ev, 32, 5000);
		if (k <= 0)
			die("urdma_poll");
		for (int i = 0; i < k; i++) {
			if (ev[i].type == URDMA_EV_CLOSED)
				die("closed");
			if (ev[i].type == URDMA_EV_RECV) {
				urdma_buf_free(ctx, ev[i].buf);
				done = true;
			}
		}
	}
	t0 = now_s() - t0;
	urdma_ctx_destroy(ctx);
	return t0;
}

/* ---- kernel TCP, and rsockets: the same calls with an r in front ---- */

struct sock_ops {
	int (*socket)(int, int, int);
	int (*bind)(int, const struct sockaddr *, socklen_t);
	int (*listen)(int, int);
	int (*accept)(int, struct sockaddr *, socklen_t *);
	int (*connect)(int, const struct sockaddr *, socklen_t);
	int (*setsockopt)(int, int, int, const void *, socklen_t);
	ssize_t (*read)(int, void *, size_t);
	ssize_t (*write)(int, const void *, size_t);
	int (*close)(int);
};

static const struct sock_ops kernel_ops = {
	socket, bind, listen, accept, connect, setsockopt, read, write, close,
};

static const struct sock_ops rs_ops = {
	rsocket, rbind, rlisten, raccept, rconnect, rsetsockopt, rread, rwrite,
	rclose,
};

static void sock_serve(const struct sock_ops *o, const char *port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_port = htons((uint16_t)atoi(port)) };
	int one = 1, l = o->socket(AF_INET, SOCK_STREAM, 0), fd;
	static char buf[MAX_SIZE * WINDOW];

	o->setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (o->bind(l, (struct sockaddr *)&sa, sizeof(sa)) || o->listen(l, 8))
		die("listen");
	for (;;) {
		ssize_t r;

		fd = o->accept(l, NULL, NULL);
		if (fd < 0)
			die("accept");
		o->setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		while ((r = o->read(fd, buf, sizeof(buf))) > 0)
			for (ssize_t off = 0, w; off < r; off += w)
				if ((w = o->write(fd, buf + off,
						  (size_t)(r - off))) <= 0)
					break;
		o->close(fd);
	}
}

static double sock_run(const struct sock_ops *o, const char *addr,
		       size_t size, long n, int window)
{
	char host[256];
	const char *colon = strrchr(addr, ':');
	struct addrinfo *ai, hints = { .ai_socktype = SOCK_STREAM };
	int one = 1, fd;
	char *buf = calloc(window, size);
	long sent = 0, got = 0, warm = n / 10;
	size_t part = 0;
	double t0 = 0;

	snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
	if (getaddrinfo(host, colon + 1, &hints, &ai))
		die("getaddrinfo");
	fd = o->socket(ai->ai_family, SOCK_STREAM, 0);
	if (o->connect(fd, ai->ai_addr, ai->ai_addrlen))
		die("connect");
	o->setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	while (got < n + warm) {
		while (sent - got < window && sent < n + warm) {
			for (size_t off = 0; off < size;) {
				ssize_t w = o->write(fd, buf + off, size - off);

				if (w <= 0)
					die("write");
				off += (size_t)w;
			}
			sent++;
		}
		ssize_t r = o->read(fd, buf, size * (size_t)(sent - got) - part);

		if (r <= 0)
			die("read");
		part += (size_t)r;
		for (; part >= size; part -= size)
			if (++got == warm)
				t0 = now_s();
	}
	t0 = now_s() - t0;
	o->close(fd);
	return t0;
}

int main(int argc, char **argv)
{
	const char *kind = argc > 2 ? argv[2] : "";
	const struct sock_ops *o = !strcmp(kind, "tcp") ? &kernel_ops :
				   !strcmp(kind, "rs")	? &rs_ops :
							  NULL;

	if (!o && strcmp(kind, "urdma"))
		goto usage;
	cfg_conns();
	if (argc == 4 && !strcmp(argv[1], "serve")) {
		o ? sock_serve(o, argv[3]) : urdma_serve(argv[3]);
		return 0;
	}
	if (argc == 6 && (!strcmp(argv[1], "lat") || !strcmp(argv[1], "rate") ||
			  (!strcmp(argv[1], "stream") && !o))) {
		bool lat = !strcmp(argv[1], "lat");
		size_t size = (size_t)atol(argv[4]);
		long n = atol(argv[5]);
		double t;

		if (size < 1 || size > (nconns > 1 ? 4096 : MAX_SIZE) || n < 10 ||
		    (nconns > 1 && (o || !lat)))
			return 2;
		if (!strcmp(argv[1], "stream"))
			t = urdma_stream(argv[3], size, n);
		else
			t = o ? sock_run(o, argv[3], size, n, lat ? 1 : WINDOW) :
				urdma_run(argv[3], size, n, lat ? 1 : WINDOW);
		printf("%s %s %zu B x %ld: %.3f s\n", argv[1], kind, size, n, t);
		printf("result: %.3f\n", lat ? t / (double)n / 2 * 1e6 :
					       (double)n / t / 1e6);
		return 0;
	}
usage:
	fprintf(stderr, "usage: %s serve urdma|tcp|rs PORT\n"
			"       %s lat|rate urdma|tcp|rs HOST:PORT SIZE N\n"
			"       %s stream urdma HOST:PORT SIZE N\n",
		argv[0], argv[0], argv[0]);
	return 2;
}
