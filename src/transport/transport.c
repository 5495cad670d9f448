// SPDX-License-Identifier: MIT
/*
 * Which transport a QP uses, decided when it connects (INIT->RTR).
 *
 * URDMA_TRANSPORT=shm or =tcp forces one (set it the same on both sides);
 * otherwise ("auto"): a peer addressed by LID only, or by a GID that is an
 * address of this network namespace, is on this host and gets shared
 * memory; any other GID is another host and gets TCP.
 */
#include <stdlib.h>
#include <string.h>

#include "transport/transport.h"
#include "util/log.h"

static bool gid_is_local(struct urdma_context *uctx, const union ibv_gid *g)
{
	for (int i = 0; i < uctx->num_gids; i++)
		if (!memcmp(uctx->gids[i].gid.raw, g->raw, 16))
			return true;
	return false;
}

const struct urdma_transport_ops *urdma_pick_transport(struct urdma_qp *qp,
						       const struct ibv_qp_attr *a)
{
	const char *e = getenv("URDMA_TRANSPORT");
	const struct urdma_transport_ops *tr;

	if (e && !strcmp(e, "shm"))
		tr = &urdma_shm_transport;
	else if (e && !strcmp(e, "tcp"))
		tr = &urdma_tcp_transport;
	else if (!a->ah_attr.is_global ||
		 gid_is_local(qp->uctx, &a->ah_attr.grh.dgid))
		tr = &urdma_shm_transport;
	else
		tr = &urdma_tcp_transport;
	if (tr == &urdma_tcp_transport && !qp->tcp_qpn) {
		urdma_warn("qp %#x: no TCP listener; using shared memory",
			   qp->ibqp.qp_num);
		tr = &urdma_shm_transport;
	}
	urdma_dbg("qp %#x: transport %s", qp->ibqp.qp_num, tr->name);
	return tr;
}
