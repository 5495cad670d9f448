/* SPDX-License-Identifier: MIT */
/*
 * The urdma API (<urdma.h>, liburdma.so.1): configuration errors, echo with
 * hellos, flow control in both directions with a tiny queue, orderly close
 * and a killed peer, refused connections, one-sided operations with every
 * check (and the target's memory compared byte for byte), many connections
 * on one context, and a thread-safe context shared by threads.
 * The parent is the server, the child the client; run with
 * URDMA_TRANSPORT=tcp for the same over TCP, and with API_HOST=the server's
 * address and T_CHILD_NETNS=another namespace across two hosts
 * (tests/net/api.sh).
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <urdma.h>

#include "harness.h"

#define WAIT_MS 10000

/* The server's address: where it listens and the client connects. */
static const char *host(void)
{
	const char *h = getenv("API_HOST");

	return h && *h ? h : "127.0.0.1";
}

/* The next event of type on c (any conn if NULL); fails the case on
 * anything else than what is asked. */
static urdma_event expect(urdma_ctx *ctx, urdma_conn *c, int type)
{
	urdma_event ev = { 0 };
	int r = urdma_wait(ctx, c, type, &ev, WAIT_MS);

	REQUIRE(r == 0, "urdma_wait(type %d): %s", type, urdma_strerror(r));
	REQUIRE(ev.type == type, "event %d (status %s) instead of %d", ev.type,
		urdma_strerror(ev.status), type);
	return ev;
}

static void cfg_errors(void *arg)
{
	urdma_cfg bad[] = {
		{ .reserved = { 1 } },
		{ .queue_depth = 2 },
		{ .queue_depth = 100000 },
		{ .connect_timeout_ms = -1 },
		{ .buf_size = 16 },
		{ .inline_max = 9000, .buf_size = 4096 },
		{ .flags = 0x80 },
		{ .device = "no_such_device" },
		{ .queue_depth = 8, .buf_count = 7 },
		{ .spin_us = -2 },
		{ .queue_depth = 8192 }, /* a send queue of 16,385 WRs */
	};
	urdma_ctx *ctx;
	char big[URDMA_HELLO_MAX + 1] = { 0 };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		errno = 0;
		ctx = urdma_ctx_create(&bad[i]);
		CHECK(!ctx && (errno == EINVAL || errno == ENODEV),
		      "bad config %zu: ctx %p errno %d", i, (void *)ctx, errno);
		if (ctx)
			urdma_ctx_destroy(ctx);
	}
	/* the default inline size follows a small buffer size */
	ctx = urdma_ctx_create(&(urdma_cfg){ .buf_size = 64 });
	CHECK(ctx, "64-byte buffers: %s", strerror(errno));
	urdma_ctx_destroy(ctx);
	ctx = urdma_ctx_create(NULL);
	REQUIRE(ctx, "defaults: %s", strerror(errno));
	CHECK(urdma_ctx_fd(ctx) >= 0, "fd");
	CHECK(urdma_buf_size(ctx) == 8192, "default buffer size");
	errno = 0;
	CHECK(!urdma_listen(ctx, "127.0.0.1:port", NULL, 0, NULL) &&
		      errno == EINVAL, "bad port: errno %d", errno);
	CHECK(!urdma_listen(ctx, "127.0.0.1:0", big, sizeof(big), NULL) &&
		      errno == EINVAL, "hello too long: errno %d", errno);
	CHECK(!urdma_connect(ctx, NULL, NULL, 0, NULL) && errno == EINVAL,
	      "no address");
	CHECK(urdma_send(NULL, "x", 1, NULL) == -EINVAL, "send on NULL");
	CHECK(urdma_poll(ctx, NULL, 1, 0) == -EINVAL, "poll without room");
	CHECK(!strcmp(urdma_strerror(-ERANGE), "outside the remote region"),
	      "strerror");
	CHECK(urdma_strerror(-12345) != NULL, "strerror of anything");
	CHECK(!strcmp(urdma_strerror(-EPIPE), "the peer closed the connection"),
	      "strerror of -EPIPE");
	CHECK(!strcmp(urdma_strerror(EAGAIN), urdma_strerror(-EAGAIN)),
	      "strerror of either sign");
	{
		urdma_event ev;

		CHECK(urdma_poll(ctx, &ev, 1, 0) == 0, "nothing to report");
		CHECK(urdma_wait(ctx, NULL, URDMA_EV_RECV, &ev, 50) ==
			      -ETIMEDOUT, "wait times out");
	}
	urdma_ctx_destroy(ctx);
}

/* ---- server side helpers ---- */

static urdma_ctx *serve(struct t_peer *p, const urdma_cfg *cfg,
			const void *hello, size_t len, urdma_conn **lis)
{
	urdma_ctx *ctx = urdma_ctx_create(cfg);

	REQUIRE(ctx, "ctx: %s", strerror(errno));
	char addr[64];

	snprintf(addr, sizeof(addr), "%s:0", host());
	*lis = urdma_listen(ctx, addr, hello, len, NULL);
	REQUIRE(*lis, "listen: %s", strerror(errno));
	t_send_u64(p, (uint64_t)urdma_conn_port(*lis));
	return ctx;
}

static urdma_conn *dial(struct t_peer *p, urdma_ctx *ctx, const void *hello,
			size_t len)
{
	char addr[64];
	urdma_conn *c;

	snprintf(addr, sizeof(addr), "%s:%u", host(),
		 (unsigned)t_recv_u64(p, WAIT_MS));
	c = urdma_connect(ctx, addr, hello, len, NULL);
	REQUIRE(c, "connect %s: %s", addr, strerror(errno));
	return c;
}

/* Echo every message until the listener's last connection closes; the
 * status each connection closed with goes back to the child. */
static void echo_loop(urdma_ctx *ctx, urdma_conn *lis, int conns,
		      int *closed_status)
{
	int open = 0, seen = 0;
	urdma_event ev[64];

	while (seen < conns || open) {
		/* longer than the op timeout of many_connections (a close
		 * that waits for room gives up after it) */
		int n = urdma_poll(ctx, ev, 64, 3 * WAIT_MS);

		REQUIRE(n > 0, "server: no event for %d ms (%d open)",
			3 * WAIT_MS, open);
		for (int i = 0; i < n; i++) {
			if (ev[i].type == URDMA_EV_ACCEPTED) {
				open++;
				seen++;
			} else if (ev[i].type == URDMA_EV_RECV) {
				int r = urdma_send(ev[i].conn, ev[i].buf,
						   ev[i].len, NULL);

				REQUIRE(r == 0, "echo: %s", urdma_strerror(r));
			} else if (ev[i].type == URDMA_EV_CLOSED &&
				   ev[i].conn != lis) {
				open--;
				if (closed_status)
					*closed_status = ev[i].status;
			}
		}
	}
}

/* ---- echo, with hellos, many sizes and a tiny queue ---- */

static void echo_server(struct t_peer *p, void *arg)
{
	urdma_cfg cfg = { .queue_depth = 4, .buf_size = 4096 };
	urdma_conn *lis;
	urdma_ctx *ctx = serve(p, &cfg, "srv", 3, &lis);
	urdma_event ev = expect(ctx, NULL, URDMA_EV_ACCEPTED);
	int status = 1;

	CHECK(ev.len == 3 && !memcmp(ev.buf, "cli", 3), "client hello");
	while (status == 1) {
		urdma_event e[16];
		int n = urdma_poll(ctx, e, 16, WAIT_MS);

		REQUIRE(n > 0, "server: silence");
		for (int i = 0; i < n; i++) {
			if (e[i].type == URDMA_EV_RECV)
				REQUIRE(!urdma_send(e[i].conn, e[i].buf,
						    e[i].len, NULL), "echo");
			else if (e[i].type == URDMA_EV_CLOSED)
				status = e[i].status;
		}
	}
	CHECK(status == 0, "the client closed in order: %s",
	      urdma_strerror(status));
	urdma_ctx_destroy(ctx);
}

static void echo_client(struct t_peer *p, void *arg)
{
	urdma_cfg cfg = { .queue_depth = 4, .buf_size = 4096 };
	urdma_ctx *ctx = urdma_ctx_create(&cfg);
	urdma_conn *c;
	urdma_event ev;
	char msg[4096];
	int sent = 0, got = 0, eagain = 0;
	const int total = 2000;

	REQUIRE(ctx, "ctx");
	c = dial(p, ctx, "cli", 3);
	ev = expect(ctx, c, URDMA_EV_CONNECTED);
	CHECK(ev.len == 3 && !memcmp(ev.buf, "srv", 3), "server hello");
	CHECK(urdma_send(c, msg, 4097, NULL) == -EMSGSIZE, "too long");
	{ /* a pool buffer given back is no longer the application's */
		void *b = urdma_buf_alloc(ctx), *b2, *b3;

		REQUIRE(b, "alloc");
		urdma_buf_free(ctx, b);
		urdma_buf_free(ctx, b); /* twice: left alone */
		CHECK(urdma_send(c, b, 8, NULL) == -EINVAL,
		      "send of a pool buffer given back");
		b2 = urdma_buf_alloc(ctx);
		b3 = urdma_buf_alloc(ctx);
		CHECK(b2 && b3 && b2 != b3,
		      "a buffer freed twice is handed out twice");
		urdma_buf_free(ctx, b2);
		urdma_buf_free(ctx, b3);
	}
	while (got < total) {
		urdma_event e[16];
		int n;

		while (sent < total) {
			size_t len = (size_t)(sent * 131) % sizeof(msg);
			void *buf = msg;
			int r;

			if (sent % 3 == 0) { /* a pool buffer: lent */
				buf = urdma_buf_alloc(ctx);
				if (!buf)
					break;
			}
			memset(buf, 'a' + sent % 26, len);
			if (len >= 4)
				memcpy(buf, &sent, 4);
			r = urdma_send(c, buf, len, NULL);
			if (r == -EAGAIN) {
				eagain++;
				if (buf != msg)
					urdma_buf_free(ctx, buf);
				break;
			}
			REQUIRE(r == 0, "send %d: %s", sent, urdma_strerror(r));
			sent++;
		}
		n = urdma_poll(ctx, e, 16, WAIT_MS);
		REQUIRE(n > 0, "client: silence at %d/%d", got, total);
		for (int i = 0; i < n; i++) {
			size_t len = (size_t)(got * 131) % sizeof(msg);
			char want[4096];

			if (e[i].type != URDMA_EV_RECV) {
				CHECK(e[i].type == URDMA_EV_WRITABLE,
				      "event %d", e[i].type);
				continue;
			}
			memset(want, 'a' + got % 26, len);
			if (len >= 4)
				memcpy(want, &got, 4);
			REQUIRE(e[i].len == len && !memcmp(e[i].buf, want, len),
				"echo %d: %zu bytes, want %zu", got, e[i].len,
				len);
			urdma_buf_free(ctx, e[i].buf);
			got++;
		}
	}
	t_note("%d messages echoed, %d sends refused for room", got, eagain);
	urdma_close(c);
	CHECK(urdma_send(c, "x", 1, NULL) == -ENOTCONN, "send after close");
	ev = expect(ctx, c, URDMA_EV_CLOSED);
	CHECK(ev.status == 0, "closed in order: %s", urdma_strerror(ev.status));
	urdma_ctx_destroy(ctx);
}

/* ---- A blocking ping-pong whose round trips outlast 30 us (64 KiB over
 * TCP: 50-60 us here) spins through them once the waits have been seen,
 * rather than arming the CQ on each: then the progress thread took every
 * message (the stream unparked for the sleep), woke per round trip and
 * signalled the CQ's channel, and the hand-offs doubled the round trip.
 * Counted: the voluntary switches of this process's other threads (the
 * library's), under one in four round trips.  Each side on a CPU of its
 * own, its threads with it, as the benchmark runs it (unpinned, the
 * progress thread often found another CPU free, and the case did not
 * tell).  Skipped when even a fixed 250 us spin gives round trips over
 * 150 us (an ASan build), judged on a connection of its own. ---- */

#define PP_LEN 65536
#define PP_MSGS 400

/* This process, and the threads it makes, on the which-th CPU it may use,
 * when it may use two or more (else, or if that fails, where it is). */
static void pin(int which)
{
	cpu_set_t set;

	if (sched_getaffinity(0, sizeof(set), &set) || CPU_COUNT(&set) < 2)
		return;
	for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
		if (!CPU_ISSET(cpu, &set) || which--)
			continue;
		CPU_ZERO(&set);
		CPU_SET(cpu, &set);
		if (sched_setaffinity(0, sizeof(set), &set))
			t_note("not pinned to CPU %d: %s", cpu, strerror(errno));
		return;
	}
}

static void pp_server(struct t_peer *p, void *arg)
{
	urdma_cfg cfg = { .buf_size = PP_LEN, .buf_count = 256 };
	urdma_conn *lis;
	urdma_ctx *ctx;
	int closed = 1;

	pin(1);
	ctx = serve(p, &cfg, "srv", 3, &lis);
	echo_loop(ctx, lis, 2, &closed); /* pp_client's two connections */
	CHECK(closed == 0, "closed in order: %s", urdma_strerror(closed));
	urdma_ctx_destroy(ctx);
}

/* n round trips of PP_LEN on a new connection of a context made from cfg
 * (spin_us: its spin); the mean round trip in us, and in *sw the library's
 * threads' sleeps meanwhile (after a first n that teach the waits). */
static uint64_t pp_run(const char *addr, int spin_us, int n, long *sw)
{
	urdma_cfg cfg = { .buf_size = PP_LEN, .buf_count = 256, .spin_us = spin_us };
	urdma_ctx *ctx = urdma_ctx_create(&cfg);
	static char msg[PP_LEN];
	urdma_conn *c;
	urdma_event ev;
	uint64_t t0 = 0;

	REQUIRE(ctx, "ctx");
	c = urdma_connect(ctx, addr, "cli", 3, NULL);
	REQUIRE(c, "connect %s: %s", addr, strerror(errno));
	expect(ctx, c, URDMA_EV_CONNECTED);
	for (int i = 0; i < 2 * n; i++) {
		if (i == n) {
			*sw = t_other_threads_switches();
			t0 = t_now_us();
		}
		memset(msg, 'a' + i % 26, 64);
		REQUIRE(!urdma_send(c, msg, PP_LEN, NULL), "send %d", i);
		ev = expect(ctx, c, URDMA_EV_RECV);
		REQUIRE(ev.len == PP_LEN && !memcmp(ev.buf, msg, 64), "echo %d", i);
		urdma_buf_free(ctx, ev.buf);
	}
	*sw = t_other_threads_switches() - *sw;
	t0 = (t_now_us() - t0) / n;
	urdma_close(c);
	expect(ctx, c, URDMA_EV_CLOSED);
	urdma_ctx_destroy(ctx);
	return t0;
}

static void pp_client(struct t_peer *p, void *arg)
{
	char addr[64];
	uint64_t rt, cal;
	long sw;

	pin(0);
	snprintf(addr, sizeof(addr), "%s:%u", host(),
		 (unsigned)t_recv_u64(p, WAIT_MS));
	/* What a spin as long as the bound (250 us) gives on this machine:
	 * round trips past 150 us (a slow machine, an ASan build) would not
	 * be met by the stretched spin either, and sleep, as they should. */
	cal = pp_run(addr, 250, PP_MSGS / 4, &sw);
	rt = pp_run(addr, 0, PP_MSGS, &sw);
	t_note("%d round trips of %d B: %llu us each (%llu with a fixed 250 us "
	       "spin), %.2f wake-ups of the library's threads each", PP_MSGS,
	       PP_LEN, (unsigned long long)rt, (unsigned long long)cal,
	       (double)sw / PP_MSGS);
	if (cal > 150)
		t_skip("a round trip took %llu us with a 250 us spin",
		       (unsigned long long)cal);
	CHECK(sw * 4 < PP_MSGS, "the library's threads woke %ld times in %d "
	      "round trips", sw, PP_MSGS);
}

/* ---- both directions at once ---- */

#define FLOW_MSGS 20000

static void flow_side(urdma_ctx *ctx, urdma_conn *c, bool server)
{
	uint32_t sent = 0, got = 0;
	int closed = 1; /* not yet */

	while (got < FLOW_MSGS || sent < FLOW_MSGS) {
		urdma_event e[32];
		int n;

		while (sent < FLOW_MSGS) {
			int r = urdma_send(c, &sent, sizeof(sent), NULL);

			if (r == -EAGAIN)
				break;
			REQUIRE(r == 0, "send: %s", urdma_strerror(r));
			sent++;
		}
		n = urdma_poll(ctx, e, 32, got < FLOW_MSGS ? WAIT_MS : 0);
		REQUIRE(n > 0 || got == FLOW_MSGS,
			"%s: silence, sent %u got %u",
			server ? "server" : "client", sent, got);
		for (int i = 0; i < n; i++) {
			uint32_t v;

			if (e[i].type == URDMA_EV_CLOSED)
				closed = e[i].status; /* the peer was done */
			if (e[i].type != URDMA_EV_RECV)
				continue;
			memcpy(&v, e[i].buf, 4);
			REQUIRE(e[i].len == 4 && v == got, "message %u is %u",
				got, v);
			got++;
			urdma_buf_free(ctx, e[i].buf);
		}
	}
	/* what is still queued goes before the goodbye */
	urdma_close(c);
	if (closed == 1)
		closed = expect(ctx, c, URDMA_EV_CLOSED).status;
	CHECK(closed == 0, "%s: closed: %s", server ? "server" : "client",
	      urdma_strerror(closed));
}

/* arg: the configuration of both sides (queue 4 and 256 B buffers if NULL) */
static void flow_server(struct t_peer *p, void *arg)
{
	urdma_cfg cfg = { .queue_depth = 4, .buf_size = 256 };
	urdma_conn *lis;
	urdma_ctx *ctx = serve(p, arg ? arg : &cfg, NULL, 0, &lis);
	urdma_event ev = expect(ctx, NULL, URDMA_EV_ACCEPTED);

	flow_side(ctx, ev.conn, true);
	urdma_ctx_destroy(ctx);
}

static void flow_client(struct t_peer *p, void *arg)
{
	urdma_cfg cfg = { .queue_depth = 4, .buf_size = 256 };
	urdma_ctx *ctx = urdma_ctx_create(arg ? arg : &cfg);
	urdma_conn *c = dial(p, ctx, NULL, 0);

	expect(ctx, c, URDMA_EV_CONNECTED);
	flow_side(ctx, c, false);
	urdma_ctx_destroy(ctx);
}

/* ---- a receiver that keeps its buffers: its pool runs dry ---- */

#define POOL 8
#define HOLD_MSGS 200

static void hold_server(struct t_peer *p, void *arg)
{
	urdma_cfg cfg = { .queue_depth = 4, .buf_size = 256, .buf_count = POOL };
	urdma_conn *lis;
	urdma_ctx *ctx = serve(p, &cfg, NULL, 0, &lis);
	urdma_event ev = expect(ctx, NULL, URDMA_EV_ACCEPTED);
	void *held[POOL];
	uint32_t got = 0, v;

	/* We keep every buffer: once the pool's 8 are ours, receives can't
	 * be re-posted, no credit is granted and the sender stops. */
	while (!urdma_wait(ctx, NULL, URDMA_EV_RECV, &ev, 300)) {
		REQUIRE(ev.type == URDMA_EV_RECV, "event %d", ev.type);
		REQUIRE(got < POOL, "more messages held than pool buffers");
		memcpy(&v, ev.buf, 4);
		REQUIRE(v == got, "message %u is %u", got, v);
		held[got++] = ev.buf;
	}
	CHECK(got > 4, "the receives were re-posted while buffers lasted");
	t_note("%u messages held when the pool ran dry", got);
	/* buffers back: the starved receives get them, credits flow again */
	for (uint32_t i = 0; i < got; i++)
		urdma_buf_free(ctx, held[i]);
	while (got < HOLD_MSGS) {
		ev = expect(ctx, NULL, URDMA_EV_RECV);
		memcpy(&v, ev.buf, 4);
		REQUIRE(v == got, "message %u is %u", got, v);
		urdma_buf_free(ctx, ev.buf);
		got++;
	}
	t_barrier(p);
	urdma_ctx_destroy(ctx);
}

static void hold_client(struct t_peer *p, void *arg)
{
	urdma_ctx *ctx = urdma_ctx_create(NULL);
	urdma_conn *c = dial(p, ctx, NULL, 0);
	uint32_t sent = 0;

	expect(ctx, c, URDMA_EV_CONNECTED);
	while (sent < HOLD_MSGS) {
		urdma_event e[8];
		int r = urdma_send(c, &sent, 4, NULL);

		REQUIRE(r == 0 || r == -EAGAIN, "send: %s", urdma_strerror(r));
		sent += r == 0;
		urdma_poll(ctx, e, 8, r ? 100 : 0);
	}
	urdma_close(c); /* sends what is queued first */
	CHECK(expect(ctx, c, URDMA_EV_CLOSED).status == 0, "closed in order");
	t_barrier(p);
	urdma_ctx_destroy(ctx);
}

/* ---- a peer that dies ---- */

static void killed_server(struct t_peer *p, void *arg)
{
	urdma_conn *lis;
	urdma_ctx *ctx = serve(p, NULL, NULL, 0, &lis);
	urdma_event ev = expect(ctx, NULL, URDMA_EV_ACCEPTED);
	urdma_conn *c = ev.conn;

	ev = expect(ctx, c, URDMA_EV_RECV);
	urdma_buf_free(ctx, ev.buf);
	t_peer_kill(p);
	ev = expect(ctx, c, URDMA_EV_CLOSED);
	CHECK(ev.status == -ECONNRESET, "a killed peer: %s",
	      urdma_strerror(ev.status));
	CHECK(urdma_send(c, "x", 1, NULL) < 0, "send on a closed connection");
	urdma_ctx_destroy(ctx);
}

static void killed_client(struct t_peer *p, void *arg)
{
	urdma_ctx *ctx = urdma_ctx_create(NULL);
	urdma_conn *c = dial(p, ctx, NULL, 0);

	expect(ctx, c, URDMA_EV_CONNECTED);
	REQUIRE(!urdma_send(c, "hi", 2, NULL), "send");
	for (;;) {
		urdma_event e;

		urdma_poll(ctx, &e, 1, 1000);
	}
}

/* ---- the two sides' largest messages differ ---- */

static void sizes_server(struct t_peer *p, void *arg)
{
	urdma_cfg cfg = { .buf_size = 256 };
	urdma_conn *lis;
	urdma_ctx *ctx = serve(p, &cfg, NULL, 0, &lis);

	echo_loop(ctx, lis, 2, NULL);
	urdma_ctx_destroy(ctx);
}

/* The client takes 8 KiB, the server 256 B: a larger message is refused
 * at urdma_send once connected, and fails the connection with -EMSGSIZE
 * if it was queued before (never the peer's receive). */
static void sizes_client(struct t_peer *p, void *arg)
{
	urdma_ctx *ctx = urdma_ctx_create(NULL);
	static char msg[1000];
	urdma_conn *a, *b;
	urdma_event ev;
	char addr[64];

	REQUIRE(ctx, "ctx");
	snprintf(addr, sizeof(addr), "%s:%u", host(),
		 (unsigned)t_recv_u64(p, WAIT_MS));
	a = urdma_connect(ctx, addr, NULL, 0, NULL);
	REQUIRE(a, "connect: %s", strerror(errno));
	CHECK(urdma_send(a, msg, sizeof(msg), NULL) == 0, "queued");
	CHECK(urdma_wait(ctx, a, URDMA_EV_CLOSED, &ev, WAIT_MS) == 0 &&
		      ev.type == URDMA_EV_CLOSED && ev.status == -EMSGSIZE,
	      "queued, too large for the peer: event %d, %s", ev.type,
	      urdma_strerror(ev.status));
	b = urdma_connect(ctx, addr, NULL, 0, NULL);
	REQUIRE(b, "connect: %s", strerror(errno));
	expect(ctx, b, URDMA_EV_CONNECTED);
	CHECK(urdma_send(b, msg, 257, NULL) == -EMSGSIZE, "257 B to 256 B");
	CHECK(urdma_send(b, msg, 256, NULL) == 0, "256 B");
	ev = expect(ctx, b, URDMA_EV_RECV);
	CHECK(ev.len == 256, "echo of %zu bytes", ev.len);
	urdma_buf_free(ctx, ev.buf);
	urdma_close(b);
	CHECK(expect(ctx, b, URDMA_EV_CLOSED).status == 0, "closed in order");
	urdma_ctx_destroy(ctx);
}

/* ---- nobody listens ---- */

static void refused(void *arg)
{
	urdma_cfg cfg = { .connect_timeout_ms = 3000 };
	urdma_ctx *ctx = urdma_ctx_create(&cfg);
	urdma_conn *lis, *c;
	urdma_event ev;
	char addr[64];
	int port;

	REQUIRE(ctx, "ctx");
	/* a port that was free a moment ago */
	lis = urdma_listen(ctx, "127.0.0.1:0", NULL, 0, NULL);
	REQUIRE(lis, "listen");
	port = urdma_conn_port(lis);
	urdma_close(lis);
	expect(ctx, lis, URDMA_EV_CLOSED);
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
	c = urdma_connect(ctx, addr, NULL, 0, NULL);
	REQUIRE(c, "connect");
	REQUIRE(!urdma_wait(ctx, c, URDMA_EV_CONNECTED, &ev, WAIT_MS),
		"an answer");
	CHECK(ev.type == URDMA_EV_CLOSED && ev.status < 0,
	      "refused: event %d, %s", ev.type, urdma_strerror(ev.status));
	t_note("refused connection: %s", urdma_strerror(ev.status));
	urdma_ctx_destroy(ctx);
}

/* ---- one-sided ---- */

#define REGION 4096

static void rma_server(struct t_peer *p, void *arg)
{
	static uint8_t mem[REGION] __attribute__((aligned(64)));
	uint8_t want[REGION];
	urdma_rmem desc;
	urdma_ctx *ctx = urdma_ctx_create(NULL);
	urdma_mem *m;
	urdma_conn *lis;
	char addr[64];

	REQUIRE(ctx, "ctx");
	memset(mem, 0x5a, sizeof(mem));
	m = urdma_reg(ctx, mem, sizeof(mem),
		      URDMA_REMOTE_READ | URDMA_REMOTE_WRITE |
			      URDMA_REMOTE_ATOMIC,
		      &desc);
	REQUIRE(m, "reg: %s", strerror(errno));
	snprintf(addr, sizeof(addr), "%s:0", host());
	lis = urdma_listen(ctx, addr, &desc, sizeof(desc), NULL);
	REQUIRE(lis, "listen");
	t_send_u64(p, (uint64_t)urdma_conn_port(lis));
	expect(ctx, NULL, URDMA_EV_ACCEPTED);
	/* serve until the client is done: one-sided needs nothing from us,
	 * but the context must make progress for the connection itself */
	for (int done = 0; !done;) {
		urdma_event e[8];
		int n = urdma_poll(ctx, e, 8, WAIT_MS);

		REQUIRE(n > 0, "server: silence");
		for (int i = 0; i < n; i++)
			if (e[i].type == URDMA_EV_CLOSED && e[i].conn != lis)
				done = 1;
	}
	/* what the client did: bytes 8..107 written, then 200 fetch-and-adds
	 * of 1 at offset 0, a compare-and-swap at offset 128 */
	memset(want, 0x5a, sizeof(want));
	for (int i = 0; i < 100; i++)
		want[8 + i] = (uint8_t)i;
	{
		uint64_t v = 0x5a5a5a5a5a5a5a5aull + 200, s = 77;

		memcpy(want, &v, 8);
		memcpy(want + 128, &s, 8);
	}
	CHECK(!memcmp(mem, want, sizeof(mem)),
	      "the region holds exactly what the client did");
	CHECK(urdma_dereg(m) == 0, "dereg");
	urdma_ctx_destroy(ctx);
}

static void rma_client(struct t_peer *p, void *arg)
{
	urdma_ctx *ctx = urdma_ctx_create(NULL);
	urdma_conn *c = dial(p, ctx, NULL, 0);
	urdma_event ev = expect(ctx, c, URDMA_EV_CONNECTED);
	urdma_rmem rm, ro, bad;
	uint8_t src[100], *local = malloc(8192), *unreg = malloc(8192);
	uint64_t old;
	urdma_mem *lm;

	REQUIRE(ev.len == sizeof(rm), "the descriptor in the hello");
	memcpy(&rm, ev.buf, sizeof(rm));
	lm = urdma_reg(ctx, local, 8192, URDMA_LOCAL_WRITE, NULL);
	REQUIRE(lm, "reg local");
	for (int i = 0; i < 100; i++)
		src[i] = (uint8_t)i;
	/* checks that post nothing */
	ro = rm;
	ro.access = URDMA_REMOTE_READ;
	CHECK(urdma_write(c, src, 100, &ro, 8, NULL) == -EACCES, "read-only");
	CHECK(urdma_write(c, src, 100, &rm, REGION - 99, NULL) == -ERANGE,
	      "past the end");
	CHECK(urdma_write(c, src, 1, &rm, UINT64_MAX, NULL) == -ERANGE,
	      "offset overflow");
	CHECK(urdma_read(c, local, 8, &rm, REGION, NULL) == -ERANGE,
	      "read past the end");
	CHECK(urdma_write(c, unreg, 1000, &rm, 0, NULL) == -EFAULT,
	      "unregistered local memory");
	CHECK(urdma_read(c, unreg, 8, &rm, 0, NULL) == -EFAULT,
	      "read into unregistered memory");
	CHECK(urdma_atomic(c, URDMA_FADD, &rm, 4, 1, 0, NULL) == -EINVAL,
	      "misaligned atomic");
	CHECK(urdma_atomic(c, 9, &rm, 0, 1, 0, NULL) == -EINVAL, "bad op");
	CHECK(urdma_atomic(c, URDMA_FADD, &rm, REGION, 1, 0, NULL) == -ERANGE,
	      "atomic past the end");
	/* the operations */
	REQUIRE(!urdma_write(c, src, 100, &rm, 8, (void *)1), "write");
	ev = expect(ctx, c, URDMA_EV_WRITE);
	CHECK(ev.status == 0 && ev.user == (void *)1, "write done");
	REQUIRE(!urdma_read(c, local, 108, &rm, 0, (void *)2), "read");
	ev = expect(ctx, c, URDMA_EV_READ);
	CHECK(ev.status == 0 && !memcmp(local + 8, src, 100), "read back");
	for (int i = 0; i < 200; i++) {
		REQUIRE(!urdma_atomic(c, URDMA_FADD, &rm, 0, 1, 0, NULL),
			"fadd %d", i);
		ev = expect(ctx, c, URDMA_EV_ATOMIC);
		CHECK(ev.value == 0x5a5a5a5a5a5a5a5aull + (uint64_t)i,
		      "fadd %d saw %#llx", i, (unsigned long long)ev.value);
	}
	old = 0x5a5a5a5a5a5a5a5aull;
	REQUIRE(!urdma_atomic(c, URDMA_CAS, &rm, 128, old, 77, NULL), "cas");
	ev = expect(ctx, c, URDMA_EV_ATOMIC);
	CHECK(ev.value == old, "cas old value");
	REQUIRE(!urdma_atomic(c, URDMA_CAS, &rm, 128, old, 99, NULL), "cas 2");
	ev = expect(ctx, c, URDMA_EV_ATOMIC);
	CHECK(ev.value == 77, "a failed cas returns the value");
	/* a forged key: the peer refuses, the connection fails */
	bad = rm;
	bad.rkey ^= 0x5500;
	REQUIRE(!urdma_write(c, src, 100, &bad, 200, (void *)3), "bad key");
	ev = expect(ctx, c, URDMA_EV_WRITE);
	CHECK(ev.status == -EACCES, "bad key: %s", urdma_strerror(ev.status));
	ev = expect(ctx, c, URDMA_EV_CLOSED);
	CHECK(ev.status == -EACCES, "closed with the error: %s",
	      urdma_strerror(ev.status));
	urdma_dereg(lm);
	urdma_ctx_destroy(ctx);
	free(local);
	free(unreg);
}

/* ---- a full send queue, and a context destroyed while connected ---- */

static void full_server(struct t_peer *p, void *arg)
{
	static uint64_t mem[64];
	urdma_rmem desc;
	urdma_ctx *ctx = urdma_ctx_create(NULL);
	urdma_conn *lis;
	urdma_mem *m;
	urdma_event ev;
	char addr[64];

	REQUIRE(ctx, "ctx");
	m = urdma_reg(ctx, mem, sizeof(mem),
		      URDMA_REMOTE_WRITE | URDMA_REMOTE_ATOMIC, &desc);
	REQUIRE(m, "reg");
	snprintf(addr, sizeof(addr), "%s:0", host());
	lis = urdma_listen(ctx, addr, &desc, sizeof(desc), NULL);
	REQUIRE(lis, "listen");
	t_send_u64(p, (uint64_t)urdma_conn_port(lis));
	ev = expect(ctx, NULL, URDMA_EV_ACCEPTED);
	/* the client destroys its context without closing: still a goodbye */
	ev = expect(ctx, ev.conn, URDMA_EV_CLOSED);
	CHECK(ev.status == 0, "closed in order by urdma_ctx_destroy: %s",
	      urdma_strerror(ev.status));
	CHECK(mem[0] == (uint64_t)t_recv_u64(p, WAIT_MS),
	      "the last write and every fetch-and-add landed: %llu",
	      (unsigned long long)mem[0]);
	urdma_dereg(m);
	urdma_ctx_destroy(ctx);
}

/* Post without polling until -EAGAIN; WRITABLE then says it may go on. */
static int fill(urdma_ctx *ctx, urdma_conn *c, const urdma_rmem *rm,
		bool atomic, uint64_t *val)
{
	int n = 0, r;

	for (;; n++) {
		uint64_t v = *val + 1;

		r = atomic ? urdma_atomic(c, URDMA_FADD, rm, 0, 1, 0, NULL) :
			     urdma_write(c, &v, 8, rm, 0, NULL);
		if (r)
			break;
		*val = v;
		REQUIRE(n < 100000, "the send queue never fills");
	}
	CHECK(r == -EAGAIN, "a full queue: %s", urdma_strerror(r));
	expect(ctx, c, URDMA_EV_WRITABLE);
	return n;
}

static void full_client(struct t_peer *p, void *arg)
{
	urdma_ctx *ctx = urdma_ctx_create(NULL);
	urdma_conn *c = dial(p, ctx, NULL, 0);
	urdma_event ev = expect(ctx, c, URDMA_EV_CONNECTED);
	urdma_rmem rm;
	uint64_t val = 0;
	int n;

	REQUIRE(ev.len == sizeof(rm), "the descriptor in the hello");
	memcpy(&rm, ev.buf, sizeof(rm));
	n = fill(ctx, c, &rm, false, &val);
	CHECK(n >= 64, "%d writes before the queue was full", n);
	REQUIRE(!urdma_write(c, &(uint64_t){ val + 1 }, 8, &rm, 0, (void *)1),
		"a write after WRITABLE");
	val++;
	ev = expect(ctx, c, URDMA_EV_WRITE);
	CHECK(ev.status == 0, "write: %s", urdma_strerror(ev.status));
	n = fill(ctx, c, &rm, true, &val);
	CHECK(n >= 1, "%d atomics before the queue was full", n);
	/* the atomics' events are still to come: drain them */
	for (int i = 0; i < n; i++)
		CHECK(expect(ctx, c, URDMA_EV_ATOMIC).status == 0, "atomic");
	t_send_u64(p, val);
	urdma_ctx_destroy(ctx); /* no urdma_close */
}

/* ---- many connections on one context ---- */

#define MANY_MAX 1000
/* API_MANY=N runs fewer (ctest does under ASan). */
static int many(void)
{
	const char *e = getenv("API_MANY");
	int n = e ? atoi(e) : MANY_MAX;

	return n > 0 && n <= MANY_MAX ? n : MANY_MAX;
}

static void many_server(struct t_peer *p, void *arg)
{
	urdma_cfg cfg = { .queue_depth = 4, .buf_size = 256,
			  .op_timeout_ms = 20000 };
	urdma_conn *lis;
	urdma_ctx *ctx = serve(p, &cfg, NULL, 0, &lis);

	echo_loop(ctx, lis, many(), NULL);
	urdma_ctx_destroy(ctx);
}

static void many_client(struct t_peer *p, void *arg)
{
	urdma_cfg cfg = { .queue_depth = 4, .buf_size = 256,
			  .connect_timeout_ms = 20000, .op_timeout_ms = 20000 };
	urdma_ctx *ctx = urdma_ctx_create(&cfg);
	static urdma_conn *c[MANY_MAX];
	const int MANY = many();
	char addr[64];
	int connected = 0, echoed = 0, closed = 0;
	uint64_t t0 = (uint64_t)time(NULL);

	REQUIRE(ctx, "ctx");
	snprintf(addr, sizeof(addr), "%s:%u", host(),
		 (unsigned)t_recv_u64(p, WAIT_MS));
	for (int i = 0; i < MANY; i++) {
		c[i] = urdma_connect(ctx, addr, NULL, 0, (void *)(intptr_t)i);
		REQUIRE(c[i], "connect %d: %s", i, strerror(errno));
		REQUIRE(!urdma_send(c[i], &i, sizeof(i), NULL), "send %d", i);
	}
	while (closed < MANY) {
		urdma_event e[64];
		int n = urdma_poll(ctx, e, 64, 20000);

		REQUIRE(n > 0, "silence: %d connected, %d echoed, %d closed",
			connected, echoed, closed);
		for (int i = 0; i < n; i++) {
			int k = (int)(intptr_t)e[i].user, v;

			switch (e[i].type) {
			case URDMA_EV_CONNECTED:
				connected++;
				break;
			case URDMA_EV_RECV:
				memcpy(&v, e[i].buf, sizeof(v));
				CHECK(v == k, "connection %d got %d", k, v);
				urdma_buf_free(ctx, e[i].buf);
				echoed++;
				urdma_close(e[i].conn);
				break;
			case URDMA_EV_CLOSED:
				CHECK(e[i].status == 0, "connection %d: %s", k,
				      urdma_strerror(e[i].status));
				closed++;
				break;
			}
		}
	}
	CHECK(connected == MANY && echoed == MANY, "%d connected, %d echoed",
	      connected, echoed);
	t_note("%d connections, one echo each, closed: %llu s", MANY,
	       (unsigned long long)((uint64_t)time(NULL) - t0));
	urdma_ctx_destroy(ctx);
}

/* ---- a thread-safe context shared by threads ---- */

#define TS_THREADS 4
#define TS_MSGS 2000

struct ts {
	urdma_ctx *ctx;
	urdma_conn *c;
	int id;
};

static void *ts_sender(void *arg)
{
	struct ts *t = arg;

	for (int i = 0; i < TS_MSGS;) {
		int v[2] = { t->id, i };
		int r = urdma_send(t->c, v, sizeof(v), NULL);

		if (r == -EAGAIN) {
			urdma_event e;

			/* another thread may be polling: that is allowed */
			urdma_wait(t->ctx, t->c, URDMA_EV_WRITABLE, &e, 100);
			continue;
		}
		if (r)
			return (void *)1;
		i++;
	}
	return NULL;
}

static void ts_server(struct t_peer *p, void *arg)
{
	urdma_cfg cfg = { .queue_depth = 8, .buf_size = 256 };
	urdma_conn *lis;
	urdma_ctx *ctx = serve(p, &cfg, NULL, 0, &lis);
	urdma_event ev = expect(ctx, NULL, URDMA_EV_ACCEPTED);
	int next[TS_THREADS] = { 0 }, total = 0, closed = 1;

	while (total < TS_THREADS * TS_MSGS) {
		urdma_event e[32];
		int n = urdma_poll(ctx, e, 32, WAIT_MS), v[2];

		REQUIRE(n > 0, "server: silence at %d", total);
		for (int i = 0; i < n; i++) {
			if (e[i].type == URDMA_EV_CLOSED)
				closed = e[i].status;
			if (e[i].type != URDMA_EV_RECV)
				continue;
			memcpy(v, e[i].buf, sizeof(v));
			REQUIRE(v[0] >= 0 && v[0] < TS_THREADS &&
					v[1] == next[v[0]],
				"thread %d message %d, want %d", v[0], v[1],
				next[v[0]]);
			next[v[0]]++;
			total++;
			urdma_buf_free(ctx, e[i].buf);
		}
	}
	if (closed == 1)
		closed = expect(ctx, ev.conn, URDMA_EV_CLOSED).status;
	CHECK(closed == 0, "closed in order: %s", urdma_strerror(closed));
	urdma_ctx_destroy(ctx);
}

static void ts_client(struct t_peer *p, void *arg)
{
	urdma_cfg cfg = { .queue_depth = 8, .buf_size = 256,
			  .flags = URDMA_CFG_THREADSAFE };
	urdma_ctx *ctx = urdma_ctx_create(&cfg);
	urdma_conn *c = dial(p, ctx, NULL, 0);
	pthread_t th[TS_THREADS];
	struct ts t[TS_THREADS];

	expect(ctx, c, URDMA_EV_CONNECTED);
	for (int i = 0; i < TS_THREADS; i++) {
		t[i] = (struct ts){ ctx, c, i };
		pthread_create(&th[i], NULL, ts_sender, &t[i]);
	}
	for (int i = 0; i < TS_THREADS; i++) {
		void *r;

		pthread_join(th[i], &r);
		CHECK(!r, "sender %d failed", i);
	}
	urdma_close(c); /* sends what is queued first */
	CHECK(expect(ctx, c, URDMA_EV_CLOSED).status == 0, "closed in order");
	urdma_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
	struct rlimit rl;

	/* a connection holds a few fds (its CM socket, its QP's) */
	if (!getrlimit(RLIMIT_NOFILE, &rl)) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	t_init(argc, argv);
	t_set_case_timeout(120);
	t_case("cfg_errors", cfg_errors, NULL);
	t_pair("echo", echo_server, echo_client, NULL);
	t_pair("flow_both_ways", flow_server, flow_client, NULL);
	/* and without the spin before sleeping */
	t_pair("flow_small_pool", flow_server, flow_client,
	       &(urdma_cfg){ .queue_depth = 4, .buf_size = 256,
			     .buf_count = 12, .spin_us = -1 });
	/* every pool buffer is a posted receive: sends go inline or wait */
	t_pair("flow_pool_all_receives", flow_server, flow_client,
	       &(urdma_cfg){ .queue_depth = 4, .buf_size = 256,
			     .buf_count = 4 });
	t_pair("receiver_keeps_buffers", hold_server, hold_client, NULL);
	t_pair("peer_killed", killed_server, killed_client, NULL);
	t_pair("sizes_differ", sizes_server, sizes_client, NULL);
	t_pair("ping_pong_64k_spins", pp_server, pp_client, NULL);
	t_case("refused", refused, NULL);
	t_pair("one_sided", rma_server, rma_client, NULL);
	t_pair("queue_full", full_server, full_client, NULL);
	t_pair("many_connections", many_server, many_client, NULL);
	t_pair("threadsafe", ts_server, ts_client, NULL);
	return t_finish();
}
