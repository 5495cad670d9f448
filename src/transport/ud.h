/* SPDX-License-Identifier: MIT */
/*
 * UD datagrams (ud.c): one transport table for UD QPs, which sends each
 * datagram over shared memory when its destination QP is one of this
 * user's on this host (shm/shm_ud.c), else over UDP (udp/udp.c); and the
 * delivery into a UD QP's receive queue that both use: a sender over
 * shared memory writes the destination's ring in its owner's memory, the
 * UDP receive path writes its own QP's ring.
 */
#ifndef URDMA_UD_H
#define URDMA_UD_H

#include "transport/shm/shm.h"

/* A datagram to deliver: len bytes at data (in this process). */
struct urdma_ud_msg {
	const uint8_t *data;
	uint32_t len;
	const struct ibv_grh *grh; /* the GRH to write first, or NULL */
	uint32_t qpn;		   /* the destination QP */
	uint32_t qkey;
	uint32_t src_qp;
	uint32_t ud_src; /* the receive's sender fields (URDMA_RQE_UD_*) */
	uint32_t imm;	 /* network order */
	bool with_imm, solicited;
};

enum urdma_ud_res {
	URDMA_UD_DONE,	  /* delivered (a receive WR completed) */
	URDMA_UD_DROPPED, /* dropped and counted at the receiver: *why */
	URDMA_UD_GONE,	  /* d is another QP's now, or corrupt: forget it */
};

/* After URDMA_UD_DONE: what the receiver's owner must be told. */
enum {
	URDMA_UD_NOTIFY = 1, /* its armed CQ fires */
	URDMA_UD_ERROR = 2,  /* its QP goes to ERR (error_req is set) */
};

/* Deliver m into d, the receive queue of a UD QP whose registered memory
 * is dpeer's (NULL: ours) with MR table mrs; dpeer is also woken when its
 * SRQ's armed limit is crossed.  *tell: URDMA_UD_*; *why: a drop's
 * reason. */
enum urdma_ud_res urdma_ud_deliver(struct urdma_shm_dest *d,
				   struct urdma_peer *dpeer,
				   const struct urdma_shm_ctx *mrs,
				   const struct urdma_ud_msg *m, int *tell,
				   const char **why);

/* Does every datagram go over UDP (URDMA_TRANSPORT=tcp)? */
bool urdma_ud_net(void);

/* shm_ud.c: send m (read out of w's memory once, ud.c) to QP qpn over
 * shared memory, waiting up to wait_ms for the hello of a context not met
 * yet: URDMA_UD_GONE if that QP is not one of this user's on this host
 * (send it another way), else done. */
#define URDMA_UD_WAIT_MS 1000
enum urdma_ud_res urdma_shm_ud_send(struct urdma_qp *qp,
				    const struct urdma_swqe *w,
				    const struct urdma_ud_msg *m, uint32_t qpn,
				    int wait_ms);
void urdma_shm_ud_forget(struct urdma_qp *qp);

/* udp.c */
void urdma_udp_send(struct urdma_qp *qp, const struct urdma_swqe *w,
		    const struct urdma_ud_msg *m);
void urdma_udp_poll(struct urdma_qp *qp, enum urdma_poll_hint hint);
void urdma_udp_armed(struct urdma_qp *qp);
void urdma_udp_tick(void);
int urdma_udp_qpn_reserve(uint32_t *qpn);
void urdma_udp_qpn_bind(struct urdma_qp *qp);
void urdma_udp_qpn_unbind(struct urdma_qp *qp);
void urdma_udp_qpn_release(uint32_t qpn);
/* qp joins / leaves multicast group gid: datagrams to the group's IP
 * address reach it.  0 or -errno. */
int urdma_udp_mcast_join(struct urdma_qp *qp, const union ibv_gid *gid);
void urdma_udp_mcast_leave(struct urdma_qp *qp, const union ibv_gid *gid);

#endif
