/* SPDX-License-Identifier: MIT */
/*
 * Conformance: both sides of an RC connection send at once, more than the
 * transport buffers: each must go on receiving while its own sends wait
 * for room, and, when the peer's Sends outrun the receives posted, a Send
 * on its way must not keep the application from posting more (on a NIC,
 * ibv_post_send never waits for the peer; the responder's RNR retries do).
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

#define MiB (1024 * 1024)

struct side {
	struct t_res r;
	char *buf;
	size_t len;
	struct ibv_mr *mr;
};

static void side_open(struct side *s, const struct t_opts *o, size_t len)
{
	t_res_open(&s->r, o);
	s->len = len;
	s->buf = t_alloc(len);
	s->mr = t_reg(&s->r, s->buf, len, IBV_ACCESS_LOCAL_WRITE);
}

static void side_close(struct side *s)
{
	t_res_close(&s->r);
	free(s->buf);
}

/* ------------------------------------------------------------------ */
/* Both sides send at once, more than the transport buffers           */
/* ------------------------------------------------------------------ */

/* Each side sends XSENDS messages of XSEND_LEN while the other does the
 * same: over TCP both sockets fill, and each side must go on receiving
 * while its own send waits for room. */
#define XSENDS 8
#define XSEND_LEN (4u * MiB)

static void xsend_side(struct t_peer *p, unsigned mine, unsigned theirs)
{
	struct t_opts o = t_opts_default();
	struct side s;
	size_t half = (size_t)XSENDS * XSEND_LEN;
	struct ibv_wc wc[XSENDS];
	int got;

	o.separate_cqs = true;
	o.max_send_wr = XSENDS;
	o.max_recv_wr = XSENDS;
	side_open(&s, &o, 2 * half); /* [what we send][what we receive] */
	for (int i = 0; i < XSENDS; i++)
		t_pattern_fill(s.buf + (size_t)i * XSEND_LEN, XSEND_LEN, mine + (unsigned)i);
	memset(s.buf + half, 0, half);
	t_connect_pair(p, &s.r, s.mr, NULL);
	for (int i = 0; i < XSENDS; i++)
		REQUIRE(t_post_recv(s.r.qp, (uint64_t)i, s.buf + half + (size_t)i * XSEND_LEN,
				    XSEND_LEN, s.mr->lkey) == 0,
			"ibv_post_recv #%d", i);
	t_barrier(p); /* both sides' receives are posted */
	for (int i = 0; i < XSENDS; i++)
		REQUIRE(t_post_send(s.r.qp, (uint64_t)i, IBV_WR_SEND,
				    s.buf + (size_t)i * XSEND_LEN, XSEND_LEN, s.mr->lkey,
				    IBV_SEND_SIGNALED, 0, 0) == 0,
			"ibv_post_send #%d", i);
	got = t_poll(s.r.send_cq, wc, XSENDS, T_WAIT_MS);
	CHECK(got == XSENDS, "%d of %d sends completed", got, XSENDS);
	for (int i = 0; i < got; i++)
		CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)i,
		      "send completion %d: %s wr_id %llu", i, t_wc_status_str(wc[i].status),
		      (unsigned long long)wc[i].wr_id);
	got = t_poll(s.r.recv_cq, wc, XSENDS, T_WAIT_MS);
	CHECK(got == XSENDS, "%d of %d messages received", got, XSENDS);
	for (int i = 0; i < got; i++) {
		long bad;

		if (!CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)i &&
				   wc[i].byte_len == XSEND_LEN,
			   "receive %d: %s wr_id %llu byte_len %u", i,
			   t_wc_status_str(wc[i].status), (unsigned long long)wc[i].wr_id,
			   wc[i].byte_len))
			continue;
		bad = t_pattern_check(s.buf + half + (size_t)i * XSEND_LEN, XSEND_LEN,
				      theirs + (unsigned)i);
		CHECK(bad < 0, "message %d differs at %ld", i, bad);
	}
	t_barrier(p);
	side_close(&s);
}

static void xsend_parent(struct t_peer *p, void *arg)
{
	xsend_side(p, 100, 200);
}

static void xsend_child(struct t_peer *p, void *arg)
{
	xsend_side(p, 200, 100);
}

/* ---- More Sends each way than the other side has receives posted ----
 *
 * Each side posts BEYOND_RECVS receives, then BEYOND_MSGS Sends of
 * BEYOND_LEN at once, then polls, and reposts each receive it takes.  The
 * Sends beyond the first ones wait for the peer's reposts (RNR, retried
 * for ever).  Over TCP both sides once sat inside ibv_post_send, each
 * waiting for room that only the other's reading makes, neither reading
 * (its receives used up, its application in the send): the connection
 * died at the retry budget (qperf rc_bi_bw, "Retries exceeded"). */
#define BEYOND_MSGS 24
#define BEYOND_LEN MiB
#define BEYOND_RECVS 2
#define BEYOND_MS 20000

static void beyond_side(struct t_peer *p, unsigned mine, unsigned theirs)
{
	struct t_opts o = t_opts_default();
	struct side s;
	size_t half = (size_t)BEYOND_MSGS * BEYOND_LEN;
	struct ibv_wc wc[8];
	int sent = 0, got = 0;
	uint64_t t0;

	o.separate_cqs = true;
	o.max_send_wr = BEYOND_MSGS;
	o.max_recv_wr = BEYOND_RECVS;
	o.rnr_retry = 7; /* for ever */
	side_open(&s, &o, half + (size_t)BEYOND_RECVS * BEYOND_LEN);
	for (int i = 0; i < BEYOND_MSGS; i++)
		t_pattern_fill(s.buf + (size_t)i * BEYOND_LEN, BEYOND_LEN, mine + (unsigned)i);
	t_connect_pair(p, &s.r, s.mr, NULL);
	for (int i = 0; i < BEYOND_RECVS; i++)
		REQUIRE(t_post_recv(s.r.qp, (uint64_t)i, s.buf + half + (size_t)i * BEYOND_LEN,
				    BEYOND_LEN, s.mr->lkey) == 0, "ibv_post_recv #%d", i);
	t_barrier(p); /* both sides' receives are posted */
	t0 = t_now_ms();
	for (int i = 0; i < BEYOND_MSGS; i++)
		REQUIRE(t_post_send(s.r.qp, (uint64_t)i, IBV_WR_SEND,
				    s.buf + (size_t)i * BEYOND_LEN, BEYOND_LEN, s.mr->lkey,
				    IBV_SEND_SIGNALED, 0, 0) == 0,
			"ibv_post_send #%d", i);
	t_note("%d Sends of %d MiB posted in %llu ms", BEYOND_MSGS, BEYOND_LEN / MiB,
	       (unsigned long long)(t_now_ms() - t0));
	while ((sent < BEYOND_MSGS || got < BEYOND_MSGS) && t_now_ms() - t0 < BEYOND_MS) {
		int n = ibv_poll_cq(s.r.recv_cq, 8, wc);

		REQUIRE(n >= 0, "ibv_poll_cq: %d", n);
		for (int i = 0; i < n; i++, got++) {
			uint64_t slot = wc[i].wr_id;
			char *at = s.buf + half + (size_t)slot * BEYOND_LEN;
			long bad;

			REQUIRE(wc[i].status == IBV_WC_SUCCESS && slot < BEYOND_RECVS &&
					wc[i].byte_len == BEYOND_LEN,
				"receive %d: %s wr_id %llu byte_len %u", got,
				t_wc_status_str(wc[i].status), (unsigned long long)slot,
				wc[i].byte_len);
			bad = t_pattern_check(at, BEYOND_LEN, theirs + (unsigned)got);
			CHECK(bad < 0, "message %d differs at %ld", got, bad);
			REQUIRE(t_post_recv(s.r.qp, slot, at, BEYOND_LEN, s.mr->lkey) == 0,
				"ibv_post_recv again");
		}
		n = ibv_poll_cq(s.r.send_cq, 8, wc);
		REQUIRE(n >= 0, "ibv_poll_cq: %d", n);
		for (int i = 0; i < n; i++, sent++)
			REQUIRE(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)sent,
				"Send %d: %s wr_id %llu", sent, t_wc_status_str(wc[i].status),
				(unsigned long long)wc[i].wr_id);
	}
	CHECK(sent == BEYOND_MSGS && got == BEYOND_MSGS,
	      "after %d ms: %d of %d Sends completed, %d of %d received", BEYOND_MS, sent,
	      BEYOND_MSGS, got, BEYOND_MSGS);
	t_barrier(p);
	side_close(&s);
}

static void beyond_parent(struct t_peer *p, void *arg)
{
	beyond_side(p, 300, 400);
}

static void beyond_child(struct t_peer *p, void *arg)
{
	beyond_side(p, 400, 300);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	t_pair_and_tcp("both_sides_send_at_once", xsend_parent, xsend_child, NULL);
	t_pair_and_tcp("both_sides_send_beyond_receives", beyond_parent, beyond_child, NULL);
	return t_finish();
}
