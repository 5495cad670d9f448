// SPDX-License-Identifier: MIT
/*
 * Plain TCP connection setup rate, the peer of cmtime's rows in bench.sh.
 *
 *   tcp_connrate server PORT N        accept N connections, answer each with
 *                                     one byte, then close them all
 *   tcp_connrate client HOST PORT N   open N connections at once (non-blocking
 *                                     connects) and wait until every one has
 *                                     its byte: the server's accept is part of
 *                                     the setup, as the REP is in the RDMA CM
 *
 * The client prints "N connections in S s: R conn/s".  Exit 0 on success.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int die(const char *what)
{
	fprintf(stderr, "tcp_connrate: %s: %s\n", what, strerror(errno));
	return 1;
}

static int server(const char *port, int n)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	int one = 1, l, *fds = calloc((size_t)n, sizeof(int));

	if (!fds)
		return die("calloc");
	sa.sin_port = htons((uint16_t)atoi(port));
	l = socket(AF_INET, SOCK_STREAM, 0);
	if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(l, (struct sockaddr *)&sa, sizeof(sa)) || listen(l, n))
		return die("listen");
	for (int i = 0; i < n; i++) {
		fds[i] = accept(l, NULL, NULL);
		if (fds[i] < 0)
			return die("accept");
		if (write(fds[i], "x", 1) != 1)
			return die("write");
	}
	/* The client closes first: wait for its EOF on each. */
	for (int i = 0; i < n; i++) {
		char b;

		(void)!read(fds[i], &b, 1);
		close(fds[i]);
	}
	close(l);
	return 0;
}

static int client(const char *host, const char *port, int n)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai;
	int ep, left = n, *fds = calloc((size_t)n, sizeof(int));
	struct epoll_event ev, evs[64];
	double t0, t;

	if (!fds)
		return die("calloc");
	if (getaddrinfo(host, port, &hints, &ai))
		return die("getaddrinfo");
	ep = epoll_create1(0);
	if (ep < 0)
		return die("epoll_create1");
	t0 = now();
	for (int i = 0; i < n; i++) {
		fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		if (fds[i] < 0)
			return die("socket");
		if (connect(fds[i], ai->ai_addr, ai->ai_addrlen) && errno != EINPROGRESS)
			return die("connect");
		ev.events = EPOLLIN;
		ev.data.u32 = (uint32_t)i;
		if (epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev))
			return die("epoll_ctl");
	}
	while (left > 0) {
		int k = epoll_wait(ep, evs, 64, 10000);

		if (k <= 0)
			return die(k ? "epoll_wait" : "epoll_wait (timed out)");
		for (int j = 0; j < k; j++) {
			int fd = fds[evs[j].data.u32];
			char b;

			if (read(fd, &b, 1) != 1)
				return die("read");
			epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
			left--;
		}
	}
	t = now() - t0;
	printf("%d connections in %.6f s: %.0f conn/s\n", n, t, n / t);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	freeaddrinfo(ai);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "server"))
		return server(argv[2], atoi(argv[3]));
	if (argc == 5 && !strcmp(argv[1], "client"))
		return client(argv[2], argv[3], atoi(argv[4]));
	fprintf(stderr, "usage: tcp_connrate server PORT N | client HOST PORT N\n");
	return 2;
}
