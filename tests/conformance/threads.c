/* SPDX-License-Identifier: MIT */
/*
 * Conformance: thread safety of the data path (libibverbs verbs are thread
 * safe): several threads posting to one QP while another polls, and several
 * threads polling one CQ.  Every count must match exactly: nothing lost,
 * nothing duplicated.
 */
#include "harness.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define NTHREADS 4
#define PER_THREAD 500
#define TOTAL (NTHREADS * PER_THREAD)
#define SQ 128
#define SLOTS 64 /* per posting thread */
#define MSG 64
#define DEADLINE_MS 40000

struct payload {
	uint32_t tid, seq;
};

/* ------------------------------------------------------------------ */
/* Several threads post SENDs to one QP; one thread polls              */
/* ------------------------------------------------------------------ */

struct post_ctx {
	struct t_res *r;
	char *buf;
	uint32_t lkey;
	atomic_uint completed[NTHREADS];
	atomic_int enomem;
	atomic_int errors;
	uint64_t deadline;
};

struct post_thread {
	struct post_ctx *c;
	uint32_t tid;
	pthread_t th;
};

static void *poster(void *arg)
{
	struct post_thread *pt = arg;
	struct post_ctx *c = pt->c;
	for (uint32_t seq = 0; seq < PER_THREAD; seq++) {
		/* Reuse a slot only once its previous send completed. */
		while (seq - atomic_load(&c->completed[pt->tid]) >= SLOTS) {
			if (t_now_ms() > c->deadline)
				return NULL;
			sched_yield();
		}
		char *slot = c->buf + ((size_t)pt->tid * SLOTS + seq % SLOTS) * MSG;
		struct payload pl = {pt->tid, seq};
		memcpy(slot, &pl, sizeof(pl));
		struct ibv_sge sge = {.addr = (uintptr_t)slot, .length = MSG, .lkey = c->lkey};
		struct ibv_send_wr wr = {.wr_id = ((uint64_t)pt->tid << 32) | seq, .sg_list = &sge,
					 .num_sge = 1, .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED};
		for (;;) {
			struct ibv_send_wr *bad = NULL;
			int ret = ibv_post_send(c->r->qp, &wr, &bad);
			if (ret == 0)
				break;
			/* A full send queue is the one acceptable refusal. */
			if (ret != ENOMEM) {
				CHECK(false, "thread %u: ibv_post_send #%u: %d", pt->tid, seq, ret);
				atomic_fetch_add(&c->errors, 1);
				return NULL;
			}
			CHECK(bad == &wr, "thread %u: ENOMEM but bad_wr is not the WR", pt->tid);
			atomic_fetch_add(&c->enomem, 1);
			if (t_now_ms() > c->deadline)
				return NULL;
			sched_yield();
		}
	}
	return NULL;
}

static void mt_post_parent(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	o.max_send_wr = SQ;
	o.cq_size = 2 * SQ;
	o.separate_cqs = true;
	struct t_res r;
	t_res_open(&r, &o);
	struct post_ctx *c = calloc(1, sizeof(*c));
	REQUIRE(c, "calloc");
	c->r = &r;
	c->buf = t_alloc((size_t)NTHREADS * SLOTS * MSG);
	struct ibv_mr *mr = t_reg(&r, c->buf, (size_t)NTHREADS * SLOTS * MSG, IBV_ACCESS_LOCAL_WRITE);
	c->lkey = mr->lkey;
	t_connect_pair(p, &r, mr, NULL);
	c->deadline = t_now_ms() + DEADLINE_MS;

	struct post_thread pts[NTHREADS];
	for (uint32_t i = 0; i < NTHREADS; i++) {
		pts[i] = (struct post_thread){.c = c, .tid = i};
		REQUIRE(pthread_create(&pts[i].th, NULL, poster, &pts[i]) == 0, "pthread_create");
	}
	/* This thread polls. */
	static uint8_t seen[NTHREADS][PER_THREAD];
	memset(seen, 0, sizeof(seen));
	int done = 0, bad_status = 0, dups = 0;
	uint32_t last[NTHREADS];
	memset(last, 0xff, sizeof(last));
	int order_err = 0;
	while (done < TOTAL && t_now_ms() < c->deadline && !atomic_load(&c->errors)) {
		struct ibv_wc wc[32];
		int n = ibv_poll_cq(r.send_cq, 32, wc);
		REQUIRE(n >= 0, "ibv_poll_cq: %d", n);
		for (int i = 0; i < n; i++) {
			uint32_t tid = (uint32_t)(wc[i].wr_id >> 32), seq = (uint32_t)wc[i].wr_id;
			if (wc[i].status != IBV_WC_SUCCESS && bad_status++ < 3)
				CHECK(false, "send %u/%u: %s", tid, seq, t_wc_status_str(wc[i].status));
			if (tid >= NTHREADS || seq >= PER_THREAD) {
				CHECK(false, "completion with a wr_id never posted: 0x%llx",
				      (unsigned long long)wc[i].wr_id);
				continue;
			}
			if (seen[tid][seq]++)
				dups++;
			/* One thread's sends complete in its posting order. */
			if (seq != last[tid] + 1)
				order_err++;
			last[tid] = seq;
			atomic_store(&c->completed[tid], seq + 1);
			done++;
		}
		if (n == 0)
			sched_yield();
	}
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(pts[i].th, NULL);
	CHECK(done == TOTAL, "%d send completions, expected %d", done, TOTAL);
	CHECK(dups == 0, "%d duplicate completions", dups);
	CHECK(order_err == 0, "%d completions out of a thread's posting order", order_err);
	CHECK(bad_status == 0, "%d failed sends", bad_status);
	CHECK(t_cq_drain(r.send_cq, NULL, 0, 50) == 0, "extra send completions");
	t_note("%d ENOMEM retries", atomic_load(&c->enomem));
	t_barrier_timeout(p, DEADLINE_MS);
	t_res_close(&r);
	free(c->buf);
	free(c);
}

static void mt_post_child(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	o.max_recv_wr = 256;
	o.cq_size = 512;
	struct t_res r;
	t_res_open(&r, &o);
	char *buf = t_alloc(256 * MSG);
	struct ibv_mr *mr = t_reg(&r, buf, 256 * MSG, IBV_ACCESS_LOCAL_WRITE);
	t_connect_pair(p, &r, mr, NULL);
	uint32_t posted = 0;
	for (; posted < 256; posted++)
		REQUIRE(t_post_recv(r.qp, posted, buf + (size_t)posted * MSG, MSG, mr->lkey) == 0,
			"ibv_post_recv");
	uint32_t next_seq[NTHREADS] = {0};
	int got = 0, bad = 0;
	uint64_t deadline = t_now_ms() + DEADLINE_MS;
	while (got < TOTAL && t_now_ms() < deadline) {
		struct ibv_wc wc[32];
		int n = ibv_poll_cq(r.recv_cq, 32, wc);
		REQUIRE(n >= 0, "ibv_poll_cq: %d", n);
		for (int i = 0; i < n; i++, got++) {
			REQUIRE(wc[i].status == IBV_WC_SUCCESS, "receive #%d: %s", got,
				t_wc_status_str(wc[i].status));
			char *slot = buf + (size_t)(wc[i].wr_id % 256) * MSG;
			struct payload pl;
			memcpy(&pl, slot, sizeof(pl));
			if (pl.tid >= NTHREADS || pl.seq != next_seq[pl.tid] || wc[i].byte_len != MSG) {
				if (bad++ < 5)
					CHECK(false, "receive #%d: thread %u seq %u byte_len %u (expected "
					      "seq %u)", got, pl.tid, pl.seq, wc[i].byte_len,
					      pl.tid < NTHREADS ? next_seq[pl.tid] : 0);
			} else {
				next_seq[pl.tid]++;
			}
			REQUIRE(t_post_recv(r.qp, posted, buf + (size_t)(posted % 256) * MSG, MSG,
					    mr->lkey) == 0, "ibv_post_recv");
			posted++;
		}
	}
	CHECK(got == TOTAL, "received %d messages, expected %d", got, TOTAL);
	CHECK(bad == 0, "%d messages out of their thread's order or corrupt", bad);
	t_barrier_timeout(p, DEADLINE_MS);
	t_res_close(&r);
	free(buf);
}

/* ------------------------------------------------------------------ */
/* Several threads poll one CQ                                         */
/* ------------------------------------------------------------------ */

#define NPOLLERS 4
#define NWRITES 4000

struct poll_ctx {
	struct ibv_cq *cq;
	atomic_int total;
	atomic_int errors;
	atomic_uchar seen[NWRITES];
	atomic_int dups;
	atomic_int per_thread[NPOLLERS];
	uint64_t deadline;
};

struct poll_thread {
	struct poll_ctx *c;
	int idx;
	pthread_t th;
};

static void *poller(void *arg)
{
	struct poll_thread *pt = arg;
	struct poll_ctx *c = pt->c;
	while (atomic_load(&c->total) < NWRITES && t_now_ms() < c->deadline) {
		struct ibv_wc wc[4];
		int n = ibv_poll_cq(c->cq, 4, wc);
		if (n < 0) {
			CHECK(false, "poller %d: ibv_poll_cq: %d", pt->idx, n);
			atomic_fetch_add(&c->errors, 1);
			return NULL;
		}
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				if (atomic_fetch_add(&c->errors, 1) < 3)
					CHECK(false, "write %llu: %s", (unsigned long long)wc[i].wr_id,
					      t_wc_status_str(wc[i].status));
			}
			if (wc[i].wr_id >= NWRITES) {
				CHECK(false, "unknown wr_id %llu", (unsigned long long)wc[i].wr_id);
				continue;
			}
			if (atomic_fetch_add(&c->seen[wc[i].wr_id], 1) != 0)
				atomic_fetch_add(&c->dups, 1);
			atomic_fetch_add(&c->per_thread[pt->idx], 1);
		}
		if (n)
			atomic_fetch_add(&c->total, n);
		else
			sched_yield();
	}
	return NULL;
}

static void mt_poll_parent(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	o.max_send_wr = SQ;
	o.cq_size = 2 * SQ;
	struct t_res r;
	t_res_open(&r, &o);
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct t_conn remote;
	t_connect_pair(p, &r, mr, &remote);
	struct poll_ctx *c = calloc(1, sizeof(*c));
	REQUIRE(c, "calloc");
	c->cq = r.send_cq;
	c->deadline = t_now_ms() + DEADLINE_MS;
	struct poll_thread pts[NPOLLERS];
	for (int i = 0; i < NPOLLERS; i++) {
		pts[i] = (struct poll_thread){.c = c, .idx = i};
		REQUIRE(pthread_create(&pts[i].th, NULL, poller, &pts[i]) == 0, "pthread_create");
	}
	/* This thread posts, keeping at most SQ - 1 outstanding. */
	for (int i = 0; i < NWRITES && t_now_ms() < c->deadline && !atomic_load(&c->errors);) {
		if (i - atomic_load(&c->total) >= (int)r.cap.max_send_wr - 1 ||
		    i - atomic_load(&c->total) >= SQ - 1) {
			sched_yield();
			continue;
		}
		int ret = t_post_send(r.qp, (uint64_t)i, IBV_WR_RDMA_WRITE, buf + (i % 64) * 64, 64,
				      mr->lkey, IBV_SEND_SIGNALED, remote.addr + (uint64_t)(i % 64) * 64,
				      remote.rkey);
		if (ret == ENOMEM) { /* completions polled but not yet counted */
			sched_yield();
			continue;
		}
		REQUIRE(ret == 0, "post WRITE #%d: %d", i, ret);
		i++;
	}
	for (int i = 0; i < NPOLLERS; i++)
		pthread_join(pts[i].th, NULL);
	int total = atomic_load(&c->total);
	CHECK(total == NWRITES, "%d completions polled by %d threads, expected %d", total, NPOLLERS,
	      NWRITES);
	CHECK(atomic_load(&c->dups) == 0, "%d completions were returned twice", atomic_load(&c->dups));
	int missing = 0;
	for (int i = 0; i < NWRITES; i++)
		missing += atomic_load(&c->seen[i]) == 0;
	CHECK(missing == 0, "%d WRITEs never completed", missing);
	CHECK(atomic_load(&c->errors) == 0, "%d failed completions", atomic_load(&c->errors));
	t_note("completions per poller: %d %d %d %d", atomic_load(&c->per_thread[0]),
	       atomic_load(&c->per_thread[1]), atomic_load(&c->per_thread[2]),
	       atomic_load(&c->per_thread[3]));
	t_barrier(p);
	t_res_close(&r);
	free(buf);
	free(c);
}

static void mt_poll_child(struct t_peer *p, void *arg)
{
	t_passive_target(p, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
			 DEADLINE_MS + 5000);
}

/* ------------------------------------------------------------------ */
/* One thread polls a CQ behind many QPs while another resets and      */
/* destroys them one by one                                            */
/* ------------------------------------------------------------------ */

/* More QPs than a poll enters at once (8): over TCP the CQ then keeps
 * their sockets in a readiness set, which names QPs by pointer; each must
 * leave it before it goes.  Every QP still there keeps working. */
#define CHURN_QPS 12
#define CHURN_ROUNDS 6 /* Writes over every QP left, between two losses */

struct churn {
	struct ibv_cq *cq;
	atomic_int ok, errors, stop;
};

static void *churn_poller(void *arg)
{
	struct churn *c = arg;

	while (!atomic_load(&c->stop)) {
		struct ibv_wc wc[8];
		int n = ibv_poll_cq(c->cq, 8, wc);

		if (n < 0) {
			atomic_fetch_add(&c->errors, 1);
			return NULL;
		}
		for (int i = 0; i < n; i++) {
			/* (a QP reset or destroyed with Writes out may flush
			 * them; the others must succeed) */
			if (wc[i].wr_id >= CHURN_QPS)
				continue; /* (the Write out as its QP goes) */
			if (wc[i].status == IBV_WC_SUCCESS)
				atomic_fetch_add(&c->ok, 1);
			else if (wc[i].status != IBV_WC_WR_FLUSH_ERR)
				atomic_fetch_add(&c->errors, 1);
		}
	}
	return NULL;
}

/* CHURN_QPS QPs on r's one CQ, each connected to one of the peer's. */
static void churn_connect(struct t_peer *p, struct t_res *r, struct ibv_qp **qps,
			  const struct ibv_mr *mr, struct t_conn *remote)
{
	for (int i = 0; i < CHURN_QPS; i++) {
		struct ibv_qp_init_attr ia = {
			.send_cq = r->send_cq,
			.recv_cq = r->recv_cq,
			.qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 16, .max_recv_wr = 16,
				 .max_send_sge = 1, .max_recv_sge = 1 },
		};
		struct t_conn local;

		qps[i] = ibv_create_qp(r->pd, &ia);
		REQUIRE(qps[i], "ibv_create_qp %d: %s", i, strerror(errno));
		r->qp = qps[i];
		t_conn_local(r, mr, &local);
		t_exchange(p, &local, remote);
		t_connect(r, remote);
	}
	r->qp = NULL;
	t_barrier(p);
}

static void churn_parent(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	struct ibv_qp *qps[CHURN_QPS];
	struct churn *c = calloc(1, sizeof(*c));
	struct t_conn remote;
	struct t_res r;
	pthread_t th;
	int want = 0;

	o.create_qp = false;
	o.cq_size = 1024;
	t_res_open(&r, &o);
	REQUIRE(c, "calloc");
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	churn_connect(p, &r, qps, mr, &remote);
	c->cq = r.send_cq;
	REQUIRE(pthread_create(&th, NULL, churn_poller, c) == 0, "pthread_create");
	for (int gone = 0; gone < CHURN_QPS; gone++) {
		uint64_t until = t_now_ms() + 20000;

		for (int k = 0; k < CHURN_ROUNDS; k++)
			for (int i = gone; i < CHURN_QPS; i++) {
				int ret = t_post_send(qps[i], (uint64_t)i, IBV_WR_RDMA_WRITE,
						      buf + i * 64, 64, mr->lkey,
						      IBV_SEND_SIGNALED,
						      remote.addr + (uint64_t)i * 64,
						      remote.rkey);

				CHECK(ret == 0, "post Write on QP %d: %d", i, ret);
				want += ret == 0;
			}
		while (atomic_load(&c->ok) < want && !atomic_load(&c->errors) &&
		       t_now_ms() < until)
			sched_yield();
		CHECK(atomic_load(&c->ok) == want,
		      "%d QPs lost: %d of %d Writes completed", gone,
		      atomic_load(&c->ok), want);
		if (atomic_load(&c->ok) != want) {
			while (gone < CHURN_QPS) /* (the rest go before the CQ) */
				ibv_destroy_qp(qps[gone++]);
			break;
		}
		/* Writes out, then the QP goes while the other thread polls:
		 * the odd ones through RESET first. */
		t_post_send(qps[gone], 99, IBV_WR_RDMA_WRITE, buf, 64, mr->lkey,
			    IBV_SEND_SIGNALED, remote.addr, remote.rkey);
		if (gone & 1)
			CHECK(t_modify_state(qps[gone], IBV_QPS_RESET) == 0,
			      "QP %d to RESET", gone);
		CHECK(ibv_destroy_qp(qps[gone]) == 0, "ibv_destroy_qp %d", gone);
	}
	atomic_store(&c->stop, 1);
	pthread_join(th, NULL);
	CHECK(atomic_load(&c->errors) == 0, "%d failed polls or completions",
	      atomic_load(&c->errors));
	t_barrier(p);
	t_res_close(&r);
	free(buf);
	free(c);
}

static void churn_child(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	struct ibv_qp *qps[CHURN_QPS];
	struct t_conn remote;
	struct t_res r;

	o.create_qp = false;
	t_res_open(&r, &o);
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096,
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	churn_connect(p, &r, qps, mr, &remote);
	t_barrier_timeout(p, 50000);
	for (int i = 0; i < CHURN_QPS; i++)
		ibv_destroy_qp(qps[i]);
	t_res_close(&r);
	free(buf);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	t_set_case_timeout(55);
	t_pair("threads_post_one_qp", mt_post_parent, mt_post_child, NULL);
	t_pair("threads_poll_one_cq", mt_poll_parent, mt_poll_child, NULL);
	t_pair("threads_poll_while_qps_go", churn_parent, churn_child, NULL);
	return t_finish();
}
