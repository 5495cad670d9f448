// SPDX-License-Identifier: MIT
/*
 * The ids' queue pairs: rdma_create_qp (with the CQs and PD it makes when
 * the application gives none), the attributes of each state, and moving a
 * QP through INIT, RTR and RTS with the peer's parameters, or to ERR.
 */
#include "rdmacm/cma_priv.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

/* ---- queue pairs -------------------------------------------------------- */

/* A UD id's Q_Key: its QP's, or the port space's (RDMA_UDP_QKEY). */
uint32_t cma_ud_qkey(struct cma_id *cid)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;

	if (cid->id.qp && !ibv_query_qp(cid->id.qp, &a, IBV_QP_QKEY, &ia))
		return a.qkey;
	return RDMA_UDP_QKEY;
}

/* The address of the peer of a UD id, from its message m. */
void cma_ud_ah(struct cma_id *cid, const struct cma_msg *m,
	       struct ibv_ah_attr *ah)
{
	memset(ah, 0, sizeof(*ah));
	(void)m; /* (the address we reached it at, not one it claims) */
	ah->is_global = 1;
	ah->grh.dgid = cid->id.route.addr.addr.ibaddr.dgid;
	ah->grh.sgid_index = cma_gid_index(&cid->id.route.addr.addr.ibaddr.sgid);
	ah->grh.hop_limit = 64;
	ah->grh.traffic_class = cid->tos;
	ah->port_num = cid->id.port_num ? cid->id.port_num : 1;
}

static void cma_qp_attr_init(struct cma_id *cid, struct ibv_qp_attr *a, int *mask)
{
	a->qp_state = IBV_QPS_INIT;
	a->pkey_index = 0;
	a->port_num = cid->id.port_num ? cid->id.port_num : 1;
	if (cid->id.qp_type == IBV_QPT_UD) {
		a->qkey = RDMA_UDP_QKEY;
		*mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			IBV_QP_QKEY;
		return;
	}
	a->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
			     IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
	*mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
		IBV_QP_ACCESS_FLAGS;
}

static void cma_qp_attr_rtr(struct cma_id *cid, struct ibv_qp_attr *a, int *mask)
{
	struct rdma_ib_addr *ib = &cid->id.route.addr.addr.ibaddr;

	a->qp_state = IBV_QPS_RTR;
	if (cid->id.qp_type == IBV_QPT_UD) { /* no peer */
		*mask = IBV_QP_STATE;
		return;
	}
	a->path_mtu = cma_mtu;
	a->dest_qp_num = ntohl(cid->peer.qpn) & 0xffffff;
	a->rq_psn = ntohl(cid->peer.psn) & 0xffffff;
	a->max_dest_rd_atomic = cid->responder_resources ? cid->responder_resources : 1;
	a->min_rnr_timer = 12;
	memset(&a->ah_attr, 0, sizeof(a->ah_attr));
	a->ah_attr.is_global = 1;
	memcpy(a->ah_attr.grh.dgid.raw, cid->peer.gid, 16);
	a->ah_attr.grh.sgid_index = cma_gid_index(&ib->sgid);
	a->ah_attr.grh.hop_limit = 64;
	a->ah_attr.grh.traffic_class = cid->tos;
	a->ah_attr.port_num = cid->id.port_num ? cid->id.port_num : 1;
	*mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
}

static void cma_qp_attr_rts(struct cma_id *cid, struct ibv_qp_attr *a, int *mask)
{
	a->qp_state = IBV_QPS_RTS;
	a->sq_psn = cid->psn;
	if (cid->id.qp_type == IBV_QPT_UD) {
		*mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
		return;
	}
	a->timeout = cid->ack_timeout;
	a->retry_cnt = cid->retry_count;
	a->rnr_retry = cid->rnr_retry;
	a->max_rd_atomic = cid->initiator_depth ? cid->initiator_depth : 1;
	*mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
		IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
}

static int cma_modify(struct cma_id *cid,
		      void (*fill)(struct cma_id *, struct ibv_qp_attr *, int *))
{
	struct ibv_qp_attr a;
	int mask, ret;

	memset(&a, 0, sizeof(a));
	fill(cid, &a, &mask);
	ret = ibv_modify_qp(cid->id.qp, &a, mask);
	return ret ? -ret : 0;
}

/* Move our QP to RTR and RTS with the peer's parameters. */
int cma_qp_connect(struct cma_id *cid)
{
	int ret;

	if (!cid->id.qp)
		return 0;
	ret = cma_modify(cid, cma_qp_attr_rtr);
	if (!ret)
		ret = cma_modify(cid, cma_qp_attr_rts);
	return ret;
}

/* The id's QP to ERR.  The application may have destroyed the QP that
 * rdma_create_qp made with ibv_destroy_qp, leaving id.qp dangling, so that
 * one is moved by libibverbs, which finds it by address and handle if it
 * still exists (core/cm_link.h). */
void cma_qp_error(struct cma_id *cid)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	const struct verbs_ex_private *link = cma_link();

	if (!cid->id.qp)
		return;
	if (cid->id.qp == cid->qp_made && link)
		link->qp_error_if_live(cid->qp_ctx, cid->qp_made, cid->handle_made);
	else
		ibv_modify_qp(cid->id.qp, &a, IBV_QP_STATE);
}

EXPORT int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr,
			     int *qp_attr_mask)
{
	struct cma_id *cid;
	int ret = 0;

	if (!id || !qp_attr || !qp_attr_mask)
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	switch (qp_attr->qp_state) {
	case IBV_QPS_INIT:
		if (!id->verbs)
			ret = cma_err(EINVAL);
		else
			cma_qp_attr_init(cid, qp_attr, qp_attr_mask);
		break;
	case IBV_QPS_RTR:
		if (!cid->peer.magic && id->qp_type != IBV_QPT_UD)
			ret = cma_err(EINVAL);
		else
			cma_qp_attr_rtr(cid, qp_attr, qp_attr_mask);
		break;
	case IBV_QPS_RTS:
		if (!cid->peer.magic && id->qp_type != IBV_QPT_UD)
			ret = cma_err(EINVAL);
		else
			cma_qp_attr_rts(cid, qp_attr, qp_attr_mask);
		break;
	default:
		ret = cma_err(EINVAL);
	}
	pthread_mutex_unlock(&cma_lock);
	return ret;
}

static void cma_free_cqs(struct cma_id *cid)
{
	struct rdma_cm_id *id = &cid->id;

	if (!cid->own_cqs)
		return;
	if (id->send_cq && id->send_cq != id->recv_cq)
		ibv_destroy_cq(id->send_cq);
	if (id->recv_cq)
		ibv_destroy_cq(id->recv_cq);
	if (id->send_cq_channel && id->send_cq_channel != id->recv_cq_channel)
		ibv_destroy_comp_channel(id->send_cq_channel);
	if (id->recv_cq_channel)
		ibv_destroy_comp_channel(id->recv_cq_channel);
	id->send_cq = id->recv_cq = NULL;
	id->send_cq_channel = id->recv_cq_channel = NULL;
	cid->own_cqs = false;
}

/* CQs, each with its completion channel, for a QP created without them:
 * what <rdma/rdma_verbs.h>'s rdma_get_send_comp/rdma_get_recv_comp wait on. */
static int cma_make_cqs(struct cma_id *cid, struct ibv_context *ctx,
			uint32_t send_wr, uint32_t recv_wr)
{
	struct rdma_cm_id *id = &cid->id;

	cid->own_cqs = true;
	id->send_cq_channel = ibv_create_comp_channel(ctx);
	id->recv_cq_channel = ibv_create_comp_channel(ctx);
	if (id->send_cq_channel && id->recv_cq_channel) {
		id->send_cq = ibv_create_cq(ctx, send_wr ? send_wr : 1, id,
					    id->send_cq_channel, 0);
		id->recv_cq = ibv_create_cq(ctx, recv_wr ? recv_wr : 1, id,
					    id->recv_cq_channel, 0);
	}
	if (id->send_cq && id->recv_cq)
		return 0;
	cma_free_cqs(cid);
	return -1;
}

static int cma_qp_created(struct cma_id *cid, struct ibv_qp *qp, struct ibv_pd *pd)
{
	cid->id.qp = qp;
	cid->id.pd = pd;
	cid->qp_made = qp;
	cid->qp_ctx = qp->context;
	cid->handle_made = qp->handle;
	if (!cid->id.verbs)
		cid->id.verbs = qp->context;
	/* A UD QP needs no peer: it is ready at once, as rdma-core's. */
	if (cma_modify(cid, cma_qp_attr_init) ||
	    (qp->qp_type == IBV_QPT_UD &&
	     (cma_modify(cid, cma_qp_attr_rtr) ||
	      cma_modify(cid, cma_qp_attr_rts)))) {
		int e = errno;

		ibv_destroy_qp(qp);
		cid->id.qp = cid->qp_made = NULL;
		return cma_err(e);
	}
	return 0;
}

EXPORT int rdma_create_qp_ex(struct rdma_cm_id *id,
			     struct ibv_qp_init_attr_ex *attr)
{
	struct cma_id *cid;
	struct ibv_qp *qp;
	int ret;

	if (!id || !attr || id->qp)
		return cma_err(EINVAL);
	/* An id's QP is of its port space's kind. */
	if (attr->qp_type != id->qp_type)
		return cma_err(attr->qp_type == IBV_QPT_RC ||
					       attr->qp_type == IBV_QPT_UD ?
				       EINVAL :
				       EOPNOTSUPP);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
		attr->pd = id->pd ? id->pd : id->verbs ? cma_pd : NULL;
		attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
	}
	if (!attr->pd || (id->verbs && attr->pd->context != id->verbs &&
			  id->verbs != cma_ctx)) {
		pthread_mutex_unlock(&cma_lock);
		return cma_err(EINVAL);
	}
	if ((!attr->send_cq || !attr->recv_cq) &&
	    cma_make_cqs(cid, attr->pd->context, attr->cap.max_send_wr,
			 attr->cap.max_recv_wr)) {
		pthread_mutex_unlock(&cma_lock);
		return -1;
	}
	if (!attr->send_cq)
		attr->send_cq = id->send_cq;
	if (!attr->recv_cq)
		attr->recv_cq = id->recv_cq;
	if (!attr->srq && id->srq)
		attr->srq = id->srq;
	qp = ibv_create_qp_ex(attr->pd->context, attr);
	if (!qp) {
		int e = errno;

		cma_free_cqs(cid);
		pthread_mutex_unlock(&cma_lock);
		return cma_err(e);
	}
	if (!cid->own_cqs) {
		id->send_cq = attr->send_cq;
		id->recv_cq = attr->recv_cq;
	}
	ret = cma_qp_created(cid, qp, attr->pd);
	if (ret)
		cma_free_cqs(cid);
	pthread_mutex_unlock(&cma_lock);
	return ret;
}

EXPORT int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd,
			  struct ibv_qp_init_attr *qp_init_attr)
{
	struct ibv_qp_init_attr_ex ax;
	int ret;

	if (!id || !qp_init_attr)
		return cma_err(EINVAL);
	memset(&ax, 0, sizeof(ax));
	memcpy(&ax, qp_init_attr, sizeof(*qp_init_attr));
	ax.comp_mask = IBV_QP_INIT_ATTR_PD;
	ax.pd = pd;
	ret = rdma_create_qp_ex(id, &ax);
	if (!ret) {
		qp_init_attr->send_cq = ax.send_cq;
		qp_init_attr->recv_cq = ax.recv_cq;
		qp_init_attr->cap = ax.cap;
	}
	return ret;
}

EXPORT void rdma_destroy_qp(struct rdma_cm_id *id)
{
	struct cma_id *cid;

	if (!id || !id->qp)
		return;
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	ibv_destroy_qp(id->qp);
	id->qp = cid->qp_made = NULL;
	cma_mc_qp_gone(cid);
	cma_free_cqs(cid);
	pthread_mutex_unlock(&cma_lock);
}

EXPORT int rdma_create_srq_ex(struct rdma_cm_id *id,
			      struct ibv_srq_init_attr_ex *attr)
{
	struct ibv_srq *srq;

	if (!id || !attr)
		return cma_err(EINVAL);
	if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
		pthread_mutex_lock(&cma_lock);
		attr->pd = id->pd ? id->pd : id->verbs ? cma_pd : NULL;
		pthread_mutex_unlock(&cma_lock);
		attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
	}
	if (!attr->pd)
		return cma_err(EINVAL);
	srq = ibv_create_srq_ex(attr->pd->context, attr);
	if (!srq)
		return -1;
	id->srq = srq;
	id->pd = attr->pd;
	return 0;
}

EXPORT int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd,
			   struct ibv_srq_init_attr *attr)
{
	struct ibv_srq_init_attr_ex ax;
	int ret;

	if (!id || !attr)
		return cma_err(EINVAL);
	memset(&ax, 0, sizeof(ax));
	ax.srq_context = attr->srq_context;
	ax.attr = attr->attr;
	ax.comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE;
	ax.srq_type = IBV_SRQT_BASIC;
	ax.pd = pd;
	ret = rdma_create_srq_ex(id, &ax);
	if (!ret)
		attr->attr = ax.attr;
	return ret;
}

EXPORT void rdma_destroy_srq(struct rdma_cm_id *id)
{
	if (!id || !id->srq)
		return;
	ibv_destroy_srq(id->srq);
	id->srq = NULL;
}
