// SPDX-License-Identifier: MIT
/*
 * The extended QP (ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS):
 * ibv_wr_start, an ibv_wr_* call per WR with ibv_wr_set_sge(_list) or
 * ibv_wr_set_inline_data(_list) after it, then ibv_wr_complete posts them
 * all, or none (ibv_wr_abort, or the first error, which it returns).
 *
 * The WRs are built in the QP's batch (struct urdma_wr_batch) as ordinary
 * ibv_send_wr and go through the send queue's own checks and copy
 * (urdma_post_send_all), so ibv_post_send and the wr_ calls mix freely on
 * one QP.  Inline data is copied into the batch when it is set, as the
 * program may reuse its buffer at once.  wr_start..wr_complete hold the
 * batch's lock: one thread builds at a time.
 */
#include <errno.h>
#include <string.h>

#include "core/urdma.h"
#include "util/alloc.h"

struct urdma_wr_batch {
	pthread_mutex_t lock;
	uint64_t ops;	 /* IBV_QP_EX_WITH_*: what the QP was made for */
	uint32_t n, cap; /* WRs built; at most the send queue's size */
	int err;	 /* the first error: nothing is posted */
	struct ibv_send_wr *wr;
	struct ibv_sge *sge; /* cap x max_send_sge */
	uint8_t *inl;	     /* cap x max_inline_data, made on first use */
};

#define QP_EX_OPS                                                              \
	(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |      \
	 IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |                  \
	 IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |        \
	 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)

static inline struct urdma_qp *ex_to_uqp(struct ibv_qp_ex *q)
{
	return container_of(q, struct urdma_qp, ibqp_ex);
}

/* A new WR at the end of the batch, or NULL (the batch keeps the error). */
static struct ibv_send_wr *wr_new(struct ibv_qp_ex *x, enum ibv_wr_opcode op,
				  uint64_t with)
{
	struct urdma_qp *qp = ex_to_uqp(x);
	struct urdma_wr_batch *b = qp->wrb;
	struct ibv_send_wr *wr;

	if (b->err)
		return NULL;
	if (!(b->ops & with)) { /* not among the QP's send_ops_flags */
		b->err = EINVAL;
		return NULL;
	}
	if (b->n == b->cap) {
		b->err = ENOMEM;
		return NULL;
	}
	wr = &b->wr[b->n];
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = x->wr_id;
	wr->send_flags = x->wr_flags;
	wr->opcode = op;
	wr->sg_list = &b->sge[(size_t)b->n * qp->cap.max_send_sge];
	b->n++;
	return wr;
}

/* The WR that the set calls fill: the last one built. */
static struct ibv_send_wr *wr_last(struct urdma_wr_batch *b)
{
	if (b->err)
		return NULL;
	if (!b->n) {
		b->err = EINVAL;
		return NULL;
	}
	return &b->wr[b->n - 1];
}

static void ex_send(struct ibv_qp_ex *x)
{
	wr_new(x, IBV_WR_SEND, IBV_QP_EX_WITH_SEND);
}

static void ex_send_imm(struct ibv_qp_ex *x, __be32 imm)
{
	struct ibv_send_wr *wr =
		wr_new(x, IBV_WR_SEND_WITH_IMM, IBV_QP_EX_WITH_SEND_WITH_IMM);

	if (wr)
		wr->imm_data = imm;
}

static void rdma(struct ibv_qp_ex *x, enum ibv_wr_opcode op, uint64_t with,
		 uint32_t rkey, uint64_t addr, __be32 imm)
{
	struct ibv_send_wr *wr = wr_new(x, op, with);

	if (!wr)
		return;
	wr->wr.rdma.rkey = rkey;
	wr->wr.rdma.remote_addr = addr;
	wr->imm_data = imm;
}

static void ex_rdma_write(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr)
{
	rdma(x, IBV_WR_RDMA_WRITE, IBV_QP_EX_WITH_RDMA_WRITE, rkey, addr, 0);
}

static void ex_rdma_write_imm(struct ibv_qp_ex *x, uint32_t rkey,
			      uint64_t addr, __be32 imm)
{
	rdma(x, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM,
	     rkey, addr, imm);
}

static void ex_rdma_read(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr)
{
	rdma(x, IBV_WR_RDMA_READ, IBV_QP_EX_WITH_RDMA_READ, rkey, addr, 0);
}

static void atomic(struct ibv_qp_ex *x, enum ibv_wr_opcode op, uint64_t with,
		   uint32_t rkey, uint64_t addr, uint64_t compare_add,
		   uint64_t swap)
{
	struct ibv_send_wr *wr = wr_new(x, op, with);

	if (!wr)
		return;
	wr->wr.atomic.rkey = rkey;
	wr->wr.atomic.remote_addr = addr;
	wr->wr.atomic.compare_add = compare_add;
	wr->wr.atomic.swap = swap;
}

static void ex_cmp_swp(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr,
		       uint64_t compare, uint64_t swap)
{
	atomic(x, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP,
	       rkey, addr, compare, swap);
}

static void ex_fetch_add(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr,
			 uint64_t add)
{
	atomic(x, IBV_WR_ATOMIC_FETCH_AND_ADD,
	       IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, rkey, addr, add, 0);
}

static void ex_set_sge(struct ibv_qp_ex *x, uint32_t lkey, uint64_t addr,
		       uint32_t length)
{
	struct ibv_send_wr *wr = wr_last(ex_to_uqp(x)->wrb);

	if (!wr)
		return;
	wr->sg_list[0] = (struct ibv_sge){ addr, length, lkey };
	wr->num_sge = 1;
	wr->send_flags &= ~IBV_SEND_INLINE;
}

static void ex_set_sge_list(struct ibv_qp_ex *x, size_t num,
			    const struct ibv_sge *sg)
{
	struct urdma_qp *qp = ex_to_uqp(x);
	struct ibv_send_wr *wr = wr_last(qp->wrb);

	if (!wr)
		return;
	if (num > qp->cap.max_send_sge) {
		qp->wrb->err = EINVAL;
		return;
	}
	if (num)
		memcpy(wr->sg_list, sg, num * sizeof(*sg));
	wr->num_sge = (int)num;
	wr->send_flags &= ~IBV_SEND_INLINE;
}

static void ex_set_inline_list(struct ibv_qp_ex *x, size_t num,
			       const struct ibv_data_buf *buf)
{
	struct urdma_qp *qp = ex_to_uqp(x);
	struct urdma_wr_batch *b = qp->wrb;
	struct ibv_send_wr *wr = wr_last(b);
	size_t max = qp->cap.max_inline_data, len = 0;
	uint8_t *p;

	if (!wr)
		return;
	for (size_t i = 0; i < num; i++) {
		len += buf[i].length;
		if (len > max) {
			b->err = EINVAL;
			return;
		}
	}
	if (!b->inl) {
		b->inl = urdma_zalloc_array(b->cap, max ? max : 1);
		if (!b->inl) {
			b->err = ENOMEM;
			return;
		}
	}
	p = b->inl + (size_t)(b->n - 1) * max;
	for (size_t i = 0, off = 0; i < num; i++) {
		memcpy(p + off, buf[i].addr, buf[i].length);
		off += buf[i].length;
	}
	wr->sg_list[0] = (struct ibv_sge){ (uintptr_t)p, (uint32_t)len, 0 };
	wr->num_sge = 1;
	wr->send_flags |= IBV_SEND_INLINE;
}

static void ex_set_inline(struct ibv_qp_ex *x, void *addr, size_t length)
{
	struct ibv_data_buf one = { addr, length };

	ex_set_inline_list(x, 1, &one);
}

/* An XRC send QP's: the SRQ the WR is for (ibv_wr_set_xrc_srqn). */
static void ex_set_xrc_srqn(struct ibv_qp_ex *x, uint32_t srqn)
{
	struct ibv_send_wr *wr = wr_last(ex_to_uqp(x)->wrb);

	if (wr)
		wr->qp_type.xrc.remote_srqn = srqn;
}

/* A UD QP's: where the datagram goes (ibv_wr_set_ud_addr). */
static void ex_set_ud_addr(struct ibv_qp_ex *x, struct ibv_ah *ah,
			   uint32_t remote_qpn, uint32_t remote_qkey)
{
	struct ibv_send_wr *wr = wr_last(ex_to_uqp(x)->wrb);

	if (wr) {
		wr->wr.ud.ah = ah;
		wr->wr.ud.remote_qpn = remote_qpn;
		wr->wr.ud.remote_qkey = remote_qkey;
	}
}

static void ex_start(struct ibv_qp_ex *x)
{
	struct urdma_wr_batch *b = ex_to_uqp(x)->wrb;

	pthread_mutex_lock(&b->lock);
	b->n = 0;
	b->err = 0;
}

static int ex_complete(struct ibv_qp_ex *x)
{
	struct urdma_qp *qp = ex_to_uqp(x);
	struct urdma_wr_batch *b = qp->wrb;
	int ret = b->err;

	if (!ret && b->n)
		ret = urdma_post_send_all(qp, b->wr, b->n);
	b->n = 0;
	b->err = 0;
	pthread_mutex_unlock(&b->lock);
	return ret;
}

static void ex_abort(struct ibv_qp_ex *x)
{
	struct urdma_wr_batch *b = ex_to_uqp(x)->wrb;

	b->n = 0;
	b->err = 0;
	pthread_mutex_unlock(&b->lock);
}

/* Give qp the wr_ calls for ops (IBV_QP_EX_WITH_*): 0 or an errno. */
static int qp_ex_init(struct urdma_qp *qp, uint64_t ops)
{
	struct ibv_qp_ex *x = &qp->ibqp_ex;
	struct urdma_wr_batch *b;

	if (ops & ~(uint64_t)QP_EX_OPS)
		return EOPNOTSUPP;
	b = urdma_zalloc(sizeof(*b));
	if (!b)
		return ENOMEM;
	b->ops = ops;
	b->cap = qp->cap.max_send_wr;
	b->wr = urdma_zalloc_array(b->cap, sizeof(*b->wr));
	b->sge = urdma_zalloc_array((size_t)b->cap * qp->cap.max_send_sge,
				    sizeof(*b->sge));
	if (!b->wr || !b->sge) {
		urdma_free(b->wr);
		urdma_free(b->sge);
		urdma_free(b);
		return ENOMEM;
	}
	pthread_mutex_init(&b->lock, NULL);
	qp->wrb = b;
	x->wr_send = ex_send;
	x->wr_send_imm = ex_send_imm;
	x->wr_rdma_write = ex_rdma_write;
	x->wr_rdma_write_imm = ex_rdma_write_imm;
	x->wr_rdma_read = ex_rdma_read;
	x->wr_atomic_cmp_swp = ex_cmp_swp;
	x->wr_atomic_fetch_add = ex_fetch_add;
	x->wr_set_sge = ex_set_sge;
	x->wr_set_sge_list = ex_set_sge_list;
	x->wr_set_inline_data = ex_set_inline;
	x->wr_set_inline_data_list = ex_set_inline_list;
	if (qp->ibqp.qp_type == IBV_QPT_XRC_SEND)
		x->wr_set_xrc_srqn = ex_set_xrc_srqn;
	if (qp->ibqp.qp_type == IBV_QPT_UD)
		x->wr_set_ud_addr = ex_set_ud_addr;
	x->wr_start = ex_start;
	x->wr_complete = ex_complete;
	x->wr_abort = ex_abort;
	return 0;
}

void urdma_qp_ex_free(struct urdma_qp *qp)
{
	struct urdma_wr_batch *b = qp->wrb;

	if (!b)
		return;
	pthread_mutex_destroy(&b->lock);
	urdma_free(b->wr);
	urdma_free(b->sge);
	urdma_free(b->inl);
	urdma_free(b);
	qp->wrb = NULL;
}

#define QP_INIT_ATTR_KNOWN                                                     \
	(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD |                         \
	 IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_MAX_TSO_HEADER |     \
	 IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH |               \
	 IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)

struct ibv_qp *urdma_create_qp_ex(struct ibv_context *context,
				  struct ibv_qp_init_attr_ex *ax)
{
	struct ibv_qp_init_attr init = {
		.qp_context = ax->qp_context,
		.send_cq = ax->send_cq,
		.recv_cq = ax->recv_cq,
		.srq = ax->srq,
		.cap = ax->cap,
		.qp_type = ax->qp_type,
		.sq_sig_all = ax->sq_sig_all,
	};
	bool tgt = ax->qp_type == IBV_QPT_XRC_RECV;
	struct urdma_xrcd *xrcd = NULL;
	struct ibv_qp *ibqp;
	int ret;

	/* A PD for all but an XRC target, which has a domain instead. */
	if ((ax->comp_mask & ~(uint32_t)QP_INIT_ATTR_KNOWN) ||
	    (!tgt && (!(ax->comp_mask & IBV_QP_INIT_ATTR_PD) || !ax->pd ||
		      ax->pd->context != context)) ||
	    (tgt && (!(ax->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !ax->xrcd ||
		     ax->xrcd->context != context))) {
		errno = EINVAL;
		return NULL;
	}
	if (tgt)
		xrcd = to_uxrcd(ax->xrcd);
	/* TSO, RSS and the creation flags but a UD QP's self-multicast
	 * blocking (FCS scatter, VLAN stripping, source QPN) are not
	 * implemented. */
	if ((ax->comp_mask & (IBV_QP_INIT_ATTR_MAX_TSO_HEADER |
			      IBV_QP_INIT_ATTR_IND_TABLE |
			      IBV_QP_INIT_ATTR_RX_HASH)) ||
	    ((ax->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) &&
	     (ax->create_flags & ~(ax->qp_type == IBV_QPT_UD ?
					   IBV_QP_CREATE_BLOCK_SELF_MCAST_LB :
					   0))) ||
	    ((ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
	     (ax->send_ops_flags & ~(uint64_t)QP_EX_OPS))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	/* UC has no Reads or atomics (mlx5 refuses them here too). */
	if (ax->qp_type == IBV_QPT_UC &&
	    (ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
	    (ax->send_ops_flags & (IBV_QP_EX_WITH_RDMA_READ |
				   IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
				   IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
				   IBV_QP_EX_WITH_SEND_WITH_INV))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	/* UD sends, with or without immediate data, only. */
	if (ax->qp_type == IBV_QPT_UD &&
	    (ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
	    (ax->send_ops_flags & ~(uint64_t)(IBV_QP_EX_WITH_SEND |
					       IBV_QP_EX_WITH_SEND_WITH_IMM))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	ibqp = urdma_qp_create(context, tgt ? NULL : ax->pd, &init, xrcd);
	if (!ibqp)
		return NULL;
	ax->cap = init.cap;
	if (ax->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS)
		to_uqp(ibqp)->block_self_mcast =
			ax->create_flags & IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
	if (ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
		ret = qp_ex_init(to_uqp(ibqp), ax->send_ops_flags);
		if (ret) {
			urdma_destroy_qp(ibqp);
			errno = ret;
			return NULL;
		}
	}
	return ibqp;
}

struct ibv_qp_ex *urdma_qp_to_qp_ex(struct ibv_qp *ibqp)
{
	struct urdma_qp *qp = to_uqp(ibqp);

	return qp->wrb ? &qp->ibqp_ex : NULL;
}
