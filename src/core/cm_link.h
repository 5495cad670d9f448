/* SPDX-License-Identifier: MIT */
/*
 * What urdma's libibverbs offers urdma's librdmacm beyond the verbs API.
 *
 * 1. When the peer disconnects, the connection manager moves the id's QP to
 * ERR, as an iWARP RNIC does.  By then the application may have destroyed
 * that QP with ibv_destroy_qp, leaving rdma_cm_id.qp dangling (perftest
 * and rping tear down that way).  Hardware stacks take this step in the
 * kernel, which finds the QP by number; here libibverbs takes it, under
 * the locks that destroying a QP also takes, so a destroyed QP is simply
 * not found, even when a new one has its address and number.
 *
 * 2. An application that has received a message and turns to the connection
 * manager (perftest -R connects a second time right after its handshake)
 * should not hold back what its peer waits for: release_held.
 *
 * 3. libibverbs stops the application's threads for a moment to register
 * memory (core/stop.c); a thread that waits in rdma_get_cm_event may take
 * that signal: stop_seq tells it to wait again.
 *
 * librdmacm finds these through verbs_context.priv, a pointer that rdma-core's
 * libibverbs also keeps to itself: no symbol beyond rdma-core 44's is
 * exported.  The magic tells a urdma context from any other.
 */
#ifndef URDMA_CM_LINK_H
#define URDMA_CM_LINK_H

#include <stdint.h>
#include <infiniband/verbs.h>

/* A new member changes the magic: a librdmacm finds only the links it
 * knows (stop_seq came with "urmacml2"). */
#define URDMA_CM_LINK_MAGIC 0x326c6d63616d7275ull /* "urmacml2" */

struct verbs_ex_private {
	uint64_t magic;
	/* Move the QP at qp with ibv_qp.handle handle, of the open context
	 * ctx, to ERR.  0 if done; ENOENT if ctx is not open or has no such
	 * QP.  The handle is unique in the process; a QP number is not (TCP
	 * QPNs are reused at once) and neither is an address. */
	int (*qp_error_if_live)(struct ibv_context *ctx, struct ibv_qp *qp,
				uint32_t handle);
	/* The application turns to setting up connections: answers held back
	 * to ride with its next message on a QP (TCP flush answers) go now,
	 * not when their time comes (2 ms), as the peer's Send completes only
	 * with them. */
	void (*release_held)(void);
	/* urdma_stop_seq (core/urdma.h): a wait that returns EINTR with
	 * this moved was interrupted by a stop of the threads, not by the
	 * application's signal, and waits again. */
	uint32_t (*stop_seq)(void);
};

#endif
