/* SPDX-License-Identifier: MIT */
/*
 * Conformance: the extended QP (ibv_create_qp_ex with send ops flags,
 * ibv_qp_to_qp_ex, ibv_wr_start / ibv_wr_* / ibv_wr_complete / ibv_wr_abort),
 * mixed with ibv_post_send on one QP.
 */
#include "harness.h"

#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define OPS                                                                    \
	(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |      \
	 IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |                  \
	 IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |        \
	 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)
#define SQ 16

static struct ibv_qp *create_ex(struct t_res *r, uint32_t comp_mask, uint64_t ops, int *err)
{
	struct ibv_qp_init_attr_ex a = {
		.send_cq = r->send_cq, .recv_cq = r->recv_cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = SQ, .max_recv_wr = 16, .max_send_sge = 2,
			 .max_recv_sge = 1, .max_inline_data = 64 },
		.comp_mask = comp_mask, .pd = r->pd, .send_ops_flags = ops,
	};
	errno = 0;
	struct ibv_qp *qp = ibv_create_qp_ex(r->ctx, &a);
	*err = qp ? 0 : errno;
	if (qp)
		r->cap = a.cap;
	return qp;
}

static void create_rules(void *arg)
{
	struct t_opts o = t_opts_default();
	o.create_qp = false;
	struct t_res r;
	t_res_open(&r, &o);
	int err;
	const uint32_t m = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;

	struct ibv_qp *qp = create_ex(&r, IBV_QP_INIT_ATTR_PD, 0, &err);
	REQUIRE(qp, "ibv_create_qp_ex with only a PD: %s", strerror(err));
	CHECK(ibv_qp_to_qp_ex(qp) == NULL, "a QP made without send ops flags is extended");
	CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");

	qp = create_ex(&r, m, OPS, &err);
	REQUIRE(qp, "ibv_create_qp_ex with every supported send op: %s", strerror(err));
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(qp);
	CHECK(x && &x->qp_base == qp, "ibv_qp_to_qp_ex: %p for qp %p", (void *)x, (void *)qp);
	CHECK(r.cap.max_send_wr >= SQ && r.cap.max_inline_data >= 64, "cap not reported");
	CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");

	static const struct {
		uint64_t op;
		const char *name;
	} unsup[] = {
		{ IBV_QP_EX_WITH_LOCAL_INV, "LOCAL_INV" },
		{ IBV_QP_EX_WITH_BIND_MW, "BIND_MW" },
		{ IBV_QP_EX_WITH_SEND_WITH_INV, "SEND_WITH_INV" },
		{ IBV_QP_EX_WITH_TSO, "TSO" },
		{ IBV_QP_EX_WITH_ATOMIC_WRITE, "ATOMIC_WRITE" },
	};
	for (size_t i = 0; i < sizeof(unsup) / sizeof(unsup[0]); i++)
		CHECK(!create_ex(&r, m, IBV_QP_EX_WITH_SEND | unsup[i].op, &err) &&
		      err == EOPNOTSUPP, "send op %s: errno %d, expected EOPNOTSUPP",
		      unsup[i].name, err);
	CHECK(!create_ex(&r, IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, OPS, &err) && err == EINVAL,
	      "no IBV_QP_INIT_ATTR_PD: errno %d, expected EINVAL", err);
	CHECK(!create_ex(&r, m | (1u << 20), OPS, &err) && err == EINVAL,
	      "unknown comp_mask bit: errno %d, expected EINVAL", err);
	struct ibv_qp_init_attr_ex a = {
		.send_cq = r.send_cq, .recv_cq = r.recv_cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS, .pd = r.pd,
		.create_flags = IBV_QP_CREATE_SCATTER_FCS,
	};
	errno = 0;
	CHECK(!ibv_create_qp_ex(r.ctx, &a) && errno == EOPNOTSUPP,
	      "IBV_QP_CREATE_SCATTER_FCS: errno %d, expected EOPNOTSUPP", errno);
	t_res_close(&r);
}

/* The initiator's buffer: [0, 256) sources, [256, 512) READ sink,
 * [512, 528) atomic results. The target's: [0, 512) written, 4096 an
 * 8-byte counter, [1024, 2048) the READ source, [2048, +3 x 256) receives. */
struct ini {
	struct t_res r;
	struct ibv_qp_ex *x;
	unsigned char *buf;
	struct ibv_mr *mr;
	struct t_conn remote;
};

static void ini_open(struct t_peer *p, struct ini *in)
{
	struct t_opts o = t_opts_default();
	o.create_qp = false;
	t_res_open(&in->r, &o);
	int err;
	in->r.qp = create_ex(&in->r, IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
			     OPS, &err);
	REQUIRE(in->r.qp, "ibv_create_qp_ex: %s", strerror(err));
	in->x = ibv_qp_to_qp_ex(in->r.qp);
	REQUIRE(in->x, "ibv_qp_to_qp_ex");
	in->buf = t_alloc(4096);
	in->mr = t_reg(&in->r, in->buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	t_connect_pair(p, &in->r, in->mr, &in->remote);
}

static void wr_every_op_parent(struct t_peer *p, void *arg)
{
	struct ini in;
	ini_open(p, &in);
	struct ibv_qp_ex *x = in.x;
	uint32_t lk = in.mr->lkey, rk = in.remote.rkey;
	uint64_t ra = in.remote.addr;
	unsigned char *b = in.buf;
	char inl1[] = "inline one", inl2[] = "-and-two";

	t_pattern_fill(b, 256, 5);
	t_barrier(p); /* the target's receives are posted */
	ibv_wr_start(x);
	x->wr_flags = IBV_SEND_SIGNALED;
	x->wr_id = 1;
	ibv_wr_send(x);
	ibv_wr_set_sge(x, lk, (uintptr_t)b, 100);
	x->wr_id = 2;
	ibv_wr_send_imm(x, htobe32(0x51));
	ibv_wr_set_inline_data(x, inl1, sizeof(inl1));
	x->wr_id = 3;
	ibv_wr_rdma_write(x, rk, ra);
	struct ibv_sge two[2] = { { (uintptr_t)b, 64, lk }, { (uintptr_t)b + 128, 64, lk } };
	ibv_wr_set_sge_list(x, 2, two);
	x->wr_id = 4;
	ibv_wr_rdma_write_imm(x, rk, ra + 256, htobe32(0x52));
	struct ibv_data_buf bufs[2] = { { inl1, 6 }, { inl2, sizeof(inl2) } };
	ibv_wr_set_inline_data_list(x, 2, bufs);
	x->wr_id = 5;
	ibv_wr_rdma_read(x, rk, ra + 1024);
	ibv_wr_set_sge(x, lk, (uintptr_t)b + 256, 256);
	x->wr_id = 6;
	ibv_wr_atomic_fetch_add(x, rk, ra + 4096, 5);
	ibv_wr_set_sge(x, lk, (uintptr_t)b + 512, 8);
	x->wr_id = 7;
	ibv_wr_atomic_cmp_swp(x, rk, ra + 4096, 105, 999);
	ibv_wr_set_sge(x, lk, (uintptr_t)b + 520, 8);
	/* The program may reuse an inline buffer at once. */
	memset(inl1, 'X', sizeof(inl1));
	int ret = ibv_wr_complete(x);
	REQUIRE(ret == 0, "ibv_wr_complete: %d", ret);
	static const enum ibv_wc_opcode want[] = { IBV_WC_SEND, IBV_WC_SEND, IBV_WC_RDMA_WRITE,
						   IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ,
						   IBV_WC_FETCH_ADD, IBV_WC_COMP_SWAP };
	for (int i = 0; i < 7; i++)
		t_expect_wc(in.r.send_cq, NULL, (uint64_t)i + 1, IBV_WC_SUCCESS, want[i],
			    "a WR of the batch");
	CHECK(t_pattern_check(b + 256, 256, 6) < 0, "the READ brought other data");
	uint64_t fa, cs;
	memcpy(&fa, b + 512, 8);
	memcpy(&cs, b + 520, 8);
	CHECK(fa == 100 && cs == 105, "fetch-add returned %llu (want 100), cmp-swap %llu (want 105)",
	      (unsigned long long)fa, (unsigned long long)cs);
	t_barrier(p); /* the target checks its memory */
	t_barrier(p);
	t_res_close(&in.r);
	free(in.buf);
}

static void wr_every_op_child(struct t_peer *p, void *arg)
{
	struct t_res r;
	t_res_open(&r, NULL);
	unsigned char *m = t_alloc(8192);
	struct ibv_mr *mr = t_reg(&r, m, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	uint64_t start = 100;
	memcpy(m + 4096, &start, 8);
	t_pattern_fill(m + 1024, 256, 6);
	t_connect_pair(p, &r, mr, NULL);
	for (int i = 0; i < 3; i++)
		REQUIRE(t_post_recv(r.qp, 10 + i, m + 2048 + 256 * i, 256, mr->lkey) == 0,
			"post_recv");
	t_barrier(p);
	struct ibv_wc wc;
	t_expect_wc(r.recv_cq, &wc, 10, IBV_WC_SUCCESS, IBV_WC_RECV, "the SEND");
	CHECK(wc.byte_len == 100 && t_pattern_check(m + 2048, 100, 5) < 0, "SEND: %u bytes",
	      wc.byte_len);
	t_expect_wc(r.recv_cq, &wc, 11, IBV_WC_SUCCESS, IBV_WC_RECV, "the SEND_WITH_IMM");
	CHECK((wc.wc_flags & IBV_WC_WITH_IMM) && be32toh(wc.imm_data) == 0x51 &&
	      wc.byte_len == sizeof("inline one") && !strcmp((char *)m + 2304, "inline one"),
	      "SEND_WITH_IMM: imm %#x, %u bytes, '%.11s'", be32toh(wc.imm_data), wc.byte_len,
	      m + 2304);
	t_expect_wc(r.recv_cq, &wc, 12, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM,
		    "the WRITE_WITH_IMM");
	CHECK((wc.wc_flags & IBV_WC_WITH_IMM) && be32toh(wc.imm_data) == 0x52 &&
	      wc.byte_len == 6 + sizeof("-and-two"), "WRITE_WITH_IMM: imm %#x, %u bytes",
	      be32toh(wc.imm_data), wc.byte_len);
	t_barrier(p);
	/* The two-SGE WRITE: 64 bytes of the pattern, then 64 from 128 on. */
	unsigned char src[256];
	t_pattern_fill(src, 256, 5);
	CHECK(!memcmp(m, src, 64) && !memcmp(m + 64, src + 128, 64),
	      "the two-SGE WRITE put other bytes");
	CHECK(!memcmp(m + 256, "inline-and-two", sizeof("inline-and-two")),
	      "the inline list WRITE_WITH_IMM put '%.15s'", m + 256);
	uint64_t v;
	memcpy(&v, m + 4096, 8);
	CHECK(v == 999, "the counter is %llu after add 5 and cmp-swap 105 -> 999",
	      (unsigned long long)v);
	t_barrier(p);
	t_res_close(&r);
	free(m);
}

/* ---- Abort, the errors ibv_wr_complete returns, and mixing ---- */

static void wr_errors_parent(struct t_peer *p, void *arg)
{
	struct ini in;
	ini_open(p, &in);
	struct ibv_qp_ex *x = in.x;
	uint32_t lk = in.mr->lkey, rk = in.remote.rkey;
	uint64_t ra = in.remote.addr;
	struct ibv_wc wc[4];
	int ret;

	/* Aborted: nothing goes. */
	ibv_wr_start(x);
	x->wr_flags = IBV_SEND_SIGNALED;
	x->wr_id = 100;
	ibv_wr_rdma_write(x, rk, ra);
	ibv_wr_set_sge(x, lk, (uintptr_t)in.buf, 8);
	ibv_wr_abort(x);
	CHECK(t_cq_drain(in.r.send_cq, wc, 4, 100) == 0, "an aborted WR completed");

	/* More WRs than the send queue holds: ENOMEM, and none goes. */
	ibv_wr_start(x);
	for (int i = 0; i < (int)in.r.cap.max_send_wr + 1; i++) {
		x->wr_id = 200 + (uint64_t)i;
		ibv_wr_rdma_write(x, rk, ra);
		ibv_wr_set_sge(x, lk, (uintptr_t)in.buf, 8);
	}
	ret = ibv_wr_complete(x);
	CHECK(ret == ENOMEM, "a batch past the send queue: %d, expected ENOMEM", ret);
	CHECK(t_cq_drain(in.r.send_cq, wc, 4, 100) == 0, "a WR of a refused batch completed");

	/* A batch with one bad WR: its error, and the good ones before it
	 * are not posted either. */
	struct {
		const char *what;
		int want;
	} cases[] = { { "too many SGEs", EINVAL },
		      { "inline data past max_inline_data", EINVAL },
		      { "set_sge with no WR", EINVAL } };
	for (int c = 0; c < 3; c++) {
		ibv_wr_start(x);
		if (c != 2) {
			x->wr_id = 300;
			ibv_wr_rdma_write(x, rk, ra);
			ibv_wr_set_sge(x, lk, (uintptr_t)in.buf, 8);
			x->wr_id = 301;
			ibv_wr_send(x);
		}
		if (c == 0) {
			struct ibv_sge three[3] = { { (uintptr_t)in.buf, 1, lk },
						    { (uintptr_t)in.buf, 1, lk },
						    { (uintptr_t)in.buf, 1, lk } };
			ibv_wr_set_sge_list(x, in.r.cap.max_send_sge + 1 <= 3 ?
						       in.r.cap.max_send_sge + 1 : 3, three);
		} else if (c == 1) {
			ibv_wr_set_inline_data(x, in.buf, in.r.cap.max_inline_data + 1);
		} else {
			ibv_wr_set_sge(x, lk, (uintptr_t)in.buf, 8);
		}
		ret = ibv_wr_complete(x);
		CHECK(ret == cases[c].want, "%s: %d, expected %d", cases[c].what, ret,
		      cases[c].want);
		CHECK(t_cq_drain(in.r.send_cq, wc, 4, 50) == 0, "%s: a WR was posted",
		      cases[c].what);
	}

	/* ibv_post_send, then a batch, then ibv_post_send: in order. A bad
	 * lkey is the batch's WR's own error completion, as for post_send. */
	REQUIRE(t_post_send(in.r.qp, 400, IBV_WR_RDMA_WRITE, in.buf, 8, lk, IBV_SEND_SIGNALED, ra,
			    rk) == 0, "post_send");
	ibv_wr_start(x);
	x->wr_flags = IBV_SEND_SIGNALED;
	x->wr_id = 401;
	ibv_wr_rdma_write(x, rk, ra + 8);
	ibv_wr_set_sge(x, lk, (uintptr_t)in.buf, 8);
	x->wr_id = 402;
	ibv_wr_rdma_write(x, rk, ra + 16);
	ibv_wr_set_sge(x, lk, (uintptr_t)in.buf, 8);
	REQUIRE(ibv_wr_complete(x) == 0, "ibv_wr_complete");
	REQUIRE(t_post_send(in.r.qp, 403, IBV_WR_RDMA_WRITE, in.buf, 8, lk, IBV_SEND_SIGNALED,
			    ra + 24, rk) == 0, "post_send");
	for (uint64_t id = 400; id <= 403; id++)
		t_expect_wc(in.r.send_cq, NULL, id, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE,
			    "post_send and wr_ mixed");
	ibv_wr_start(x);
	x->wr_id = 500;
	ibv_wr_rdma_write(x, rk, ra);
	ibv_wr_set_sge(x, lk ^ 0x5a5a0000, (uintptr_t)in.buf, 8);
	REQUIRE(ibv_wr_complete(x) == 0, "ibv_wr_complete");
	t_expect_wc(in.r.send_cq, NULL, 500, IBV_WC_LOC_PROT_ERR, -1, "a bad lkey");
	t_barrier(p);
	t_res_close(&in.r);
	free(in.buf);
}

static void wr_errors_child(struct t_peer *p, void *arg)
{
	t_passive_target(p, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, 30000);
}

/* An op the QP was not made for: EINVAL from ibv_wr_complete. */
static void wr_undeclared_parent(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	o.create_qp = false;
	struct t_res r;
	t_res_open(&r, &o);
	int err;
	r.qp = create_ex(&r, IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
			 IBV_QP_EX_WITH_SEND, &err);
	REQUIRE(r.qp, "ibv_create_qp_ex: %s", strerror(err));
	unsigned char *b = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, b, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct t_conn remote;
	t_connect_pair(p, &r, mr, &remote);
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(r.qp);
	ibv_wr_start(x);
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(x, remote.rkey, remote.addr);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)b, 8);
	int ret = ibv_wr_complete(x);
	CHECK(ret == EINVAL, "RDMA WRITE on a QP made for SEND only: %d, expected EINVAL", ret);
	struct ibv_wc wc;
	CHECK(t_cq_drain(r.send_cq, &wc, 1, 50) == 0, "it was posted");
	t_barrier(p);
	t_res_close(&r);
	free(b);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	t_case("create_qp_ex_rules", create_rules, NULL);
	t_pair("wr_every_op", wr_every_op_parent, wr_every_op_child, NULL);
	t_pair("wr_abort_errors_and_mixing", wr_errors_parent, wr_errors_child, NULL);
	t_pair("wr_undeclared_op", wr_undeclared_parent, wr_errors_child, NULL);
	return t_finish();
}
