/* SPDX-License-Identifier: MIT */
/*
 * Datagram rsockets (SOCK_DGRAM over UD QPs) on urdma's librdmacm.so.1: a
 * server (the parent) and a client (the child) over 127.0.0.1.
 *
 * Echo of every size up to the limit with the source address named, that
 * resolved traffic leaves the UDP socket alone (it goes over UD), MSG_PEEK
 * and MSG_TRUNC, connected sockets (rsend/rrecv, a known stranger
 * filtered, AF_UNSPEC keeping the port), rpoll, a burst that may drop but
 * never corrupts, a peer that restarts on the same port (learned again), a
 * freed QPN taken by another socket (not mistaken for the old one), IPv6
 * and dual stack, hostile datagrams on the UDP socket and forged ones over
 * UD (dropped, and no POLLIN for them), and bad arguments.  ./rdmacm_rsocket_dgram [case...] runs
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
#include <infiniband/verbs.h>
#include <rdma/rsocket.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define WAIT_MS 10000
#define DG_MAX 4088	/* the UD MTU less the rsocket header */

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
	/* a round trip first, so that what follows comes over UD */
	REQUIRE(recv_wait(rs, buf, sizeof(buf), 0, &from, WAIT_MS) == 1, "warm-up");
	REQUIRE(rsendto(rs, buf, 1, 0, (struct sockaddr *)&from, sizeof(from)) == 1,
		"rsendto");
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
	REQUIRE(rsendto(rs, "w", 1, 0, (struct sockaddr *)&srv, sizeof(srv)) == 1, "rsendto");
	REQUIRE(recv_wait(rs, out, sizeof(out), 0, NULL, WAIT_MS) == 1, "warm-up");
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
	struct sockaddr_in from, cli, scli;
	uint16_t port, oport;
	int rs = dg_bound(0, &port), other = dg_bound(0, &oport);

	(void)arg;
	/* A stranger the client knows from before it connects (so they
	 * know each other's QPs): once connected, the client takes only
	 * what its peer sends. */
	t_send_u64(p, oport);
	REQUIRE(recv_wait(other, buf, sizeof(buf), 0, &scli, WAIT_MS) == 2, "hi");
	REQUIRE(rsendto(other, "hello", 5, 0, (struct sockaddr *)&scli, sizeof(scli)) == 5,
		"rsendto");
	t_send_u64(p, port);
	for (int i = 0; i < 50; i++) {
		ssize_t r = recv_wait(rs, buf, sizeof(buf), 0, &from, WAIT_MS);

		REQUIRE(r == 32, "datagram %d: %zd", i, r);
		REQUIRE(rsendto(rs, buf, 32, 0, (struct sockaddr *)&from,
				sizeof(from)) == 32, "rsendto");
	}
	cli = from;
	for (int i = 0; i < 3; i++)
		REQUIRE(rsendto(other, "stranger", 8, 0, (struct sockaddr *)&scli,
				sizeof(scli)) == 8, "rsendto from the stranger");
	usleep(100000);
	REQUIRE(rsendto(rs, "friend", 6, 0, (struct sockaddr *)&cli, sizeof(cli)) == 6,
		"rsendto");
	t_barrier(p);
	rclose(other);
	/* after AF_UNSPEC the client sends from the same port */
	CHECK(recv_wait(rs, buf, sizeof(buf), 0, &from, WAIT_MS) == 5 &&
	      same_addr(&from, &cli), "after AF_UNSPEC: from port %u, was %u",
	      ntohs(from.sin_port), ntohs(cli.sin_port));
	t_barrier(p);
	rclose(rs);
}

static void conn_client(struct t_peer *p, void *arg)
{
	struct sockaddr_in other = loop_addr((uint16_t)t_recv_u64(p, WAIT_MS)), srv;
	struct sockaddr_in me, me2, peer;
	socklen_t len = sizeof(peer);
	uint8_t out[32], in[64];
	int rs = rsocket(AF_INET, SOCK_DGRAM, 0);

	(void)arg;
	REQUIRE(rs >= 0, "rsocket");
	REQUIRE(rsendto(rs, "hi", 2, 0, (struct sockaddr *)&other, sizeof(other)) == 2,
		"rsendto");
	REQUIRE(recv_wait(rs, in, sizeof(in), 0, NULL, WAIT_MS) == 5, "hello");
	srv = loop_addr((uint16_t)t_recv_u64(p, WAIT_MS));
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
	{
		ssize_t r = recv_wait(rs, in, sizeof(in), 0, NULL, WAIT_MS);

		CHECK(r == 6 && !memcmp(in, "friend", 6),
		      "the connected socket got a stranger's datagram (%zd bytes)", r);
	}
	t_barrier(p);
	/* AF_UNSPEC dissolves the association; the port stays */
	{
		struct sockaddr un = { .sa_family = AF_UNSPEC };

		len = sizeof(me);
		REQUIRE(!rgetsockname(rs, (struct sockaddr *)&me, &len), "rgetsockname");
		REQUIRE(!rconnect(rs, &un, sizeof(un)), "rconnect AF_UNSPEC: %s",
			strerror(errno));
		EXPECT_ERR(rsend(rs, "x", 1, 0), EDESTADDRREQ);
		len = sizeof(peer);
		EXPECT_ERR(rgetpeername(rs, (struct sockaddr *)&peer, &len), ENOTCONN);
		len = sizeof(me2);
		REQUIRE(!rgetsockname(rs, (struct sockaddr *)&me2, &len), "rgetsockname");
		CHECK(me.sin_port == me2.sin_port, "the port changed: %u, was %u",
		      ntohs(me2.sin_port), ntohs(me.sin_port));
		REQUIRE(rsendto(rs, "after", 5, 0, (struct sockaddr *)&srv, sizeof(srv)) == 5,
			"rsendto after AF_UNSPEC: %s", strerror(errno));
	}
	t_barrier(p);
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
		ssize_t r = recv_wait(rs, buf, sizeof(buf), 0, NULL, got ? 1000 : WAIT_MS);
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
	uint32_t qpn, nonce;
} __attribute__((packed));

#define DG_MAGIC 0x75726467u
#define DG_QKEY 0x0b5d6467u

/* A plain UDP socket bound to 127.0.0.1; *me gets its address. */
static int plain_socket(struct sockaddr_in *me)
{
	socklen_t ml = sizeof(*me);
	int k = socket(AF_INET, SOCK_DGRAM, 0);

	*me = loop_addr(0);
	REQUIRE(k >= 0 && !bind(k, (struct sockaddr *)me, sizeof(*me)) &&
		!getsockname(k, (struct sockaddr *)me, &ml), "a plain socket");
	return k;
}

/* The QPN of the rsocket at 127.0.0.1:port, asked with a HELLO from a
 * plain socket; rs (that rsocket) is polled meanwhile.  0: no answer. */
static uint32_t qpn_of(int rs, uint16_t port)
{
	struct sockaddr_in me, to = loop_addr(port);
	struct udp_hdr h = { htobe32(DG_MAGIC), 1, 3, 0, 0, htobe32(0x5eed) };
	int k = plain_socket(&me);
	uint32_t q = 0;
	char c;

	sendto(k, &h, sizeof(h), 0, (struct sockaddr *)&to, sizeof(to));
	for (int i = 0; i < 200 && !q; i++) {
		rrecv(rs, &c, 1, MSG_DONTWAIT); /* (its progress answers) */
		if (recv(k, &h, sizeof(h), MSG_DONTWAIT) == (ssize_t)sizeof(h) &&
		    h.op == 2) {
			CHECK(be32toh(h.nonce) == 0x5eed, "the REPLY did not echo the nonce");
			q = be32toh(h.qpn);
		}
		usleep(5000);
	}
	close(k);
	return q;
}

static void hostile_udp(void *arg)
{
	uint16_t port;
	int rs = dg_bound(0, &port);
	struct sockaddr_in to = loop_addr(port), from, me;
	int k = plain_socket(&me);
	struct udp_hdr h = { htobe32(DG_MAGIC), 1, 1, 0, 0, 0 };
	uint8_t pkt[64], buf[64];

	(void)arg;
#define SEND(b, n) sendto(k, b, n, 0, (struct sockaddr *)&to, sizeof(to))
	SEND("hello, plain UDP", 16);				/* no header */
	SEND(&h, 5);						/* short */
	h.magic = htobe32(0x12345678);
	SEND(&h, sizeof(h));					/* bad magic */
	h.magic = htobe32(DG_MAGIC);
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
	h.nonce = htobe32(0xd00d);
	memcpy(pkt, &h, sizeof(h));
	memcpy(pkt + sizeof(h), "good", 4);
	SEND(pkt, sizeof(h) + 4);		/* DATA, a bad QPN: delivered, not learned */
#undef SEND
	CHECK(recv_wait(rs, buf, sizeof(buf), 0, &from, WAIT_MS) == 4 &&
	      !memcmp(buf, "good", 4), "the well-formed datagram was not delivered");
	CHECK(same_addr(&from, &me), "its source is not the sender's");
	EXPECT_ERR(rrecv(rs, buf, sizeof(buf), MSG_DONTWAIT), EAGAIN);
	/* The DATA was answered with a REPLY that echoes its nonce; the
	 * unasked REPLY was not (nothing else comes to k). */
	{
		struct udp_hdr r;
		bool got = false;

		for (int i = 0; i < 200 && !got; i++) {
			if (recv(k, &r, sizeof(r), MSG_DONTWAIT) == (ssize_t)sizeof(r) && r.op == 2)
				got = true;
			else
				usleep(5000);
		}
		CHECK(got && be32toh(r.nonce) == 0xd00d, "no REPLY echoing the DATA's nonce");
	}
	/* Not learned from the DATA's QPN: what rs sends k goes over UDP. */
	REQUIRE(rsendto(rs, "back", 4, 0, (struct sockaddr *)&me, sizeof(me)) == 4, "rsendto");
	{
		struct pollfd pf = { .fd = k, .events = POLLIN };
		ssize_t n = poll(&pf, 1, WAIT_MS) == 1 ? recv(k, pkt, sizeof(pkt), 0) : -1;

		CHECK(n == (ssize_t)sizeof(h) + 4 && ((struct udp_hdr *)pkt)->op == 1 &&
			      !memcmp(pkt + sizeof(h), "back", 4),
		      "the answer to an unlearned source did not come over UDP (%zd bytes)", n);
	}
	CHECK(qpn_of(rs, port) != 0, "no REPLY to a HELLO");
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

/* A raw UD QP of ours, to forge datagrams to an rsocket's QP. */
struct raw_ud {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	struct ibv_ah *grh_ah, *lid_ah;
	uint8_t buf[256];
};

static void raw_ud_open(struct raw_ud *u)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_qp_init_attr ia = { .qp_type = IBV_QPT_UD,
				       .cap = { .max_send_wr = 16, .max_recv_wr = 1,
						.max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = DG_QKEY };
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1 };
	struct ibv_port_attr pa;
	union ibv_gid g;
	int i;

	REQUIRE(l && l[0], "a device");
	u->ctx = ibv_open_device(l[0]);
	ibv_free_device_list(l);
	REQUIRE(u->ctx, "open");
	u->pd = ibv_alloc_pd(u->ctx);
	u->cq = ibv_create_cq(u->ctx, 16, NULL, NULL, 0);
	REQUIRE(u->pd && u->cq, "pd, cq");
	ia.send_cq = ia.recv_cq = u->cq;
	u->qp = ibv_create_qp(u->pd, &ia);
	u->mr = ibv_reg_mr(u->pd, u->buf, sizeof(u->buf), IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(u->qp && u->mr, "qp, mr");
	REQUIRE(!ibv_modify_qp(u->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				IBV_QP_PORT | IBV_QP_QKEY), "INIT");
	a.qp_state = IBV_QPS_RTR;
	REQUIRE(!ibv_modify_qp(u->qp, &a, IBV_QP_STATE), "RTR");
	a.qp_state = IBV_QPS_RTS;
	REQUIRE(!ibv_modify_qp(u->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), "RTS");
	REQUIRE(!ibv_query_port(u->ctx, 1, &pa), "port");
	for (i = 0; i < pa.gid_tbl_len; i++)
		if (!ibv_query_gid(u->ctx, 1, i, &g) && g.raw[10] == 0xff &&
		    g.raw[11] == 0xff && g.raw[12] == 127)
			break;
	REQUIRE(i < pa.gid_tbl_len, "a GID of 127.0.0.1");
	aa.grh.sgid_index = (uint8_t)i;
	aa.grh.hop_limit = 64;
	aa.grh.dgid = g;
	u->grh_ah = ibv_create_ah(u->pd, &aa);
	aa.is_global = 0;
	aa.dlid = pa.lid;
	u->lid_ah = ibv_create_ah(u->pd, &aa);
	REQUIRE(u->grh_ah && u->lid_ah, "address handles");
}

/* Send a forged datagram: the rsocket header {1, 0, sport, dport, 0}
 * (version ver), then data. */
static void raw_ud_send(struct raw_ud *u, struct ibv_ah *ah, uint32_t qpn, uint8_t ver,
			uint16_t sport, uint16_t dport, const char *data, size_t len)
{
	struct ibv_sge sge = { (uintptr_t)u->buf, (uint32_t)(8 + len), u->mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	uint16_t sp = htons(sport), dp = htons(dport);

	memset(u->buf, 0, 8);
	u->buf[0] = ver;
	memcpy(u->buf + 2, &sp, 2);
	memcpy(u->buf + 4, &dp, 2);
	memcpy(u->buf + 8, data, len);
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = DG_QKEY;
	REQUIRE(!ibv_post_send(u->qp, &wr, &bad), "post_send");
	/* It left: a check that nothing arrived means something only then. */
	REQUIRE(t_expect_wc(u->cq, NULL, 0, IBV_WC_SUCCESS, IBV_WC_SEND, "forged datagram"),
		"the forged datagram was sent");
}

static void raw_ud_close(struct raw_ud *u)
{
	ibv_destroy_ah(u->grh_ah);
	ibv_destroy_ah(u->lid_ah);
	ibv_destroy_qp(u->qp);
	ibv_dereg_mr(u->mr);
	ibv_destroy_cq(u->cq);
	ibv_dealloc_pd(u->pd);
	ibv_close_device(u->ctx);
}

/* Forged UD datagrams: none is delivered, none makes rpoll say POLLIN,
 * and a peer the rsocket knows still gets through. */
static void hostile_ud(void *arg)
{
	uint16_t port, cport;
	int rs = dg_bound(0, &port), c = dg_bound(0, &cport);
	struct sockaddr_in to = loop_addr(port), from;
	struct pollfd pf = { .fd = rs, .events = POLLIN };
	struct raw_ud u;
	uint32_t q;
	char buf[64];

	(void)arg;
	/* c and rs know each other: the first over UDP, then UD */
	REQUIRE(rsendto(c, "first", 5, 0, (struct sockaddr *)&to, sizeof(to)) == 5, "rsendto");
	REQUIRE(recv_wait(rs, buf, sizeof(buf), 0, &from, WAIT_MS) == 5, "first");
	usleep(20000);
	rrecv(c, buf, 1, MSG_DONTWAIT); /* (c takes rs's REPLY) */
	q = qpn_of(rs, port);
	REQUIRE(q, "the rsocket's QPN");
	raw_ud_open(&u);
	raw_ud_send(&u, u.lid_ah, q, 1, cport, port, "nogrh", 5);	/* no GRH */
	raw_ud_send(&u, u.grh_ah, q, 1, cport, port, "forged", 6);	/* c's port, not c's QP */
	raw_ud_send(&u, u.grh_ah, q, 1, cport, port ^ 1, "dport", 5);	/* another port's */
	raw_ud_send(&u, u.grh_ah, q, 7, cport, port, "versn", 5);	/* bad version */
	raw_ud_send(&u, u.grh_ah, q, 1, 0, port, "sport", 5);		/* no source port */
	CHECK(rpoll(&pf, 1, 300) == 0, "rpoll says POLLIN for forged datagrams (%#x)",
	      pf.revents);
	EXPECT_ERR(rrecv(rs, buf, sizeof(buf), MSG_DONTWAIT), EAGAIN);
	REQUIRE(rsendto(c, "legit", 5, 0, (struct sockaddr *)&to, sizeof(to)) == 5, "rsendto");
	CHECK(recv_wait(rs, buf, sizeof(buf), 0, &from, WAIT_MS) == 5 &&
	      !memcmp(buf, "legit", 5) && ntohs(from.sin_port) == cport,
	      "the known peer's datagram did not come through");
	raw_ud_close(&u);
	rclose(c);
	rclose(rs);
}

/* A QPN freed and taken by another socket of the same process: what a
 * peer still sends to the old socket's address does not reach the new
 * one (the header names the port it is for). */
static void stale_qpn(void *arg)
{
	uint16_t px, py;
	int p = rsocket(AF_INET, SOCK_DGRAM, 0), x = dg_bound(0, &px), y;
	struct sockaddr_in tx = loop_addr(px), from;
	uint32_t qx, qy;
	char buf[16];

	(void)arg;
	REQUIRE(p >= 0, "rsocket");
	for (int i = 0; i < 2; i++) {
		REQUIRE(rsendto(p, "toX", 3, 0, (struct sockaddr *)&tx, sizeof(tx)) == 3,
			"rsendto");
		REQUIRE(recv_wait(x, buf, sizeof(buf), 0, &from, WAIT_MS) == 3, "X got it");
		usleep(20000);
		rrecv(p, buf, 1, MSG_DONTWAIT); /* (p takes X's REPLY) */
	}
	qx = qpn_of(x, px);
	rclose(x);
	y = dg_bound(0, &py);
	qy = qpn_of(y, py);
	/* The case's premise: without it the check below passes whatever
	 * the receive path does. */
	REQUIRE(qx == qy, "Y got QPN %#x, not X's freed %#x", qy, qx);
	/* Y knows p too (so p's datagrams pass Y's source check) */
	{
		struct sockaddr_in ty = loop_addr(py);

		REQUIRE(rsendto(p, "toY", 3, 0, (struct sockaddr *)&ty, sizeof(ty)) == 3,
			"rsendto");
		REQUIRE(recv_wait(y, buf, sizeof(buf), 0, &from, WAIT_MS) == 3, "Y got it");
	}
	REQUIRE(rsendto(p, "toX", 3, 0, (struct sockaddr *)&tx, sizeof(tx)) == 3, "rsendto");
	CHECK(recv_wait(y, buf, sizeof(buf), 0, &from, 300) < 0,
	      "a datagram for port %u reached the socket of port %u", px, py);
	rclose(y);
	rclose(p);
}

/* ---- IPv6: ::1, and a dual-stack socket that hears IPv4 --------------- */

/* Receive one datagram (up to WAIT_MS) with its source as sockaddr_in6. */
static ssize_t recv6(int rs, char *buf, size_t len, struct sockaddr_storage *from,
		     socklen_t *fl)
{
	struct pollfd p = { .fd = rs, .events = POLLIN };

	*fl = sizeof(*from);
	if (rpoll(&p, 1, WAIT_MS) != 1)
		return -1;
	return rrecvfrom(rs, buf, len, MSG_DONTWAIT, (struct sockaddr *)from, fl);
}

static void ipv6(void *arg)
{
	struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
	struct sockaddr_storage from;
	socklen_t fl, l = sizeof(a6);
	char buf[32];
	int s = rsocket(AF_INET6, SOCK_DGRAM, 0), c = rsocket(AF_INET6, SOCK_DGRAM, 0);

	(void)arg;
	REQUIRE(s >= 0 && c >= 0, "rsocket AF_INET6");
	REQUIRE(!rbind(s, (struct sockaddr *)&a6, sizeof(a6)) &&
		!rgetsockname(s, (struct sockaddr *)&a6, &l), "rbind [::1]:0");
	for (int i = 0; i < 3; i++) {	/* the first over UDP, then UD */
		const struct sockaddr_in6 *f6 = (const void *)&from;

		REQUIRE(rsendto(c, "six", 3, 0, (struct sockaddr *)&a6, sizeof(a6)) == 3,
			"rsendto [::1]: %s", strerror(errno));
		REQUIRE(recv6(s, buf, sizeof(buf), &from, &fl) == 3, "over ::1 (%d)", i);
		CHECK(fl == sizeof(struct sockaddr_in6) && f6->sin6_family == AF_INET6 &&
		      IN6_IS_ADDR_LOOPBACK(&f6->sin6_addr), "the source is not [::1]");
		REQUIRE(rsendto(s, "back", 4, 0, (struct sockaddr *)&from, fl) == 4, "rsendto");
		REQUIRE(recv6(c, buf, sizeof(buf), &from, &fl) == 4, "back over ::1 (%d)", i);
	}
	rclose(c);
	rclose(s);

	/* dual stack: an AF_INET6 socket on [::] hears 127.0.0.1, v4-mapped */
	{
		struct sockaddr_in6 any = { .sin6_family = AF_INET6 };
		struct sockaddr_in to = loop_addr(0), f4;
		int c4 = rsocket(AF_INET, SOCK_DGRAM, 0), v6only = 1, s2;

		s = rsocket(AF_INET6, SOCK_DGRAM, 0);
		l = sizeof(any);
		REQUIRE(s >= 0 && c4 >= 0 && !rbind(s, (struct sockaddr *)&any, sizeof(any)) &&
			!rgetsockname(s, (struct sockaddr *)&any, &l), "rbind [::]:0");
		to.sin_port = any.sin6_port;
		for (int i = 0; i < 3; i++) {
			const struct sockaddr_in6 *f6 = (const void *)&from;

			REQUIRE(rsendto(c4, "four", 4, 0, (struct sockaddr *)&to,
					sizeof(to)) == 4, "rsendto");
			REQUIRE(recv6(s, buf, sizeof(buf), &from, &fl) == 4, "v4 to [::] (%d)", i);
			CHECK(IN6_IS_ADDR_V4MAPPED(&f6->sin6_addr) &&
			      f6->sin6_addr.s6_addr[12] == 127, "the source is not v4-mapped");
			REQUIRE(rsendto(s, "mapped", 6, 0, (struct sockaddr *)&from, fl) == 6,
				"rsendto v4-mapped: %s", strerror(errno));
			REQUIRE(recv_wait(c4, buf, sizeof(buf), 0, &f4, WAIT_MS) == 6,
				"back to IPv4 (%d)", i);
		}
		/* a v6only socket hears no IPv4 */
		s2 = rsocket(AF_INET6, SOCK_DGRAM, 0);
		any.sin6_port = 0;
		l = sizeof(any);
		REQUIRE(s2 >= 0 && !rsetsockopt(s2, IPPROTO_IPV6, IPV6_V6ONLY, &v6only,
						sizeof(v6only)) &&
			!rbind(s2, (struct sockaddr *)&any, sizeof(any)) &&
			!rgetsockname(s2, (struct sockaddr *)&any, &l), "a v6only socket");
		to.sin_port = any.sin6_port;
		REQUIRE(rsendto(c4, "four", 4, 0, (struct sockaddr *)&to, sizeof(to)) == 4,
			"rsendto");
		{
			struct pollfd pf = { .fd = s2, .events = POLLIN };

			CHECK(rpoll(&pf, 1, 200) == 0, "a v6only socket heard IPv4");
		}
		rclose(s2);
		rclose(c4);
		rclose(s);
	}
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
	t_case("hostile_udp", hostile_udp, NULL);
	t_case("hostile_ud", hostile_ud, NULL);
	t_case("stale_qpn", stale_qpn, NULL);
	t_case("ipv6", ipv6, NULL);
	t_pair("echo", echo_server, echo_client, NULL);
	t_pair("peek_trunc", peek_server, peek_client, NULL);
	t_pair("connected", conn_server, conn_client, NULL);
	t_pair("burst", burst_server, burst_client, NULL);
	t_pair("restart", restart_server, restart_client, NULL);
	t_pair("rpoll", poll_server, poll_client, NULL);
	return t_finish();
}
