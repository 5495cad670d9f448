/* SPDX-License-Identifier: MIT */
/*
 * Conformance: memory windows.  The parent owns a buffer, its MR and a
 * window over part of it; the child, the peer, reaches the window with
 * its rkey.  A refused access puts both QPs in error, so each case ends
 * with at most one.
 */
#include "harness.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define LEN 8192
#define WOFF 1024 /* the window: [WOFF, WOFF + WLEN) of the buffer */
#define WLEN 2048

/* What the owner tells the peer: where and with which key. */
struct win {
	uint64_t addr;
	uint32_t rkey;
	uint32_t op; /* 0 done, 1 write, 2 read, 3 Send with Invalidate of
		      * rkey then, at once, a write through it */
	uint64_t off, len;
};

struct owner {
	struct t_res r;
	unsigned char *buf;
	struct ibv_mr *mr;
	struct ibv_mw *mw;
};

static void owner_open(struct t_peer *p, struct owner *o, enum ibv_mw_type type)
{
	t_res_open(&o->r, NULL);
	o->buf = t_alloc(LEN);
	o->mr = t_reg(&o->r, o->buf, LEN,
		      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND | IBV_ACCESS_REMOTE_READ);
	o->mw = ibv_alloc_mw(o->r.pd, type);
	REQUIRE(o->mw, "ibv_alloc_mw(type %d): %s", type, strerror(errno));
	t_connect_pair(p, &o->r, NULL, NULL);
}

static void owner_close(struct owner *o)
{
	CHECK(ibv_dealloc_mw(o->mw) == 0, "ibv_dealloc_mw");
	t_res_close(&o->r);
	free(o->buf);
}

/* A type 1 bind (ibv_bind_mw) of [WOFF, WOFF + WLEN), its completion. */
static void bind1(struct owner *o, unsigned access)
{
	uint32_t before = o->mw->rkey;
	struct ibv_mw_bind b = {
		.wr_id = 77, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = o->mr, .addr = (uintptr_t)o->buf + WOFF, .length = WLEN,
			       .mw_access_flags = access },
	};
	int ret = ibv_bind_mw(o->r.qp, o->mw, &b);
	REQUIRE(ret == 0, "ibv_bind_mw: %d", ret);
	CHECK(o->mw->rkey != before && (o->mw->rkey & ~0xffu) == (before & ~0xffu),
	      "the rkey after a bind: %#x (before %#x): a new low byte expected", o->mw->rkey,
	      before);
	t_expect_wc(o->r.send_cq, NULL, 77, IBV_WC_SUCCESS, IBV_WC_BIND_MW, "the bind");
}

/* A type 2 bind posted as a WR, with the next key. */
static void bind2(struct owner *o, unsigned access)
{
	uint32_t key = ibv_inc_rkey(o->mw->rkey);
	struct ibv_send_wr wr = {
		.wr_id = 78, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED,
		.bind_mw = { .mw = o->mw, .rkey = key,
			     .bind_info = { .mr = o->mr, .addr = (uintptr_t)o->buf + WOFF,
					    .length = WLEN, .mw_access_flags = access } },
	}, *bad;
	REQUIRE(ibv_post_send(o->r.qp, &wr, &bad) == 0, "post IBV_WR_BIND_MW");
	t_expect_wc(o->r.send_cq, NULL, 78, IBV_WC_SUCCESS, IBV_WC_BIND_MW, "the type 2 bind");
	o->mw->rkey = key;
}

/* Ask the peer to write (op 1) or read (op 2) [off, off + len) of the
 * window through rkey; its completion status comes back. */
static int peer_do(struct t_peer *p, struct owner *o, uint32_t op, uint64_t off, uint64_t len,
		   uint32_t rkey)
{
	struct win w = { (uintptr_t)o->buf + WOFF, rkey, op, off, len };
	t_send_msg(p, &w, sizeof(w));
	return (int)t_recv_u64(p, T_WAIT_MS);
}

static void peer_done(struct t_peer *p)
{
	struct win w = { 0 };
	t_send_msg(p, &w, sizeof(w));
}

/* The peer: connect, then do what it is told until op 0. */
static void peer(struct t_peer *p, void *arg)
{
	struct t_res r;
	t_res_open(&r, NULL);
	unsigned char *buf = t_alloc(LEN);
	struct ibv_mr *mr = t_reg(&r, buf, LEN, IBV_ACCESS_LOCAL_WRITE);
	t_connect_pair(p, &r, NULL, NULL);
	for (;;) {
		struct win w;
		struct ibv_wc wc;
		t_recv_msg(p, &w, sizeof(w), 30000);
		if (!w.op)
			break;
		t_pattern_fill(buf, (size_t)w.len, 9);
		if (w.op == 3) {
			struct ibv_sge sge = { (uintptr_t)buf, 16, mr->lkey };
			struct ibv_send_wr s = { .wr_id = 3, .sg_list = &sge, .num_sge = 1,
						 .opcode = IBV_WR_SEND_WITH_INV,
						 .send_flags = IBV_SEND_SIGNALED,
						 .invalidate_rkey = w.rkey }, *bad;
			uint64_t st1 = 1000, st2 = 1000;
			if (!ibv_post_send(r.qp, &s, &bad) &&
			    !t_post_send(r.qp, 4, IBV_WR_RDMA_WRITE, buf, 8, mr->lkey,
					 IBV_SEND_SIGNALED, w.addr + w.off, w.rkey)) {
				st1 = t_poll_one(r.send_cq, &wc, T_WAIT_MS, "the Send") ?
					      wc.status : 1001;
				st2 = t_poll_one(r.send_cq, &wc, T_WAIT_MS, "the write") ?
					      wc.status : 1001;
			}
			t_send_u64(p, st1 | st2 << 16);
			continue;
		}
		int ret = t_post_send(r.qp, 1, w.op == 1 ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ,
				      buf, (uint32_t)w.len, mr->lkey, IBV_SEND_SIGNALED,
				      w.addr + w.off, w.rkey);
		uint64_t st = ret ? 1000 : (t_poll_one(r.send_cq, &wc, T_WAIT_MS, "the access") ?
						    wc.status : 1001);
		t_send_u64(p, st);
	}
	t_barrier(p);
	t_res_close(&r);
	free(buf);
}

static bool outside_untouched(struct owner *o, uint64_t from, uint64_t to)
{
	for (uint64_t i = 0; i < LEN; i++)
		if ((i < from || i >= to) && o->buf[i])
			return false;
	return true;
}

/* Type 1: a write inside lands; a read without the right is refused. */
static void type1_parent(struct t_peer *p, void *arg)
{
	struct owner o;
	owner_open(p, &o, IBV_MW_TYPE_1);
	bind1(&o, IBV_ACCESS_REMOTE_WRITE);
	CHECK(ibv_dereg_mr(o.mr) == EBUSY, "deregistering an MR with a window bound to it");
	/* A type 1 window is bound with ibv_bind_mw, not a WR (on a QP in
	 * RTS, where a WR could be posted). */
	struct ibv_send_wr wr = { .opcode = IBV_WR_BIND_MW, .bind_mw = { .mw = o.mw } }, *bad;
	CHECK(ibv_post_send(o.r.qp, &wr, &bad) == EINVAL,
	      "IBV_WR_BIND_MW of a type 1 window posted");
	int st = peer_do(p, &o, 1, 100, 500, o.mw->rkey);
	CHECK(st == IBV_WC_SUCCESS, "a write inside the window: %s", ibv_wc_status_str(st));
	CHECK(t_pattern_check(o.buf + WOFF + 100, 500, 9) < 0, "the write's data");
	CHECK(outside_untouched(&o, WOFF + 100, WOFF + 600), "bytes outside the write changed");
	/* The MR's own rkey still reads; the window's, without the right,
	 * does not. */
	st = peer_do(p, &o, 2, 0, 64, o.mw->rkey);
	CHECK(st == IBV_WC_REM_ACCESS_ERR, "a read through a write-only window: %s",
	      ibv_wc_status_str(st));
	peer_done(p);
	t_barrier(p);
	owner_close(&o);
}

/* Type 1: past the window's end is refused, nothing written. */
static void bounds_parent(struct t_peer *p, void *arg)
{
	struct owner o;
	owner_open(p, &o, IBV_MW_TYPE_1);
	bind1(&o, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	int st = peer_do(p, &o, 1, WLEN - 16, 32, o.mw->rkey);
	CHECK(st == IBV_WC_REM_ACCESS_ERR, "a write past the window's end: %s",
	      ibv_wc_status_str(st));
	CHECK(outside_untouched(&o, 0, 0), "a refused write changed bytes");
	peer_done(p);
	t_barrier(p);
	owner_close(&o);
}

/* Type 1: bound to nothing is unbound; the old rkey then fails. */
static void unbind_parent(struct t_peer *p, void *arg)
{
	struct owner o;
	owner_open(p, &o, IBV_MW_TYPE_1);
	bind1(&o, IBV_ACCESS_REMOTE_WRITE);
	uint32_t old = o.mw->rkey;
	CHECK(peer_do(p, &o, 1, 0, 8, old) == IBV_WC_SUCCESS, "a write while bound");
	struct ibv_mw_bind b = { .wr_id = 79, .send_flags = IBV_SEND_SIGNALED };
	REQUIRE(ibv_bind_mw(o.r.qp, o.mw, &b) == 0, "unbind");
	t_expect_wc(o.r.send_cq, NULL, 79, IBV_WC_SUCCESS, IBV_WC_BIND_MW, "the unbind");
	CHECK(ibv_dereg_mr(o.mr) == 0, "deregistering the MR once the window is unbound");
	o.r.mrs[0] = NULL;
	int st = peer_do(p, &o, 1, 0, 8, old);
	CHECK(st == IBV_WC_REM_ACCESS_ERR, "a write with the unbound window's rkey: %s",
	      ibv_wc_status_str(st));
	peer_done(p);
	t_barrier(p);
	owner_close(&o);
}

/* Type 2: bound by a WR to this QP; after IBV_WR_LOCAL_INV its rkey
 * fails. */
static void type2_parent(struct t_peer *p, void *arg)
{
	struct owner o;
	owner_open(p, &o, IBV_MW_TYPE_2);
	bind2(&o, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	int st = peer_do(p, &o, 1, 64, 256, o.mw->rkey);
	CHECK(st == IBV_WC_SUCCESS, "a write through a type 2 window: %s",
	      ibv_wc_status_str(st));
	CHECK(t_pattern_check(o.buf + WOFF + 64, 256, 9) < 0, "the write's data");
	struct ibv_send_wr inv = { .wr_id = 80, .opcode = IBV_WR_LOCAL_INV,
				   .send_flags = IBV_SEND_SIGNALED,
				   .invalidate_rkey = o.mw->rkey }, *bad;
	REQUIRE(ibv_post_send(o.r.qp, &inv, &bad) == 0, "post IBV_WR_LOCAL_INV");
	t_expect_wc(o.r.send_cq, NULL, 80, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV, "the invalidation");
	st = peer_do(p, &o, 1, 64, 8, o.mw->rkey);
	CHECK(st == IBV_WC_REM_ACCESS_ERR, "a write through an invalidated window: %s",
	      ibv_wc_status_str(st));
	peer_done(p);
	t_barrier(p);
	owner_close(&o);
}

/* A Send with Invalidate names the window: the receive says so
 * (IBV_WC_WITH_INV, the key), and the sender's write right behind it,
 * with the same key, is refused, as on a NIC that ran them in order. */
static void send_inv_parent(struct t_peer *p, void *arg)
{
	struct owner o;
	owner_open(p, &o, IBV_MW_TYPE_2);
	bind2(&o, IBV_ACCESS_REMOTE_WRITE);
	REQUIRE(t_post_recv(o.r.qp, 5, o.buf, 64, o.mr->lkey) == 0, "post_recv");
	int st = peer_do(p, &o, 3, 0, 8, o.mw->rkey);
	CHECK((st & 0xffff) == IBV_WC_SUCCESS, "the Send with Invalidate: %s",
	      ibv_wc_status_str(st & 0xffff));
	CHECK(st >> 16 == IBV_WC_REM_ACCESS_ERR, "the write after it, same key: %s",
	      ibv_wc_status_str(st >> 16));
	struct ibv_wc wc;
	CHECK(t_poll_one(o.r.recv_cq, &wc, T_WAIT_MS, "the receive") &&
	      wc.status == IBV_WC_SUCCESS && (wc.wc_flags & IBV_WC_WITH_INV) &&
	      wc.invalidated_rkey == o.mw->rkey && wc.byte_len == 16,
	      "the receive: %s, flags %#x, key %#x (window %#x)", ibv_wc_status_str(wc.status),
	      wc.wc_flags, wc.invalidated_rkey, o.mw->rkey);
	CHECK(outside_untouched(&o, 0, 16), "the refused write changed bytes");
	peer_done(p);
	t_barrier(p);
	owner_close(&o);
}

/* A Send with Invalidate of a key that names no window of the QP (the
 * MR's own): refused; the receive does not succeed and the QP goes to
 * error (over TCP a Terminate, before the receive is taken: flushed). */
static void send_inv_bad_parent(struct t_peer *p, void *arg)
{
	struct owner o;
	owner_open(p, &o, IBV_MW_TYPE_2);
	REQUIRE(t_post_recv(o.r.qp, 6, o.buf, 64, o.mr->lkey) == 0, "post_recv");
	int st = peer_do(p, &o, 3, 0, 8, o.mr->rkey);
	CHECK((st & 0xffff) != IBV_WC_SUCCESS, "a Send with Invalidate of an MR's key succeeded");
	struct ibv_wc wc;
	CHECK(t_poll_one(o.r.recv_cq, &wc, T_WAIT_MS, "the receive") &&
	      (wc.status == IBV_WC_LOC_PROT_ERR || wc.status == IBV_WC_WR_FLUSH_ERR),
	      "the receive: %s", ibv_wc_status_str(wc.status));
	uint64_t end = t_now_ms() + T_WAIT_MS;
	while (t_qp_state(o.r.qp) != IBV_QPS_ERR && t_now_ms() < end)
		t_sleep_ms(5);
	CHECK(t_qp_state(o.r.qp) == IBV_QPS_ERR, "the QP is %s, not ERR",
	      t_qp_state_str(t_qp_state(o.r.qp)));
	peer_done(p);
	t_barrier(p);
	owner_close(&o);
}

/* What is refused at posting and when the bind runs. */
static void rules(void *arg)
{
	struct t_res r;
	t_res_open(&r, NULL);
	CHECK(r.dev_attr.max_mw > 0 && (r.dev_attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW),
	      "max_mw %d, device_cap_flags %#x", r.dev_attr.max_mw, r.dev_attr.device_cap_flags);
	errno = 0;
	CHECK(!ibv_alloc_mw(r.pd, (enum ibv_mw_type)7) && errno == EINVAL,
	      "a window of type 7: errno %d", errno);
	struct ibv_mw *m1 = ibv_alloc_mw(r.pd, IBV_MW_TYPE_1);
	struct ibv_mw *m2 = ibv_alloc_mw(r.pd, IBV_MW_TYPE_2);
	REQUIRE(m1 && m2, "ibv_alloc_mw: %s", strerror(errno));
	CHECK(m1->type == IBV_MW_TYPE_1 && m2->type == IBV_MW_TYPE_2 && m1->pd == r.pd &&
	      m1->rkey != m2->rkey, "the windows' fields");
	CHECK(ibv_dealloc_mw(m1) == 0 && ibv_dealloc_mw(m2) == 0, "ibv_dealloc_mw");
	t_res_close(&r);
}

/* A bind of an MR registered without IBV_ACCESS_MW_BIND: MW_BIND_ERR. */
static void bind_err_parent(struct t_peer *p, void *arg)
{
	struct owner o;
	t_res_open(&o.r, NULL);
	o.buf = t_alloc(LEN);
	o.mr = t_reg(&o.r, o.buf, LEN, IBV_ACCESS_LOCAL_WRITE);
	o.mw = ibv_alloc_mw(o.r.pd, IBV_MW_TYPE_1);
	REQUIRE(o.mw, "ibv_alloc_mw");
	t_connect_pair(p, &o.r, NULL, NULL);
	struct ibv_mw_bind b = {
		.wr_id = 81, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = o.mr, .addr = (uintptr_t)o.buf, .length = 64,
			       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE },
	};
	REQUIRE(ibv_bind_mw(o.r.qp, o.mw, &b) == 0, "ibv_bind_mw");
	t_expect_wc(o.r.send_cq, NULL, 81, IBV_WC_MW_BIND_ERR, -1,
		    "binding over an MR without IBV_ACCESS_MW_BIND");
	peer_done(p);
	t_barrier(p);
	owner_close(&o);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	t_case("mw_rules", rules, NULL);
	t_pair("mw_type1_write_and_rights", type1_parent, peer, NULL);
	t_pair("mw_type1_bounds", bounds_parent, peer, NULL);
	t_pair("mw_type1_unbind", unbind_parent, peer, NULL);
	t_pair("mw_type2_bind_and_local_inv", type2_parent, peer, NULL);
	t_pair("mw_bind_needs_mw_bind_access", bind_err_parent, peer, NULL);
	t_pair("mw_send_with_invalidate", send_inv_parent, peer, NULL);
	t_pair("mw_send_with_invalidate_no_window", send_inv_bad_parent, peer, NULL);
	return t_finish();
}
