// SPDX-License-Identifier: MIT
/*
 * RC queue pairs: the state machine and the send queue engine (the owner's
 * side of the receive queue is in rq.c).
 *
 * Send path: ibv_post_send validates and copies each WR into the private SQ
 * ring, then runs the engine in the caller's thread: the transport executes
 * the WR against the peer at once (shm: plain memory operations), and the
 * completion goes to the send CQ.  A WR the responder can't take yet (no
 * receive posted: RNR; peer not in RTR) stays at the head of the SQ and is
 * retried from ibv_poll_cq, ibv_post_send and the progress thread, until the
 * retry limits of the QP say otherwise.
 *
 * Receive path: ibv_post_recv writes the WR into the shared receive ring;
 * the peer's engine completes it in place; ibv_poll_cq harvests it.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/urdma.h"
#include "transport/transport.h"
#include "util/alloc.h"
#include "util/log.h"

/* How long destroying or resetting a QP waits for a deliverer to leave its
 * receive queue (one copy; a stopped peer would hold it for ever). */
#define RQ_WAIT_NS 1000000000ull

static const char *const qp_state_names[] = {
	[IBV_QPS_RESET] = "RESET", [IBV_QPS_INIT] = "INIT",
	[IBV_QPS_RTR] = "RTR",	   [IBV_QPS_RTS] = "RTS",
	[IBV_QPS_SQD] = "SQD",	   [IBV_QPS_SQE] = "SQE",
	[IBV_QPS_ERR] = "ERR",
};

static inline struct urdma_swqe *sq_slot(struct urdma_qp *qp, uint32_t idx)
{
	return (struct urdma_swqe *)(qp->sq + (size_t)(idx & (qp->sq_size - 1)) *
						      qp->sq_stride);
}

/* ---- creation ---- */

static _Atomic uint32_t next_handle = 1;

/*
 * A QP number, published in the host directory with the QP's shared block.
 * A transport that makes numbers (TCP: one that names its listener, so
 * peers on other hosts and of other users can reach the QP) is asked
 * first; a random number otherwise.  A number a transport made but the
 * host directory refuses (another network namespace on this host uses it)
 * stays taken and another is tried.
 */
static int qp_number(struct urdma_qp *qp, uint32_t *qpn)
{
	uint32_t ctx_id = qp->uctx->ctx_id;
	int ret = EAGAIN;

	for (int t = 0; urdma_transports[t] && ret; t++) {
		const struct urdma_transport_ops *tr = urdma_transports[t];

		for (int tries = 0; tr->qpn_reserve && ret && tries < 64;
		     tries++) {
			if (tr->qpn_reserve(qpn))
				break;
			ret = -urdma_host_qp_publish(*qpn, ctx_id,
						     (uintptr_t)qp->shm,
						     qp->shm_size);
			if (!ret)
				qp->qpn_tr = tr;
		}
	}
	for (int tries = 0; ret && tries < 64; tries++) {
		*qpn = urdma_random32() & 0xffffff;
		if (*qpn < 2)
			continue;
		ret = -urdma_host_qp_publish(*qpn, ctx_id, (uintptr_t)qp->shm,
					     qp->shm_size);
	}
	return ret;
}

struct ibv_qp *urdma_create_qp(struct ibv_pd *ibpd,
			       struct ibv_qp_init_attr *init)
{
	struct urdma_context *uctx = to_uctx(ibpd->context);
	struct urdma_cq *scq, *rcq;
	struct ibv_qp_cap cap = init->cap;
	struct urdma_qp *qp;
	uint32_t qpn;
	int ret;

	if (init->qp_type != IBV_QPT_RC || init->srq) {
		urdma_dbg("only RC QPs without SRQ are supported");
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (!init->send_cq || !init->recv_cq ||
	    init->send_cq->context != ibpd->context ||
	    init->recv_cq->context != ibpd->context ||
	    cap.max_send_wr > URDMA_MAX_QP_WR ||
	    cap.max_recv_wr > URDMA_MAX_QP_WR ||
	    cap.max_send_sge > URDMA_MAX_SGE ||
	    cap.max_recv_sge > URDMA_MAX_SGE ||
	    cap.max_inline_data > URDMA_MAX_INLINE) {
		errno = EINVAL;
		return NULL;
	}
	if (!cap.max_send_wr)
		cap.max_send_wr = 1;
	if (!cap.max_send_sge)
		cap.max_send_sge = 1;
	if (!cap.max_recv_sge)
		cap.max_recv_sge = 1;
	if (cap.max_inline_data < 256)
		cap.max_inline_data = 256;
	scq = to_ucq(init->send_cq);
	rcq = to_ucq(init->recv_cq);

	qp = urdma_zalloc(sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	qp->uctx = uctx;
	qp->cap = cap;
	qp->sq_sig_all = init->sq_sig_all;
	qp->sq_size = roundup_pow2(cap.max_send_wr);
	qp->sq_stride = (sizeof(struct urdma_swqe) +
			 cap.max_send_sge * sizeof(struct ibv_sge) +
			 cap.max_inline_data + 63) & ~63u;
	qp->sq = urdma_zalloc_array(qp->sq_size, qp->sq_stride);
	if (!qp->sq) {
		ret = ENOMEM;
		goto err_free;
	}
	ret = -urdma_rq_init(qp, cap.max_recv_wr, cap.max_recv_sge);
	if (ret)
		goto err_free_sq;
	ret = qp_number(qp, &qpn);
	if (ret)
		goto err_free_rq;
	*qp->shm = (struct urdma_shm_qp){
		.magic = URDMA_SHM_MAGIC,
		.version = URDMA_SHM_VERSION,
		.qpn = qpn,
		.ctx_id = uctx->ctx_id,
		.pd_id = to_upd(ibpd)->id,
		.rq_size = qp->rq.size,
		.rq_stride = qp->rq.stride,
		.rq_max_sge = qp->rq.max_sge,
		.rq_offset = sizeof(struct urdma_shm_qp),
	};
	pthread_mutex_init(&qp->sq_lock, NULL);
	pthread_mutex_init(&qp->rq_lock, NULL);
	pthread_mutex_init(&qp->ibqp.mutex, NULL);
	pthread_cond_init(&qp->ibqp.cond, NULL);
	qp->ibqp.context = ibpd->context;
	qp->ibqp.qp_context = init->qp_context;
	qp->ibqp.pd = ibpd;
	qp->ibqp.send_cq = init->send_cq;
	qp->ibqp.recv_cq = init->recv_cq;
	/* Unique in the process, unlike QPNs and addresses (core/cm_link.h). */
	qp->ibqp.handle = atomic_fetch_add(&next_handle, 1);
	qp->ibqp.qp_num = qpn;
	qp->ibqp.state = IBV_QPS_RESET;
	qp->ibqp.qp_type = IBV_QPT_RC;
	qp->attr.qp_state = IBV_QPS_RESET;
	qp->attr.path_mtu = IBV_MTU_1024;

	pthread_mutex_lock(&uctx->lock);
	list_add_tail(&qp->ctx_node, &uctx->qps);
	pthread_mutex_unlock(&uctx->lock);
	pthread_mutex_lock(&scq->lock);
	list_add_tail(&qp->scq_node, &scq->send_qps);
	pthread_mutex_unlock(&scq->lock);
	pthread_mutex_lock(&rcq->lock);
	list_add_tail(&qp->rcq_node, &rcq->recv_qps);
	/* A CQ armed before this QP existed is armed for it too. */
	atomic_store(&qp->shm->notify, rcq->armed);
	pthread_mutex_unlock(&rcq->lock);
	atomic_fetch_add(&scq->usecnt, 1);
	atomic_fetch_add(&rcq->usecnt, 1);
	atomic_fetch_add(&to_upd(ibpd)->usecnt, 1);
	init->cap = cap;
	if (qp->qpn_tr)
		qp->qpn_tr->qpn_bind(qp);
	urdma_dbg("qp %#x created (sq %u, rq %u)", qpn, qp->sq_size,
		  qp->rq.size);
	return &qp->ibqp;

err_free_rq:
	urdma_rq_destroy(qp);
err_free_sq:
	urdma_free(qp->sq);
err_free:
	urdma_free(qp);
	errno = ret;
	return NULL;
}

/* Count the QP in its CQs' polled_qps while its transport has tr->poll. */
static void qp_count_polled(struct urdma_qp *qp, int d)
{
	if (!qp->tr || !qp->tr->poll)
		return;
	atomic_fetch_add(&to_ucq(qp->ibqp.send_cq)->polled_qps, d);
	atomic_fetch_add(&to_ucq(qp->ibqp.recv_cq)->polled_qps, d);
}

/*
 * Let go of the transport.  ibv_poll_cq enters tr->poll only for a QP it
 * found with a transport under a CQ lock, counting itself in 'pollers'; so
 * clear qp->tr, pass through both CQ locks, and wait for those inside.
 */
static void qp_disconnect(struct urdma_qp *qp)
{
	const struct urdma_transport_ops *tr = qp->tr;
	struct urdma_cq *scq = to_ucq(qp->ibqp.send_cq),
			*rcq = to_ucq(qp->ibqp.recv_cq);

	if (!tr)
		return;
	qp_count_polled(qp, -1);
	pthread_mutex_lock(&scq->lock);
	__atomic_store_n(&qp->tr, NULL, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&scq->lock);
	pthread_mutex_lock(&rcq->lock);
	pthread_mutex_unlock(&rcq->lock);
	while (atomic_load(&qp->pollers))
		sched_yield();
	tr->disconnect(qp);
}

/* Drop CQ entries that point at a QP being destroyed. */
static void cq_forget_qp(struct urdma_cq *cq, struct urdma_qp *qp)
{
	pthread_mutex_lock(&cq->lock);
	for (uint32_t i = cq->head; i != cq->tail; i++) {
		struct urdma_cqe *e = &cq->ring[i & (cq->size - 1)];

		if (e->qp == qp) {
			e->qp = NULL;
			e->retire = 0;
		}
	}
	pthread_mutex_unlock(&cq->lock);
}

int urdma_destroy_qp(struct ibv_qp *ibqp)
{
	struct urdma_qp *qp = to_uqp(ibqp);
	struct urdma_cq *scq = to_ucq(ibqp->send_cq), *rcq = to_ucq(ibqp->recv_cq);
	struct urdma_context *uctx = qp->uctx;

	urdma_host_qp_unpublish(ibqp->qp_num);
	atomic_store(&qp->shm->state, URDMA_SQPS_GONE);
	if (!urdma_rq_quiesce(qp, RQ_WAIT_NS)) {
		/* Its block is never reused: the deliverer may write on. */
		urdma_warn("qp %#x: destroyed with a peer still inside its "
			   "receive queue", ibqp->qp_num);
		qp->shm_busy_left = true;
	}
	pthread_mutex_lock(&uctx->lock);
	list_del(&qp->ctx_node);
	pthread_mutex_unlock(&uctx->lock);
	pthread_mutex_lock(&scq->lock);
	list_del(&qp->scq_node);
	pthread_mutex_unlock(&scq->lock);
	pthread_mutex_lock(&rcq->lock);
	list_del(&qp->rcq_node);
	pthread_mutex_unlock(&rcq->lock);
	cq_forget_qp(scq, qp);
	if (rcq != scq)
		cq_forget_qp(rcq, qp);
	pthread_mutex_lock(&qp->sq_lock);
	qp_disconnect(qp);
	pthread_mutex_unlock(&qp->sq_lock);
	if (qp->qpn_tr)
		qp->qpn_tr->qpn_release(ibqp->qp_num);
	atomic_fetch_sub(&scq->usecnt, 1);
	atomic_fetch_sub(&rcq->usecnt, 1);
	atomic_fetch_sub(&to_upd(ibqp->pd)->usecnt, 1);
	urdma_rq_destroy(qp);
	urdma_free(qp->sq);
	urdma_free(qp);
	return 0;
}

/* ---- errors and flushing ---- */

/* Move to ERR.  Called with sq_lock held; the engine flushes the SQ. */
static void qp_enter_error(struct urdma_qp *qp)
{
	bool was_error = qp->ibqp.state == IBV_QPS_ERR;

	qp->ibqp.state = IBV_QPS_ERR;
	qp->attr.qp_state = IBV_QPS_ERR;
	atomic_store(&qp->shm->state, URDMA_SQPS_ERR);
	if (!was_error) {
		qp->rq_err_ns = urdma_now_ns();
		urdma_dbg("qp %#x -> ERR", qp->ibqp.qp_num);
	}
	/* sq_run() flushes the receive queue after the send queue, once no
	 * deliverer is inside it (urdma_rq_flush). */
}

static void sq_complete(struct urdma_qp *qp, struct urdma_swqe *wqe,
			enum ibv_wc_status status)
{
	static const uint8_t wc_opcode[] = {
		[IBV_WR_RDMA_WRITE] = IBV_WC_RDMA_WRITE,
		[IBV_WR_RDMA_WRITE_WITH_IMM] = IBV_WC_RDMA_WRITE,
		[IBV_WR_SEND] = IBV_WC_SEND,
		[IBV_WR_SEND_WITH_IMM] = IBV_WC_SEND,
		[IBV_WR_RDMA_READ] = IBV_WC_RDMA_READ,
		[IBV_WR_ATOMIC_CMP_AND_SWP] = IBV_WC_COMP_SWAP,
		[IBV_WR_ATOMIC_FETCH_AND_ADD] = IBV_WC_FETCH_ADD,
	};
	bool signaled = qp->sq_sig_all || (wqe->send_flags & IBV_SEND_SIGNALED);
	struct ibv_wc wc;

	if (status == IBV_WC_SUCCESS && !signaled) {
		qp->unsignaled++;
		return;
	}
	memset(&wc, 0, sizeof(wc));
	wc.wr_id = wqe->wr_id;
	wc.status = status;
	wc.opcode = wc_opcode[wqe->opcode];
	wc.byte_len = wqe->byte_len;
	wc.qp_num = qp->ibqp.qp_num;
	urdma_cq_push(to_ucq(qp->ibqp.send_cq), &wc, qp, qp->unsignaled + 1);
	qp->unsignaled = 0;
}

/* What the QP's transport retries may take before RETRY_EXC_ERR: 4.096 us
 * * 2^timeout per try, retry_cnt + 1 tries; 0 when timeout is 0 (for ever). */
uint64_t urdma_qp_retry_ns(const struct urdma_qp *qp)
{
	if (!qp->attr.timeout)
		return 0;
	return (4096ull << qp->attr.timeout) * (qp->attr.retry_cnt + 1);
}

static uint64_t rnr_timer_ns(uint32_t code)
{
	/* IB spec encoding of the RNR NAK timer, in units of 10 us. */
	static const uint32_t t10us[32] = {
		65536, 1,    2,	   3,	 4,    6,    8,	   12,	 16,   24,   32,
		48,    64,   96,   128,	 192,  256,  384,  512,	 768,  1024, 1536,
		2048,  3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
	};
	return (uint64_t)t10us[code & 31] * 10000;
}

/* Decide what a WR the responder could not take becomes. */
static bool sq_retry_exceeded(struct urdma_qp *qp, struct urdma_swqe *wqe,
			      enum urdma_tx r, enum ibv_wc_status *status)
{
	uint64_t now = urdma_now_ns(), waited, budget;

	if (!wqe->first_try_ns)
		wqe->first_try_ns = now;
	waited = now - wqe->first_try_ns;
	if (qp->peer && urdma_peer_dead(qp->peer)) {
		*status = IBV_WC_RETRY_EXC_ERR;
		return true;
	}
	if (r == URDMA_TX_RNR) {
		uint32_t code = qp->peer_qp ? qp->peer_qp->min_rnr_timer : 12;

		if (qp->attr.rnr_retry == 7)
			return false; /* 7 means for ever */
		if (waited / rnr_timer_ns(code) > qp->attr.rnr_retry) {
			*status = IBV_WC_RNR_RETRY_EXC_ERR;
			return true;
		}
		return false;
	}
	budget = urdma_qp_retry_ns(qp);
	if (budget && waited > budget) {
		*status = IBV_WC_RETRY_EXC_ERR;
		return true;
	}
	return false;
}

static void sq_set_pending(struct urdma_qp *qp, bool pending)
{
	bool was = qp->sq_pending;

	qp->sq_pending = pending;
	if (pending && !was) {
		/* Retried from poll_cq, and by the progress thread's timer. */
		atomic_store(&to_ucq(qp->ibqp.send_cq)->sq_pending, 1);
		urdma_progress_kick();
	}
}

/* Is a READ or atomic before sq_head not complete yet?  Under sq_lock. */
static bool sq_reads_pending(struct urdma_qp *qp)
{
	for (uint32_t i = qp->sq_comp; i != qp->sq_head; i++) {
		struct urdma_swqe *w = sq_slot(qp, i);

		if ((w->opcode == IBV_WR_RDMA_READ ||
		     w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		     w->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) &&
		    !atomic_load_explicit(&w->done, memory_order_acquire))
			return true;
	}
	return false;
}

/* The QP whose engine this thread is running a WR of (sq_run). */
static __thread struct urdma_qp *running_qp;

/*
 * The engine: run WRs from the head of the SQ.  Called with sq_lock.
 *
 * sq_head is the next WR to execute, sq_comp the oldest not yet completed.
 * A transport finishes most WRs at once (URDMA_TX_DONE); one that waits for
 * a response (a READ or an atomic over TCP) returns URDMA_TX_POSTED and
 * later calls urdma_qp_wr_mark() and _kick().  Completions are reported
 * in SQ order.
 */
static void sq_run(struct urdma_qp *qp)
{
	atomic_store_explicit(&qp->sq_async, 0, memory_order_relaxed);
	for (;;) {
		struct urdma_swqe *wqe;
		enum ibv_wc_status status = IBV_WC_SUCCESS;
		enum urdma_tx r;

		/* Retire, in order, what has finished. */
		while (qp->sq_comp != qp->sq_head) {
			uint32_t d;

			wqe = sq_slot(qp, qp->sq_comp);
			d = atomic_load_explicit(&wqe->done,
						 memory_order_acquire);
			if (!d) {
				if (qp->ibqp.state != IBV_QPS_ERR)
					break;
				d = IBV_WC_WR_FLUSH_ERR + 1;
			}
			sq_complete(qp, wqe, d - 1);
			qp->sq_comp++;
			if (d - 1 != IBV_WC_SUCCESS) {
				urdma_dbg("qp %#x: wr %#llx failed: %s",
					  qp->ibqp.qp_num,
					  (unsigned long long)wqe->wr_id,
					  ibv_wc_status_str(d - 1));
				/* A flush that a transport's error request
				 * brought: the request puts the QP in ERR,
				 * with its event (urdma_qp_set_error). */
				if (qp->ibqp.state != IBV_QPS_ERR &&
				    (d - 1 != IBV_WC_WR_FLUSH_ERR ||
				     !atomic_load(&qp->shm->error_req)))
					qp_enter_error(qp);
			}
		}
		if (qp->sq_head == qp->sq_tail)
			break;
		wqe = sq_slot(qp, qp->sq_head);
		if (qp->ibqp.state == IBV_QPS_ERR) {
			atomic_store_explicit(&wqe->done,
					      IBV_WC_WR_FLUSH_ERR + 1,
					      memory_order_relaxed);
			qp->sq_head++;
			continue;
		}
		if (qp->ibqp.state != IBV_QPS_RTS)
			break; /* SQD: hold the queue */
		/* A fenced WR waits for the READs and atomics before it
		 * (not for Sends and Writes, which over TCP stay unconfirmed
		 * until a later response). */
		if ((wqe->send_flags & IBV_SEND_FENCE) && sq_reads_pending(qp))
			break;
		running_qp = qp;
		r = qp->tr ? qp->tr->execute(qp, wqe, &status) :
			     URDMA_TX_NOT_READY;
		running_qp = NULL;
		if (r == URDMA_TX_POSTED) {
			qp->sq_head++;
			continue;
		}
		if (r == URDMA_TX_WAIT) {
			sq_set_pending(qp, true);
			return;
		}
		if (r != URDMA_TX_DONE &&
		    !sq_retry_exceeded(qp, wqe, r, &status)) {
			sq_set_pending(qp, true);
			return;
		}
		atomic_store_explicit(&wqe->done, status + 1,
				      memory_order_relaxed);
		qp->sq_head++;
	}
	sq_set_pending(qp, false);
	/* In ERR: send errors and flushes are in the CQ; now the receives.
	 * Flushed receives are completions: wake an armed CQ. */
	if (qp->ibqp.state == IBV_QPS_ERR && urdma_rq_flush(qp))
		urdma_cq_notify(to_ucq(qp->ibqp.recv_cq));
}

/* A transport finished a WR it had posted (URDMA_TX_POSTED): mark it, then
 * kick.  Any thread; never waits for sq_lock. */
void urdma_qp_wr_mark(struct urdma_qp *qp, uint32_t idx,
		      enum ibv_wc_status status)
{
	atomic_store_explicit(&sq_slot(qp, idx)->done, status + 1,
			      memory_order_release);
}

/* Report WRs marked done: run the engine now if nobody holds it. */
void urdma_qp_wr_kick(struct urdma_qp *qp)
{
	atomic_store(&qp->sq_async, 1);
	/* Marked from inside a WR's execution (the sending thread took the
	 * answers): the engine retires it when that returns, or the QP is
	 * pending and retried. */
	if (running_qp == qp)
		return;
	if (pthread_mutex_trylock(&qp->sq_lock)) {
		urdma_progress_kick(); /* the holder may have passed it */
		return;
	}
	sq_run(qp);
	pthread_mutex_unlock(&qp->sq_lock);
}

void urdma_qp_progress(struct urdma_qp *qp)
{
	if (pthread_mutex_trylock(&qp->sq_lock))
		return; /* whoever holds it runs the engine */
	if (qp->sq_pending || atomic_load(&qp->sq_async))
		sq_run(qp);
	pthread_mutex_unlock(&qp->sq_lock);
}

void urdma_qp_set_error(struct urdma_qp *qp, bool fatal_event)
{
	struct ibv_async_event ev = {
		.element.qp = &qp->ibqp,
		.event_type = fatal_event ? IBV_EVENT_QP_FATAL :
					    IBV_EVENT_QP_ACCESS_ERR,
	};
	bool changed;

	pthread_mutex_lock(&qp->sq_lock);
	/* Under sq_lock, as sq_run looks at it. */
	atomic_store(&qp->shm->error_req, 0);
	changed = qp->ibqp.state != IBV_QPS_ERR &&
		  qp->ibqp.state != IBV_QPS_RESET;
	if (changed) {
		qp_enter_error(qp);
		sq_run(qp);
	}
	pthread_mutex_unlock(&qp->sq_lock);
	if (changed)
		urdma_async_event(qp->uctx, &ev);
}

/*
 * How long a QP with nothing in flight takes to notice a dead peer: what
 * its retry limits would take on a wire (4.096 us * 2^timeout per try,
 * retry_cnt + 1 tries; 1 s when timeout is 0 = infinite).  A peer that
 * exits normally right after its last message must not flush receives
 * whose completions the application has yet to poll.  A send WR that meets
 * the dead peer meanwhile fails at once with RETRY_EXC_ERR (the engine's
 * sq_retry_exceeded), and the ones behind it are flushed.
 */
uint64_t urdma_qp_loss_grace_ns(struct urdma_qp *qp)
{
	uint64_t budget = urdma_qp_retry_ns(qp);

	return budget ? budget : 1000000000ull;
}

/* Progress thread: requests from peers, and retries.  Returns whether it
 * wants to be called again soon. */
bool urdma_qp_maintain(struct urdma_qp *qp)
{
	struct urdma_shm_qp *s = qp->shm;
	const struct urdma_transport_ops *tr;
	bool again = false;

	struct urdma_peer *p = urdma_peer_ref(&qp->peer);
	bool dead = p && urdma_peer_dead(p);

	urdma_peer_put(p);
	if (atomic_load(&qp->rq_bad) && qp->ibqp.state != IBV_QPS_ERR) {
		urdma_qp_set_error(qp, true);
	} else if (atomic_load(&s->error_req)) {
		urdma_qp_set_error(qp, false);
	} else if (dead && !atomic_load(&qp->peer_dead)) {
		uint64_t now = urdma_now_ns();

		if (!qp->peer_dead_ns)
			qp->peer_dead_ns = now;
		if (now - qp->peer_dead_ns >= urdma_qp_loss_grace_ns(qp)) {
			atomic_store(&qp->peer_dead, true);
			urdma_info("qp %#x: the peer process died",
				   qp->ibqp.qp_num);
			urdma_qp_set_error(qp, true);
		} else {
			again = true;
		}
	}
	if (atomic_load(&s->notify_fired) && atomic_exchange(&s->notify_fired, 0))
		urdma_cq_notify(to_ucq(qp->ibqp.recv_cq));
	/* In ERR, the receives wait for a deliverer to leave the ring. */
	if (atomic_load(&qp->rq_flush_wait)) {
		if (urdma_rq_flush(qp))
			urdma_cq_notify(to_ucq(qp->ibqp.recv_cq));
		again = true;
	}
	tr = qp->tr; /* read once: modify_qp may clear it meanwhile */
	if (tr && tr->maintain)
		again |= tr->maintain(qp);
	if (qp->sq_pending || atomic_load(&qp->sq_async))
		urdma_qp_progress(qp);
	return again || qp->sq_pending || atomic_load(&qp->sq_async);
}

void urdma_qp_release(struct urdma_qp *qp)
{
	pthread_mutex_lock(&qp->sq_lock);
	if (qp->tr && qp->tr->release)
		qp->tr->release(qp);
	pthread_mutex_unlock(&qp->sq_lock);
}


/* ---- send queue, posting ---- */

static int check_send_wr(struct urdma_qp *qp, const struct ibv_send_wr *wr,
			 uint32_t *len)
{
	uint64_t total = 0;

	switch (wr->opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
	case IBV_WR_RDMA_READ:
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		if (wr->num_sge != 1 || wr->sg_list[0].length != 8 ||
		    (wr->send_flags & IBV_SEND_INLINE))
			return EINVAL;
		break;
	default:
		return EINVAL; /* not an RC operation we implement */
	}
	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_send_sge)
		return EINVAL;
	for (int i = 0; i < wr->num_sge; i++)
		total += wr->sg_list[i].length;
	if (total > (1u << 31))
		return EINVAL;
	if (wr->send_flags & IBV_SEND_INLINE) {
		if (wr->opcode == IBV_WR_RDMA_READ ||
		    total > qp->cap.max_inline_data)
			return EINVAL;
	}
	*len = total;
	return 0;
}

int urdma_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
		    struct ibv_send_wr **bad)
{
	struct urdma_qp *qp = to_uqp(ibqp);
	int ret = 0;

	pthread_mutex_lock(&qp->sq_lock);
	for (; wr; wr = wr->next) {
		enum ibv_qp_state st = ibqp->state;
		struct urdma_swqe *w;
		uint32_t len;

		if (st == IBV_QPS_RESET || st == IBV_QPS_INIT ||
		    st == IBV_QPS_RTR) {
			ret = EINVAL;
			break;
		}
		ret = check_send_wr(qp, wr, &len);
		if (ret)
			break;
		if (qp->sq_tail - atomic_load_explicit(&qp->sq_retired,
						       memory_order_acquire) >=
		    qp->cap.max_send_wr) {
			ret = ENOMEM;
			break;
		}
		w = sq_slot(qp, qp->sq_tail);
		w->wr_id = wr->wr_id;
		w->opcode = wr->opcode;
		w->send_flags = wr->send_flags;
		w->imm_data = wr->imm_data;
		w->byte_len = len;
		w->first_try_ns = 0;
		w->rnr_tries = 0;
		atomic_store_explicit(&w->done, 0, memory_order_relaxed);
		if (wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		    wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
			w->remote_addr = wr->wr.atomic.remote_addr;
			w->rkey = wr->wr.atomic.rkey;
			w->compare_add = wr->wr.atomic.compare_add;
			w->swap = wr->wr.atomic.swap;
		} else {
			w->remote_addr = wr->wr.rdma.remote_addr;
			w->rkey = wr->wr.rdma.rkey;
		}
		if (wr->send_flags & IBV_SEND_INLINE) {
			uint8_t *p = (uint8_t *)&w->sge[qp->cap.max_send_sge];

			for (int i = 0; i < wr->num_sge; i++) {
				memcpy(p, (void *)(uintptr_t)wr->sg_list[i].addr,
				       wr->sg_list[i].length);
				p += wr->sg_list[i].length;
			}
			w->inline_len = len;
			w->num_sge = 0;
		} else {
			w->inline_len = 0;
			w->num_sge = wr->num_sge;
			if (wr->num_sge) /* sg_list may be NULL then */
				memcpy(w->sge, wr->sg_list,
				       wr->num_sge * sizeof(struct ibv_sge));
		}
		qp->sq_tail++;
	}
	if (ret)
		*bad = wr;
	sq_run(qp);
	pthread_mutex_unlock(&qp->sq_lock);
	return ret;
}

/* Inline data of a WR. */
static inline uint8_t *swqe_inline(struct urdma_qp *qp, struct urdma_swqe *w)
{
	return (uint8_t *)&w->sge[qp->cap.max_send_sge];
}

enum ibv_wc_status urdma_local_spans(struct urdma_qp *qp,
				     struct urdma_swqe *wqe,
				     struct urdma_span *spans, int *n,
				     uint32_t access)
{
	uint32_t pd_id = to_upd(qp->ibqp.pd)->id;
	int k = 0;

	if (wqe->send_flags & IBV_SEND_INLINE) {
		spans[0] = (struct urdma_span){ .len = wqe->inline_len,
						.ptr = swqe_inline(qp, wqe) };
		*n = 1;
		return IBV_WC_SUCCESS;
	}
	for (uint32_t i = 0; i < wqe->num_sge; i++) {
		struct ibv_sge *sg = &wqe->sge[i];

		if (!sg->length)
			continue;
		if (urdma_mr_lookup(qp->uctx->shm, sg->lkey, sg->addr,
				    sg->length, access, pd_id, &spans[k].va,
				    &spans[k].direct))
			return IBV_WC_LOC_PROT_ERR;
		spans[k].len = sg->length;
		spans[k].ptr = NULL;
		k++;
	}
	*n = k;
	return IBV_WC_SUCCESS;
}

/* ---- modify / query ---- */

struct qp_trans {
	int req, opt;
	bool ok;
};

#define T(r, o) { .req = (r), .opt = (o), .ok = true }
static const struct qp_trans qp_trans[IBV_QPS_ERR + 1][IBV_QPS_ERR + 1] = {
	[IBV_QPS_RESET] = {
		[IBV_QPS_RESET] = T(0, 0),
		[IBV_QPS_INIT] = T(IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				   IBV_QP_ACCESS_FLAGS, 0),
	},
	[IBV_QPS_INIT] = {
		[IBV_QPS_INIT] = T(0, IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				      IBV_QP_ACCESS_FLAGS),
		[IBV_QPS_RTR] = T(IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				  IBV_QP_MIN_RNR_TIMER,
				  IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
				  IBV_QP_PKEY_INDEX),
	},
	[IBV_QPS_RTR] = {
		[IBV_QPS_RTS] = T(IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
				  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				  IBV_QP_MAX_QP_RD_ATOMIC,
				  IBV_QP_CUR_STATE | IBV_QP_ALT_PATH |
				  IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
				  IBV_QP_PATH_MIG_STATE),
	},
	[IBV_QPS_RTS] = {
		[IBV_QPS_RTS] = T(0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS |
				     IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
				     IBV_QP_MIN_RNR_TIMER),
		[IBV_QPS_SQD] = T(0, IBV_QP_EN_SQD_ASYNC_NOTIFY),
	},
	[IBV_QPS_SQD] = {
		[IBV_QPS_RTS] = T(0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS |
				     IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
				     IBV_QP_MIN_RNR_TIMER),
		[IBV_QPS_SQD] = T(0, IBV_QP_AV | IBV_QP_ALT_PATH |
				     IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX |
				     IBV_QP_MIN_RNR_TIMER |
				     IBV_QP_MAX_QP_RD_ATOMIC |
				     IBV_QP_MAX_DEST_RD_ATOMIC |
				     IBV_QP_CUR_STATE | IBV_QP_PATH_MIG_STATE |
				     IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY),
	},
	[IBV_QPS_SQE] = {
		[IBV_QPS_RTS] = T(0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS),
	},
};
#undef T

#define QP_ACCESS_OK                                                           \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |                    \
	 IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

static int check_values(struct urdma_qp *qp, const struct ibv_qp_attr *a,
			int mask)
{
	if ((mask & IBV_QP_PORT) && a->port_num != 1)
		return EINVAL;
	if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0)
		return EINVAL;
	if ((mask & IBV_QP_ACCESS_FLAGS) && (a->qp_access_flags & ~QP_ACCESS_OK))
		return EINVAL;
	if ((mask & IBV_QP_PATH_MTU) &&
	    (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096))
		return EINVAL;
	if ((mask & IBV_QP_DEST_QPN) && a->dest_qp_num > 0xffffff)
		return EINVAL;
	if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) &&
	    a->max_dest_rd_atomic > URDMA_MAX_RD_ATOM)
		return EINVAL;
	if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) &&
	    a->max_rd_atomic > URDMA_MAX_RD_ATOM)
		return EINVAL;
	if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31)
		return EINVAL;
	if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7)
		return EINVAL;
	if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7)
		return EINVAL;
	if ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31)
		return EINVAL;
	if ((mask & IBV_QP_PATH_MIG_STATE) && a->path_mig_state != IBV_MIG_MIGRATED)
		return EOPNOTSUPP;
	if (mask & IBV_QP_ALT_PATH)
		return EOPNOTSUPP; /* no automatic path migration */
	if (mask & IBV_QP_AV) {
		const struct ibv_ah_attr *ah = &a->ah_attr;

		if (ah->port_num > 1)
			return EINVAL;
		if (ah->is_global && ah->grh.sgid_index >= qp->uctx->num_gids)
			return EINVAL;
	}
	return 0;
}

static void reset_queues(struct urdma_qp *qp)
{
	struct urdma_shm_qp *s = qp->shm;

	qp->sq_head = qp->sq_tail = qp->sq_comp = 0;
	atomic_store(&qp->sq_retired, 0);
	qp->unsignaled = 0;
	qp->sq_pending = false;
	urdma_rq_reset(qp);
	atomic_store(&s->error_req, 0);
	atomic_store(&s->rnr_waiter, 0);
	atomic_store(&qp->peer_dead, false);
	qp->peer_dead_ns = 0;
}

int urdma_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask)
{
	struct urdma_qp *qp = to_uqp(ibqp);
	enum ibv_qp_state cur, next;
	const struct qp_trans *t;
	int ret = 0;

	pthread_mutex_lock(&qp->sq_lock);
	cur = ibqp->state;
	next = (mask & IBV_QP_STATE) ? a->qp_state : cur;
	if (next > IBV_QPS_ERR || ((mask & IBV_QP_CUR_STATE) &&
				   a->cur_qp_state != cur)) {
		ret = EINVAL;
		goto out;
	}
	if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
		static const struct qp_trans any = { 0, IBV_QP_CUR_STATE, true };
		t = &any;
	} else {
		t = &qp_trans[cur][next];
	}
	mask &= ~IBV_QP_STATE;
	if (!t->ok || (mask & t->req) != t->req ||
	    (mask & ~(t->req | t->opt))) {
		urdma_dbg("qp %#x: %s -> %s with mask %#x refused",
			  ibqp->qp_num, qp_state_names[cur],
			  qp_state_names[next], mask);
		ret = EINVAL;
		goto out;
	}
	ret = check_values(qp, a, mask);
	if (ret)
		goto out;

	if (mask & IBV_QP_ACCESS_FLAGS) {
		qp->attr.qp_access_flags = a->qp_access_flags;
		qp->shm->access = a->qp_access_flags;
	}
	if (mask & IBV_QP_PKEY_INDEX)
		qp->attr.pkey_index = a->pkey_index;
	if (mask & IBV_QP_PORT)
		qp->attr.port_num = a->port_num;
	if (mask & IBV_QP_AV)
		qp->attr.ah_attr = a->ah_attr;
	if (mask & IBV_QP_PATH_MTU)
		qp->attr.path_mtu = a->path_mtu;
	if (mask & IBV_QP_DEST_QPN)
		qp->attr.dest_qp_num = a->dest_qp_num;
	if (mask & IBV_QP_RQ_PSN)
		qp->attr.rq_psn = a->rq_psn & 0xffffff;
	if (mask & IBV_QP_SQ_PSN)
		qp->attr.sq_psn = a->sq_psn & 0xffffff;
	if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) {
		qp->attr.max_dest_rd_atomic = a->max_dest_rd_atomic;
		qp->shm->max_dest_rd_atomic = a->max_dest_rd_atomic;
	}
	if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
		qp->attr.max_rd_atomic = a->max_rd_atomic;
	if (mask & IBV_QP_MIN_RNR_TIMER) {
		qp->attr.min_rnr_timer = a->min_rnr_timer;
		qp->shm->min_rnr_timer = a->min_rnr_timer;
	}
	if (mask & IBV_QP_TIMEOUT)
		qp->attr.timeout = a->timeout;
	if (mask & IBV_QP_RETRY_CNT)
		qp->attr.retry_cnt = a->retry_cnt;
	if (mask & IBV_QP_RNR_RETRY)
		qp->attr.rnr_retry = a->rnr_retry;
	if (mask & IBV_QP_PATH_MIG_STATE)
		qp->attr.path_mig_state = a->path_mig_state;
	if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY)
		qp->attr.en_sqd_async_notify = a->en_sqd_async_notify;

	switch (next) {
	case IBV_QPS_RESET:
		atomic_store(&qp->shm->state, URDMA_SQPS_RESET);
		if (!urdma_rq_quiesce(qp, RQ_WAIT_NS)) {
			urdma_warn("qp %#x: reset with a peer still inside its "
				   "receive queue", ibqp->qp_num);
			qp->shm_busy_left = true;
		}
		qp_disconnect(qp);
		reset_queues(qp);
		break;
	case IBV_QPS_INIT:
		atomic_store(&qp->shm->state, URDMA_SQPS_INIT);
		break;
	case IBV_QPS_RTR:
		if (cur == IBV_QPS_INIT) {
			qp->tr = urdma_pick_transport(qp, &qp->attr);
			if (!qp->tr) {
				ret = EADDRNOTAVAIL;
				goto out;
			}
			ret = -qp->tr->connect(qp, &qp->attr);
			if (ret) {
				qp->tr = NULL;
				goto out;
			}
			qp_count_polled(qp, 1);
			atomic_store(&qp->shm->dest_qpn, qp->attr.dest_qp_num);
			atomic_store(&qp->shm->state, URDMA_SQPS_RTR);
			/* A sender may wait for us to reach RTR. */
			atomic_thread_fence(memory_order_seq_cst);
			if (atomic_exchange(&qp->shm->rnr_waiter, 0) && qp->peer)
				urdma_peer_wake(qp->peer);
			if (qp->tr->recv_posted) /* data may wait for RTR */
				qp->tr->recv_posted(qp);
		}
		break;
	case IBV_QPS_ERR:
		if (cur != IBV_QPS_ERR)
			qp_enter_error(qp);
		break;
	default:
		break;
	}
	if (next != cur)
		urdma_dbg("qp %#x: %s -> %s", ibqp->qp_num, qp_state_names[cur],
			  qp_state_names[next]);
	ibqp->state = next;
	qp->attr.qp_state = next;
	qp->attr.cur_qp_state = next;
	if (next == IBV_QPS_SQD && mask & IBV_QP_EN_SQD_ASYNC_NOTIFY &&
	    a->en_sqd_async_notify) {
		struct ibv_async_event ev = { .element.qp = ibqp,
					      .event_type = IBV_EVENT_SQ_DRAINED };
		urdma_async_event(qp->uctx, &ev);
	}
	if (next == IBV_QPS_RTS || next == IBV_QPS_ERR)
		sq_run(qp);
out:
	pthread_mutex_unlock(&qp->sq_lock);
	return ret;
}

int urdma_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask,
		   struct ibv_qp_init_attr *init)
{
	struct urdma_qp *qp = to_uqp(ibqp);

	pthread_mutex_lock(&qp->sq_lock);
	*a = qp->attr;
	a->qp_state = ibqp->state;
	a->cur_qp_state = ibqp->state;
	a->cap = qp->cap;
	a->sq_draining = 0;
	a->port_num = a->port_num ? a->port_num : 1;
	pthread_mutex_unlock(&qp->sq_lock);
	memset(init, 0, sizeof(*init));
	init->qp_context = ibqp->qp_context;
	init->send_cq = ibqp->send_cq;
	init->recv_cq = ibqp->recv_cq;
	init->cap = qp->cap;
	init->qp_type = ibqp->qp_type;
	init->sq_sig_all = qp->sq_sig_all;
	return 0;
}
