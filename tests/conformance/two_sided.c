/* SPDX-License-Identifier: MIT */
/*
 * Conformance: two-sided operations on RC QPs between two processes:
 * SEND/RECV, SEND_WITH_IMM, scatter/gather, inline data, unsignaled sends,
 * ordering, RNR retry, and a receive buffer that is too small.
 *
 * In every case the parent is the sender and the child the receiver.
 */
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024 * 1024)

struct side {
	struct t_res r;
	char *buf;
	size_t len;
	struct ibv_mr *mr;
	struct t_conn remote;
};

static void side_open(struct side *s, const struct t_opts *o, size_t len)
{
	t_res_open(&s->r, o);
	s->len = len;
	s->buf = t_alloc(len);
	s->mr = t_reg(&s->r, s->buf, len,
		      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
}

static void side_close(struct side *s)
{
	t_res_close(&s->r);
	free(s->buf);
}

/* ------------------------------------------------------------------ */
/* SEND / SEND_WITH_IMM of various sizes                               */
/* ------------------------------------------------------------------ */

static const uint32_t sizes[] = {0, 1, 4096, MiB, 4097, 1000, 65537};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define CANARY 0xEE

struct sizes_arg {
	bool imm;
	bool use_gid;
	enum ibv_mtu mtu; /* 0: the harness default (1024) */
};

static uint32_t imm_for(size_t i) { return 0x12345600u + (uint32_t)i; }

/* Connects, tolerating a refusal of dlid-only addressing at RTR (real RoCE
 * devices demand a GRH and refuse is_global = 0 with EINVAL). Returns false
 * if the connection was refused by either side. */
static bool connect_maybe_dlid(struct t_peer *p, struct side *s)
{
	struct t_conn local;
	t_conn_local(&s->r, s->mr, &local);
	t_exchange(p, &local, &s->remote);
	int ret = t_modify_init(&s->r);
	REQUIRE(ret == 0, "RESET->INIT: %d", ret);
	int rtr = t_modify_rtr(&s->r, &s->remote);
	CHECK(rtr == 0 || (rtr == EINVAL && !s->r.opts.use_gid), "INIT->RTR: %d", rtr);
	t_send_u64(p, (uint64_t)rtr);
	uint64_t peer_rtr = t_recv_u64(p, T_WAIT_MS);
	CHECK(rtr == (int)peer_rtr, "the two sides disagree on RTR: %d here, %d there", rtr,
	      (int)peer_rtr);
	if (rtr != 0 || peer_rtr != 0)
		return false;
	ret = t_modify_rts(&s->r);
	REQUIRE(ret == 0, "RTR->RTS: %d", ret);
	t_barrier(p);
	return true;
}

static void sizes_parent(struct t_peer *p, void *argp)
{
	const struct sizes_arg *arg = argp;
	struct t_opts o = t_opts_default();
	o.use_gid = arg->use_gid;
	if (arg->mtu)
		o.path_mtu = arg->mtu;
	struct side s;
	side_open(&s, &o, MiB);
	if (!connect_maybe_dlid(p, &s)) {
		t_note("dlid-only addressing refused at RTR with EINVAL (as real RoCE devices do)");
		side_close(&s);
		return;
	}
	for (size_t i = 0; i < NSIZES; i++) {
		t_pattern_fill(s.buf, sizes[i], (unsigned)i);
		t_barrier(p); /* the receive is posted */
		struct ibv_sge sge = {.addr = (uintptr_t)s.buf, .length = sizes[i], .lkey = s.mr->lkey};
		struct ibv_send_wr wr = {.wr_id = 100 + i, .sg_list = &sge,
					 .num_sge = sizes[i] ? 1 : 0,
					 .opcode = arg->imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED};
		wr.imm_data = htonl(imm_for(i));
		struct ibv_send_wr *bad = NULL;
		int ret = ibv_post_send(s.r.qp, &wr, &bad);
		REQUIRE(ret == 0, "ibv_post_send(size %u): %d", sizes[i], ret);
		struct ibv_wc wc;
		char what[64];
		snprintf(what, sizeof(what), "send of %u bytes", sizes[i]);
		if (t_expect_wc(s.r.send_cq, &wc, 100 + i, IBV_WC_SUCCESS, IBV_WC_SEND, what))
			CHECK(wc.qp_num == s.r.qp->qp_num, "%s: wc.qp_num %u, expected %u", what,
			      wc.qp_num, s.r.qp->qp_num);
		t_barrier(p); /* the receiver has checked */
	}
	side_close(&s);
}

static void sizes_child(struct t_peer *p, void *argp)
{
	const struct sizes_arg *arg = argp;
	struct t_opts o = t_opts_default();
	o.use_gid = arg->use_gid;
	if (arg->mtu)
		o.path_mtu = arg->mtu;
	struct side s;
	side_open(&s, &o, MiB + 4096);
	if (!connect_maybe_dlid(p, &s)) {
		side_close(&s);
		return;
	}
	for (size_t i = 0; i < NSIZES; i++) {
		memset(s.buf, CANARY, s.len);
		/* The receive buffer is larger than the message. */
		int ret = t_post_recv(s.r.qp, 500 + i, s.buf, MiB + 1024, s.mr->lkey);
		REQUIRE(ret == 0, "ibv_post_recv: %d", ret);
		t_barrier(p);
		struct ibv_wc wc;
		char what[64];
		snprintf(what, sizeof(what), "receive of %u bytes", sizes[i]);
		if (t_expect_wc(s.r.recv_cq, &wc, 500 + i, IBV_WC_SUCCESS, IBV_WC_RECV, what)) {
			CHECK(wc.byte_len == sizes[i], "%s: byte_len %u", what, wc.byte_len);
			CHECK(wc.qp_num == s.r.qp->qp_num, "%s: wc.qp_num %u, expected %u", what,
			      wc.qp_num, s.r.qp->qp_num);
			if (arg->imm) {
				CHECK(wc.wc_flags & IBV_WC_WITH_IMM, "%s: IBV_WC_WITH_IMM not set "
				      "(wc_flags 0x%x)", what, wc.wc_flags);
				CHECK(ntohl(wc.imm_data) == imm_for(i), "%s: imm_data 0x%08x, expected "
				      "0x%08x", what, ntohl(wc.imm_data), imm_for(i));
			} else {
				CHECK(!(wc.wc_flags & IBV_WC_WITH_IMM), "%s: IBV_WC_WITH_IMM set on a "
				      "plain SEND", what);
			}
			long bad = t_pattern_check(s.buf, sizes[i], (unsigned)i);
			CHECK(bad < 0, "%s: data differs at offset %ld", what, bad);
			for (size_t k = sizes[i]; k < MiB + 1024; k++) {
				if (!CHECK((unsigned char)s.buf[k] == CANARY,
					   "%s: receive buffer written past the message, at offset %zu",
					   what, k))
					break;
			}
		}
		t_barrier(p);
	}
	side_close(&s);
}

/* ------------------------------------------------------------------ */
/* Scatter/gather: odd splits, different on each side                  */
/* ------------------------------------------------------------------ */

#define SG_TOTAL 10007u
#define SG_MAX 64

/* Splits `total` bytes into k pieces at pseudo-random cut points (seeded),
 * placing them in buf with gaps between them. */
static void make_sges(struct ibv_sge *sge, int k, uint32_t total, char *buf, uint32_t lkey,
		      unsigned seed)
{
	uint32_t cuts[SG_MAX + 1];
	cuts[0] = 0;
	cuts[k] = total;
	unsigned x = seed * 2654435761u + 12345u;
	for (int i = 1; i < k; i++) {
		x = x * 1103515245u + 12345u;
		cuts[i] = 1 + (x >> 8) % (total - 1);
	}
	/* sort and make distinct (every piece at least one byte) */
	for (int i = 1; i < k; i++)
		for (int j = i + 1; j < k; j++)
			if (cuts[j] < cuts[i]) {
				uint32_t t = cuts[i];
				cuts[i] = cuts[j];
				cuts[j] = t;
			}
	for (int i = 1; i < k; i++)
		if (cuts[i] <= cuts[i - 1])
			cuts[i] = cuts[i - 1] + 1;
	for (int i = k - 1; i >= 1; i--)
		if (cuts[i] >= cuts[i + 1])
			cuts[i] = cuts[i + 1] - 1;
	size_t off = 3;
	for (int i = 0; i < k; i++) {
		uint32_t len = cuts[i + 1] - cuts[i];
		sge[i].addr = (uintptr_t)(buf + off);
		sge[i].length = len;
		sge[i].lkey = lkey;
		off += len + 5 + 2 * (size_t)i; /* a gap of odd size */
	}
}

static int sg_counts(int max_sge, int *out)
{
	int n = 0;
	int cand[] = {1, 2, 3, 7, max_sge - 1, max_sge};
	for (size_t i = 0; i < sizeof(cand) / sizeof(cand[0]); i++) {
		int c = cand[i];
		if (c < 1 || c > max_sge || c > SG_MAX)
			continue;
		if (n && out[n - 1] >= c)
			continue;
		out[n++] = c;
	}
	return n;
}

static int sg_max(struct t_peer *p)
{
	/* Both sides use the same SGE counts: the smaller device limit. */
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_device_attr a;
	REQUIRE(ibv_query_device(ctx, &a) == 0, "ibv_query_device");
	ibv_close_device(ctx);
	int m = a.max_sge < SG_MAX ? a.max_sge : SG_MAX;
	return m;
}

static void sg_parent(struct t_peer *p, void *arg)
{
	int m = sg_max(p);
	struct t_opts o = t_opts_default();
	o.max_send_sge = o.max_recv_sge = (uint32_t)m;
	struct side s;
	side_open(&s, &o, 64 * 1024);
	CHECK(s.r.cap.max_send_sge >= (uint32_t)m, "max_send_sge %u", s.r.cap.max_send_sge);
	t_connect_pair(p, &s.r, s.mr, NULL);
	int counts[8];
	int nc = sg_counts(m, counts);
	for (int c = 0; c < nc; c++) {
		struct ibv_sge sge[SG_MAX];
		make_sges(sge, counts[c], SG_TOTAL, s.buf, s.mr->lkey, 1000u + (unsigned)c);
		/* Fill the pieces so that, concatenated, they form the pattern. */
		size_t pos = 0;
		for (int i = 0; i < counts[c]; i++)
			for (uint32_t b = 0; b < sge[i].length; b++, pos++)
				((char *)(uintptr_t)sge[i].addr)[b] = (char)t_pattern_byte(pos, (unsigned)c);
		t_barrier(p);
		struct ibv_send_wr wr = {.wr_id = (uint64_t)c, .sg_list = sge, .num_sge = counts[c],
					 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
		struct ibv_send_wr *bad;
		int ret = ibv_post_send(s.r.qp, &wr, &bad);
		REQUIRE(ret == 0, "ibv_post_send with %d SGEs: %d", counts[c], ret);
		char what[64];
		snprintf(what, sizeof(what), "send with %d SGEs", counts[c]);
		t_expect_wc(s.r.send_cq, NULL, (uint64_t)c, IBV_WC_SUCCESS, IBV_WC_SEND, what);
		t_barrier(p);
	}
	side_close(&s);
}

static void sg_child(struct t_peer *p, void *arg)
{
	int m = sg_max(p);
	struct t_opts o = t_opts_default();
	o.max_send_sge = o.max_recv_sge = (uint32_t)m;
	struct side s;
	side_open(&s, &o, 64 * 1024);
	CHECK(s.r.cap.max_recv_sge >= (uint32_t)m, "max_recv_sge %u", s.r.cap.max_recv_sge);
	t_connect_pair(p, &s.r, s.mr, NULL);
	int counts[8];
	int nc = sg_counts(m, counts);
	for (int c = 0; c < nc; c++) {
		/* A different split on this side (and the same count of SGEs). */
		struct ibv_sge sge[SG_MAX];
		make_sges(sge, counts[c], SG_TOTAL, s.buf, s.mr->lkey, 7777u + (unsigned)c);
		memset(s.buf, CANARY, s.len);
		struct ibv_recv_wr wr = {.wr_id = 50u + (uint64_t)c, .sg_list = sge,
					 .num_sge = counts[c]};
		struct ibv_recv_wr *bad;
		int ret = ibv_post_recv(s.r.qp, &wr, &bad);
		REQUIRE(ret == 0, "ibv_post_recv with %d SGEs: %d", counts[c], ret);
		t_barrier(p);
		{
			char what[64];
			snprintf(what, sizeof(what), "receive into %d SGEs", counts[c]);
			struct ibv_wc wc;
			if (t_expect_wc(s.r.recv_cq, &wc, 50u + (uint64_t)c, IBV_WC_SUCCESS,
					IBV_WC_RECV, what)) {
				CHECK(wc.byte_len == SG_TOTAL, "%s: byte_len %u", what, wc.byte_len);
				size_t pos = 0;
				long bad_at = -1;
				for (int i = 0; i < counts[c] && bad_at < 0; i++)
					for (uint32_t b = 0; b < sge[i].length; b++, pos++)
						if ((unsigned char)((char *)(uintptr_t)sge[i].addr)[b] !=
						    t_pattern_byte(pos, (unsigned)c)) {
							bad_at = (long)pos;
							break;
						}
				CHECK(bad_at < 0, "%s: data differs at message offset %ld", what, bad_at);
				/* The gaps between the SGEs are untouched. */
				for (int i = 0; i + 1 < counts[c]; i++) {
					char *gap = (char *)(uintptr_t)(sge[i].addr + sge[i].length);
					char *end = (char *)(uintptr_t)sge[i + 1].addr;
					for (; gap < end; gap++)
						if (!CHECK((unsigned char)*gap == CANARY,
							   "%s: gap after SGE %d was written", what, i))
							break;
				}
			}
		}
		t_barrier(p);
	}
	side_close(&s);
}

/* ------------------------------------------------------------------ */
/* Inline sends                                                        */
/* ------------------------------------------------------------------ */

#define INLINE_WANT 64

static void inline_parent(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	o.max_inline_data = INLINE_WANT;
	struct side s;
	side_open(&s, &o, 4096);
	REQUIRE(s.r.cap.max_inline_data >= INLINE_WANT, "max_inline_data %u < %u requested",
		s.r.cap.max_inline_data, INLINE_WANT);
	t_connect_pair(p, &s.r, s.mr, NULL);
	uint32_t lens[] = {1, 16, INLINE_WANT, s.r.cap.max_inline_data};
	for (int i = 0; i < 4; i++) {
		/* An unregistered stack buffer with a bogus lkey: for inline
		 * data the lkey is not checked (ibv_post_send(3)). */
		unsigned char stackbuf[1024];
		uint32_t len = lens[i] > sizeof(stackbuf) ? (uint32_t)sizeof(stackbuf) : lens[i];
		t_pattern_fill(stackbuf, len, 40u + (unsigned)i);
		struct ibv_sge sge = {.addr = (uintptr_t)stackbuf, .length = len, .lkey = 0xdeadbeef};
		struct ibv_send_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1,
					 .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED};
		struct ibv_send_wr *bad;
		int ret = ibv_post_send(s.r.qp, &wr, &bad);
		/* The buffer may be reused as soon as the post returns. */
		memset(stackbuf, 0x5A, sizeof(stackbuf));
		REQUIRE(ret == 0, "inline post of %u bytes: %d", len, ret);
		t_expect_wc(s.r.send_cq, NULL, (uint64_t)i, IBV_WC_SUCCESS, IBV_WC_SEND, "inline send");
		t_send_u64(p, len);
		t_barrier(p);
	}
	/* Inline data over max_inline_data: an immediate error. */
	uint32_t too_big = s.r.cap.max_inline_data + 1;
	char *big = t_alloc(too_big);
	struct ibv_sge sge = {.addr = (uintptr_t)big, .length = too_big, .lkey = s.mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 99, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad = NULL;
	int ret = ibv_post_send(s.r.qp, &wr, &bad);
	CHECK(ret != 0, "inline post of max_inline_data + 1 = %u bytes succeeded", too_big);
	CHECK(ret == 0 || bad == &wr, "inline post too big: bad_wr %p, expected %p", (void *)bad,
	      (void *)&wr);
	t_send_u64(p, ret == 0 ? 1 : 0); /* tell the receiver whether a message is coming */
	if (ret == 0)
		t_poll(s.r.send_cq, &(struct ibv_wc){0}, 1, T_WAIT_MS);
	t_barrier(p);
	free(big);
	side_close(&s);
}

static void inline_child(struct t_peer *p, void *arg)
{
	struct side s;
	side_open(&s, NULL, 4096);
	t_connect_pair(p, &s.r, s.mr, NULL);
	for (int i = 0; i < 4; i++) {
		REQUIRE(t_post_recv(s.r.qp, 10u + (uint64_t)i, s.buf, 4096, s.mr->lkey) == 0,
			"ibv_post_recv");
		uint64_t len = t_recv_u64(p, T_WAIT_MS);
		struct ibv_wc wc;
		if (t_expect_wc(s.r.recv_cq, &wc, 10u + (uint64_t)i, IBV_WC_SUCCESS, IBV_WC_RECV,
				"inline receive")) {
			CHECK(wc.byte_len == len, "inline receive: byte_len %u, expected %llu",
			      wc.byte_len, (unsigned long long)len);
			long bad = t_pattern_check(s.buf, len, 40u + (unsigned)i);
			CHECK(bad < 0, "inline message of %llu bytes differs at offset %ld "
			      "(was the buffer read after the post returned?)",
			      (unsigned long long)len, bad);
		}
		t_barrier(p);
	}
	uint64_t coming = t_recv_u64(p, T_WAIT_MS);
	if (coming)
		t_poll(s.r.recv_cq, &(struct ibv_wc){0}, 1, T_WAIT_MS);
	t_barrier(p);
	side_close(&s);
}

/* ------------------------------------------------------------------ */
/* Unsignaled sends and sq_sig_all                                     */
/* ------------------------------------------------------------------ */

#define NUNSIG 20

static void unsig_parent(struct t_peer *p, void *arg)
{
	bool sig_all = arg != NULL;
	struct t_opts o = t_opts_default();
	o.sq_sig_all = sig_all;
	struct side s;
	side_open(&s, &o, 4096);
	t_connect_pair(p, &s.r, s.mr, NULL);
	t_barrier(p); /* receives posted */
	for (int i = 0; i < NUNSIG; i++) {
		/* With sq_sig_all = 0 only every 5th is signaled. */
		unsigned flags = (i % 5 == 4) ? IBV_SEND_SIGNALED : 0;
		s.buf[i] = (char)i;
		int ret = t_post_send(s.r.qp, (uint64_t)i, IBV_WR_SEND, s.buf + i, 1, s.mr->lkey,
				      flags, 0, 0);
		REQUIRE(ret == 0, "ibv_post_send #%d: %d", i, ret);
	}
	struct ibv_wc wc[NUNSIG + 1];
	int want = sig_all ? NUNSIG : NUNSIG / 5;
	int got = t_poll(s.r.send_cq, wc, want, T_WAIT_MS);
	CHECK(got == want, "%d send completions, expected %d", got, want);
	for (int i = 0; i < got; i++) {
		uint64_t exp = sig_all ? (uint64_t)i : (uint64_t)(5 * i + 4);
		CHECK(wc[i].wr_id == exp && wc[i].status == IBV_WC_SUCCESS,
		      "completion %d: wr_id %llu status %s, expected wr_id %llu SUCCESS", i,
		      (unsigned long long)wc[i].wr_id, t_wc_status_str(wc[i].status),
		      (unsigned long long)exp);
	}
	/* And no more. */
	int extra = t_cq_drain(s.r.send_cq, wc, NUNSIG, 200);
	CHECK(extra == 0, "%d unexpected completions for unsignaled sends (first wr_id %llu)", extra,
	      extra ? (unsigned long long)wc[0].wr_id : 0ull);
	t_barrier(p);
	side_close(&s);
}

static void unsig_child(struct t_peer *p, void *arg)
{
	struct side s;
	side_open(&s, NULL, 4096);
	t_connect_pair(p, &s.r, s.mr, NULL);
	for (int i = 0; i < NUNSIG; i++)
		REQUIRE(t_post_recv(s.r.qp, (uint64_t)i, s.buf + 64 * i, 64, s.mr->lkey) == 0,
			"ibv_post_recv #%d", i);
	t_barrier(p);
	struct ibv_wc wc[NUNSIG];
	int got = t_poll(s.r.recv_cq, wc, NUNSIG, T_WAIT_MS);
	CHECK(got == NUNSIG, "received %d of %d messages", got, NUNSIG);
	for (int i = 0; i < got; i++) {
		CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)i &&
			      wc[i].byte_len == 1 && s.buf[64 * i] == (char)i,
		      "receive %d: status %s wr_id %llu byte_len %u data %d", i,
		      t_wc_status_str(wc[i].status), (unsigned long long)wc[i].wr_id, wc[i].byte_len,
		      s.buf[64 * i]);
	}
	t_barrier(p);
	side_close(&s);
}

/* ------------------------------------------------------------------ */
/* RC ordering: many sends arrive in order                             */
/* ------------------------------------------------------------------ */

#define NORDER 2000
#define ORDER_SLOT 8192
#define RQ_DEPTH 128

static uint32_t order_len(uint32_t seq) { return 4 + (seq * 37u) % 6000u; }

static void order_parent(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	o.max_send_wr = 64;
	struct side s;
	side_open(&s, &o, 64 * ORDER_SLOT);
	t_connect_pair(p, &s.r, s.mr, NULL);
	int outstanding = 0, done = 0;
	uint32_t next = 0;
	struct ibv_wc wc[16];
	uint64_t deadline = t_now_ms() + 20000;
	while (done < NORDER) {
		while (next < NORDER && outstanding < 64) {
			char *slot = s.buf + (size_t)(next % 64) * ORDER_SLOT;
			uint32_t len = order_len(next);
			t_pattern_fill(slot, len, next);
			memcpy(slot, &next, 4);
			int ret = t_post_send(s.r.qp, next, IBV_WR_SEND, slot, len, s.mr->lkey,
					      IBV_SEND_SIGNALED, 0, 0);
			REQUIRE(ret == 0, "ibv_post_send #%u: %d", next, ret);
			next++;
			outstanding++;
		}
		int n = ibv_poll_cq(s.r.send_cq, 16, wc);
		REQUIRE(n >= 0, "ibv_poll_cq: %d", n);
		for (int i = 0; i < n; i++) {
			REQUIRE(wc[i].status == IBV_WC_SUCCESS, "send %llu: %s",
				(unsigned long long)wc[i].wr_id, t_wc_status_str(wc[i].status));
			CHECK(wc[i].wr_id == (uint64_t)done, "send completion %d has wr_id %llu: send "
			      "completions out of order", done, (unsigned long long)wc[i].wr_id);
			done++;
			outstanding--;
		}
		REQUIRE(t_now_ms() < deadline, "only %d of %d sends completed in 20 s", done, NORDER);
	}
	t_barrier_timeout(p, 20000);
	side_close(&s);
}

static void order_child(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	o.max_recv_wr = RQ_DEPTH;
	o.cq_size = 2 * RQ_DEPTH;
	struct side s;
	side_open(&s, &o, (size_t)RQ_DEPTH * ORDER_SLOT);
	uint32_t posted = 0, got = 0;
	t_connect_pair(p, &s.r, s.mr, NULL);
	/* Receives go in as the RQ drains (RNR retry covers the gaps). */
	for (; posted < RQ_DEPTH; posted++)
		REQUIRE(t_post_recv(s.r.qp, posted, s.buf + (size_t)(posted % RQ_DEPTH) * ORDER_SLOT,
				    ORDER_SLOT, s.mr->lkey) == 0, "ibv_post_recv");
	uint64_t deadline = t_now_ms() + 20000;
	int bad_reported = 0;
	while (got < NORDER) {
		struct ibv_wc wc[16];
		int n = ibv_poll_cq(s.r.recv_cq, 16, wc);
		REQUIRE(n >= 0, "ibv_poll_cq: %d", n);
		for (int i = 0; i < n; i++, got++) {
			REQUIRE(wc[i].status == IBV_WC_SUCCESS, "receive #%u: %s", got,
				t_wc_status_str(wc[i].status));
			char *slot = s.buf + (size_t)(got % RQ_DEPTH) * ORDER_SLOT;
			uint32_t seq;
			memcpy(&seq, slot, 4);
			bool ok = wc[i].wr_id == got && seq == got && wc[i].byte_len == order_len(got);
			/* bytes 0..3 carry the sequence number, the rest the pattern */
			for (uint32_t k = 4; ok && k < order_len(got); k++)
				ok = (unsigned char)slot[k] == t_pattern_byte(k, got);
			if (!ok && bad_reported++ < 5)
				CHECK(false, "receive #%u: wr_id %llu, sequence %u, byte_len %u "
				      "(expected %u): out of order or corrupt", got,
				      (unsigned long long)wc[i].wr_id, seq, wc[i].byte_len,
				      order_len(got));
			if (posted < NORDER) {
				REQUIRE(t_post_recv(s.r.qp, posted,
						    s.buf + (size_t)(posted % RQ_DEPTH) * ORDER_SLOT,
						    ORDER_SLOT, s.mr->lkey) == 0, "ibv_post_recv");
				posted++;
			}
		}
		REQUIRE(t_now_ms() < deadline, "only %u of %d messages arrived in 20 s", got, NORDER);
	}
	CHECK(bad_reported == 0, "%d receives were out of order or corrupt", bad_reported);
	t_barrier_timeout(p, 20000);
	side_close(&s);
}

/* ------------------------------------------------------------------ */
/* A SEND posted before the peer is ready (RNR retry, rnr_retry = 7)   */
/* ------------------------------------------------------------------ */

#define NEARLY 3

static void early_parent(struct t_peer *p, void *arg)
{
	struct side s;
	side_open(&s, NULL, 4096);
	struct t_conn local;
	t_conn_local(&s.r, s.mr, &local);
	t_exchange(p, &local, &s.remote);
	t_connect(&s.r, &s.remote); /* the child's QP is still in RESET */
	for (int i = 0; i < NEARLY; i++) {
		t_pattern_fill(s.buf + 1024 * i, 1000, 70u + (unsigned)i);
		int ret = t_post_send(s.r.qp, (uint64_t)i, IBV_WR_SEND, s.buf + 1024 * i, 1000,
				      s.mr->lkey, IBV_SEND_SIGNALED, 0, 0);
		REQUIRE(ret == 0, "ibv_post_send #%d: %d", i, ret);
	}
	t_send_u64(p, 1); /* "posted" */
	struct ibv_wc wc[NEARLY];
	int got = t_poll(s.r.send_cq, wc, NEARLY, T_WAIT_MS);
	CHECK(got == NEARLY, "%d of %d sends completed within %d ms", got, NEARLY, T_WAIT_MS);
	for (int i = 0; i < got; i++)
		CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)i,
		      "send %d: status %s wr_id %llu (expected SUCCESS: rnr_retry 7 retries forever)",
		      i, t_wc_status_str(wc[i].status), (unsigned long long)wc[i].wr_id);
	t_barrier(p);
	side_close(&s);
}

static void early_child(struct t_peer *p, void *arg)
{
	struct side s;
	side_open(&s, NULL, 4096);
	struct t_conn local;
	t_conn_local(&s.r, s.mr, &local);
	t_exchange(p, &local, &s.remote);
	(void)t_recv_u64(p, T_WAIT_MS); /* the sends are posted */
	/* Stay out of RTR a little (well inside the transport retry budget of
	 * timeout 14 = 67 ms x retry_cnt 7), then sit in RTS with no receive
	 * posted for longer (RNR NAKs; rnr_retry 7 = retry forever). */
	t_sleep_ms(100);
	t_connect(&s.r, &s.remote);
	t_sleep_ms(400);
	for (int i = 0; i < NEARLY; i++)
		REQUIRE(t_post_recv(s.r.qp, (uint64_t)i, s.buf + 1024 * i, 1024, s.mr->lkey) == 0,
			"ibv_post_recv");
	struct ibv_wc wc[NEARLY];
	int got = t_poll(s.r.recv_cq, wc, NEARLY, T_WAIT_MS);
	CHECK(got == NEARLY, "%d of %d messages arrived", got, NEARLY);
	for (int i = 0; i < got; i++) {
		CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)i &&
			      wc[i].byte_len == 1000,
		      "receive %d: status %s wr_id %llu byte_len %u", i, t_wc_status_str(wc[i].status),
		      (unsigned long long)wc[i].wr_id, wc[i].byte_len);
		long bad = t_pattern_check(s.buf + 1024 * i, 1000, 70u + (unsigned)i);
		CHECK(bad < 0, "message %d differs at offset %ld", i, bad);
	}
	t_barrier(p);
	side_close(&s);
}

/* ------------------------------------------------------------------ */
/* Receive buffer too small                                            */
/* ------------------------------------------------------------------ */

static void small_parent(struct t_peer *p, void *arg)
{
	struct side s;
	side_open(&s, NULL, 4096);
	t_connect_pair(p, &s.r, s.mr, NULL);
	t_barrier(p); /* receives posted */
	int ret = t_post_send(s.r.qp, 1, IBV_WR_SEND, s.buf, 200, s.mr->lkey, IBV_SEND_SIGNALED, 0, 0);
	REQUIRE(ret == 0, "ibv_post_send: %d", ret);
	/* IB: the responder NAKs with "invalid request"; on the requester
	 * that is IBV_WC_REM_INV_REQ_ERR. */
	t_expect_wc(s.r.send_cq, NULL, 1, IBV_WC_REM_INV_REQ_ERR, -1,
		    "send of 200 bytes into a 100-byte receive");
	int st = t_qp_state(s.r.qp);
	CHECK(st == IBV_QPS_ERR, "sender QP is %s after the error completion, expected ERR",
	      t_qp_state_str(st));
	t_barrier(p);
	side_close(&s);
}

static void small_child(struct t_peer *p, void *arg)
{
	struct side s;
	side_open(&s, NULL, 4096);
	t_connect_pair(p, &s.r, s.mr, NULL);
	memset(s.buf, CANARY, 4096);
	REQUIRE(t_post_recv(s.r.qp, 1, s.buf, 100, s.mr->lkey) == 0, "ibv_post_recv");
	REQUIRE(t_post_recv(s.r.qp, 2, s.buf + 2048, 1024, s.mr->lkey) == 0, "ibv_post_recv");
	t_barrier(p);
	struct ibv_wc wc;
	t_expect_wc(s.r.recv_cq, &wc, 1, IBV_WC_LOC_LEN_ERR, -1, "100-byte receive of a 200-byte send");
	/* The QP went to ERR: the other receive is flushed. */
	t_expect_wc(s.r.recv_cq, &wc, 2, IBV_WC_WR_FLUSH_ERR, -1, "the next posted receive");
	int st = t_qp_state(s.r.qp);
	CHECK(st == IBV_QPS_ERR, "receiver QP is %s after IBV_WC_LOC_LEN_ERR, expected ERR",
	      t_qp_state_str(st));
	for (int i = 100; i < 2048; i++)
		if (!CHECK((unsigned char)s.buf[i] == CANARY, "byte %d past the 100-byte receive "
			   "buffer was written", i))
			break;
	t_barrier(p);
	side_close(&s);
}

/* ------------------------------------------------------------------ */
/* Receives into an MR registered at an IOVA                           */
/* ------------------------------------------------------------------ */

/* The receive SGEs carry the MR's IOVA, not the buffer's address: small
 * and larger Sends land in the buffer all the same. */
#define RECV_IOVA 0x5a5a00000000ull
/* Receive i: iova_lens[i] bytes at RECV_IOVA + iova_offs[i] (an inline
 * one over shared memory, and one that is not) */
static const uint32_t iova_lens[] = { 8, 300 }, iova_offs[] = { 16, 1024 };

static void iova_parent(struct t_peer *p, void *arg)
{
	struct side s;
	side_open(&s, NULL, 4096);
	t_connect_pair(p, &s.r, s.mr, NULL);
	t_barrier(p); /* receives posted */
	t_pattern_fill(s.buf, 4096, 7);
	for (int k = 0; k < 2; k++) {
		REQUIRE(t_post_send(s.r.qp, (uint64_t)k, IBV_WR_SEND, s.buf, iova_lens[k],
				    s.mr->lkey, IBV_SEND_SIGNALED, 0, 0) == 0, "ibv_post_send");
		t_expect_wc(s.r.send_cq, NULL, (uint64_t)k, IBV_WC_SUCCESS, IBV_WC_SEND, "Send");
	}
	t_barrier(p);
	side_close(&s);
}

static void iova_child(struct t_peer *p, void *arg)
{
	struct side s;
	side_open(&s, NULL, 4096);
	t_connect_pair(p, &s.r, s.mr, NULL);
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = ibv_reg_mr_iova(s.r.pd, buf, 4096, RECV_IOVA, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr != NULL, "ibv_reg_mr_iova: %s", strerror(errno));
	for (int k = 0; k < 2; k++)
		REQUIRE(t_post_recv(s.r.qp, (uint64_t)k,
				    (void *)(uintptr_t)(RECV_IOVA + iova_offs[k]), 400,
				    mr->lkey) == 0, "ibv_post_recv at the IOVA");
	t_barrier(p);
	for (int k = 0; k < 2; k++) {
		struct ibv_wc wc;
		t_expect_wc(s.r.recv_cq, &wc, (uint64_t)k, IBV_WC_SUCCESS, IBV_WC_RECV, "receive");
		CHECK(wc.byte_len == iova_lens[k], "receive %d: %u bytes, not %u", k, wc.byte_len,
		      iova_lens[k]);
		long bad = t_pattern_check(buf + iova_offs[k], iova_lens[k], 7);
		CHECK(bad < 0, "%u-byte receive: byte %ld", iova_lens[k], bad);
	}
	t_barrier(p);
	CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
	free(buf);
	side_close(&s);
}

/* ------------------------------------------------------------------ */
/* ibv_resize_cq keeps the completions already in the CQ               */
/* ------------------------------------------------------------------ */

#define NRESIZE 10

static void resize_parent(struct t_peer *p, void *arg)
{
	struct side s;
	side_open(&s, NULL, 4096);
	t_connect_pair(p, &s.r, s.mr, NULL);
	t_barrier(p); /* receives posted */
	for (int i = 0; i < NRESIZE; i++) {
		s.buf[i] = (char)(i + 1);
		REQUIRE(t_post_send(s.r.qp, (uint64_t)i, IBV_WR_SEND, s.buf + i, 1, s.mr->lkey,
				    IBV_SEND_SIGNALED, 0, 0) == 0, "ibv_post_send");
	}
	struct ibv_wc wc[NRESIZE];
	CHECK(t_poll(s.r.send_cq, wc, NRESIZE, T_WAIT_MS) == NRESIZE, "sends did not complete");
	t_barrier(p);
	t_barrier(p);
	side_close(&s);
}

static void resize_child(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	o.separate_cqs = true;
	o.cq_size = 16;
	struct side s;
	side_open(&s, &o, 4096);
	t_connect_pair(p, &s.r, s.mr, NULL);
	for (int i = 0; i < NRESIZE; i++)
		REQUIRE(t_post_recv(s.r.qp, (uint64_t)i, s.buf + 64 * i, 64, s.mr->lkey) == 0,
			"ibv_post_recv");
	t_barrier(p);
	/* All sent and completed at the sender, so all received: NRESIZE
	 * completions sit unpolled in the CQ.  (Not told by the buffers: a
	 * receive buffer is defined once its completion is polled, and a
	 * small Send over shared memory lands there only then.) */
	t_barrier(p);
	t_sleep_ms(20);
	/* Larger: nothing is lost. */
	int ret = ibv_resize_cq(s.r.recv_cq, 200);
	CHECK(ret == 0, "ibv_resize_cq(200) with %d unpolled completions: %d", NRESIZE, ret);
	if (ret == 0)
		CHECK(s.r.recv_cq->cqe >= 200, "cq->cqe %d after resize to 200", s.r.recv_cq->cqe);
	/* Below the number of unpolled entries: not allowed (ibv_resize_cq(3):
	 * "cqe must be at least the number of unpolled entries"); either
	 * refused, or accepted without dropping anything. */
	ret = ibv_resize_cq(s.r.recv_cq, 4);
	if (ret == 0)
		CHECK(s.r.recv_cq->cqe >= NRESIZE, "resize to 4 accepted with %d unpolled entries and "
		      "cq->cqe is now %d", NRESIZE, s.r.recv_cq->cqe);
	struct ibv_wc wc[NRESIZE];
	int got = t_poll(s.r.recv_cq, wc, NRESIZE, T_WAIT_MS);
	CHECK(got == NRESIZE, "%d of %d completions survived ibv_resize_cq", got, NRESIZE);
	for (int i = 0; i < got; i++) {
		CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)i,
		      "completion %d after resize: %s wr_id %llu", i, t_wc_status_str(wc[i].status),
		      (unsigned long long)wc[i].wr_id);
		CHECK(wc[i].byte_len == 1 && s.buf[64 * i] == (char)(i + 1),
		      "receive %d holds %d (%u bytes)", i, s.buf[64 * i], wc[i].byte_len);
	}
	t_barrier(p);
	side_close(&s);
}

/* ---- A receiver that destroys its QP right after the message it needed,
 * with one more already arrived: as on a NIC, the sender's Sends all
 * succeed (the last was received, if never polled), and none fails before
 * the QP's retry budget would have run out. ---- */

static void gone_parent(struct t_peer *p, void *arg)
{
	struct t_res r;
	t_res_open(&r, NULL);
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	t_connect_pair(p, &r, mr, NULL);
	for (int i = 0; i < 2; i++)
		REQUIRE(t_post_send(r.qp, (uint64_t)i, IBV_WR_SEND, buf, 64, mr->lkey,
				    IBV_SEND_SIGNALED, 0, 0) == 0, "post_send");
	t_expect_wc(r.send_cq, NULL, 0, IBV_WC_SUCCESS, IBV_WC_SEND, "the first Send");
	t_expect_wc(r.send_cq, NULL, 1, IBV_WC_SUCCESS, IBV_WC_SEND,
		    "the second Send, received but never polled before the QP went");
	t_barrier(p);
	t_res_close(&r);
	free(buf);
}

static void gone_child(struct t_peer *p, void *arg)
{
	struct t_res r;
	t_res_open(&r, NULL);
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(t_modify_init(&r) == 0, "INIT");
	for (int i = 0; i < 2; i++)
		REQUIRE(t_post_recv(r.qp, (uint64_t)i, buf + 128 * i, 128, mr->lkey) == 0,
			"post_recv");
	t_connect_pair(p, &r, mr, NULL);
	struct ibv_wc wc;
	t_expect_wc(r.recv_cq, &wc, 0, IBV_WC_SUCCESS, IBV_WC_RECV, "the first message");
	/* The second is here by now or nearly (sent right after the first):
	 * go without polling it, sooner than a stream left unpolled is read
	 * by the library's own thread (2 ms over TCP). */
	t_sleep_ms(1);
	REQUIRE(ibv_destroy_qp(r.qp) == 0, "ibv_destroy_qp");
	r.qp = NULL;
	t_barrier(p);
	t_res_close(&r);
	free(buf);
}

/* ---- Over TCP: the answer that completes a Send, held back for a message
 * of the receiver's own that never comes, goes within its hold (2 ms), not
 * the progress thread's idle sleep (200 ms).  The receiver polls (its
 * stream parks, and the progress thread is asked to look at it 2 ms on),
 * takes the Send in a poll (its answer held until 2 ms after that, a later
 * deadline), then stops polling.  The earlier look woke the thread and
 * cleared the request; the held answer, not yet due, asked for nothing
 * more, and went 200 ms later (ib_send_bw over TCP: 2,000 messages of
 * 64 KiB in 265 ms, not 53). ---- */

#define HELD_MAX_MS 100

static void held_parent(struct t_peer *p, void *arg)
{
	struct t_res r;
	t_res_open(&r, NULL);
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	t_connect_pair(p, &r, mr, NULL);
	for (int i = 0; i < 3; i++) {
		t_barrier(p); /* the receiver polls now */
		t_sleep_ms(1);
		uint64_t t0 = t_now_us();
		REQUIRE(t_post_send(r.qp, (uint64_t)i, IBV_WR_SEND, buf, 64, mr->lkey,
				    IBV_SEND_SIGNALED, 0, 0) == 0, "post_send");
		t_expect_wc(r.send_cq, NULL, (uint64_t)i, IBV_WC_SUCCESS, IBV_WC_SEND,
			    "the Send");
		uint64_t us = t_now_us() - t0;
		CHECK(us < HELD_MAX_MS * 1000ull,
		      "Send %d completed after %llu us: its answer waited for the "
		      "progress thread's idle sleep", i, (unsigned long long)us);
		t_barrier(p);
	}
	t_res_close(&r);
	free(buf);
}

static void held_child(struct t_peer *p, void *arg)
{
	struct t_res r;
	t_res_open(&r, NULL);
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(t_modify_init(&r) == 0, "INIT");
	for (int i = 0; i < 3; i++)
		REQUIRE(t_post_recv(r.qp, (uint64_t)i, buf + 128 * i, 128, mr->lkey) == 0,
			"post_recv");
	t_connect_pair(p, &r, mr, NULL);
	for (int i = 0; i < 3; i++) {
		struct ibv_wc wc;
		t_barrier(p);
		/* A poll loop, then nothing: the application went elsewhere. */
		t_expect_wc(r.recv_cq, &wc, (uint64_t)i, IBV_WC_SUCCESS, IBV_WC_RECV,
			    "the Send");
		t_barrier_timeout(p, 2 * HELD_MAX_MS + 5000);
	}
	t_res_close(&r);
	free(buf);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	static struct sizes_arg plain = {.imm = false, .use_gid = true};
	static struct sizes_arg imm = {.imm = true, .use_gid = true};
	static struct sizes_arg dlid = {.imm = false, .use_gid = false};
	static struct sizes_arg mtu4096 = {.imm = false, .use_gid = true, .mtu = IBV_MTU_4096};
	t_pair("send_recv_sizes", sizes_parent, sizes_child, &plain);
	t_pair("send_with_imm_sizes", sizes_parent, sizes_child, &imm);
	t_pair("send_recv_dlid_only", sizes_parent, sizes_child, &dlid);
	t_pair("send_recv_mtu4096", sizes_parent, sizes_child, &mtu4096);
	t_pair("scatter_gather", sg_parent, sg_child, NULL);
	t_pair("inline_send", inline_parent, inline_child, NULL);
	t_pair("unsignaled_sends", unsig_parent, unsig_child, NULL);
	t_pair("sq_sig_all", unsig_parent, unsig_child, (void *)1);
	t_pair("rc_ordering", order_parent, order_child, NULL);
	t_pair("send_before_peer_ready", early_parent, early_child, NULL);
	t_pair("recv_buffer_too_small", small_parent, small_child, NULL);
	t_pair("recv_into_iova_mr", iova_parent, iova_child, NULL);
	t_pair("cq_resize_keeps_completions", resize_parent, resize_child, NULL);
	t_pair("receiver_gone_after_last_needed", gone_parent, gone_child, NULL);
	setenv("URDMA_TRANSPORT", "tcp", 1);
	t_pair("tcp_held_answer_goes", held_parent, held_child, NULL);
	unsetenv("URDMA_TRANSPORT");
	return t_finish();
}
