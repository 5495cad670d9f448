// SPDX-License-Identifier: MIT
/*
 * RC, UC, UD and XRC queue pairs: creating and destroying them, the state machine
 * (ibv_modify_qp, ibv_query_qp).  The send queue engine is in sq.c, the
 * owner's side of the receive queue in rq.c.
 */

#include <errno.h>
#include <string.h>
#include <sched.h>

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
	const struct urdma_transport_ops *const *trs =
		qp->ibqp.qp_type == IBV_QPT_UD ? urdma_ud_transports :
						 urdma_transports;
	uint32_t ctx_id = qp->uctx->ctx_id;
	int ret = EAGAIN;

	for (int t = 0; trs[t] && ret; t++) {
		const struct urdma_transport_ops *tr = trs[t];

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

/*
 * Make a QP of type init->qp_type: RC, XRC_SEND (no receive queue: no
 * receive CQ) or XRC_RECV (a target of xrcd: no send queue, no CQ, no
 * PD).  The engine's CQs are never NULL: those a type has not are one of
 * the QP's own that nothing ever completes into.
 */
struct ibv_qp *urdma_qp_create(struct ibv_context *context,
			       struct ibv_pd *ibpd,
			       struct ibv_qp_init_attr *init,
			       struct urdma_xrcd *xrcd)
{
	struct urdma_context *uctx = to_uctx(context);
	enum ibv_qp_type type = init->qp_type;
	bool tgt = type == IBV_QPT_XRC_RECV, ini = type == IBV_QPT_XRC_SEND;
	struct ibv_qp_cap cap = init->cap;
	struct urdma_cq *scq, *rcq;
	struct urdma_qp *qp;
	uint32_t qpn;
	int ret;

	if (type != IBV_QPT_RC && type != IBV_QPT_UC && type != IBV_QPT_UD &&
	    !tgt && !ini) {
		urdma_dbg("QP type %d is not supported", type);
		errno = EOPNOTSUPP;
		return NULL;
	}
	/* What the kind has: a target only its domain, a send QP no
	 * receive queue (what the program passed for those is ignored). */
	struct ibv_cq *app_scq = tgt ? NULL : init->send_cq;
	bool rq = type == IBV_QPT_RC || type == IBV_QPT_UC ||
		  type == IBV_QPT_UD;
	struct ibv_cq *app_rcq = rq ? init->recv_cq : NULL;
	struct ibv_srq *srq = tgt ? NULL : init->srq;

	if (tgt) {
		ibpd = NULL;
		cap = (struct ibv_qp_cap){ 0 };
	} else if (ini) {
		cap.max_recv_wr = cap.max_recv_sge = 0;
	}
	if ((!tgt && (!ibpd || ibpd->context != context || !app_scq ||
		      app_scq->context != context)) ||
	    (rq && (!app_rcq || app_rcq->context != context)) ||
	    (srq && (ini || srq->context != context || to_usrq(srq)->xrcd)) ||
	    (tgt && !xrcd) ||
	    cap.max_send_wr > URDMA_MAX_QP_WR ||
	    (!srq && cap.max_recv_wr > URDMA_MAX_QP_WR) ||
	    cap.max_send_sge > URDMA_MAX_SGE ||
	    (!srq && cap.max_recv_sge > URDMA_MAX_SGE) ||
	    cap.max_inline_data > URDMA_MAX_INLINE) {
		errno = EINVAL;
		return NULL;
	}
	if (!tgt) {
		if (!cap.max_send_wr)
			cap.max_send_wr = 1;
		if (!cap.max_send_sge)
			cap.max_send_sge = 1;
		if (cap.max_inline_data < 256)
			cap.max_inline_data = 256;
	}
	if (!cap.max_recv_sge && rq)
		cap.max_recv_sge = 1;

	/* The device's max_qp, per context, as a NIC's QP table: past it,
	 * ENOMEM. */
	if (atomic_fetch_add(&uctx->nqps, 1) >= URDMA_MAX_QP) {
		atomic_fetch_sub(&uctx->nqps, 1);
		errno = ENOMEM;
		return NULL;
	}
	qp = urdma_zalloc(sizeof(*qp));
	if (!qp) {
		atomic_fetch_sub(&uctx->nqps, 1);
		errno = ENOMEM;
		return NULL;
	}
	if (tgt || ini) {
		qp->own_cq = urdma_cq_new(context, 1, NULL, 0);
		if (!qp->own_cq) {
			ret = errno;
			goto err_free;
		}
	}
	scq = app_scq ? to_ucq(app_scq) : qp->own_cq;
	rcq = app_rcq ? to_ucq(app_rcq) : qp->own_cq;
	qp->uctx = uctx;
	qp->pd = ibpd ? to_upd(ibpd) : NULL;
	qp->scq = scq;
	qp->rcq = rcq;
	qp->xrcd = tgt ? xrcd : NULL;
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
	/* On an SRQ, or without a receive queue, the QP's own ring is not
	 * used: it keeps one entry, and it reports none. */
	if (srq || !rq)
		cap.max_recv_wr = 0;
	ret = -urdma_rq_init(qp, cap.max_recv_wr,
			     srq || !cap.max_recv_sge ? 1 : cap.max_recv_sge);
	if (ret)
		goto err_free_sq;
	if (srq)
		qp->cap.max_recv_wr = qp->cap.max_recv_sge = 0;
	qp->ibqp.qp_type = type;
	ret = qp_number(qp, &qpn);
	if (ret)
		goto err_free_rq;
	*qp->shm = (struct urdma_shm_qp){
		.magic = URDMA_SHM_MAGIC,
		.version = URDMA_SHM_VERSION,
		.qpn = qpn,
		.ctx_id = uctx->ctx_id,
		.qp_type = type,
		.pd_id = qp->pd ? qp->pd->id : 0,
		.rq_size = qp->rq.size,
		.rq_stride = qp->rq.stride,
		.rq_max_sge = qp->rq.max_sge,
		.rq_offset = sizeof(struct urdma_shm_qp),
		.xrcd_id = tgt ? xrcd->id : 0,
		.wake_va = urdma_wake_va(),
		.gen = urdma_random32() | 1,
	};
	pthread_mutex_init(&qp->sq_lock, NULL);
	pthread_mutex_init(&qp->rq_lock, NULL);
	pthread_mutex_init(&qp->ibqp.mutex, NULL);
	pthread_cond_init(&qp->ibqp.cond, NULL);
	qp->ibqp.context = context;
	qp->ibqp.qp_context = init->qp_context;
	qp->ibqp.pd = ibpd;
	qp->ibqp.send_cq = app_scq;
	qp->ibqp.recv_cq = app_rcq;
	qp->ibqp.srq = srq;
	qp->ibqp.qp_num = qpn;
	if (srq) {
		ret = urdma_srq_attach(to_usrq(srq), qp);
		if (ret) {
			pthread_mutex_destroy(&qp->sq_lock);
			pthread_mutex_destroy(&qp->rq_lock);
			pthread_mutex_destroy(&qp->ibqp.mutex);
			pthread_cond_destroy(&qp->ibqp.cond);
			urdma_host_qp_unpublish(qpn);
			if (qp->qpn_tr)
				qp->qpn_tr->qpn_release(qpn);
			goto err_free_rq;
		}
	}
	/* Unique in the process, unlike QPNs and addresses (core/cm_link.h). */
	qp->ibqp.handle = atomic_fetch_add(&next_handle, 1);
	qp->ibqp.state = IBV_QPS_RESET;
	qp->ibqp.qp_type = type;
	qp->attr.qp_state = IBV_QPS_RESET;
	qp->attr.path_mtu = IBV_MTU_1024;
	if (tgt)
		urdma_xrc_tgt_add(qp);

	pthread_mutex_lock(&uctx->lock);
	list_add_tail(&qp->ctx_node, &uctx->qps);
	pthread_mutex_unlock(&uctx->lock);
	pthread_mutex_lock(&scq->lock);
	list_add_tail(&qp->scq_node, &scq->send_qps);
	pthread_mutex_unlock(&scq->lock);
	pthread_mutex_lock(&rcq->lock);
	list_add_tail(&qp->rcq_node, &rcq->recv_qps);
	qp->ring_listed = rq && !qp->srq;
	if (qp->ring_listed)
		list_add_tail(&qp->ring_node, &rcq->ring_qps);
	urdma_bell_add(rcq, qp); /* (its notify too) */
	pthread_mutex_unlock(&rcq->lock);
	atomic_fetch_add(&scq->usecnt, 1);
	atomic_fetch_add(&rcq->usecnt, 1);
	if (qp->pd)
		atomic_fetch_add(&qp->pd->usecnt, 1);
	init->cap = qp->cap;
	if (qp->qpn_tr)
		qp->qpn_tr->qpn_bind(qp);
	urdma_dbg("qp %#x created (type %d, sq %u, rq %u)", qpn, type,
		  qp->sq_size, qp->rq.size);
	return &qp->ibqp;

err_free_rq:
	urdma_rq_destroy(qp);
err_free_sq:
	urdma_free(qp->sq);
err_free:
	if (qp->own_cq)
		urdma_destroy_cq(&qp->own_cq->ibcq);
	urdma_free(qp);
	atomic_fetch_sub(&uctx->nqps, 1);
	errno = ret;
	return NULL;
}

struct ibv_qp *urdma_create_qp(struct ibv_pd *ibpd,
			       struct ibv_qp_init_attr *init)
{
	/* An XRC target needs ibv_create_qp_ex (its domain).  An XRC send
	 * QP comes here too: ibv_create_qp_ex with only a PD calls
	 * ibv_create_qp. */
	if (init->qp_type == IBV_QPT_XRC_RECV) {
		errno = EINVAL;
		return NULL;
	}
	return urdma_qp_create(ibpd->context, ibpd, init, NULL);
}

/* QPs whose transport holds messages back (tr->release): the process's
 * count, so that a call to the connection manager walks no QPs when none
 * has one (urdma_release_held: cmtime -c 2,000 over shm walked 2,000 QPs
 * with their locks at each of its 4,000 calls). */
_Atomic int urdma_held_qps;

/* Count the QP in its CQs' polled_qps while its transport has tr->poll,
 * in their armed_qps while it has tr->armed, and in
 * urdma_held_qps while it has tr->release. */
static void qp_count_polled(struct urdma_qp *qp, int d)
{
	if (qp->tr && qp->tr->release)
		atomic_fetch_add(&urdma_held_qps, d);
	if (qp->tr && qp->tr->armed) {
		atomic_fetch_add(&qp->rcq->armed_qps, d);
		if (qp->scq != qp->rcq)
			atomic_fetch_add(&qp->scq->armed_qps, d);
	}
	if (!qp->tr || !qp->tr->poll)
		return;
	atomic_fetch_add(&qp->scq->polled_qps, d);
	if (qp->rcq != qp->scq) /* (a QP once: cq_watch.c counts QPs) */
		atomic_fetch_add(&qp->rcq->polled_qps, d);
	if (qp->xrcd) /* and its SRQs' CQs (urdma_xrc_take_pollers) */
		atomic_fetch_add(&urdma_xrc_polled, d);
}

/*
 * Let go of the transport.  ibv_poll_cq enters tr->poll only for a QP it
 * found with a transport under a CQ lock, counting itself in 'pollers'; so
 * clear qp->tr, pass through both CQ locks, and wait for those inside.
 */
static void qp_disconnect(struct urdma_qp *qp)
{
	const struct urdma_transport_ops *tr = qp->tr;
	struct urdma_cq *scq = qp->scq,
			*rcq = qp->rcq;

	if (!tr)
		return;
	qp_count_polled(qp, -1);
	pthread_mutex_lock(&scq->lock);
	__atomic_store_n(&qp->tr, NULL, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&scq->lock);
	pthread_mutex_lock(&rcq->lock);
	pthread_mutex_unlock(&rcq->lock);
	/* (and for a target's, whose pollers are counted in without these
	 * locks: tr cleared before pollers is read) */
	atomic_thread_fence(memory_order_seq_cst);
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
	struct urdma_qp *qp = to_uqp(ibqp), *first = qp;
	struct urdma_cq *scq, *rcq;
	struct urdma_context *uctx;

	/* (its events first: an XRC handle's are its own) */
	urdma_async_release(to_uctx(ibqp->context), ibqp, &qp->async_reported,
			    &ibqp->events_completed, &ibqp->mutex, &ibqp->cond,
			    &qp->async_gone);
	/* An XRC target lives until its last handle goes. */
	if (qp->xrc_real || qp->xrcd) {
		qp = urdma_xrc_handle_put(qp);
		if (!qp)
			return 0;
		ibqp = &qp->ibqp;
	}
	scq = qp->scq;
	rcq = qp->rcq;
	uctx = qp->uctx;

	if (qp != first)	/* the XRC target itself, its last handle gone */
		urdma_async_release(uctx, ibqp, &qp->async_reported,
				    &ibqp->events_completed, &ibqp->mutex,
				    &ibqp->cond, &qp->async_gone);
	if (qp->tr && qp->tr->drain)
		qp->tr->drain(qp);
	urdma_mcast_detach_all(qp);
	if (ibqp->qp_type == IBV_QPT_UD && atomic_load(&qp->shm->ud_drops))
		urdma_info("qp %#x: %u datagrams to it were dropped", ibqp->qp_num,
			   atomic_load(&qp->shm->ud_drops));
	urdma_host_qp_unpublish(ibqp->qp_num);
	if (qp->qpn_tr && qp->qpn_tr->qpn_unbind) /* nothing new reaches it */
		qp->qpn_tr->qpn_unbind(qp);
	atomic_store(&qp->shm->state, URDMA_SQPS_GONE);
	urdma_srq_detach(qp);
	if (!urdma_rq_quiesce(qp, RQ_WAIT_NS)) {
		/* Its block is never reused: the deliverer may write on. */
		urdma_warn("qp %#x: destroyed with a peer still inside its "
			   "receive queue", ibqp->qp_num);
		qp->shm_busy_left = true;
	}
	pthread_mutex_lock(&uctx->lock);
	list_del(&qp->ctx_node);
	pthread_mutex_unlock(&uctx->lock);
	atomic_fetch_sub(&uctx->nqps, 1);
	pthread_mutex_lock(&scq->lock);
	list_del(&qp->scq_node);
	pthread_mutex_unlock(&scq->lock);
	pthread_mutex_lock(&rcq->lock);
	list_del(&qp->rcq_node);
	urdma_bell_del(rcq, qp);
	if (qp->ring_listed)
		list_del(&qp->ring_node);
	pthread_mutex_unlock(&rcq->lock);
	/* The transport first: until it lets go, its receive path may
	 * settle a WR (urdma_qp_wr_kick) and push a completion that names
	 * the QP; after, nothing does, and the CQs forget what was pushed. */
	pthread_mutex_lock(&qp->sq_lock);
	qp_disconnect(qp);
	urdma_sq_forget_signaled(qp);
	pthread_mutex_unlock(&qp->sq_lock);
	cq_forget_qp(scq, qp);
	if (rcq != scq)
		cq_forget_qp(rcq, qp);
	if (qp->qpn_tr)
		qp->qpn_tr->qpn_release(ibqp->qp_num);
	/* A deliverer still inside may write its CQ's block too (bell.c) */
	if (qp->shm_busy_left)
		atomic_store(&rcq->shm_busy_left, true);
	atomic_fetch_sub(&scq->usecnt, 1);
	atomic_fetch_sub(&rcq->usecnt, 1);
	if (qp->pd)
		atomic_fetch_sub(&qp->pd->usecnt, 1);
	urdma_rq_destroy(qp);
	urdma_qp_ex_free(qp);
	urdma_free(qp->sq);
	if (qp->own_cq)
		urdma_destroy_cq(&qp->own_cq->ibcq);
	urdma_free(qp);
	return 0;
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

/* UD, as the kernel's table has it: a Q_Key, no path or peer. */
#define T(r, o) { .req = (r), .opt = (o), .ok = true }
#define UD_OPT (IBV_QP_CUR_STATE | IBV_QP_QKEY)
static const struct qp_trans ud_trans[IBV_QPS_ERR + 1][IBV_QPS_ERR + 1] = {
	[IBV_QPS_RESET] = {
		[IBV_QPS_RESET] = T(0, 0),
		[IBV_QPS_INIT] = T(IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
				   0),
	},
	[IBV_QPS_INIT] = {
		[IBV_QPS_INIT] = T(0, IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				      IBV_QP_QKEY),
		[IBV_QPS_RTR] = T(0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY),
	},
	[IBV_QPS_RTR] = { [IBV_QPS_RTS] = T(IBV_QP_SQ_PSN, UD_OPT) },
	[IBV_QPS_RTS] = {
		[IBV_QPS_RTS] = T(0, UD_OPT),
		[IBV_QPS_SQD] = T(0, IBV_QP_EN_SQD_ASYNC_NOTIFY),
	},
	[IBV_QPS_SQD] = {
		[IBV_QPS_RTS] = T(0, UD_OPT),
		[IBV_QPS_SQD] = T(0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY),
	},
	[IBV_QPS_SQE] = { [IBV_QPS_RTS] = T(0, UD_OPT) },
};
#undef T
#undef UD_OPT

#define UC_NONE                                                                \
	(IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER | IBV_QP_TIMEOUT |   \
	 IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC)

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
	/* A controlled Q_Key (the top bit) is for privileged consumers,
	 * as the kernel's uverbs has it. */
	if ((mask & IBV_QP_QKEY) && (a->qkey & 0x80000000u))
		return EPERM;
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

	urdma_sq_forget_signaled(qp);
	qp->sq_head = qp->sq_tail = qp->sq_comp = 0;
	atomic_store(&qp->sq_retired, 0);
	qp->unsignaled = 0;
	qp->sq_pending = false;
	urdma_rq_reset(qp);
	atomic_store(&s->error_req, 0);
	atomic_store(&s->rnr_waiter, 0);
	atomic_store(&qp->peer_dead, false);
	qp->peer_dead_ns = 0;
	qp->uc_lost_ns = 0;
}

int urdma_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask)
{
	struct urdma_qp *qp = to_uqp(ibqp);
	enum ibv_qp_state cur, next;
	const struct qp_trans *t;
	int ret = 0, req, opt;

	if (qp->xrc_real) { /* a handle of ibv_open_qp */
		ret = urdma_modify_qp(&qp->xrc_real->ibqp, a, mask);
		ibqp->state = qp->xrc_real->ibqp.state;
		return ret;
	}

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
	} else if (ibqp->qp_type == IBV_QPT_UD) {
		t = &ud_trans[cur][next];
	} else {
		t = &qp_trans[cur][next];
	}
	mask &= ~IBV_QP_STATE;
	/* As the kernel's uverbs: what an XRC QP has no use for is dropped
	 * from the mask (perftest sets it for both kinds). */
	if (ibqp->qp_type == IBV_QPT_XRC_SEND)
		mask &= ~(IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (ibqp->qp_type == IBV_QPT_XRC_RECV)
		mask &= ~(IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY);
	req = t->req;
	opt = t->opt;
	/* XRC QPs as the kernel's table has them: the send QP has no
	 * responder resources; the target has no requester ones. */
	if (ibqp->qp_type == IBV_QPT_XRC_SEND && next == IBV_QPS_RTR &&
	    cur == IBV_QPS_INIT)
		req &= ~(IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (ibqp->qp_type == IBV_QPT_XRC_RECV && next == IBV_QPS_RTS &&
	    cur == IBV_QPS_RTR)
		req = IBV_QP_TIMEOUT | IBV_QP_SQ_PSN;
	/* UC: no acknowledgements, so no timeouts, retries, RNR timer or
	 * responder resources. */
	if (ibqp->qp_type == IBV_QPT_UC) {
		req &= ~UC_NONE;
		opt &= ~UC_NONE;
	}
	if (!t->ok || (mask & req) != req || (mask & ~(req | opt))) {
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
	if (mask & IBV_QP_QKEY) {
		qp->attr.qkey = a->qkey;
		qp->shm->qkey = a->qkey; /* deliverers compare it */
	}
	if (mask & IBV_QP_PORT)
		qp->attr.port_num = a->port_num;
	if (mask & IBV_QP_AV) {
		/* Another host by LID alone goes by the GID learned with that
		 * LID, if any (ud.c); the QP then shows that GRH. */
		qp->attr.ah_attr = a->ah_attr;
		urdma_lid_learn(qp->uctx, &a->ah_attr);
		urdma_lid_route(qp->uctx, &qp->attr.ah_attr);
	}
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
			urdma_qp_enter_error(qp);
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
		urdma_sq_run(qp);
out:
	pthread_mutex_unlock(&qp->sq_lock);
	return ret;
}

int urdma_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask,
		   struct ibv_qp_init_attr *init)
{
	struct urdma_qp *qp = to_uqp(ibqp);

	if (qp->xrc_real) {
		int ret = urdma_query_qp(&qp->xrc_real->ibqp, a, mask, init);

		init->qp_context = ibqp->qp_context;
		return ret;
	}
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
	init->srq = ibqp->srq;
	init->cap = qp->cap;
	init->qp_type = ibqp->qp_type;
	init->sq_sig_all = qp->sq_sig_all;
	return 0;
}
