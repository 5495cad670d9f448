/* SPDX-License-Identifier: MIT */
/*
 * Conformance: the extended CQ (ibv_create_cq_ex, ibv_start_poll /
 * ibv_next_poll / ibv_end_poll, the ibv_wc_read_* calls), the device's
 * clock (ibv_query_rt_values_ex, hca_core_clock) and ibv_query_device_ex.
 */
#include "harness.h"

#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ALL_WC_FLAGS                                                           \
	(IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | \
	 IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |      \
	 IBV_WC_EX_WITH_DLID_PATH_BITS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | \
	 IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)

static uint64_t raw_clock(struct ibv_context *ctx)
{
	struct ibv_values_ex v = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	int ret = ibv_query_rt_values_ex(ctx, &v);

	REQUIRE(ret == 0, "ibv_query_rt_values_ex: %d", ret);
	REQUIRE(v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK, "no raw clock given");
	return (uint64_t)v.raw_clock.tv_sec * 1000000000ull + (uint64_t)v.raw_clock.tv_nsec;
}

static uint64_t wall_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- Queries ---- */

static void query_device_ex(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_device_attr a;
	struct ibv_device_attr_ex x;

	REQUIRE(ibv_query_device(ctx, &a) == 0, "ibv_query_device");
	memset(&x, 0xa5, sizeof(x));
	int ret = ibv_query_device_ex(ctx, NULL, &x);
	REQUIRE(ret == 0, "ibv_query_device_ex: %d", ret);
	CHECK(!memcmp(&x.orig_attr, &a, sizeof(a)), "orig_attr differs from ibv_query_device");
	CHECK(x.phys_port_cnt_ex == a.phys_port_cnt && a.phys_port_cnt == 1,
	      "phys_port_cnt_ex %u, phys_port_cnt %u", x.phys_port_cnt_ex, a.phys_port_cnt);
	CHECK(x.hca_core_clock > 0 && x.completion_timestamp_mask != 0,
	      "timestamps offered without a clock: hca_core_clock %llu kHz, mask %#llx",
	      (unsigned long long)x.hca_core_clock,
	      (unsigned long long)x.completion_timestamp_mask);
	CHECK((uint32_t)x.device_cap_flags_ex == (uint32_t)a.device_cap_flags,
	      "device_cap_flags_ex %#llx, device_cap_flags %#x",
	      (unsigned long long)x.device_cap_flags_ex, a.device_cap_flags);
	/* What urdma does not do is 0, not left over. */
	CHECK(x.cq_mod_caps.max_cq_count > 1 && x.cq_mod_caps.max_cq_period > 0,
	      "ibv_modify_cq is implemented, cq_mod_caps say nothing");
	CHECK(x.odp_caps.general_caps == 0 && x.tso_caps.max_tso == 0 &&
	      x.rss_caps.max_rwq_indirection_tables == 0 && x.max_dm_size == 0 &&
	      x.tm_caps.max_num_tags == 0 && x.raw_packet_caps == 0,
	      "capabilities urdma lacks are reported");
	struct ibv_query_device_ex_input in = { .comp_mask = 1 };
	CHECK(ibv_query_device_ex(ctx, &in, &x) == EINVAL, "unknown input comp_mask accepted");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

static void rt_values(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_device_attr_ex x;

	REQUIRE(ibv_query_device_ex(ctx, NULL, &x) == 0, "ibv_query_device_ex");
	uint64_t c0 = raw_clock(ctx);
	t_sleep_ms(20);
	uint64_t c1 = raw_clock(ctx);
	/* 20 ms in hca_core_clock (kHz) ticks, within the sleep's slack. */
	uint64_t want = 20 * x.hca_core_clock, got = c1 - c0;
	CHECK(c1 > c0 && got >= want && got < want * 10,
	      "20 ms of sleep took %llu ticks at %llu kHz (expected about %llu)",
	      (unsigned long long)got, (unsigned long long)x.hca_core_clock,
	      (unsigned long long)want);
	struct ibv_values_ex v = { .comp_mask = 0 };
	CHECK(ibv_query_rt_values_ex(ctx, &v) == 0 && v.comp_mask == 0,
	      "nothing asked, something given (comp_mask %#x)", v.comp_mask);
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

/* ---- Creation rules ---- */

static struct ibv_cq_ex *try_create(struct ibv_context *ctx, struct ibv_cq_init_attr_ex a,
				    int *err)
{
	errno = 0;
	struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &a);
	*err = cq ? 0 : errno;
	return cq;
}

static void create_rules(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_device_attr a;
	int err;

	REQUIRE(ibv_query_device(ctx, &a) == 0, "ibv_query_device");
	struct ibv_cq_init_attr_ex ok = { .cqe = 16, .wc_flags = ALL_WC_FLAGS };
	struct ibv_cq_ex *cq = try_create(ctx, ok, &err);
	REQUIRE(cq, "ibv_create_cq_ex with every supported wc_flag: %s", strerror(err));
	CHECK(ibv_cq_ex_to_cq(cq)->cqe >= 16, "cqe %d", ibv_cq_ex_to_cq(cq)->cqe);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0, "ibv_destroy_cq");

	struct ibv_cq_init_attr_ex big = ok;
	big.cqe = (uint32_t)a.max_cqe + 1;
	CHECK(!try_create(ctx, big, &err) && err == EINVAL,
	      "cqe above max_cqe: errno %d (%s), expected EINVAL", err, strerror(err));
	struct ibv_cq_init_attr_ex zero = ok;
	zero.cqe = 0;
	CHECK(!try_create(ctx, zero, &err) && err == EINVAL, "cqe 0: errno %d", err);
	struct ibv_cq_init_attr_ex vlan = ok;
	vlan.wc_flags |= IBV_WC_EX_WITH_CVLAN;
	CHECK(!try_create(ctx, vlan, &err) && err == EOPNOTSUPP,
	      "IBV_WC_EX_WITH_CVLAN: errno %d, expected EOPNOTSUPP", err);
	struct ibv_cq_init_attr_ex tm = ok;
	tm.wc_flags = IBV_WC_EX_WITH_TM_INFO;
	CHECK(!try_create(ctx, tm, &err) && err == EOPNOTSUPP, "IBV_WC_EX_WITH_TM_INFO: errno %d",
	      err);
	struct ibv_cq_init_attr_ex mask = ok;
	mask.comp_mask = 1u << 7;
	CHECK(!try_create(ctx, mask, &err) && err == EINVAL, "unknown comp_mask: errno %d", err);
	struct ibv_cq_init_attr_ex flags = ok;
	flags.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
	flags.flags = 1u << 5;
	CHECK(!try_create(ctx, flags, &err) && err == EOPNOTSUPP, "unknown flag: errno %d", err);
	struct ibv_cq_init_attr_ex vec = ok;
	vec.comp_vector = (uint32_t)ctx->num_comp_vectors;
	CHECK(!try_create(ctx, vec, &err) && err == EINVAL, "comp_vector out of range: errno %d",
	      err);
	struct ibv_cq_init_attr_ex st = ok;
	st.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
	st.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
	cq = try_create(ctx, st, &err);
	CHECK(cq, "SINGLE_THREADED | IGNORE_OVERRUN: %s", strerror(err));
	if (cq) {
		struct ibv_poll_cq_attr pa = { 0 };
		CHECK(ibv_start_poll(cq, &pa) == ENOENT, "an empty CQ gave a completion");
		CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0, "ibv_destroy_cq");
	}
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

/* ---- Traffic through extended CQs ---- */

/* t_res with one extended CQ for both queues, and an RC QP on it. */
static struct ibv_cq_ex *res_open_ex(struct t_res *r, bool channel)
{
	struct t_opts o = t_opts_default();
	o.create_qp = false;
	o.use_channel = channel;
	o.max_send_wr = 512;
	t_res_open(r, &o);
	REQUIRE(ibv_destroy_cq(r->send_cq) == 0, "ibv_destroy_cq");
	struct ibv_cq_init_attr_ex a = { .cqe = 1024, .cq_context = r, .channel = r->channel,
					 .wc_flags = ALL_WC_FLAGS };
	struct ibv_cq_ex *cq = ibv_create_cq_ex(r->ctx, &a);
	REQUIRE(cq, "ibv_create_cq_ex: %s", strerror(errno));
	r->send_cq = r->recv_cq = ibv_cq_ex_to_cq(cq);
	CHECK(r->send_cq->cq_context == r, "cq_context not kept");
	struct ibv_qp_init_attr ia = {
		.send_cq = r->send_cq, .recv_cq = r->recv_cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = o.max_send_wr, .max_recv_wr = o.max_recv_wr,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	r->qp = ibv_create_qp(r->pd, &ia);
	REQUIRE(r->qp, "ibv_create_qp on an extended CQ: %s", strerror(errno));
	r->cap = ia.cap;
	return cq;
}

/* The fields of one completion, read through the extended CQ. */
struct exwc {
	uint64_t wr_id, ts, wall;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len, qp_num, src_qp, slid, wc_flags, imm;
	uint8_t sl, dlid_path_bits;
};

static void ex_read(struct ibv_cq_ex *cq, struct exwc *w)
{
	w->wr_id = cq->wr_id;
	w->status = cq->status;
	w->opcode = ibv_wc_read_opcode(cq);
	w->byte_len = ibv_wc_read_byte_len(cq);
	w->qp_num = ibv_wc_read_qp_num(cq);
	w->src_qp = ibv_wc_read_src_qp(cq);
	w->slid = ibv_wc_read_slid(cq);
	w->sl = ibv_wc_read_sl(cq);
	w->dlid_path_bits = ibv_wc_read_dlid_path_bits(cq);
	w->wc_flags = ibv_wc_read_wc_flags(cq);
	w->imm = w->wc_flags & IBV_WC_WITH_IMM ? be32toh(ibv_wc_read_imm_data(cq)) : 0;
	w->ts = ibv_wc_read_completion_ts(cq);
	w->wall = ibv_wc_read_completion_wallclock_ns(cq);
	(void)ibv_wc_read_vendor_err(cq);
}

/* Up to n completions through start/next/end; waits up to T_WAIT_MS. */
static int ex_poll(struct ibv_cq_ex *cq, struct exwc *w, int n)
{
	struct ibv_poll_cq_attr pa = { 0 };
	uint64_t end = t_now_ms() + T_WAIT_MS;
	int got = 0;

	while (got < n && t_now_ms() < end) {
		int ret = ibv_start_poll(cq, &pa);
		if (ret == ENOENT)
			continue;
		REQUIRE(ret == 0, "ibv_start_poll: %d", ret);
		do
			ex_read(cq, &w[got++]);
		while (got < n && (ret = ibv_next_poll(cq)) == 0);
		ibv_end_poll(cq);
		REQUIRE(ret == 0 || ret == ENOENT, "ibv_next_poll: %d", ret);
	}
	return got;
}

static void check_ts(const struct exwc *w, uint64_t c0, uint64_t c1, uint64_t w0, uint64_t w1,
		     const char *what)
{
	CHECK(w->ts >= c0 && w->ts <= c1, "%s: completion_ts %llu outside [%llu, %llu]", what,
	      (unsigned long long)w->ts, (unsigned long long)c0, (unsigned long long)c1);
	/* The wall clock is derived at read time: allow 2 ms of slack. */
	CHECK(w->wall + 2000000 >= w0 && w->wall <= w1 + 2000000,
	      "%s: wallclock %llu outside [%llu, %llu]", what, (unsigned long long)w->wall,
	      (unsigned long long)w0, (unsigned long long)w1);
}

#define MSG 1000

static void traffic_parent(struct t_peer *p, void *arg)
{
	struct t_res r;
	struct ibv_cq_ex *cq = res_open_ex(&r, false);
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct t_conn remote;
	struct exwc w[2];

	t_connect_pair(p, &r, mr, &remote);
	t_barrier(p); /* the receives are posted */
	uint64_t c0 = raw_clock(r.ctx), w0 = wall_ns();
	struct ibv_sge sge = { (uintptr_t)buf, MSG, mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 11, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
				  .imm_data = htobe32(0xfeed0001) }, *bad;
	REQUIRE(ibv_post_send(r.qp, &wr, &bad) == 0, "post SEND_WITH_IMM");
	wr.wr_id = 12;
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.imm_data = htobe32(0xfeed0002);
	wr.wr.rdma.remote_addr = remote.addr + 64;
	wr.wr.rdma.rkey = remote.rkey;
	REQUIRE(ibv_post_send(r.qp, &wr, &bad) == 0, "post RDMA_WRITE_WITH_IMM");
	REQUIRE(ex_poll(cq, w, 2) == 2, "the two send completions did not come");
	uint64_t c1 = raw_clock(r.ctx), w1 = wall_ns();
	CHECK(w[0].wr_id == 11 && w[0].status == IBV_WC_SUCCESS && w[0].opcode == IBV_WC_SEND,
	      "first: wr_id %llu status %d opcode %d", (unsigned long long)w[0].wr_id,
	      w[0].status, w[0].opcode);
	CHECK(w[1].wr_id == 12 && w[1].status == IBV_WC_SUCCESS &&
	      w[1].opcode == IBV_WC_RDMA_WRITE, "second: wr_id %llu status %d opcode %d",
	      (unsigned long long)w[1].wr_id, w[1].status, w[1].opcode);
	for (int i = 0; i < 2; i++) {
		CHECK(w[i].qp_num == r.qp->qp_num, "qp_num %#x, ours %#x", w[i].qp_num,
		      r.qp->qp_num);
		check_ts(&w[i], c0, c1, w0, w1, "send");
	}
	CHECK(w[0].ts <= w[1].ts, "send timestamps out of order");
	t_barrier(p);
	t_barrier(p);
	t_res_close(&r);
	free(buf);
}

static void traffic_child(struct t_peer *p, void *arg)
{
	struct t_res r;
	struct ibv_cq_ex *cq = res_open_ex(&r, true);
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct t_conn remote;
	struct exwc w[2];

	uint64_t c0 = raw_clock(r.ctx), w0 = wall_ns();
	t_connect_pair(p, &r, mr, &remote);
	REQUIRE(ibv_req_notify_cq(ibv_cq_ex_to_cq(cq), 0) == 0, "ibv_req_notify_cq");
	for (int i = 0; i < 2; i++)
		REQUIRE(t_post_recv(r.qp, 100 + i, buf + 2048 * i, 2048, mr->lkey) == 0,
			"post_recv");
	t_barrier(p); /* the receives are posted */
	/* Events work on the extended CQ as on any other. */
	CHECK(t_wait_cq_event(r.channel, ibv_cq_ex_to_cq(cq), T_WAIT_MS),
	      "no completion event on the extended CQ");
	/* The first through ibv_poll_cq on ibv_cq_ex_to_cq, the second
	 * through the extended calls: one CQ, two ways to read it. */
	struct ibv_wc wc;
	REQUIRE(t_poll(ibv_cq_ex_to_cq(cq), &wc, 1, T_WAIT_MS) == 1, "no receive");
	CHECK(wc.wr_id == 100 && wc.opcode == IBV_WC_RECV && wc.byte_len == MSG &&
	      (wc.wc_flags & IBV_WC_WITH_IMM) && be32toh(wc.imm_data) == 0xfeed0001,
	      "receive through ibv_poll_cq: wr_id %llu opcode %d len %u imm %#x",
	      (unsigned long long)wc.wr_id, wc.opcode, wc.byte_len, be32toh(wc.imm_data));
	REQUIRE(ex_poll(cq, w, 1) == 1, "the WRITE_WITH_IMM's completion did not come");
	uint64_t c1 = raw_clock(r.ctx), w1 = wall_ns();
	CHECK(w[0].wr_id == 101 && w[0].status == IBV_WC_SUCCESS &&
	      w[0].opcode == IBV_WC_RECV_RDMA_WITH_IMM && w[0].byte_len == MSG,
	      "wr_id %llu status %d opcode %d byte_len %u", (unsigned long long)w[0].wr_id,
	      w[0].status, w[0].opcode, w[0].byte_len);
	CHECK((w[0].wc_flags & IBV_WC_WITH_IMM) && w[0].imm == 0xfeed0002,
	      "wc_flags %#x imm %#x", w[0].wc_flags, w[0].imm);
	CHECK(w[0].qp_num == r.qp->qp_num, "qp_num %#x, ours %#x", w[0].qp_num, r.qp->qp_num);
	check_ts(&w[0], c0, c1, w0, w1, "receive");
	struct ibv_poll_cq_attr pa = { 0 };
	CHECK(ibv_start_poll(cq, &pa) == ENOENT, "a completion too many");
	t_barrier(p);
	t_barrier(p);
	t_res_close(&r);
	free(buf);
}

/* ---- Two threads in start_poll..end_poll at once: each completion read
 * once (the CQ's lock spans the three calls) ---- */

#define NWR 20000

struct drain {
	struct ibv_cq_ex *cq;
	_Atomic int *taken;
	unsigned char *seen;
	int dup;
};

static void *drain_thread(void *arg)
{
	struct drain *d = arg;
	struct ibv_poll_cq_attr pa = { 0 };
	uint64_t end = t_now_ms() + T_WAIT_MS;

	while (*d->taken < NWR && t_now_ms() < end) {
		if (ibv_start_poll(d->cq, &pa))
			continue;
		int ret;
		do {
			uint64_t id = d->cq->wr_id;
			if (id < NWR && d->cq->status == IBV_WC_SUCCESS &&
			    !__atomic_exchange_n(&d->seen[id], 1, __ATOMIC_RELAXED))
				(*d->taken)++;
			else
				d->dup++;
		} while ((ret = ibv_next_poll(d->cq)) == 0);
		ibv_end_poll(d->cq);
	}
	return NULL;
}

static void threads_parent(struct t_peer *p, void *arg)
{
	struct t_res r;
	struct ibv_cq_ex *cq = res_open_ex(&r, false);
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct t_conn remote;
	_Atomic int taken = 0;
	unsigned char *seen = calloc(NWR, 1);
	struct drain d[2] = { { cq, &taken, seen, 0 }, { cq, &taken, seen, 0 } };
	pthread_t th[2];

	t_connect_pair(p, &r, mr, &remote);
	for (int i = 0; i < 2; i++)
		REQUIRE(pthread_create(&th[i], NULL, drain_thread, &d[i]) == 0, "pthread_create");
	for (int i = 0; i < NWR;) {
		int ret = t_post_send(r.qp, (uint64_t)i, IBV_WR_RDMA_WRITE, buf, 8, mr->lkey,
				      IBV_SEND_SIGNALED, remote.addr, remote.rkey);
		if (ret == ENOMEM) { /* send queue full: the threads drain it */
			t_sleep_ms(1);
			continue;
		}
		REQUIRE(ret == 0, "post RDMA_WRITE %d: %d", i, ret);
		i++;
	}
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	CHECK(taken == NWR && d[0].dup + d[1].dup == 0,
	      "%d of %d completions read once, %d read twice or wrong", (int)taken, NWR,
	      d[0].dup + d[1].dup);
	t_barrier(p);
	t_res_close(&r);
	free(seen);
	free(buf);
}

static void threads_child(struct t_peer *p, void *arg)
{
	t_passive_target(p, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, 30000);
}

/* ---- CQ moderation (ibv_modify_cq): the event waits for cq_count
 * completions, or cq_period after the first ---- */

static void mod_parent(struct t_peer *p, void *arg)
{
	struct t_res r;
	struct ibv_cq_ex *cq = res_open_ex(&r, true);
	struct ibv_cq *c = ibv_cq_ex_to_cq(cq);
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_wc wc[8];

	t_connect_pair(p, &r, mr, NULL);
	for (int i = 0; i < 8; i++)
		REQUIRE(t_post_recv(r.qp, (uint64_t)i, buf + 64 * i, 64, mr->lkey) == 0,
			"post_recv");
	struct ibv_modify_cq_attr bad = { .attr_mask = 1u << 5 };
	CHECK(ibv_modify_cq(c, &bad) == EINVAL, "an unknown attr_mask");
	/* A count alone: held until 4 are there. */
	struct ibv_modify_cq_attr m = { .attr_mask = IBV_CQ_ATTR_MODERATE,
					.moderate = { .cq_count = 4, .cq_period = 0 } };
	REQUIRE(ibv_modify_cq(c, &m) == 0, "ibv_modify_cq");
	REQUIRE(ibv_req_notify_cq(c, 0) == 0, "arm");
	t_send_u64(p, 3);
	(void)t_recv_u64(p, T_WAIT_MS); /* sent */
	CHECK(!t_fd_readable(r.channel->fd, 200), "an event at 3 completions of a count of 4");
	t_send_u64(p, 1);
	(void)t_recv_u64(p, T_WAIT_MS);
	CHECK(t_wait_cq_event(r.channel, c, T_WAIT_MS), "no event at the 4th completion");
	CHECK(t_poll(c, wc, 4, T_WAIT_MS) == 4, "the four receives");
	/* A period: one completion, then the event within it. */
	m.moderate = (struct ibv_moderate_cq){ .cq_count = 1000, .cq_period = 20000 };
	REQUIRE(ibv_modify_cq(c, &m) == 0, "ibv_modify_cq");
	REQUIRE(ibv_req_notify_cq(c, 0) == 0, "arm");
	t_send_u64(p, 1);
	(void)t_recv_u64(p, T_WAIT_MS);
	CHECK(t_wait_cq_event(r.channel, c, T_WAIT_MS), "no event 20 ms after the completion");
	CHECK(t_poll(c, wc, 1, T_WAIT_MS) == 1, "the receive");
	t_send_u64(p, 0);
	t_barrier(p);
	t_res_close(&r);
	free(buf);
}

static void mod_child(struct t_peer *p, void *arg)
{
	struct t_res r;
	t_res_open(&r, NULL);
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	uint64_t n;

	t_connect_pair(p, &r, mr, NULL);
	while ((n = t_recv_u64(p, 30000)) > 0) {
		for (uint64_t i = 0; i < n; i++) {
			REQUIRE(t_post_send(r.qp, i, IBV_WR_SEND, buf, 8, mr->lkey,
					    IBV_SEND_SIGNALED, 0, 0) == 0, "post_send");
			t_expect_wc(r.send_cq, NULL, i, IBV_WC_SUCCESS, IBV_WC_SEND, "a send");
		}
		t_send_u64(p, n);
	}
	t_barrier(p);
	t_res_close(&r);
	free(buf);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	t_case("query_device_ex", query_device_ex, NULL);
	t_case("rt_values_clock", rt_values, NULL);
	t_case("create_cq_ex_rules", create_rules, NULL);
	t_pair("poll_ex_fields_and_events", traffic_parent, traffic_child, NULL);
	t_pair("poll_ex_two_threads", threads_parent, threads_child, NULL);
	t_pair("modify_cq_moderation", mod_parent, mod_child, NULL);
	return t_finish();
}
