/* SPDX-License-Identifier: MIT */
/*
 * urdma's librdmacm: the connection manager's internal interface.
 *
 * Each rdma_cm_id owns at most one TCP socket in the host's (namespace's)
 * port space: the RDMA CM port *is* the TCP port.  Connection setup is a
 * short exchange of CM messages on that socket (REQ, REP, RTU, REJ, DREQ;
 * docs/rdmacm.md); the RDMA traffic itself goes over the QP's own transport
 * (shared memory or iWARP/TCP), chosen by libibverbs from the GIDs.  One
 * thread per process (the CM thread) watches the sockets with epoll.
 */
#ifndef URDMA_CMA_H
#define URDMA_CMA_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <rdma/rdma_cma.h>

#include "util/clock.h"

#ifndef container_of
#define container_of(ptr, type, member)                                        \
	((type *)((char *)(ptr) - offsetof(type, member)))
#endif

/* librdmacm's convention: -1 with errno set. */
static inline int cma_err(int e)
{
	errno = e;
	return -1;
}

/* The largest private data a CM message carries (IB's REP limit). */
#define CMA_MAX_PDATA 196

#endif
