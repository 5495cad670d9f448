// SPDX-License-Identifier: MIT
/*
 * Shared receive queues, owner side.  An SRQ's ring is a block of the
 * identity memfd (struct urdma_shm_srq), as a QP's receive ring is; the
 * QPs on it name it in their own block (srq_va), so a deliverer of any
 * QP, in any process, finds it.  ibv_post_srq_recv writes entries and
 * publishes prod; a deliverer claims the next entry by compare-and-swap on
 * claim, fills it, writes the QPN it received for and publishes the entry
 * with its tag (transport.c: urdma_srq_claim, urdma_srq_publish).  The
 * owner takes published entries in ring order (urdma_srq_drain, from
 * ibv_poll_cq on a CQ that one of the SRQ's QPs receives into) and pushes
 * each, as a completion of the QP it names, into that QP's receive CQ.
 *
 * Nothing a deliverer writes is trusted: the claim index is checked
 * against what was posted (else IBV_EVENT_SRQ_ERR and nothing more is
 * taken), a tag that names a QP not on the SRQ (one destroyed since, or
 * nonsense) gives the WR back to the SRQ, and a completion that can't be
 * puts the QP it names in error.  An entry claimed by a process that died
 * before it published (its pid gone, or none written after RQ_STUCK_NS)
 * is given back too: a dead peer loses no receive WR of ours.  One that a
 * live but stopped process holds keeps the entries behind it waiting.
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "core/urdma.h"
#include "transport/transport.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#define SRQ_STUCK_NS 2000000000ull

static _Atomic uint32_t next_srqn = 1;

static struct urdma_shm_rqe *srq_entry(struct urdma_srq *srq, uint32_t idx)
{
	return urdma_rqe_at(srq->ring, &srq->rq, idx);
}


static void srq_event(struct urdma_srq *srq, enum ibv_event_type type)
{
	struct ibv_async_event ev = { .element.srq = &srq->ibsrq,
				      .event_type = type };

	urdma_async_event(srq->uctx, &ev);
}

struct ibv_srq *urdma_create_srq(struct ibv_pd *ibpd,
				 struct ibv_srq_init_attr *init)
{
	struct urdma_context *uctx = to_uctx(ibpd->context);
	struct ibv_srq_attr *a = &init->attr;
	struct urdma_srq *srq;
	uint32_t size, max_sge;
	uint64_t va;

	/* srq_limit is not used here (ibv_create_srq(3)): armed by
	 * ibv_modify_srq only. */
	if (!a->max_wr || a->max_wr > URDMA_MAX_SRQ_WR ||
	    a->max_sge > URDMA_MAX_SGE) {
		errno = EINVAL;
		return NULL;
	}
	srq = urdma_zalloc(sizeof(*srq));
	if (!srq) {
		errno = ENOMEM;
		return NULL;
	}
	size = roundup_pow2(a->max_wr);
	max_sge = a->max_sge ? a->max_sge : 1;
	srq->rq = (struct urdma_rq_geo){ .size = size, .max_sge = max_sge,
					 .stride = urdma_rq_stride(max_sge) };
	srq->shm_size = sizeof(struct urdma_shm_srq) + (size_t)size * srq->rq.stride;
	srq->rq_wr = urdma_zalloc_array(size, sizeof(*srq->rq_wr));
	srq->shm = srq->rq_wr ? urdma_arena_alloc(srq->shm_size, &va) : NULL;
	if (!srq->shm) {
		int e = srq->rq_wr ? errno : ENOMEM;

		urdma_free(srq->rq_wr);
		urdma_free(srq);
		errno = e;
		return NULL;
	}
	srq->va = va;
	srq->ring = (uint8_t *)srq->shm + sizeof(struct urdma_shm_srq);
	srq->uctx = uctx;
	srq->srqn = atomic_fetch_add(&next_srqn, 1) & 0xffffff;
	*srq->shm = (struct urdma_shm_srq){
		.magic = URDMA_SHM_MAGIC,
		.version = URDMA_SHM_VERSION,
		.srqn = srq->srqn,
		.ctx_id = uctx->ctx_id,
		.pd_id = to_upd(ibpd)->id,
		.rq_size = size,
		.rq_stride = srq->rq.stride,
		.rq_max_sge = max_sge,
		.rq_offset = sizeof(struct urdma_shm_srq),
		.limit = 0,
	};
	list_init(&srq->qps);
	pthread_mutex_init(&srq->lock, NULL);
	srq->ibsrq.context = ibpd->context;
	srq->ibsrq.srq_context = init->srq_context;
	srq->ibsrq.pd = ibpd;
	pthread_mutex_init(&srq->ibsrq.mutex, NULL);
	pthread_cond_init(&srq->ibsrq.cond, NULL);
	a->max_wr = size;
	a->max_sge = max_sge;
	atomic_fetch_add(&to_upd(ibpd)->usecnt, 1);
	pthread_mutex_lock(&uctx->lock);
	list_add_tail(&srq->ctx_node, &uctx->srqs);
	pthread_mutex_unlock(&uctx->lock);
	return &srq->ibsrq;
}

struct ibv_srq *urdma_create_srq_ex(struct ibv_context *context,
				    struct ibv_srq_init_attr_ex *ax)
{
	struct ibv_srq_init_attr init = { .srq_context = ax->srq_context,
					  .attr = ax->attr };
	bool xrc = (ax->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) &&
		   ax->srq_type == IBV_SRQT_XRC;
	struct ibv_srq *srq;
	int ret;

	if ((ax->comp_mask & ~(uint32_t)(IBV_SRQ_INIT_ATTR_TYPE |
					  IBV_SRQ_INIT_ATTR_PD |
					  IBV_SRQ_INIT_ATTR_XRCD |
					  IBV_SRQ_INIT_ATTR_CQ |
					  IBV_SRQ_INIT_ATTR_TM)) ||
	    !(ax->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !ax->pd ||
	    ax->pd->context != context ||
	    (xrc && (!(ax->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !ax->xrcd ||
		     ax->xrcd->context != context ||
		     !(ax->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !ax->cq ||
		     ax->cq->context != context))) {
		errno = EINVAL;
		return NULL;
	}
	/* Tag matching SRQs are not implemented. */
	if (((ax->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) &&
	     ax->srq_type != IBV_SRQT_BASIC && !xrc) ||
	    (ax->comp_mask & IBV_SRQ_INIT_ATTR_TM)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	srq = urdma_create_srq(ax->pd, &init);
	if (!srq)
		return NULL;
	if (xrc) {
		ret = -urdma_xsrq_setup(to_usrq(srq), to_uxrcd(ax->xrcd),
					to_ucq(ax->cq));
		if (ret) {
			urdma_destroy_srq(srq);
			errno = ret;
			return NULL;
		}
	}
	ax->attr = init.attr;
	return srq;
}

int urdma_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr,
		     int mask)
{
	struct urdma_srq *srq = to_usrq(ibsrq);
	int ret = 0;

	/* Resizing a ring that deliverers have mapped is not supported (no
	 * IBV_DEVICE_SRQ_RESIZE), as on mlx5. */
	if (mask & ~IBV_SRQ_LIMIT)
		return EINVAL;
	if (!mask)
		return 0;
	pthread_mutex_lock(&srq->lock);
	if (attr->srq_limit > srq->rq.size) {
		ret = EINVAL;
	} else {
		srq->limit = attr->srq_limit;
		atomic_store(&srq->shm->limit, attr->srq_limit);
		atomic_store(&srq->shm->limit_hit, 0);
	}
	pthread_mutex_unlock(&srq->lock);
	return ret;
}

int urdma_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	struct urdma_srq *srq = to_usrq(ibsrq);

	pthread_mutex_lock(&srq->lock);
	attr->max_wr = srq->rq.size;
	attr->max_sge = srq->rq.max_sge;
	attr->srq_limit = srq->limit;
	pthread_mutex_unlock(&srq->lock);
	return 0;
}

static void xrc_hold_end(struct urdma_srq *srq)
{
	if (srq->xrc_hold_ns) {
		srq->xrc_hold_ns = 0;
		atomic_fetch_sub(&urdma_xrc_held, 1);
	}
}

int urdma_destroy_srq(struct ibv_srq *ibsrq)
{
	struct urdma_srq *srq = to_usrq(ibsrq);
	struct urdma_context *uctx = srq->uctx;
	bool quarantine;

	pthread_mutex_lock(&srq->lock);
	if (!list_empty(&srq->qps)) {
		pthread_mutex_unlock(&srq->lock);
		return EBUSY;
	}
	pthread_mutex_unlock(&srq->lock);

	urdma_async_release(uctx, ibsrq, &srq->async_reported,
			    &ibsrq->events_completed, &ibsrq->mutex, &ibsrq->cond,
			    &srq->async_gone);
	pthread_mutex_lock(&uctx->lock);
	list_del(&srq->ctx_node);
	pthread_mutex_unlock(&uctx->lock);
	xrc_hold_end(srq); /* (the progress thread no longer sees it) */
	if (srq->xrcd && !urdma_xsrq_teardown(srq))
		urdma_warn("xrc srq %#x: destroyed with a deliverer still "
			   "inside", srq->srqn);
	/* A poller that found it on a CQ's QP (or its CQ) is done with it. */
	while (atomic_load(&srq->drainers))
		sched_yield();
	atomic_fetch_sub(&to_upd(ibsrq->pd)->usecnt, 1);
	/* An entry still claimed by a peer may be written: quarantined; an
	 * XRC SRQ's block always is, as whoever found it by its number may
	 * look at it again (and find it dead). */
	quarantine = srq->xrcd || atomic_load(&srq->shm->claim) != srq->poll;
	urdma_arena_free(srq->shm, srq->shm_size, quarantine);
	urdma_free(srq->rq_wr);
	urdma_free(srq->htab);
	pthread_mutex_destroy(&srq->lock);
	urdma_free(srq);
	return 0;
}

/* Wake whoever waits for a receive: deliverers of the SRQ's QPs. */
static void srq_wake(struct urdma_srq *srq)
{
	struct urdma_qp *qp;

	pthread_mutex_lock(&srq->lock);
	list_for_each_entry(qp, &srq->qps, srq_node)
		urdma_qp_recv_posted(qp, true);
	pthread_mutex_unlock(&srq->lock);
	/* An XRC SRQ's deliverers are whoever names it: ours (a target's
	 * stream held for a receive) are looked at again by the progress
	 * thread; another process's retry as after an RNR. */
	if (srq->xrcd)
		urdma_progress_kick();
}

int urdma_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr,
			struct ibv_recv_wr **bad)
{
	struct urdma_srq *srq = to_usrq(ibsrq);
	struct urdma_shm_srq *s = srq->shm;
	int ret = 0;

	pthread_mutex_lock(&srq->lock);
	for (; wr; wr = wr->next) {
		struct urdma_shm_rqe *e;

		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > srq->rq.max_sge) {
			ret = EINVAL;
			break;
		}
		if (srq->prod - srq->poll >= srq->rq.size) {
			ret = ENOMEM;
			break;
		}
		e = srq_entry(srq, srq->prod);
		urdma_rqe_post(e, srq->prod,
			       &srq->rq_wr[srq->prod & (srq->rq.size - 1)], wr);
		srq->prod++;
		atomic_store_explicit(&s->prod, srq->prod, memory_order_release);
	}
	pthread_mutex_unlock(&srq->lock);
	if (ret)
		*bad = wr;
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&s->rnr_waiter, memory_order_relaxed) &&
	    atomic_exchange(&s->rnr_waiter, 0))
		srq_wake(srq);
	return ret;
}

/* Give the WR of entry idx (being taken) back to the SRQ, at its end.
 * Under srq->lock; there is room: idx is freed at the same time. */
static void srq_repost(struct urdma_srq *srq, uint32_t idx)
{
	struct urdma_shm_rqe *from = srq_entry(srq, idx);
	struct urdma_shm_rqe *to = srq_entry(srq, srq->prod);
	uint32_t n = READ_ONCE(from->num_sge);

	if (n > srq->rq.max_sge)
		n = 0; /* scribbled: the WR comes back with no buffer */
	if (to != from) {
		memmove(to->sge, from->sge, n * sizeof(to->sge[0]));
		to->num_sge = n;
	}
	urdma_rqe_unpublished(to, srq->prod);
	to->status = IBV_WC_SUCCESS;
	srq->rq_wr[srq->prod & (srq->rq.size - 1)] =
		srq->rq_wr[idx & (srq->rq.size - 1)];
	srq->rq_wr[srq->prod & (srq->rq.size - 1)].inv_done = false;
	srq->prod++;
	atomic_store_explicit(&srq->shm->prod, srq->prod, memory_order_release);
}

static uint32_t qpn_bucket(uint32_t qpn, uint32_t hsize)
{
	return (qpn * 2654435761u) >> 8 & (hsize - 1);
}

/* Count qp in the SRQ's table: ENOMEM if there is none and none could be
 * made (a table that could not grow stays, its chains longer).  Under
 * srq->lock. */
static int srq_hash_add(struct urdma_srq *srq, struct urdma_qp *qp)
{
	if (srq->nqps + 1 > 2 * srq->hsize) {
		uint32_t size = srq->hsize ? 2 * srq->hsize : 16;
		struct urdma_qp **t = urdma_zalloc_array(size, sizeof(*t));

		if (t) {
			for (uint32_t i = 0; i < srq->hsize; i++) {
				struct urdma_qp *q = srq->htab[i], *next;

				for (; q; q = next) {
					uint32_t b = qpn_bucket(q->ibqp.qp_num,
								size);

					next = q->srq_hnext;
					q->srq_hnext = t[b];
					t[b] = q;
				}
			}
			urdma_free(srq->htab);
			srq->htab = t;
			srq->hsize = size;
		} else if (!srq->hsize) {
			return ENOMEM;
		}
	}
	uint32_t b = qpn_bucket(qp->ibqp.qp_num, srq->hsize);

	qp->srq_hnext = srq->htab[b];
	srq->htab[b] = qp;
	srq->nqps++;
	return 0;
}

/* Under srq->lock. */
static void srq_hash_del(struct urdma_srq *srq, struct urdma_qp *qp)
{
	struct urdma_qp **p =
		&srq->htab[qpn_bucket(qp->ibqp.qp_num, srq->hsize)];

	for (; *p; p = &(*p)->srq_hnext)
		if (*p == qp) {
			*p = qp->srq_hnext;
			srq->nqps--;
			return;
		}
}

/* The SRQ's QP numbered qpn (as an entry names it), or NULL.  Under
 * srq->lock. */
static struct urdma_qp *srq_qp(struct urdma_srq *srq, uint32_t qpn)
{
	struct urdma_qp *qp;

	if (!srq->hsize)
		return NULL;
	for (qp = srq->htab[qpn_bucket(qpn, srq->hsize)]; qp; qp = qp->srq_hnext)
		if (qp->ibqp.qp_num == qpn)
			return qp;
	return NULL;
}

/* Is the entry at srq->poll, unpublished, given up by its claimer? */
static bool srq_abandoned(struct urdma_srq *srq)
{
	struct urdma_shm_rqe *e = srq_entry(srq, srq->poll);
	uint64_t now = urdma_now_ns();
	pid_t pid;

	if (srq->stuck_idx != srq->poll || !srq->stuck_ns) {
		srq->stuck_idx = srq->poll;
		__atomic_store_n(&srq->stuck_ns, now, __ATOMIC_RELAXED);
		return false;
	}
	if (now - srq->stuck_ns < SRQ_STUCK_NS)
		return false;
	pid = (pid_t)READ_ONCE(e->srq_pid);
	if (pid > 0 && (pid == getpid() || !kill(pid, 0) || errno != ESRCH))
		return false; /* alive (or not ours to know): it will publish */
	urdma_warn("srq %#x: receive %u was claimed by process %d, which "
		   "died before finishing it: the WR is posted again",
		   srq->srqn, srq->poll, (int)pid);
	__atomic_store_n(&srq->stuck_ns, 0, __ATOMIC_RELAXED);
	return true;
}

/* An XRC SRQ's published entry at srq->poll: a completion of the target
 * QP it names, into the SRQ's own CQ.  Under srq->lock. */
static void srq_take_xrc(struct urdma_srq *srq, struct urdma_shm_rqe *e,
			 const struct urdma_rq_wr *pw)
{
	struct ibv_wc wc = { 0 };

	if (urdma_rqe_take(e, pw->len, false, &wc) ||
	    (wc.wc_flags & IBV_WC_WITH_INV)) {
		/* Nonsense a deliverer wrote: the WR is not lost. */
		urdma_warn("xrc srq %#x: a completion that can't be: the WR "
			   "is posted again", srq->srqn);
		srq_repost(srq, srq->poll++);
		return;
	}
	wc.wr_id = pw->wr_id;
	wc.qp_num = READ_ONCE(e->srq_qpn);
	wc.src_qp = READ_ONCE(e->src_qp);
	/* (no event here: the deliverer's notify brings it, as below) */
	urdma_cq_push_as(srq->cq, &wc, NULL, 0, false);
	srq->poll++;
	__atomic_store_n(&srq->stuck_ns, 0, __ATOMIC_RELAXED);
}

/* Has a deliverer claimed a receive not yet taken (urdma_srq_drain has
 * something to do)?  No lock: poll only grows, so a stale value can only
 * say yes.  The caller keeps srq alive (cq->lock, with its cq->srqs entry,
 * or its drainers count). */
bool urdma_srq_pending(const struct urdma_srq *srq)
{
	return atomic_load_explicit(&srq->shm->claim, memory_order_acquire) !=
		       READ_ONCE(srq->poll) &&
	       !READ_ONCE(srq->bad);
}

/*
 * Take the published entries, in order, into the receive CQs of the QPs
 * they name (an XRC SRQ: into its own CQ).  Any thread; cq locks are taken inside srq->lock, never the
 * other way round.
 */
void urdma_srq_drain(struct urdma_srq *srq)
{
	struct urdma_shm_srq *s = srq->shm;
	uint32_t claim;

	/* Waited for, not tried: a poller that skipped it (a post under
	 * way) would find nothing and sleep with a completion waiting. */
	pthread_mutex_lock(&srq->lock);
	claim = atomic_load_explicit(&s->claim, memory_order_acquire);
	if (srq->bad || claim - srq->poll > srq->prod - srq->poll) {
		if (!srq->bad) {
			srq->bad = true;
			urdma_err("srq %#x: a claim index (%u) past the receives "
				  "posted (%u), which another process wrote: "
				  "nothing more is taken from it", srq->srqn,
				  claim, srq->prod);
			srq_event(srq, IBV_EVENT_SRQ_ERR);
		}
		pthread_mutex_unlock(&srq->lock);
		return;
	}
	while (srq->poll != claim) {
		struct urdma_shm_rqe *e = srq_entry(srq, srq->poll);
		const struct urdma_rq_wr *pw =
			&srq->rq_wr[srq->poll & (srq->rq.size - 1)];
		struct ibv_wc wc = { 0 };
		struct urdma_qp *qp;

		if (!urdma_rqe_done(e, srq->poll)) {
			if (!srq_abandoned(srq))
				break;
			srq_repost(srq, srq->poll++);
			continue;
		}
		if (srq->xrcd) {
			srq_take_xrc(srq, e, pw);
			continue;
		}
		qp = srq_qp(srq, READ_ONCE(e->srq_qpn));
		/* One that can't have received (RESET, INIT) is nobody. */
		if (qp && (qp->ibqp.state == IBV_QPS_RESET ||
			   qp->ibqp.state == IBV_QPS_INIT))
			qp = NULL;
		if (!qp || urdma_rqe_take(e, pw->len,
					  qp->ibqp.qp_type == IBV_QPT_UD, &wc)) {
			if (qp) { /* nonsense for a QP of ours */
				urdma_err("qp %#x: a completion that can't be in "
					  "its SRQ %#x: the QP goes to error",
					  qp->ibqp.qp_num, srq->srqn);
				urdma_qp_set_error(qp, true);
			}
			srq_repost(srq, srq->poll++);
			continue;
		}
		wc.wr_id = pw->wr_id;
		wc.qp_num = qp->ibqp.qp_num;
		urdma_rqe_source(qp, e, &wc);
		urdma_rq_invalidate(qp, pw, &wc);
		/* The event, if armed, came from the deliverer's notify
		 * (whoever drains: this may be the application's poll, after
		 * it armed again for the next one). */
		urdma_cq_push_as(qp->rcq, &wc, qp, 0, false);
		srq->poll++;
		__atomic_store_n(&srq->stuck_ns, 0, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&srq->lock);
}

/*
 * Does an XRC SRQ's receive event wait for the signaled WRs of the XRC
 * send QPs on its CQ's channel, taken before it (sq.c: sig_chan says
 * why)?  Until they complete, for at most XRC_HOLD_NS: one the peer does
 * not answer (its SRQ has no receive posted) must not hold it for ever.
 * Progress thread.
 */
#define XRC_HOLD_NS 20000000ull
_Atomic int urdma_xrc_held;

static bool xrc_event_waits(struct urdma_srq *srq)
{
	struct urdma_channel *ch = srq->cq->chan;
	uint32_t taken;
	uint64_t now;

	if (!ch)
		return false;
	now = urdma_now_ns();
	taken = atomic_load(&ch->xrc_taken);
	if (!srq->xrc_hold_ns) {
		if (atomic_load(&ch->xrc_done) == taken)
			return false;
		srq->xrc_hold_ns = now;
		srq->xrc_hold_to = taken;
		atomic_fetch_add(&urdma_xrc_held, 1);
	}
	/* (one counted, then not taken after all, is no longer waited for) */
	if ((int32_t)(taken - srq->xrc_hold_to) < 0)
		srq->xrc_hold_to = taken;
	if ((int32_t)(atomic_load(&ch->xrc_done) - srq->xrc_hold_to) < 0 &&
	    now - srq->xrc_hold_ns < XRC_HOLD_NS) {
		/* asked again: an earlier pass asked for takes its place */
		urdma_progress_by(srq->xrc_hold_ns + XRC_HOLD_NS);
		return true;
	}
	xrc_hold_end(srq);
	return false;
}

/* Progress thread: an entry the poller found unpublished is looked at
 * again (its claimer may be dead: srq_abandoned), without waiting for the
 * application to poll; and a deliverer saw fewer WRs than the armed
 * limit. */
void urdma_srq_maintain(struct urdma_srq *srq)
{
	struct urdma_shm_srq *s = srq->shm;
	bool fire = false;

	if (__atomic_load_n(&srq->stuck_ns, __ATOMIC_RELAXED))
		urdma_srq_drain(srq);
	/* A deliverer completed into an XRC SRQ whose CQ is armed: taken
	 * into the CQ (without firing), then the CQ fires, once the sends
	 * before it have (until then the next pass looks again), and if the
	 * program's polls did not take what came meanwhile. */
	if (srq->xrcd && atomic_load(&s->notify_fired) &&
	    atomic_exchange(&s->notify_fired, 0)) {
		urdma_srq_drain(srq);
		if (xrc_event_waits(srq))
			atomic_store(&s->notify_fired, 1);
		else
			urdma_cq_notify_left(srq->cq);
	}
	if (!atomic_load(&s->limit_hit) || !atomic_exchange(&s->limit_hit, 0))
		return;
	pthread_mutex_lock(&srq->lock);
	if (srq->limit &&
	    srq->prod - atomic_load(&s->claim) < srq->limit) {
		/* Fires once; the program arms it again (ibv_modify_srq). */
		srq->limit = 0;
		atomic_store(&s->limit, 0);
		fire = true;
	}
	pthread_mutex_unlock(&srq->lock);
	if (fire)
		srq_event(srq, IBV_EVENT_SRQ_LIMIT_REACHED);
}

/* srq's entry in cq->srqs, or NULL.  Under cq->lock. */
static struct urdma_cq_srq *cq_srq_find(struct urdma_cq *cq,
					struct urdma_srq *srq)
{
	struct urdma_cq_srq *cs;

	list_for_each_entry(cs, &cq->srqs, node)
		if (cs->srq == srq)
			return cs;
	return NULL;
}

/* A QP of cq no longer receives from srq. */
static void cq_srq_put(struct urdma_cq *cq, struct urdma_srq *srq)
{
	struct urdma_cq_srq *cs;

	pthread_mutex_lock(&cq->lock);
	cs = cq_srq_find(cq, srq);
	if (cs && !--cs->nqps)
		list_del(&cs->node);
	else
		cs = NULL;
	pthread_mutex_unlock(&cq->lock);
	urdma_free(cs);
}

/* qp, being created, receives from srq: 0, or ENOMEM.  (Its number is
 * known; the QP is not yet in any list.) */
int urdma_srq_attach(struct urdma_srq *srq, struct urdma_qp *qp)
{
	struct urdma_cq *rcq = qp->rcq;
	struct urdma_cq_srq *cs, *fresh = urdma_zalloc(sizeof(*fresh));
	int ret;

	pthread_mutex_lock(&rcq->lock);
	cs = cq_srq_find(rcq, srq);
	if (!cs && fresh) {
		cs = fresh;
		fresh = NULL;
		cs->srq = srq;
		list_add_tail(&cs->node, &rcq->srqs);
	}
	if (cs)
		cs->nqps++;
	pthread_mutex_unlock(&rcq->lock);
	urdma_free(fresh);
	if (!cs)
		return ENOMEM;
	pthread_mutex_lock(&srq->lock);
	ret = srq_hash_add(srq, qp);
	if (!ret)
		list_add_tail(&qp->srq_node, &srq->qps);
	pthread_mutex_unlock(&srq->lock);
	if (ret) {
		cq_srq_put(rcq, srq);
		return ret;
	}
	qp->srq = srq;
	qp->shm->srq_va = srq->va;
	qp->shm->srq_bytes = srq->shm_size;
	qp->shm->srqn = srq->srqn;
	atomic_fetch_add(&rcq->srq_qps, 1);
	return 0;
}

/* qp, being destroyed, no longer does.  An entry published for it after
 * this gives its WR back to the SRQ (urdma_srq_drain). */
void urdma_srq_detach(struct urdma_qp *qp)
{
	struct urdma_srq *srq = qp->srq;
	struct urdma_cq *rcq = qp->rcq;

	if (!srq)
		return;
	/* Under the CQ's lock, where cq_drain_srqs counts itself in the
	 * SRQ's drainers: one that saw it in cq->srqs has, before we go on. */
	pthread_mutex_lock(&rcq->lock);
	qp->srq = NULL;
	pthread_mutex_unlock(&rcq->lock);
	cq_srq_put(rcq, srq);
	atomic_fetch_sub(&rcq->srq_qps, 1);
	pthread_mutex_lock(&srq->lock);
	list_del(&qp->srq_node);
	srq_hash_del(srq, qp);
	pthread_mutex_unlock(&srq->lock);
}

/* qp on an SRQ went to error and no deliverer is inside it: it will take
 * no more WRs from the SRQ (IBV_EVENT_QP_LAST_WQE_REACHED). */
void urdma_srq_last_wqe(struct urdma_qp *qp)
{
	struct ibv_async_event ev = { .element.qp = &qp->ibqp,
				      .event_type = IBV_EVENT_QP_LAST_WQE_REACHED };

	urdma_async_event(qp->uctx, &ev);
}
