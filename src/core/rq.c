// SPDX-License-Identifier: MIT
/*
 * The receive queue, owner side: ibv_post_recv writes receive WRs into the
 * QP's shared receive ring; a deliverer (the peer's requester over shared
 * memory, our own receive path over TCP) completes them in place;
 * ibv_poll_cq harvests the completions.  Flushing on ERR, and waiting for
 * deliverers to leave the ring before the owner changes it.
 *
 * The ring is in memory that every process of the user can write (the
 * identity memfd), so nothing in it is trusted: the geometry, what was
 * posted (WR id and length) and how far it was posted are kept here, in
 * private memory; what a deliverer writes (the completion index and
 * fields) is checked before it is reported, and nonsense puts the QP in
 * error (IBV_EVENT_QP_FATAL) instead of making up a completion.  No wait
 * on a deliverer is unbounded.
 */
#include <errno.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#include "core/urdma.h"
#include "transport/transport.h"
#include "util/alloc.h"
#include "util/log.h"

/* A deliverer inside the ring for this long while the QP is in ERR is
 * stuck (a stopped process, or a hostile one): flush without it. */
#define RQ_STUCK_NS 2000000000ull

int urdma_rq_init(struct urdma_qp *qp, uint32_t max_wr, uint32_t max_sge)
{
	uint64_t va;

	qp->rq.size = roundup_pow2(max_wr ? max_wr : 1);
	qp->rq.max_sge = max_sge;
	qp->rq.stride = urdma_rq_stride(max_sge);
	qp->shm_size = sizeof(struct urdma_shm_qp) +
		       (size_t)qp->rq.size * qp->rq.stride;
	qp->rq_wr = urdma_zalloc_array(qp->rq.size, sizeof(*qp->rq_wr));
	if (!qp->rq_wr)
		return -ENOMEM;
	qp->shm = urdma_arena_alloc(qp->shm_size, &va);
	if (!qp->shm) {
		urdma_free(qp->rq_wr);
		return -errno;
	}
	qp->rq_ring = (uint8_t *)qp->shm + sizeof(struct urdma_shm_qp);
	return 0;
}

void urdma_rq_destroy(struct urdma_qp *qp)
{
	urdma_arena_free(qp->shm, qp->shm_size, qp->shm_busy_left);
	urdma_free(qp->rq_wr);
}

/*
 * Wait until no deliverer is inside our receive ring, for at most wait_ns
 * once a short spin is over.  The caller has just published a state
 * deliverers refuse, with a full fence.  A deliverer is inside for one
 * copy; a dead one will not come back.
 */
bool urdma_rq_quiesce(struct urdma_qp *qp, uint64_t wait_ns)
{
	uint64_t start = 0;
	long pause = 1000;

	atomic_thread_fence(memory_order_seq_cst);
	for (int spins = 0; atomic_load(&qp->shm->busy); spins++) {
		struct timespec ts = { 0, pause };
		struct urdma_peer *p;
		uint64_t now;
		bool dead;

		if (spins < 64) {
			sched_yield();
			continue;
		}
		p = urdma_peer_ref(&qp->peer);
		dead = p && urdma_peer_dead(p);
		urdma_peer_put(p);
		if (dead)
			return true;
		now = urdma_now_ns();
		if (!start)
			start = now;
		if (now - start >= wait_ns)
			return false;
		nanosleep(&ts, NULL);
		if (pause < 1000000)
			pause *= 2;
	}
	return true;
}

/* A deliverer wrote something that can't be: the progress thread puts the
 * QP in error (urdma_qp_maintain); meanwhile nothing more is harvested. */
static void rq_bad(struct urdma_qp *qp, const char *what, uint32_t a,
		   uint32_t b)
{
	if (atomic_exchange(&qp->rq_bad, true))
		return;
	urdma_err("qp %#x: %s (%u, %u) in its receive queue, which another "
		  "process wrote: the QP goes to error", qp->ibqp.qp_num, what,
		  a, b);
	urdma_progress_kick();
}

/* The first entry from `from` on, before prod, that is not completed. */
static uint32_t rq_first_open(struct urdma_qp *qp, uint32_t from,
			      uint32_t prod)
{
	while (from != prod && urdma_rqe_done(urdma_rq_entry(qp, from), from))
		from++;
	return from;
}

/*
 * The QP is in ERR: every receive WR not completed yet completes with
 * FLUSH_ERR (harvested from rq_wr, not from the ring).  Returns how many
 * WRs that is, 0 if none or not yet: while a deliverer is still inside the
 * ring we wait (rq_flush_wait, retried by the progress thread), up to
 * RQ_STUCK_NS.
 */
uint32_t urdma_rq_flush(struct urdma_qp *qp)
{
	uint32_t prod, poll, from, n;

	pthread_mutex_lock(&qp->rq_lock);
	prod = atomic_load(&qp->rq_prod);
	if (!atomic_load(&qp->rq_flushed)) {
		if (!urdma_rq_quiesce(qp, 0)) {
			if (urdma_now_ns() - qp->rq_err_ns < RQ_STUCK_NS) {
				qp->rq_flush_wait = true;
				pthread_mutex_unlock(&qp->rq_lock);
				return 0;
			}
			urdma_warn("qp %#x: a peer has been inside its receive "
				   "queue for 2 s: flushed without it",
				   qp->ibqp.qp_num);
			qp->shm_busy_left = true;
		}
		poll = __atomic_load_n(&qp->rq_poll, __ATOMIC_ACQUIRE);
		/* The flushes start at the first entry not completed. */
		from = atomic_load(&qp->rq_bad) ? poll :
						  rq_first_open(qp, poll, prod);
		qp->rq_flush_from = from;
		qp->rq_flush_wait = false;
		atomic_store_explicit(&qp->rq_flushed, true,
				      memory_order_release);
		/* No deliverer is inside: it takes no more SRQ WRs.  The
		 * progress thread reports it once the transport holds none
		 * (urdma_qp_maintain). */
		if (qp->srq) {
			atomic_store(&qp->last_wqe_due, true);
			urdma_progress_kick();
		}
	}
	n = prod - qp->rq_flush_from;
	pthread_mutex_unlock(&qp->rq_lock);
	/* Flushes no deliverer rings for, and completions one published in
	 * error without a ring (a receive it could not use, UC and UD). */
	if (prod != __atomic_load_n(&qp->rq_poll, __ATOMIC_ACQUIRE))
		urdma_qp_bell_own(qp);
	return n;
}

void urdma_rq_reset(struct urdma_qp *qp)
{
	pthread_mutex_lock(&qp->rq_lock);
	atomic_fetch_add(&qp->shm->rq_epoch, 1);
	atomic_store(&qp->rq_prod, 0);
	atomic_store(&qp->shm->rq_prod, 0);
	atomic_store(&qp->shm->rq_done, 0);
	__atomic_store_n(&qp->rq_poll, 0, __ATOMIC_RELEASE);
	qp->rq_flush_from = 0;
	qp->rq_flush_wait = false;
	atomic_store(&qp->rq_flushed, false);
	atomic_store(&qp->rq_bad, false);
	atomic_store(&qp->last_wqe_due, false);
	pthread_mutex_unlock(&qp->rq_lock);
}

/* Receive completions ready to harvest (a hint: CQ resizing). */
uint32_t urdma_rq_ready(struct urdma_qp *qp)
{
	uint32_t poll = __atomic_load_n(&qp->rq_poll, __ATOMIC_ACQUIRE);
	uint32_t prod = atomic_load(&qp->rq_prod);

	if (atomic_load(&qp->rq_flushed))
		return prod - poll;
	return rq_first_open(qp, poll, prod) - poll;
}

/* Is a receive completion ready to harvest?  Only the first entry is
 * looked at: a cheap test for ibv_req_notify_cq. */
bool urdma_rq_any(struct urdma_qp *qp)
{
	uint32_t poll = __atomic_load_n(&qp->rq_poll, __ATOMIC_ACQUIRE);
	uint32_t prod = atomic_load(&qp->rq_prod);

	if (poll == prod)
		return false;
	return atomic_load(&qp->rq_flushed) ||
	       urdma_rqe_done(urdma_rq_entry(qp, poll), poll);
}

/* One completion a deliverer wrote into e, checked: 0, or -1 if it can't
 * be (an unknown status or opcode, a Send longer than the receive; for a
 * UD QP, anything but a Send of at least the GRH's 40 bytes). */
int urdma_rqe_take(const struct urdma_shm_rqe *e, uint64_t posted_len,
		   bool ud, struct ibv_wc *w)
{
	uint32_t status = READ_ONCE(e->status), opcode = READ_ONCE(e->opcode);
	uint32_t len = READ_ONCE(e->byte_len), flags = READ_ONCE(e->wc_flags);

	if (status > IBV_WC_TM_RNDV_INCOMPLETE ||
	    (opcode != IBV_WC_RECV && opcode != IBV_WC_RECV_RDMA_WITH_IMM) ||
	    (flags & ~(unsigned)(IBV_WC_WITH_IMM | IBV_WC_WITH_INV)) ||
	    (status == IBV_WC_SUCCESS && opcode == IBV_WC_RECV &&
	     len > posted_len) ||
	    (ud && (opcode != IBV_WC_RECV || (flags & IBV_WC_WITH_INV) ||
		    (status == IBV_WC_SUCCESS && len < URDMA_GRH_BYTES))))
		return -1;
	w->status = status;
	w->opcode = opcode;
	w->byte_len = len;
	w->wc_flags = flags;
	if (flags & (IBV_WC_WITH_IMM | IBV_WC_WITH_INV))
		w->imm_data = READ_ONCE(e->imm_data); /* or invalidated_rkey */
	return 0;
}

/* A received Send with Invalidate: its window is invalidated before the
 * program sees the completion; a key that names no window of the QP makes
 * it a protection error (the deliverer could not check our windows). */
void urdma_rq_invalidate(struct urdma_qp *qp, const struct urdma_rq_wr *pw,
			 struct ibv_wc *w)
{
	if (w->status != IBV_WC_SUCCESS || !(w->wc_flags & IBV_WC_WITH_INV) ||
	    pw->inv_done)
		return;
	if (!urdma_mw_remote_invalidate(qp, w->invalidated_rkey, false)) {
		/* The QP goes to error too, as over TCP (a Terminate): the
		 * progress thread moves it (not under this CQ lock). */
		urdma_warn("qp %#x: a Send with Invalidate of rkey %#x, which "
			   "names no window of the QP", qp->ibqp.qp_num,
			   w->invalidated_rkey);
		w->status = IBV_WC_LOC_PROT_ERR;
		w->wc_flags = 0;
		if (!atomic_exchange(&qp->rq_bad, true))
			urdma_progress_kick();
	}
}

/* A completed Send whose payload the deliverer left in the entry
 * (URDMA_RQE_INLINE): copy it into the first buffer we posted, by what we
 * keep of it, through its MR (addr0 is an IOVA; the MR's pages are reached
 * as any placement reaches them, not at the application's address).  An
 * MR gone meanwhile: LOC_PROT_ERR.  -1 if it can't be. */
static int rqe_inline(const struct urdma_qp *qp, const struct urdma_shm_rqe *e,
		      const struct urdma_rq_wr *pw, struct ibv_wc *w)
{
	uint32_t n = READ_ONCE(e->inline_len);
	uint64_t va, avail = n;
	uint8_t *p = NULL;
	bool direct;

	if (!n)
		return 0;
	if (n != w->byte_len || n > URDMA_RQE_INLINE || n > pw->len0 ||
	    w->opcode != IBV_WC_RECV || qp->ibqp.qp_type == IBV_QPT_UD)
		return -1;
	if (!urdma_mr_lookup(qp->uctx->shm, pw->lkey0, pw->addr0, n,
			     IBV_ACCESS_LOCAL_WRITE, qp->pd->id, URDMA_VIA_LOCAL,
			     &va, &direct))
		p = direct ? (uint8_t *)(uintptr_t)va : urdma_self_ptr(va, &avail);
	if (p && avail >= n) {
		memcpy(p, e->sge, n);
	} else {
		w->status = IBV_WC_LOC_PROT_ERR;
		w->byte_len = 0;
	}
	return 0;
}

int urdma_qp_harvest(struct urdma_qp *qp, struct ibv_wc *wc, int max)
{
	bool flushed = atomic_load_explicit(&qp->rq_flushed,
					    memory_order_acquire);
	uint32_t prod = atomic_load_explicit(&qp->rq_prod,
					     memory_order_acquire);
	uint32_t poll = qp->rq_poll;
	int n = 0;

	if (!flushed &&
	    atomic_load_explicit(&qp->rq_bad, memory_order_relaxed))
		return 0;
	/* Completed entries, in order, among those posted: an entry's tag
	 * tells (shared.h).  Flushed, every posted entry is taken: those
	 * not completed as flushed. */
	while (n < max && poll != prod) {
		const struct urdma_rq_wr *pw = &qp->rq_wr[poll & (qp->rq.size - 1)];
		const struct urdma_shm_rqe *e = urdma_rq_entry(qp, poll);
		struct ibv_wc *w = &wc[n];
		bool done = urdma_rqe_done(e, poll);

		if (!flushed && !done)
			break;
		memset(w, 0, sizeof(*w));
		if (!done ||
		    urdma_rqe_take(e, pw->len, qp->ibqp.qp_type == IBV_QPT_UD,
				   w) ||
		    rqe_inline(qp, e, pw, w)) {
			if (!flushed) {
				rq_bad(qp, "a completion that can't be, at",
				       poll, prod);
				break;
			}
			/* Not completed, or not believable: flushed. */
			w->status = IBV_WC_WR_FLUSH_ERR;
			w->opcode = IBV_WC_RECV;
			w->byte_len = 0;
			w->wc_flags = 0;
		}
		w->wr_id = pw->wr_id;
		w->qp_num = qp->ibqp.qp_num;
		urdma_rqe_source(qp, urdma_rq_entry(qp, poll), w);
		urdma_rq_invalidate(qp, pw, w);
		poll++;
		n++;
	}
	__atomic_store_n(&qp->rq_poll, poll, __ATOMIC_RELEASE);
	return n;
}

/* Entry e, posted as index idx, not published: any tag but idx + 1 (0 is
 * that at 2^32 - 1), nobody's. */
void urdma_rqe_unpublished(struct urdma_shm_rqe *e, uint32_t idx)
{
	atomic_store_explicit(&e->tag, idx, memory_order_relaxed);
	e->srq_qpn = 0;
	e->srq_pid = 0;
	e->inline_len = 0;
}

/* Write receive WR wr into entry e, of index idx, of a ring (a QP's or an
 * SRQ's), not published, and what only we keep of it into *pw (its id,
 * its length, its first buffer). */
void urdma_rqe_post(struct urdma_shm_rqe *e, uint32_t idx,
		    struct urdma_rq_wr *pw, const struct ibv_recv_wr *wr)
{
	uint64_t len = 0;

	urdma_rqe_unpublished(e, idx);
	e->num_sge = wr->num_sge;
	for (int i = 0; i < wr->num_sge; i++) {
		e->sge[i].addr = wr->sg_list[i].addr;
		e->sge[i].length = wr->sg_list[i].length;
		e->sge[i].lkey = wr->sg_list[i].lkey;
		len += wr->sg_list[i].length;
	}
	e->status = IBV_WC_SUCCESS;
	*pw = (struct urdma_rq_wr){ .wr_id = wr->wr_id, .len = len };
	if (wr->num_sge) {
		pw->addr0 = wr->sg_list[0].addr;
		pw->len0 = wr->sg_list[0].length;
		pw->lkey0 = wr->sg_list[0].lkey;
	}
}

/* Receives were posted for qp (to its ring or its SRQ): its transport
 * may take them; the peer is woken if it waits for one (wake). */
void urdma_qp_recv_posted(struct urdma_qp *qp, bool wake)
{
	if (wake) {
		struct urdma_peer *p = urdma_peer_ref(&qp->peer);

		if (p)
			urdma_peer_wake(p);
		urdma_peer_put(p);
	}
	if (qp->tr && qp->tr->recv_posted)
		qp->tr->recv_posted(qp);
}

int urdma_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
		    struct ibv_recv_wr **bad)
{
	struct urdma_qp *qp = to_uqp(ibqp);
	struct urdma_shm_qp *s = qp->shm;
	int ret = 0;
	uint32_t prod;

	/* XRC QPs (and ibv_open_qp's handles) have no receive queue. */
	if (ibqp->qp_type == IBV_QPT_XRC_SEND ||
	    ibqp->qp_type == IBV_QPT_XRC_RECV) {
		*bad = wr;
		return EINVAL;
	}
	pthread_mutex_lock(&qp->rq_lock);
	prod = atomic_load_explicit(&qp->rq_prod, memory_order_relaxed);
	for (; wr; wr = wr->next) {
		if (ibqp->state == IBV_QPS_RESET || qp->srq) {
			/* A QP on an SRQ receives from it. */
			ret = EINVAL;
			break;
		}
		if ((uint32_t)wr->num_sge > qp->cap.max_recv_sge ||
		    wr->num_sge < 0) {
			ret = EINVAL;
			break;
		}
		if (prod - __atomic_load_n(&qp->rq_poll, __ATOMIC_ACQUIRE) >=
		    qp->rq.size) {
			ret = ENOMEM;
			break;
		}
		urdma_rqe_post(urdma_rq_entry(qp, prod), prod,
			       &qp->rq_wr[prod & (qp->rq.size - 1)], wr);
		prod++;
		atomic_store_explicit(&qp->rq_prod, prod, memory_order_release);
		atomic_store_explicit(&s->rq_prod, prod, memory_order_release);
	}
	pthread_mutex_unlock(&qp->rq_lock);
	/* urdma_rq_flush takes rq_lock itself. */
	if (ibqp->state == IBV_QPS_ERR)
		urdma_rq_flush(qp);
	if (ret)
		*bad = wr;
	/* A sender waits for a receive: wake it. */
	atomic_thread_fence(memory_order_seq_cst);
	urdma_qp_recv_posted(qp,
			     atomic_load_explicit(&s->rnr_waiter,
						  memory_order_relaxed) &&
				     atomic_exchange(&s->rnr_waiter, 0));
	if (ibqp->state == IBV_QPS_ERR)
		urdma_cq_notify(qp->rcq);
	return ret;
}
