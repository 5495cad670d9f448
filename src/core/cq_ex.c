// SPDX-License-Identifier: MIT
/*
 * The extended CQ (ibv_create_cq_ex): ibv_start_poll / ibv_next_poll /
 * ibv_end_poll over the same CQ as ibv_poll_cq (cq.c), and the
 * ibv_wc_read_* calls, which read the completion the last start or next
 * poll took.  Also the device's clock (ibv_query_rt_values_ex).
 *
 * The device's clock is CLOCK_MONOTONIC in nanoseconds: hca_core_clock is
 * 1 GHz (1,000,000 kHz) and a raw clock value is nanoseconds.  A send
 * completion is stamped when urdma makes it; a receive completion, whose
 * entry a peer (or the TCP receive path) filled in shared memory, when the
 * poll takes it: a software device has no earlier moment of its own.
 */
#include <errno.h>
#include <string.h>

#include "core/urdma.h"
#include "util/clock.h"

#define CQ_EX_WC_FLAGS                                                         \
	(IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM |                        \
	 IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP |                       \
	 IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |                             \
	 IBV_WC_EX_WITH_DLID_PATH_BITS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | \
	 IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)
#define CQ_EX_STAMP                                                            \
	(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |                                 \
	 IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)
#define CQ_EX_FLAGS                                                            \
	(IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN)

static inline struct urdma_cq *ex_to_ucq(struct ibv_cq_ex *c)
{
	return container_of(c, struct urdma_cq, ibcq_ex);
}

/* Take one completion into cq->cur: 0, or ENOENT if there is none. */
static int ex_take(struct urdma_cq *cq)
{
	if (urdma_cq_poll(cq, 1, &cq->cur, cq->stamp ? &cq->cur_ts : NULL) != 1)
		return ENOENT;
	cq->ibcq_ex.status = cq->cur.status;
	cq->ibcq_ex.wr_id = cq->cur.wr_id;
	return 0;
}

static int ex_start_poll(struct ibv_cq_ex *ibcq, struct ibv_poll_cq_attr *attr)
{
	struct urdma_cq *cq = ex_to_ucq(ibcq);
	int ret;

	if (attr->comp_mask)
		return EINVAL;
	/* Until ibv_end_poll, unless the program said it is one thread; on
	 * ENOENT the program does not call ibv_end_poll. */
	if (cq->ex_locked)
		pthread_mutex_lock(&cq->ex_lock);
	ret = ex_take(cq);
	if (ret && cq->ex_locked)
		pthread_mutex_unlock(&cq->ex_lock);
	return ret;
}

static int ex_next_poll(struct ibv_cq_ex *ibcq)
{
	return ex_take(ex_to_ucq(ibcq));
}

static void ex_end_poll(struct ibv_cq_ex *ibcq)
{
	struct urdma_cq *cq = ex_to_ucq(ibcq);

	if (cq->ex_locked)
		pthread_mutex_unlock(&cq->ex_lock);
}

static enum ibv_wc_opcode ex_read_opcode(struct ibv_cq_ex *c)
{
	return ex_to_ucq(c)->cur.opcode;
}

static uint32_t ex_read_vendor_err(struct ibv_cq_ex *c)
{
	return ex_to_ucq(c)->cur.vendor_err;
}

static uint32_t ex_read_byte_len(struct ibv_cq_ex *c)
{
	return ex_to_ucq(c)->cur.byte_len;
}

/* Also ibv_wc_read_invalidated_rkey: the same field. */
static __be32 ex_read_imm_data(struct ibv_cq_ex *c)
{
	return ex_to_ucq(c)->cur.imm_data;
}

static uint32_t ex_read_qp_num(struct ibv_cq_ex *c)
{
	return ex_to_ucq(c)->cur.qp_num;
}

static uint32_t ex_read_src_qp(struct ibv_cq_ex *c)
{
	return ex_to_ucq(c)->cur.src_qp;
}

static unsigned int ex_read_wc_flags(struct ibv_cq_ex *c)
{
	return ex_to_ucq(c)->cur.wc_flags;
}

static uint32_t ex_read_slid(struct ibv_cq_ex *c)
{
	return ex_to_ucq(c)->cur.slid;
}

static uint8_t ex_read_sl(struct ibv_cq_ex *c)
{
	return ex_to_ucq(c)->cur.sl;
}

static uint8_t ex_read_dlid_path_bits(struct ibv_cq_ex *c)
{
	return ex_to_ucq(c)->cur.dlid_path_bits;
}

static uint64_t ex_read_completion_ts(struct ibv_cq_ex *c)
{
	return ex_to_ucq(c)->cur_ts;
}

/* The stamp on the wall clock: its distance from now, taken from now. */
static uint64_t ex_read_completion_wallclock_ns(struct ibv_cq_ex *c)
{
	uint64_t mono = urdma_now_ns(), real = urdma_clock_ns(CLOCK_REALTIME);

	return real - (mono - ex_to_ucq(c)->cur_ts);
}

struct ibv_cq_ex *urdma_create_cq_ex(struct ibv_context *context,
				     struct ibv_cq_init_attr_ex *attr)
{
	struct urdma_cq *cq;
	struct ibv_cq_ex *x;
	uint32_t flags = 0;

	if (attr->comp_mask & ~(uint32_t)(IBV_CQ_INIT_ATTR_MASK_FLAGS |
					  IBV_CQ_INIT_ATTR_MASK_PD)) {
		errno = EINVAL;
		return NULL;
	}
	if (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS)
		flags = attr->flags;
	/* This mask passes a parent domain (ibv_alloc_parent_domain), of
	 * this context; a plain PD is not one.  Nothing of the CQ depends on
	 * it: urdma has no allocator to take from it. */
	if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) &&
	    (!attr->parent_domain || attr->parent_domain->context != context ||
	     !to_upd(attr->parent_domain)->pd)) {
		errno = EINVAL;
		return NULL;
	}
	/* CVLAN, flow tags and tag matching are Ethernet or NIC offloads. */
	if ((attr->wc_flags & ~(uint64_t)CQ_EX_WC_FLAGS) ||
	    (flags & ~(uint32_t)CQ_EX_FLAGS)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (attr->cqe > URDMA_MAX_CQE) {
		errno = EINVAL;
		return NULL;
	}
	cq = urdma_cq_new(context, (int)attr->cqe, attr->channel,
			  attr->comp_vector);
	if (!cq)
		return NULL;
	cq->stamp = attr->wc_flags & CQ_EX_STAMP;
	cq->ex_locked = !(flags & IBV_CREATE_CQ_ATTR_SINGLE_THREADED);
	x = &cq->ibcq_ex;
	x->cq_context = attr->cq_context;
	x->start_poll = ex_start_poll;
	x->next_poll = ex_next_poll;
	x->end_poll = ex_end_poll;
	x->read_opcode = ex_read_opcode;
	x->read_vendor_err = ex_read_vendor_err;
	x->read_byte_len = ex_read_byte_len;
	x->read_imm_data = ex_read_imm_data;
	x->read_qp_num = ex_read_qp_num;
	x->read_src_qp = ex_read_src_qp;
	x->read_wc_flags = ex_read_wc_flags;
	x->read_slid = ex_read_slid;
	x->read_sl = ex_read_sl;
	x->read_dlid_path_bits = ex_read_dlid_path_bits;
	x->read_completion_ts = ex_read_completion_ts;
	x->read_completion_wallclock_ns = ex_read_completion_wallclock_ns;
	return x;
}

int urdma_query_rt_values(struct ibv_context *context,
			  struct ibv_values_ex *values)
{
	uint32_t asked = values->comp_mask;

	(void)context;
	values->comp_mask = 0;
	if (asked & IBV_VALUES_MASK_RAW_CLOCK) {
		/* As mlx5 gives its cycle counter: all in tv_nsec. */
		values->raw_clock.tv_sec = 0;
		values->raw_clock.tv_nsec = (long)urdma_now_ns();
		values->comp_mask |= IBV_VALUES_MASK_RAW_CLOCK;
	}
	return 0;
}
