// SPDX-License-Identifier: MIT
/*
 * The echo of the urdma API next to the same echo over kernel TCP sockets,
 * for bench/bench.sh.
 *
 *   api_bench serve urdma|tcp PORT
 *   api_bench lat   urdma|tcp HOST:PORT SIZE N   one-way latency: half the
 *                                                mean round trip, in us
 *   api_bench rate  urdma|tcp HOST:PORT SIZE N   echoes per second (in
 *                                                millions), WINDOW in flight
 *
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
#include <urdma.h>

#define MAX_SIZE (64 * 1024)
#define WINDOW 32

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

static const urdma_cfg cfg = { .buf_size = MAX_SIZE, .buf_count = 1024 };

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

		for (int i = 0; i < n; i++)
			if (ev[i].type == URDMA_EV_RECV &&
			    urdma_send(ev[i].conn, ev[i].buf, ev[i].len, NULL))
				urdma_buf_free(ctx, ev[i].buf);
	}
}

static double urdma_run(const char *addr, size_t size, long n, int window)
{
	urdma_ctx *ctx = urdma_ctx_create(&cfg);
	urdma_conn *c = ctx ? urdma_connect(ctx, addr, NULL, 0, NULL) : NULL;
	char *msg = calloc(1, size);
	long sent = 0, got = 0, warm = n / 10;
	double t0 = 0;
	urdma_event ev[32];

	if (!c || urdma_wait(ctx, c, URDMA_EV_CONNECTED, ev, 5000) ||
	    ev[0].type != URDMA_EV_CONNECTED)
		die("urdma_connect");
	while (got < n + warm) {
		while (sent - got < window && sent < n + warm) {
			if (urdma_send(c, msg, size, NULL))
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
	urdma_close(c);
	urdma_wait(ctx, c, URDMA_EV_CLOSED, ev, 2000);
	urdma_ctx_destroy(ctx);
	return t0;
}

/* ---- kernel TCP ---- */

static void tcp_serve(const char *port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_port = htons((uint16_t)atoi(port)) };
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0), fd;
	static char buf[MAX_SIZE * WINDOW];

	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (struct sockaddr *)&sa, sizeof(sa)) || listen(l, 8))
		die("listen");
	for (;;) {
		ssize_t r;

		fd = accept(l, NULL, NULL);
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		while ((r = read(fd, buf, sizeof(buf))) > 0)
			for (ssize_t off = 0, w; off < r; off += w)
				if ((w = write(fd, buf + off, (size_t)(r - off))) <= 0)
					break;
		close(fd);
	}
}

static double tcp_run(const char *addr, size_t size, long n, int window)
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
	fd = socket(ai->ai_family, SOCK_STREAM, 0);
	if (connect(fd, ai->ai_addr, ai->ai_addrlen))
		die("connect");
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	while (got < n + warm) {
		while (sent - got < window && sent < n + warm) {
			for (size_t off = 0; off < size;) {
				ssize_t w = write(fd, buf + off, size - off);

				if (w <= 0)
					die("write");
				off += (size_t)w;
			}
			sent++;
		}
		ssize_t r = read(fd, buf, size * (size_t)(sent - got) - part);

		if (r <= 0)
			die("read");
		part += (size_t)r;
		for (; part >= size; part -= size)
			if (++got == warm)
				t0 = now_s();
	}
	t0 = now_s() - t0;
	close(fd);
	return t0;
}

int main(int argc, char **argv)
{
	bool tcp = argc > 2 && !strcmp(argv[2], "tcp");

	if (argc == 4 && !strcmp(argv[1], "serve")) {
		tcp ? tcp_serve(argv[3]) : urdma_serve(argv[3]);
		return 0;
	}
	if (argc == 6 && (!strcmp(argv[1], "lat") || !strcmp(argv[1], "rate"))) {
		bool lat = !strcmp(argv[1], "lat");
		size_t size = (size_t)atol(argv[4]);
		long n = atol(argv[5]);
		int window = lat ? 1 : WINDOW;
		double t;

		if (size < 1 || size > MAX_SIZE || n < 10)
			return 2;
		t = tcp ? tcp_run(argv[3], size, n, window) :
			  urdma_run(argv[3], size, n, window);
		printf("%s %s %zu B x %ld: %.3f s\n", argv[1], argv[2], size,
		       n, t);
		printf("result: %.3f\n", lat ? t / (double)n / 2 * 1e6 :
					       (double)n / t / 1e6);
		return 0;
	}
	fprintf(stderr, "usage: %s serve urdma|tcp PORT\n"
			"       %s lat|rate urdma|tcp HOST:PORT SIZE N\n",
		argv[0], argv[0]);
	return 2;
}
