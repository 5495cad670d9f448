/* SPDX-License-Identifier: MIT */
/*
 * Datagram rsockets (SOCK_DGRAM over UD QPs) on urdma's librdmacm.so.1: a
 * server (the parent) and a client (the child) over 127.0.0.1.
 *
 * Echo of every size up to the limit with the source address named, that
 * resolved traffic leaves the UDP socket alone (it goes over UD), MSG_PEEK
 * and MSG_TRUNC, connected sockets (rsend/rrecv, other senders filtered,
 * AF_UNSPEC), rpoll, a burst that may drop but never corrupts, a peer that
 * restarts on the same port (learned again), hostile datagrams on the
 * socket's port, and bad arguments.  ./rdmacm_rsocket_dgram [case...] runs
 * some cases.
 */
#include "harness.h"
#include "rs_test.h"

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define WAIT_MS 10000
#define DG_MAX 4092	/* the UD MTU less the rsocket header */

/* A datagram rsocket bound to 127.0.0.1:port (0: any); *bound gets it. */
static int dg_bound(uint16_t port, uint16_t *bound)
{
	struct sockaddr_in sin = loop_addr(port);
	socklen_t len = sizeof(sin);
	int rs = rsocket(AF_INET, SOCK_DGRAM, 0), one = 1;

	REQUIRE(rs >= 0, "rsocket: %s", strerror(errno));
	REQUIRE(!rsetsockopt(rs, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)),
		"SO_REUSEADDR: %s", strerror(errno));
	REQUIRE(!rbind(rs, (struct sockaddr *)&sin, sizeof(sin)), "rbind: %s",
		strerror(errno));
	REQUIRE(!rgetsockname(rs, (struct sockaddr *)&sin, &len), "rgetsockname");
	REQUIRE(sin.sin_port, "rbind to port 0 gave no port");
	if (bound)
		*bound = ntohs(sin.sin_port);
	return rs;
}

/* Wait up to ms for a datagram; its length, or -1 on timeout. */
static ssize_t recv_wait(int rs, void *buf, size_t len, int flags,
			 struct sockaddr_in *from, int ms)
{
	struct pollfd p = { .fd = rs, .events = POLLIN };
	socklen_t fl = sizeof(*from);
	ssize_t r;

	if (rpoll(&p, 1, ms) != 1)
		return -1;
	r = rrecvfrom(rs, buf, len, flags | MSG_DONTWAIT, (struct sockaddr *)from,
		      from ? &fl : NULL);
	return r;
}

static void fill(uint8_t *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)(seed * 131 + i * 7);
}

static bool same_addr(const struct sockaddr_in *a, const struct sockaddr_in *b)
{
	return a->sin_family == b->sin_family && a->sin_port == b->sin_port &&
	       a->sin_addr.s_addr == b->sin_addr.s_addr;
}

/* ---- echo: every size, the source named, then nothing on the UDP socket */

static const size_t echo_sizes[] = { 0, 1, 7, 64, 1000, 2048, 4000, DG_MAX };
#define N_ECHO (sizeof(echo_sizes) / sizeof(echo_sizes[0]))

static void echo_server(struct t_peer *p, void *arg)
{
	uint8_t buf[DG_MAX + 100];
	struct sockaddr_in from, peer;
	uint16_t port;
	int rs = dg_bound(0, &port);

	(void)arg;
	t_send_u64(p, port);
	peer = loop_addr((uint16_t)t_recv_u64(p, WAIT_MS));
	for (int round = 0; round < 3; round++) {
		for (size_t i = 0; i < N_ECHO; i++) {
			ssize_t r = recv_wait(rs, buf, sizeof(buf), 0, &from, WAIT_MS);

			REQUIRE(r >= 0, "datagram %zu of round %d: %s", i, round,
				r < 0 ? "none" : "");
			CHECK((size_t)r == echo_sizes[i], "got %zd bytes, sent %zu", r,
			      echo_sizes[i]);
			CHECK(same_addr(&from, &peer), "source %s:%u, not the client's %u",
			      inet_ntoa(from.sin_addr), ntohs(from.sin_port),
			      ntohs(peer.sin_port));
			REQUIRE(rsendto(rs, buf, (size_t)r, 0, (struct sockaddr *)&from,
					sizeof(from)) == r, "rsendto: %s", strerror(errno));
		}
	}
	/* Resolved by now: a datagram comes over UD, and the kernel's UDP
	 * socket behind the rsocket sees nothing of it. */
	t_barrier(p);
	{
		struct pollfd k = { .fd = rs, .events = POLLIN };

		CHECK(poll(&k, 1, 300) == 0, "the datagram came over the UDP socket");
		CHECK(recv_wait(rs, buf, sizeof(buf), 0, &from, WAIT_MS) == 100,
		      "no datagram over UD");
	}
	t_barrier(p);
	rclose(rs);
}

static void echo_client(struct t_peer *p, void *arg)
{
	static uint8_t out[DG_MAX], in[DG_MAX + 100];
	struct sockaddr_in srv = loop_addr((uint16_t)t_recv_u64(p, WAIT_MS)), from;
	uint16_t port;
	int rs = dg_bound(0, &port);

	(void)arg;
	t_send_u64(p, port);
	for (int round = 0; round < 3; round++) {
		for (size_t i = 0; i < N_ECHO; i++) {
			ssize_t r;

			fill(out, echo_sizes[i], (unsigned)(i + round * 10));
			REQUIRE(rsendto(rs, out, echo_sizes[i], 0, (struct sockaddr *)&srv,
					sizeof(srv)) == (ssize_t)echo_sizes[i],
				"rsendto %zu: %s", echo_sizes[i], strerror(errno));
			r = recv_wait(rs, in, sizeof(in), 0, &from, WAIT_MS);
			REQUIRE(r == (ssize_t)echo_sizes[i], "echo of %zu: %zd", echo_sizes[i], r);
			CHECK(!memcmp(in, out, echo_sizes[i]), "echo of %zu differs",
			      echo_sizes[i]);
			CHECK(same_addr(&from, &srv), "echo not from the server");
		}
	}
	t_barrier(p);
	REQUIRE(rsendto(rs, out, 100, 0, (struct sockaddr *)&srv, sizeof(srv)) == 100,
		"rsendto");
	t_barrier(p);
	rclose(rs);
}

/* ---- MSG_PEEK, MSG_TRUNC, rrecvmsg ---------------------------------- */

static void peek_server(struct t_peer *p, void *arg)
{
	uint8_t buf[64], want[3000];
	struct sockaddr_in from;
	struct iovec iov[2] = { { buf, 10 }, { buf + 10, 10 } };
	struct msghdr m = { .msg_name = &from, .msg_namelen = sizeof(from),
			    .msg_iov = iov, .msg_iovlen = 2 };
	uint16_t port;
	int rs = dg_bound(0, &port);

	(void)arg;
	t_send_u64(p, port);
	fill(want, sizeof(want), 5);
	CHECK(recv_wait(rs, buf, 16, MSG_PEEK, &from, WAIT_MS) == 16, "peek");
	CHECK(!memcmp(buf, want, 16), "peeked bytes differ");
	CHECK(rrecv(rs, buf, 8, MSG_PEEK | MSG_TRUNC) == 3000,
	      "MSG_TRUNC gives the datagram's length");
	CHECK(rrecvmsg(rs, &m, 0) == 20, "rrecvmsg of a truncated datagram");
	CHECK(m.msg_flags & MSG_TRUNC, "rrecvmsg did not flag MSG_TRUNC");
	CHECK(m.msg_namelen == sizeof(from) && from.sin_port, "rrecvmsg named no source");
	CHECK(!memcmp(buf, want, 20), "rrecvmsg bytes differ");
	/* the rest of it is gone: the next datagram is the second one */
	CHECK(recv_wait(rs, buf, sizeof(buf), 0, &from, WAIT_MS) == 5, "second datagram");
	EXPECT_ERR(rrecv(rs, buf, sizeof(buf), MSG_DONTWAIT), EAGAIN);
	t_barrier(p);
	rclose(rs);
}

static void peek_client(struct t_peer *p, void *arg)
{
	struct sockaddr_in srv = loop_addr((uint16_t)t_recv_u64(p, WAIT_MS));
	uint8_t out[3000];
	int rs = rsocket(AF_INET, SOCK_DGRAM, 0);

	(void)arg;
	REQUIRE(rs >= 0, "rsocket");
	fill(out, sizeof(out), 5);
	REQUIRE(rsendto(rs, out, sizeof(out), 0, (struct sockaddr *)&srv,
			sizeof(srv)) == (ssize_t)sizeof(out), "rsendto");
	REQUIRE(rsendto(rs, out, 5, 0, (struct sockaddr *)&srv, sizeof(srv)) == 5,
		"rsendto");
	t_barrier(p);
	rclose(rs);
}

/* ---- connected sockets ---------------------------------------------- */

static void conn_server(struct t_peer *p, void *arg)
{
	uint8_t buf[256];
	struct sockaddr_in from;
	uint16_t port;
	int rs = dg_bound(0, &port);

	(void)arg;
	t_send_u64(p, port);
	for (int i = 0; i < 50; i++) {
		ssize_t r = recv_wait(rs, buf, sizeof(buf), 0, &from, WAIT_MS);

		REQUIRE(r == 32, "datagram %d: %zd", i, r);
		REQUIRE(rsendto(rs, buf, 32, 0, (struct sockaddr *)&from,
				sizeof(from)) == 32, "rsendto");
	}
	t_barrier(p);
	/* the client is connected to us: a third socket's datagram is not
	 * delivered to it; ours is */
	{
		int other = rsocket(AF_INET, SOCK_DGRAM, 0);
		struct sockaddr_in cli = loop_addr((uint16_t)t_recv_u64(p, WAIT_MS));

		REQUIRE(other >= 0, "rsocket");
		for (int i = 0; i < 3; i++)
			REQUIRE(rsendto(other, "stranger", 8, 0, (struct sockaddr *)&cli,
					sizeof(cli)) == 8, "rsendto from a stranger");
		usleep(100000);
		REQUIRE(rsendto(rs, "friend", 6, 0, (struct sockaddr *)&cli,
				sizeof(cli)) == 6, "rsendto");
		t_barrier(p);
		rclose(other);
	}
	rclose(rs);
}

static void conn_client(struct t_peer *p, void *arg)
{
	struct sockaddr_in srv = loop_addr((uint16_t)t_recv_u64(p, WAIT_MS)), me, peer;
	socklen_t len = sizeof(peer);
	uint8_t out[32], in[64];
	int rs = rsocket(AF_INET, SOCK_DGRAM, 0);

	(void)arg;
	REQUIRE(rs >= 0, "rsocket");
	EXPECT_ERR(rgetpeername(rs, (struct sockaddr *)&peer, &len), ENOTCONN);
	REQUIRE(!rconnect(rs, (struct sockaddr *)&srv, sizeof(srv)), "rconnect: %s",
		strerror(errno));
	len = sizeof(peer);
	REQUIRE(!rgetpeername(rs, (struct sockaddr *)&peer, &len), "rgetpeername");
	CHECK(same_addr(&peer, &srv), "rgetpeername is not the server");
	for (int i = 0; i < 50; i++) {
		ssize_t r;

		fill(out, sizeof(out), (unsigned)i);
		REQUIRE(rsend(rs, out, sizeof(out), 0) == (ssize_t)sizeof(out),
			"rsend: %s", strerror(errno));
		r = recv_wait(rs, in, sizeof(in), 0, NULL, WAIT_MS);
		REQUIRE(r == 32 && !memcmp(in, out, 32), "echo %d: %zd", i, r);
	}
	t_barrier(p);
	len = sizeof(me);
	REQUIRE(!rgetsockname(rs, (struct sockaddr *)&me, &len), "rgetsockname");
	t_send_u64(p, ntohs(me.sin_port));
	{
		ssize_t r = recv_wait(rs, in, sizeof(in), 0, NULL, WAIT_MS);

		CHECK(r == 6 && !memcmp(in, "friend", 6),
		      "the connected socket got a stranger's datagram (%zd bytes)", r);
	}
	t_barrier(p);
	/* AF_UNSPEC dissolves the association */
	{
		struct sockaddr un = { .sa_family = AF_UNSPEC };

		REQUIRE(!rconnect(rs, &un, sizeof(un)), "rconnect AF_UNSPEC: %s",
			strerror(errno));
		EXPECT_ERR(rsend(rs, "x", 1, 0), EDESTADDRREQ);
		EXPECT_ERR(rgetpeername(rs, (struct sockaddr *)&peer, &len), ENOTCONN);
	}
	rclose(rs);
}

/* ---- a burst: drops allowed, corruption not -------------------------- */

#define BURST 3000

static void burst_server(struct t_peer *p, void *arg)
{
	uint8_t buf[2048];
	uint16_t port;
	int rs = dg_bound(0, &port), got = 0, bad = 0, last = -1, order = 0;

	(void)arg;
	t_send_u64(p, port);
	for (;;) {
		ssize_t r = recv_wait(rs, buf, sizeof(buf), 0, NULL, 1000);
		uint32_t seq;
		uint8_t want[1024];

		if (r < 0)
			break;
		memcpy(&seq, buf, 4);
		if (seq == 0xffffffffu)
			break;
		fill(want, 1020, seq);
		if (r != 1024 || seq >= BURST || memcmp(buf + 4, want, 1020))
			bad++;
		if ((int)seq <= last)
			order++;
		last = (int)seq;
		got++;
	}
	t_note("%d of %d datagrams arrived, %d out of order", got, BURST, order);
	CHECK(bad == 0, "%d datagrams corrupted", bad);
	CHECK(got > 0, "nothing arrived");
	t_barrier(p);
	rclose(rs);
}

static void burst_client(struct t_peer *p, void *arg)
{
	struct sockaddr_in srv = loop_addr((uint16_t)t_recv_u64(p, WAIT_MS));
	uint8_t out[1024];
	uint32_t end = 0xffffffffu;
	int rs = rsocket(AF_INET, SOCK_DGRAM, 0);

	(void)arg;
	REQUIRE(rs >= 0, "rsocket");
	REQUIRE(!rconnect(rs, (struct sockaddr *)&srv, sizeof(srv)), "rconnect");
	for (uint32_t s = 0; s < BURST; s++) {
		memcpy(out, &s, 4);
		fill(out + 4, 1020, s);
		REQUIRE(rsend(rs, out, sizeof(out), 0) == (ssize_t)sizeof(out),
			"rsend %u: %s", s, strerror(errno));
	}
	usleep(200000);
	for (int i = 0; i < 5; i++)
		rsend(rs, &end, 4, 0);
	t_barrier(p);
	rclose(rs);
}

/* ---- a peer restarts on the same port: its new QP is learned --------- */

static void restart_server(struct t_peer *p, void *arg)
{
	uint8_t buf[64];
	struct sockaddr_in from, cli;
	uint16_t port;
	int rs = dg_bound(0, &port);

	(void)arg;
	t_send_u64(p, port);
	REQUIRE(recv_wait(rs, buf, sizeof(buf), 0, &from, WAIT_MS) == 4, "first");
	REQUIRE(rsendto(rs, buf, 4, 0, (struct sockaddr *)&from, sizeof(from)) == 4,
		"rsendto");
	cli = from;
	t_barrier(p);
	rclose(rs);
	/* the same address, a new socket and QP: it speaks first */
	rs = dg_bound(port, NULL);
	REQUIRE(rsendto(rs, "again", 5, 0, (struct sockaddr *)&cli, sizeof(cli)) == 5,
		"rsendto");
	CHECK(recv_wait(rs, buf, sizeof(buf), 0, &from, WAIT_MS) == 5 &&
	      !memcmp(buf, "reply", 5), "the client's answer did not reach the "
	      "restarted socket");
	t_barrier(p);
	rclose(rs);
}

static void restart_client(struct t_peer *p, void *arg)
{
	struct sockaddr_in srv = loop_addr((uint16_t)t_recv_u64(p, WAIT_MS)), from;
	uint8_t buf[64];
	int rs = rsocket(AF_INET, SOCK_DGRAM, 0);

	(void)arg;
	REQUIRE(rs >= 0, "rsocket");
	REQUIRE(rsendto(rs, "ping", 4, 0, (struct sockaddr *)&srv, sizeof(srv)) == 4,
		"rsendto");
	REQUIRE(recv_wait(rs, buf, sizeof(buf), 0, &from, WAIT_MS) == 4, "echo");
	t_barrier(p);
	REQUIRE(recv_wait(rs, buf, sizeof(buf), 0, &from, WAIT_MS) == 5 &&
		!memcmp(buf, "again", 5), "the restarted socket's datagram");
	CHECK(same_addr(&from, &srv), "from another address");
	REQUIRE(rsendto(rs, "reply", 5, 0, (struct sockaddr *)&from, sizeof(from)) == 5,
		"rsendto");
	t_barrier(p);
	rclose(rs);
}

/* ---- hostile datagrams on the rsocket's port -------------------------- */

struct udp_hdr {
	uint32_t magic;
	uint8_t version, op;
	uint16_t reserved;
	uint32_t qpn;
} __attribute__((packed));

static void hostile(void *arg)
{
	uint16_t port;
	int rs = dg_bound(0, &port), k = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in to = loop_addr(port), from, me;
	socklen_t ml = sizeof(me);
	struct udp_hdr h = { htobe32(0x75726467u), 1, 1, 0, 0 };
	uint8_t pkt[64], buf[64];

	(void)arg;
	REQUIRE(k >= 0, "socket");
	me = loop_addr(0);
	REQUIRE(!bind(k, (struct sockaddr *)&me, sizeof(me)) &&
		!getsockname(k, (struct sockaddr *)&me, &ml), "bind");
#define SEND(b, n) sendto(k, b, n, 0, (struct sockaddr *)&to, sizeof(to))
	SEND("hello, plain UDP", 16);				/* no header */
	SEND(&h, 5);						/* short */
	h.magic = htobe32(0x12345678);
	SEND(&h, sizeof(h));					/* bad magic */
	h.magic = htobe32(0x75726467u);
	h.version = 9;
	SEND(&h, sizeof(h));					/* bad version */
	h.version = 1;
	h.op = 77;
	SEND(&h, sizeof(h));					/* bad op */
	h.op = 2;
	h.qpn = htobe32(0x123456);
	SEND(&h, sizeof(h));					/* REPLY unasked */
	h.op = 1;
	h.qpn = htobe32(0xffffff);
	memcpy(pkt, &h, sizeof(h));
	memcpy(pkt + sizeof(h), "good", 4);
	SEND(pkt, sizeof(h) + 4);		/* DATA, a bad QPN: delivered, not learned */
	h.op = 3;
	h.qpn = 0;
	SEND(&h, sizeof(h));					/* a HELLO */
#undef SEND
	CHECK(recv_wait(rs, buf, sizeof(buf), 0, &from, WAIT_MS) == 4 &&
	      !memcmp(buf, "good", 4), "the well-formed datagram was not delivered");
	CHECK(same_addr(&from, &me), "its source is not the sender's");
	EXPECT_ERR(rrecv(rs, buf, sizeof(buf), MSG_DONTWAIT), EAGAIN);
	/* the HELLO was answered with a REPLY naming a QPN */
	{
		struct pollfd pk = { .fd = k, .events = POLLIN };
		ssize_t r;

		CHECK(poll(&pk, 1, WAIT_MS) == 1, "no REPLY to the HELLO");
		r = recv(k, &h, sizeof(h), MSG_DONTWAIT);
		while (r == (ssize_t)sizeof(h) && h.op != 2)
			r = recv(k, &h, sizeof(h), MSG_DONTWAIT);
		CHECK(r == (ssize_t)sizeof(h) && h.op == 2 && be32toh(h.qpn) &&
		      be32toh(h.qpn) < 0xffffff, "REPLY: %zd bytes, op %u", r, h.op);
	}
	/* and the rsocket still works */
	{
		int c = rsocket(AF_INET, SOCK_DGRAM, 0);

		REQUIRE(c >= 0, "rsocket");
		REQUIRE(rsendto(c, "after", 5, 0, (struct sockaddr *)&to, sizeof(to)) == 5,
			"rsendto");
		CHECK(recv_wait(rs, buf, sizeof(buf), 0, &from, WAIT_MS) == 5,
		      "no datagram after the hostile ones");
		rclose(c);
	}
	close(k);
	rclose(rs);
}

/* ---- rpoll: POLLOUT at once, POLLIN when a datagram comes, asleep ----- */

static void poll_server(struct t_peer *p, void *arg)
{
	uint16_t port;
	int rs = dg_bound(0, &port), pfd[2];
	struct pollfd f[2];
	char buf[16];

	(void)arg;
	REQUIRE(!pipe(pfd), "pipe");
	f[0] = (struct pollfd){ .fd = rs, .events = POLLOUT };
	CHECK(rpoll(f, 1, 0) == 1 && (f[0].revents & POLLOUT), "no POLLOUT");
	f[0].events = POLLIN;
	f[1] = (struct pollfd){ .fd = pfd[0], .events = POLLIN };
	CHECK(rpoll(f, 2, 50) == 0, "POLLIN with nothing sent");
	t_send_u64(p, port);
	CHECK(rpoll(f, 2, WAIT_MS) == 1 && (f[0].revents & POLLIN) && !f[1].revents,
	      "rpoll: %d %d", f[0].revents, f[1].revents);
	CHECK(rrecv(rs, buf, sizeof(buf), 0) == 3, "rrecv");
	close(pfd[0]);
	close(pfd[1]);
	t_barrier(p);
	rclose(rs);
}

static void poll_client(struct t_peer *p, void *arg)
{
	struct sockaddr_in srv = loop_addr((uint16_t)t_recv_u64(p, WAIT_MS));
	int rs = rsocket(AF_INET, SOCK_DGRAM, 0);

	(void)arg;
	REQUIRE(rs >= 0, "rsocket");
	usleep(200000);	/* the server sleeps in rpoll meanwhile */
	REQUIRE(rsendto(rs, "abc", 3, 0, (struct sockaddr *)&srv, sizeof(srv)) == 3,
		"rsendto");
	t_barrier(p);
	rclose(rs);
}

/* ---- bad arguments, options ------------------------------------------ */

static void bad_args(void *arg)
{
	struct sockaddr_in sin = loop_addr(9), any = { .sin_family = AF_INET };
	struct sockaddr_in6 six = { .sin6_family = AF_INET6, .sin6_port = htons(9) };
	static char big[DG_MAX + 1];
	socklen_t l = sizeof(sin);
	int rs, rs2, v;
	uint16_t port;
	char buf[8];

	(void)arg;
	EXPECT_ERR(rsocket(AF_INET, SOCK_DGRAM, IPPROTO_TCP), EPROTONOSUPPORT);
	rs = rsocket(AF_INET, SOCK_DGRAM, IPPROTO_UDP);
	REQUIRE(rs >= 0, "rsocket: %s", strerror(errno));
	v = 0;
	l = sizeof(v);
	CHECK(!rgetsockopt(rs, SOL_SOCKET, SO_TYPE, &v, &l) && v == SOCK_DGRAM, "SO_TYPE");
	CHECK(!rgetsockopt(rs, SOL_SOCKET, SO_PROTOCOL, &v, &l) && v == IPPROTO_UDP,
	      "SO_PROTOCOL");
	v = 1;
	EXPECT_ERR(rsetsockopt(rs, IPPROTO_TCP, TCP_NODELAY, &v, sizeof(v)), ENOPROTOOPT);
	EXPECT_ERR(rsetsockopt(rs, SOL_RDMA, RDMA_IOMAPSIZE, &v, sizeof(v)), ENOPROTOOPT);
	v = 64;
	CHECK(!rsetsockopt(rs, SOL_RDMA, RDMA_SQSIZE, &v, sizeof(v)), "RDMA_SQSIZE");
	EXPECT_ERR(rsend(rs, "x", 1, 0), EDESTADDRREQ);
	EXPECT_ERR(rlisten(rs, 1), EOPNOTSUPP);
	EXPECT_ERR(raccept(rs, NULL, NULL), EOPNOTSUPP);
	l = sizeof(sin);
	EXPECT_ERR(rgetpeername(rs, (struct sockaddr *)&sin, &l), ENOTCONN);
	EXPECT_ERR(rshutdown(rs, SHUT_RDWR), ENOTCONN);
	EXPECT_ERR(riomap(rs, buf, sizeof(buf), PROT_WRITE, 0, -1), EOPNOTSUPP);
	EXPECT_ERR(rsendto(rs, "x", 1, 0, (struct sockaddr *)&six, sizeof(six)),
		   EAFNOSUPPORT);
	EXPECT_ERR(rsendto(rs, "x", 1, 0, (struct sockaddr *)&any, sizeof(any)), EINVAL);
	EXPECT_ERR(rsendto(rs, "x", 1, 0, (struct sockaddr *)&sin, 3), EINVAL);
	EXPECT_ERR(rsendto(rs, big, sizeof(big), 0, (struct sockaddr *)&sin,
			   sizeof(sin)), EMSGSIZE);
	EXPECT_ERR(rrecv(rs, buf, sizeof(buf), MSG_DONTWAIT), EAGAIN);
	/* the endpoint exists now: too late for queue sizes */
	EXPECT_ERR(rsetsockopt(rs, SOL_RDMA, RDMA_SQSIZE, &v, sizeof(v)), EINVAL);
	/* bound (on first use): bound again is EINVAL */
	EXPECT_ERR(rbind(rs, (struct sockaddr *)&any, sizeof(any)), EINVAL);
	rclose(rs);

	rs = dg_bound(0, &port);
	rs2 = rsocket(AF_INET, SOCK_DGRAM, 0);
	REQUIRE(rs2 >= 0, "rsocket");
	sin = loop_addr(port);
	EXPECT_ERR(rbind(rs2, (struct sockaddr *)&sin, sizeof(sin)), EADDRINUSE);
	rclose(rs2);
	rclose(rs);
	EXPECT_ERR(rrecv(rs, buf, 1, 0), EBADF);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	t_set_case_timeout(60);
	t_case("bad_args", bad_args, NULL);
	t_case("hostile", hostile, NULL);
	t_pair("echo", echo_server, echo_client, NULL);
	t_pair("peek_trunc", peek_server, peek_client, NULL);
	t_pair("connected", conn_server, conn_client, NULL);
	t_pair("burst", burst_server, burst_client, NULL);
	t_pair("restart", restart_server, restart_client, NULL);
	t_pair("rpoll", poll_server, poll_client, NULL);
	return t_finish();
}
