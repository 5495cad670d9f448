// SPDX-License-Identifier: MIT
/*
 * The send queue engine of RC queue pairs (the state machine is in qp.c,
 * the owner's side of the receive queue in rq.c): errors and flushing,
 * running WRs, retries, posting.
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
#include <string.h>

#include "core/urdma.h"
#include "transport/transport.h"
#include "util/alloc.h"
#include "util/log.h"

static inline struct urdma_swqe *sq_slot(struct urdma_qp *qp, uint32_t idx)
{
	return (struct urdma_swqe *)(qp->sq + (size_t)(idx & (qp->sq_size - 1)) *
						      qp->sq_stride);
}

/* ---- errors and flushing ---- */

/* Move to ERR.  Called with sq_lock held; the engine flushes the SQ. */
void urdma_qp_enter_error(struct urdma_qp *qp)
{
	bool was_error = qp->ibqp.state == IBV_QPS_ERR;

	qp->ibqp.state = IBV_QPS_ERR;
	qp->attr.qp_state = IBV_QPS_ERR;
	atomic_store(&qp->shm->state, URDMA_SQPS_ERR);
	if (!was_error) {
		qp->rq_err_ns = urdma_now_ns();
		urdma_dbg("qp %#x -> ERR", qp->ibqp.qp_num);
	}
	/* urdma_sq_run() flushes the receive queue after the send queue, once no
	 * deliverer is inside it (urdma_rq_flush). */
}

/* A send WR failed: the QP goes to ERR, but a UD QP to SQE, where its
 * send queue is flushed while its receives go on, until it is moved back
 * to RTS (IBA 10.3.1). */
static void sq_error(struct urdma_qp *qp)
{
	if (qp->ibqp.qp_type != IBV_QPT_UD) {
		urdma_qp_enter_error(qp);
		return;
	}
	qp->ibqp.state = IBV_QPS_SQE;
	qp->attr.qp_state = IBV_QPS_SQE;
	urdma_dbg("qp %#x -> SQE", qp->ibqp.qp_num);
}

/* Does the engine flush what it is given (ERR, SQE)? */
static bool sq_flushing(const struct urdma_qp *qp)
{
	return qp->ibqp.state == IBV_QPS_ERR || qp->ibqp.state == IBV_QPS_SQE;
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
		[IBV_WR_LOCAL_INV] = IBV_WC_LOCAL_INV,
		[IBV_WR_BIND_MW] = IBV_WC_BIND_MW,
		[IBV_WR_SEND_WITH_INV] = IBV_WC_SEND,
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
	urdma_cq_push(qp->scq, &wc, qp, qp->unsignaled + 1);
	qp->unsignaled = 0;
}

/*
 * An XRC send QP's signaled WRs, counted on the channel of its send CQ as
 * its transport takes them and as they complete.  A Send over TCP
 * completes when the peer's answer to the flush Read behind it comes back
 * on this QP's stream; the peer's reply comes into an XRC SRQ on another
 * stream, of another QP pair, and may overtake that answer (the kernel
 * promises no order between two sockets: a reply came 0.9 ms ahead of the
 * answer sent before it).  A program that waits for its Send's event on
 * the channel its receive CQ shares (Debian's perftest -e: one channel for
 * both, then one poll of the send CQ) would take the receive's event
 * instead.  So the SRQ's event waits for the WRs taken before it, for a
 * while (srq.c: xrc_event_waits).  The counts are sums over the channel's
 * QPs: a WR of another QP taken later that completes first ends the wait
 * early (the events then come as they did before).
 */
static struct urdma_channel *sig_chan(const struct urdma_qp *qp)
{
	return qp->ibqp.qp_type == IBV_QPT_XRC_SEND ? qp->scq->chan : NULL;
}

/* The transport is given a WR: counted before, as its bytes may reach the
 * peer, and the reply come back, before execute returns (under sq_lock). */
static void sig_taken(struct urdma_qp *qp, struct urdma_swqe *wqe)
{
	struct urdma_channel *ch = sig_chan(qp);

	if (ch && (qp->sq_sig_all || (wqe->send_flags & IBV_SEND_SIGNALED))) {
		wqe->sig_counted = true;
		atomic_fetch_add(&ch->xrc_taken, 1);
	}
}

/* A counted WR completed (done), or the transport did not take it after
 * all (it runs again later, and is counted then).  Under sq_lock. */
static void sig_uncount(struct urdma_qp *qp, struct urdma_swqe *wqe,
			bool done)
{
	struct urdma_channel *ch = sig_chan(qp);

	if (!wqe->sig_counted)
		return;
	wqe->sig_counted = false;
	if (!done) {
		atomic_fetch_sub(&ch->xrc_taken, 1);
		return;
	}
	/* an event that waited may go */
	atomic_fetch_add(&ch->xrc_done, 1);
	if (atomic_load(&urdma_xrc_held))
		urdma_progress_kick();
}

/* The QP's WRs taken will not complete (reset, destroyed): counted done.
 * Those counted lie between the oldest not completed and the next to run.
 * Under sq_lock. */
void urdma_sq_forget_signaled(struct urdma_qp *qp)
{
	for (uint32_t i = qp->sq_comp; i != qp->sq_head; i++)
		sig_uncount(qp, sq_slot(qp, i), true);
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

#define UC_GRACE_NS 1000000000ull
/* The longest a WR waits for its way while others' set-ups move. */
#define SETUP_WAIT_NS (30ull * 1000000000ull)

/* Decide what a WR the responder could not take becomes. */
static bool sq_retry_exceeded(struct urdma_qp *qp, struct urdma_swqe *wqe,
			      enum urdma_tx r, enum ibv_wc_status *status)
{
	uint64_t now = urdma_now_ns(), waited, budget;

	if (!wqe->first_try_ns)
		wqe->first_try_ns = wqe->budget_from_ns = now;
	waited = now - wqe->first_try_ns;
	/* Waiting for a way that is still being set up, while set-ups move,
	 * does not fail the WR, up to SETUP_WAIT_NS: past that (a peer that
	 * refuses us while other streams keep coming up) it fails as any
	 * other (so at most SETUP_WAIT_NS and a budget in all).  Once set-ups
	 * stop, the budget (and UC's grace) counts from the first look that
	 * found them stopped, not from the first try: a process that
	 * was not run for a second (a busy host; qp_scale QS_STALL_MS) finds
	 * on waking that no stream came up for that second before its
	 * progress thread has had a turn to bring them up; counted from the
	 * first try, every WR still waiting failed at once. */
	if (r == URDMA_TX_SETTING_UP && waited < SETUP_WAIT_NS) {
		wqe->budget_from_ns = 0;
		return false;
	}
	if (!wqe->budget_from_ns)
		wqe->budget_from_ns = now;
	/* UC waits for no responder: once messages have found no way to it
	 * for a while (its QP is not there yet or is gone, the stream is not
	 * up), they go into the void, as a NIC's would, and complete; those
	 * behind them at once, until one gets through (sq_run). */
	if (qp->ibqp.qp_type == IBV_QPT_UC) {
		if (!qp->uc_lost_ns)
			qp->uc_lost_ns = wqe->budget_from_ns;
		if (!(qp->peer && urdma_peer_dead(qp->peer)) &&
		    now - qp->uc_lost_ns < UC_GRACE_NS)
			return false;
		urdma_dbg("qp %#x: wr %#llx dropped: no responder", qp->ibqp.qp_num,
			  (unsigned long long)wqe->wr_id);
		*status = IBV_WC_SUCCESS;
		return true;
	}
	/* A dead peer: the WR fails once the retry budget has passed, as a
	 * NIC's retries run out (tcp_execute does the same for a lost
	 * stream). */
	if (qp->peer && urdma_peer_dead(qp->peer)) {
		if (waited < urdma_qp_loss_grace_ns(qp))
			return false;
		*status = IBV_WC_RETRY_EXC_ERR;
		return true;
	}
	if (r == URDMA_TX_RNR) {
		uint32_t code = qp->dst.qp ? qp->dst.qp->min_rnr_timer : 12;

		if (qp->attr.rnr_retry == 7)
			return false; /* 7 means for ever */
		if (waited / rnr_timer_ns(code) > qp->attr.rnr_retry) {
			*status = IBV_WC_RNR_RETRY_EXC_ERR;
			return true;
		}
		return false;
	}
	budget = urdma_qp_retry_ns(qp);
	if (budget && now - wqe->budget_from_ns > budget) {
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
		atomic_store(&qp->scq->sq_pending, 1);
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

/* The QP whose engine this thread is running a WR of (urdma_sq_run). */
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
	bool quiet = false; /* the transport was quiesced in this run */

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
				if (!sq_flushing(qp))
					break;
				d = IBV_WC_WR_FLUSH_ERR + 1;
			}
			if (d - 1 != IBV_WC_SUCCESS && !quiet && qp->tr &&
			    qp->tr->quiesce) {
				qp->tr->quiesce(qp);
				quiet = true;
			}
			sq_complete(qp, wqe, d - 1);
			sig_uncount(qp, wqe, true);
			qp->sq_comp++;
			if (d - 1 != IBV_WC_SUCCESS) {
				urdma_dbg("qp %#x: wr %#llx failed: %s",
					  qp->ibqp.qp_num,
					  (unsigned long long)wqe->wr_id,
					  ibv_wc_status_str(d - 1));
				/* A flush that a transport's error request
				 * brought: the request puts the QP in ERR,
				 * with its event (urdma_qp_set_error). */
				if (!sq_flushing(qp) &&
				    (d - 1 != IBV_WC_WR_FLUSH_ERR ||
				     !atomic_load(&qp->shm->error_req)))
					sq_error(qp);
			}
		}
		if (qp->sq_head == qp->sq_tail)
			break;
		wqe = sq_slot(qp, qp->sq_head);
		if (sq_flushing(qp)) {
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
		if (wqe->opcode == IBV_WR_BIND_MW ||
		    wqe->opcode == IBV_WR_LOCAL_INV) {
			status = urdma_mw_execute(qp, wqe); /* local */
			r = URDMA_TX_DONE;
		} else {
			sig_taken(qp, wqe);
			r = qp->tr ? qp->tr->execute(qp, wqe, &status) :
				     URDMA_TX_NOT_READY;
		}
		running_qp = NULL;
		if (qp->uc_lost_ns && (r == URDMA_TX_DONE || r == URDMA_TX_POSTED))
			qp->uc_lost_ns = 0; /* (UC) a way to the responder */
		if (r != URDMA_TX_POSTED && r != URDMA_TX_DONE)
			sig_uncount(qp, wqe, false);
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
		urdma_cq_notify(qp->rcq);
}

/* A receive's notification held back for the completions retired now
 * (urdma_qp_notify_recv): fired after them. */
static void fire_held(struct urdma_qp *qp)
{
	if (atomic_load(&qp->fire_held) && atomic_exchange(&qp->fire_held, 0))
		urdma_cq_notify(qp->rcq);
}

/* The engine, and a receive's event held for the completions it retires
 * (only then: not a look at a peer's line per ibv_post_send). */
void urdma_sq_run(struct urdma_qp *qp)
{
	bool marked = atomic_load_explicit(&qp->sq_async, memory_order_relaxed);
	const struct urdma_transport_ops *tr;

	sq_run(qp);
	tr = qp->tr;
	if (tr && tr->flush)
		tr->flush(qp);
	if (marked)
		fire_held(qp);
}

/*
 * A receive completed into qp's armed CQ, by this process's receive path
 * (TCP).  Send completions marked before it (a response read just before
 * the message) are retired and fired first, as a NIC writes CQEs in the
 * order things arrive: a program that waits for its send's event on a
 * channel its receive CQ shares (perftest -e) must not get the receive's.
 * If the engine is busy (this thread runs one of qp's WRs, or another
 * holds sq_lock), its holder fires it when it has retired them, or the
 * progress thread does.
 */
void urdma_qp_notify_recv(struct urdma_qp *qp)
{
	if (atomic_load(&qp->sq_async)) {
		if (running_qp == qp || pthread_mutex_trylock(&qp->sq_lock)) {
			atomic_store(&qp->fire_held, 1);
			urdma_progress_kick();
			return;
		}
		urdma_sq_run(qp);
		pthread_mutex_unlock(&qp->sq_lock);
	}
	urdma_cq_notify(qp->rcq);
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
	urdma_sq_run(qp);
	pthread_mutex_unlock(&qp->sq_lock);
}

void urdma_qp_progress(struct urdma_qp *qp)
{
	if (pthread_mutex_trylock(&qp->sq_lock))
		return; /* whoever holds it runs the engine */
	if (qp->sq_pending || atomic_load(&qp->sq_async))
		urdma_sq_run(qp);
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
	/* Under sq_lock, as urdma_sq_run looks at it. */
	atomic_store(&qp->shm->error_req, 0);
	changed = qp->ibqp.state != IBV_QPS_ERR &&
		  qp->ibqp.state != IBV_QPS_RESET;
	if (changed) {
		urdma_qp_enter_error(qp);
		urdma_sq_run(qp);
	}
	pthread_mutex_unlock(&qp->sq_lock);
	if (changed)
		urdma_async_event(qp->uctx, &ev);
}

/*
 * The peer is gone for good (its process, or the stream's retry budget):
 * the QP goes to ERR, and the WR at the head of the send queue, which was
 * waiting for it, completes with RETRY_EXC_ERR, as the WR whose retries
 * ran out does on a NIC; those behind it are flushed.  (Whichever comes
 * first, this or that WR's own retry limit in sq_retry_exceeded, the
 * same WR gets the same status.)
 */
void urdma_qp_lost(struct urdma_qp *qp)
{
	pthread_mutex_lock(&qp->sq_lock);
	if (qp->ibqp.state != IBV_QPS_ERR && qp->ibqp.state != IBV_QPS_RESET &&
	    qp->sq_head != qp->sq_tail) {
		if (!atomic_load_explicit(&sq_slot(qp, qp->sq_head)->done,
					  memory_order_relaxed)) {
			urdma_qp_wr_mark(qp, qp->sq_head, IBV_WC_RETRY_EXC_ERR);
			qp->sq_head++;
		}
	}
	pthread_mutex_unlock(&qp->sq_lock);
	urdma_qp_set_error(qp, true);
}

/*
 * How long a QP with nothing in flight takes to notice a dead peer: what
 * its retry limits would take on a wire (4.096 us * 2^timeout per try,
 * retry_cnt + 1 tries; 1 s when timeout is 0 = infinite).  A peer that
 * exits normally right after its last message must not flush receives
 * whose completions the application has yet to poll.  A send WR that meets
 * the dead peer fails with RETRY_EXC_ERR once it has waited as long (the
 * engine's sq_retry_exceeded; tcp_execute for a lost stream), and the
 * ones behind it are flushed.
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
	} else if (dead && !atomic_load(&qp->peer_dead) &&
		   qp->ibqp.qp_type != IBV_QPT_UC) { /* (UC never learns) */
		uint64_t now = urdma_now_ns();

		if (!qp->peer_dead_ns)
			qp->peer_dead_ns = now;
		if (now - qp->peer_dead_ns >= urdma_qp_loss_grace_ns(qp)) {
			atomic_store(&qp->peer_dead, true);
			urdma_info("qp %#x: the peer process died",
				   qp->ibqp.qp_num);
			urdma_qp_lost(qp);
		} else {
			again = true;
		}
	}
	/* In ERR, the receives wait for a deliverer to leave the ring. */
	if (atomic_load(&qp->rq_flush_wait)) {
		if (urdma_rq_flush(qp))
			urdma_cq_notify(qp->rcq);
		again = true;
	}
	tr = qp->tr; /* read once: modify_qp may clear it meanwhile */
	if (tr && tr->maintain)
		again |= tr->maintain(qp);
	if (qp->sq_pending || atomic_load(&qp->sq_async))
		urdma_qp_progress(qp);
	/* After tr->maintain, which lets go of a Send cut off by the error. */
	if (atomic_load(&qp->last_wqe_due)) {
		if (tr && tr->srq_held && tr->srq_held(qp))
			again = true;
		else if (atomic_exchange(&qp->last_wqe_due, false))
			urdma_srq_last_wqe(qp);
	}
	/* after the send completions that came before it; if the engine
	 * was busy, its holder fires it, or the next pass */
	if (!atomic_load(&qp->sq_async))
		fire_held(qp);
	return again || qp->sq_pending || atomic_load(&qp->sq_async) ||
	       atomic_load(&qp->fire_held);
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
	case IBV_WR_SEND_WITH_INV:
	case IBV_WR_RDMA_READ:
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		if (wr->num_sge != 1 || wr->sg_list[0].length != 8 ||
		    (wr->send_flags & IBV_SEND_INLINE))
			return EINVAL;
		break;
	case IBV_WR_BIND_MW: /* local: no data, checked when it runs */
		if (!wr->bind_mw.mw ||
		    wr->bind_mw.mw->context != qp->ibqp.context ||
		    (wr->send_flags & IBV_SEND_INLINE))
			return EINVAL;
		*len = 0;
		return 0;
	case IBV_WR_LOCAL_INV:
		if (wr->send_flags & IBV_SEND_INLINE)
			return EINVAL;
		*len = 0;
		return 0;
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

/* May wr be posted next?  Its length in *len.  Under sq_lock. */
static int sq_admit(struct urdma_qp *qp, const struct ibv_send_wr *wr,
		    uint32_t *len)
{
	enum ibv_qp_state st = qp->ibqp.state;
	int ret;

	if (st == IBV_QPS_RESET || st == IBV_QPS_INIT || st == IBV_QPS_RTR)
		return EINVAL;
	/* UC has no Reads, atomics or invalidation. */
	if (qp->ibqp.qp_type == IBV_QPT_UC &&
	    (wr->opcode == IBV_WR_RDMA_READ ||
	     wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
	     wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
	     wr->opcode == IBV_WR_SEND_WITH_INV))
		return EINVAL;
	/* An XRC send QP's WRs that reach the target name the SRQ; its
	 * messages do not invalidate (the Invalidate STag's field carries
	 * the SRQ over TCP). */
	if (qp->ibqp.qp_type == IBV_QPT_XRC_SEND &&
	    (wr->opcode == IBV_WR_SEND_WITH_INV ||
	     ((!wr->qp_type.xrc.remote_srqn ||
	       wr->qp_type.xrc.remote_srqn > 0xffffff) &&
	      wr->opcode != IBV_WR_BIND_MW && wr->opcode != IBV_WR_LOCAL_INV)))
		return EINVAL;
	/* UD: Sends to the QP and address a handle of ours names. */
	if (qp->ibqp.qp_type == IBV_QPT_UD &&
	    ((wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM) ||
	     !wr->wr.ud.ah || wr->wr.ud.ah->context != qp->ibqp.context ||
	     wr->wr.ud.remote_qpn > 0xffffff))
		return EINVAL;
	ret = check_send_wr(qp, wr, len);
	if (ret)
		return ret;
	if (qp->ibqp.qp_type == IBV_QPT_UD && *len > URDMA_UD_MTU)
		return EINVAL; /* a datagram is one packet */
	if (qp->sq_tail - atomic_load_explicit(&qp->sq_retired,
					       memory_order_acquire) >=
	    qp->cap.max_send_wr)
		return ENOMEM;
	return 0;
}

/* Copy an admitted WR into the SQ's next slot.  Under sq_lock. */
static void sq_put(struct urdma_qp *qp, const struct ibv_send_wr *wr,
		   uint32_t len)
{
	struct urdma_swqe *w = sq_slot(qp, qp->sq_tail);

	w->wr_id = wr->wr_id;
	w->opcode = wr->opcode;
	w->send_flags = wr->send_flags;
	w->imm_data = wr->imm_data;
	w->byte_len = len;
	w->xrc_srqn = qp->ibqp.qp_type == IBV_QPT_XRC_SEND ?
			      wr->qp_type.xrc.remote_srqn :
			      0;
	w->first_try_ns = 0;
	w->rnr_tries = 0;
	w->sig_counted = false;
	atomic_store_explicit(&w->done, 0, memory_order_relaxed);
	if (wr->opcode == IBV_WR_BIND_MW) {
		/* The window by its key when posted, the new key, the
		 * access, and the range as an SGE of the MR (mw.c). */
		const struct ibv_mw_bind_info *b = &wr->bind_mw.bind_info;

		w->swap = wr->bind_mw.mw->rkey;
		w->rkey = wr->bind_mw.rkey;
		w->imm_data = b->mw_access_flags;
		w->compare_add = b->mr ? b->length : 0;
		w->sge[0] = (struct ibv_sge){ b->addr, 0,
					      b->mr ? b->mr->lkey : 0 };
		w->num_sge = 0;
		w->inline_len = 0;
		qp->sq_tail++;
		return;
	}
	if (qp->ibqp.qp_type == IBV_QPT_UD) {
		w->ud_qpn = wr->wr.ud.remote_qpn;
		w->ud_qkey = wr->wr.ud.remote_qkey;
		w->av = to_uah(wr->wr.ud.ah)->av;
	} else if (wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
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

int urdma_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
		    struct ibv_send_wr **bad)
{
	struct urdma_qp *qp = to_uqp(ibqp);
	uint32_t len;
	int ret = 0;

	/* An XRC target (and ibv_open_qp's handles) has no send queue. */
	if (ibqp->qp_type == IBV_QPT_XRC_RECV) {
		*bad = wr;
		return EINVAL;
	}
	pthread_mutex_lock(&qp->sq_lock);
	for (; wr; wr = wr->next) {
		/* A type 1 window is bound with ibv_bind_mw only. */
		if (wr->opcode == IBV_WR_BIND_MW && wr->bind_mw.mw &&
		    wr->bind_mw.mw->type != IBV_MW_TYPE_2) {
			ret = EINVAL;
			break;
		}
		ret = sq_admit(qp, wr, &len);
		if (ret)
			break;
		sq_put(qp, wr, len);
	}
	if (ret)
		*bad = wr;
	urdma_sq_run(qp);
	pthread_mutex_unlock(&qp->sq_lock);
	return ret;
}

/* n WRs (an array, next ignored), all or none: the error of the first that
 * may not be posted, and then nothing is (ibv_wr_complete).  What was
 * copied before it is dropped: the engine runs nothing past sq_tail until
 * urdma_sq_run, under the same lock. */
int urdma_post_send_all(struct urdma_qp *qp, const struct ibv_send_wr *wr,
			uint32_t n)
{
	uint32_t len, tail;
	int ret = 0;

	pthread_mutex_lock(&qp->sq_lock);
	tail = qp->sq_tail;
	for (uint32_t i = 0; i < n && !ret; i++) {
		ret = sq_admit(qp, &wr[i], &len);
		if (!ret)
			sq_put(qp, &wr[i], len);
	}
	if (ret)
		qp->sq_tail = tail;
	else
		urdma_sq_run(qp);
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
	uint32_t pd_id = qp->pd->id;
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
				    sg->length, access, pd_id, URDMA_VIA_LOCAL,
				    &spans[k].va, &spans[k].direct))
			return IBV_WC_LOC_PROT_ERR;
		spans[k].len = sg->length;
		spans[k].ptr = NULL;
		k++;
	}
	*n = k;
	return IBV_WC_SUCCESS;
}
