// SPDX-License-Identifier: MIT
/*
 * Addresses: binding an id's socket, and resolving a destination's
 * address (the source address the routing table picks) and route.
 */
#include "rdmacm/cma_priv.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

/* ---- addresses ---------------------------------------------------------- */

socklen_t sa_len(const struct sockaddr *sa)
{
	switch (sa->sa_family) {
	case AF_INET:
		return sizeof(struct sockaddr_in);
	case AF_INET6:
		return sizeof(struct sockaddr_in6);
	default:
		return 0;
	}
}

void sa_to_gid(const struct sockaddr *sa, union ibv_gid *gid)
{
	memset(gid, 0, sizeof(*gid));
	if (sa->sa_family == AF_INET) {
		gid->raw[10] = gid->raw[11] = 0xff;
		memcpy(&gid->raw[12], &((const struct sockaddr_in *)sa)->sin_addr, 4);
	} else if (sa->sa_family == AF_INET6) {
		memcpy(gid->raw, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
	}
}

bool sa_is_any(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return ((const struct sockaddr_in *)sa)->sin_addr.s_addr ==
		       htonl(INADDR_ANY);
	return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

uint16_t sa_port(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return ((const struct sockaddr_in *)sa)->sin_port;
	if (sa->sa_family == AF_INET6)
		return ((const struct sockaddr_in6 *)sa)->sin6_port;
	return 0;
}

/* The index of gid in the device's table, or -1. */
int cma_gid_find(const union ibv_gid *gid)
{
	struct ibv_port_attr pa;
	union ibv_gid g;

	if (ibv_query_port(cma_ctx, 1, &pa))
		return -1;
	for (int i = 0; i < pa.gid_tbl_len; i++)
		if (!ibv_query_gid(cma_ctx, 1, i, &g) && !memcmp(&g, gid, 16))
			return i;
	return -1;
}

/* The index of gid in the device's table, or 0. */
uint8_t cma_gid_index(const union ibv_gid *gid)
{
	int i = cma_gid_find(gid);

	return i < 0 ? 0 : (uint8_t)i;
}

/* Record the socket's addresses in the route and bind the id to the
 * device.  Under cma_lock. */
void cma_set_route(struct cma_id *cid, bool peer)
{
	struct rdma_addr *a = &cid->id.route.addr;
	socklen_t l = sizeof(a->src_storage);

	getsockname(cid->fd, &a->src_addr, &l);
	if (peer) {
		l = sizeof(a->dst_storage);
		getpeername(cid->fd, &a->dst_addr, &l);
	}
	sa_to_gid(&a->src_addr, &a->addr.ibaddr.sgid);
	sa_to_gid(&a->dst_addr, &a->addr.ibaddr.dgid);
	a->addr.ibaddr.pkey = htons(0xffff);
	if (!sa_is_any(&a->src_addr)) {
		cma_set_device(&cid->id);
		cid->id.port_num = 1;
	}
}

static void cma_fill_path(struct cma_id *cid)
{
	struct ibv_sa_path_rec *p = &cid->path;

	memset(p, 0, sizeof(*p));
	p->sgid = cid->id.route.addr.addr.ibaddr.sgid;
	p->dgid = cid->id.route.addr.addr.ibaddr.dgid;
	p->pkey = htons(0xffff);
	p->mtu = cma_mtu;
	p->mtu_selector = 2; /* exactly */
	p->hop_limit = 64;
	p->traffic_class = cid->tos;
	p->reversible = 1;
	p->numb_path = 1;
	p->packet_life_time = cid->ack_timeout > 0 ? cid->ack_timeout - 1 : 0;
	cid->id.route.path_rec = p;
	cid->id.route.num_paths = 1;
}

int cma_socket(struct cma_id *cid, int family)
{
	int one = 1;

	cid->fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (cid->fd < 0)
		return -1;
	/* A server restarts on its port although connections of its last
	 * run are in TIME_WAIT.  (So two ids may both bind a port that
	 * neither listens on; a listener's port is exclusive.) */
	setsockopt(cid->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	setsockopt(cid->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (family == AF_INET6 && cid->afonly)
		setsockopt(cid->fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	if (cid->tos)
		setsockopt(cid->fd, IPPROTO_IP, IP_TOS, &(int){ cid->tos },
			   sizeof(int));
	return 0;
}

/* Bind the id's socket to addr.  With late_port, a port 0 is left to
 * connect(), which picks one for the whole 4-tuple: a bind to port 0
 * takes one that no socket of the address holds, TIME_WAIT ones included,
 * and scans the range for it (1.2-2.7 ms an rdma_resolve_addr with 28,000
 * connections of the last minute in TIME_WAIT on loopback; EADDRINUSE once
 * they fill the range, where connect() still finds a port). */
static int cma_bind_sock(struct cma_id *cid, const struct sockaddr *addr,
			 bool late_port)
{
	socklen_t len;
	int e;

	if (cid->state != CS_IDLE)
		return cma_err(EINVAL);
	if (addr->sa_family == AF_IB)
		return cma_err(EAFNOSUPPORT);
	len = sa_len(addr);
	if (!len)
		return cma_err(EAFNOSUPPORT);
	if (cma_socket(cid, addr->sa_family))
		return -1;
	if (late_port && !sa_port(addr))
		setsockopt(cid->fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &(int){ 1 },
			   sizeof(int));
	if (bind(cid->fd, addr, len)) {
		e = errno;
		close(cid->fd);
		cid->fd = -1;
		return cma_err(e);
	}
	cma_set_route(cid, false);
	cid->state = CS_BOUND;
	return 0;
}

int cma_bind_locked(struct cma_id *cid, const struct sockaddr *addr)
{
	return cma_bind_sock(cid, addr, false);
}

EXPORT int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
	int ret;

	if (!id || !addr)
		return cma_err(EINVAL);
	pthread_mutex_lock(&cma_lock);
	ret = cma_bind_locked(to_cid(id), addr);
	pthread_mutex_unlock(&cma_lock);
	return ret;
}

/* ---- address and route resolution --------------------------------------- */

/* The source address the routing table picks for dst. */
static int cma_route_lookup(const struct sockaddr *dst, struct sockaddr_storage *src)
{
	socklen_t l = sizeof(*src);
	int fd = socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0), e = 0;

	if (fd < 0)
		return -errno;
	if (connect(fd, dst, sa_len(dst)) || getsockname(fd, (struct sockaddr *)src, &l))
		e = -errno;
	close(fd);
	return e;
}

EXPORT int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr,
			     struct sockaddr *dst_addr, int timeout_ms)
{
	struct sockaddr_storage src;
	struct cma_id *cid;
	int e;

	cma_release_held();
	if (!id || !dst_addr)
		return cma_err(EINVAL);
	if (dst_addr->sa_family == AF_IB ||
	    (src_addr && src_addr->sa_family == AF_IB))
		return cma_err(EAFNOSUPPORT);
	if (!sa_len(dst_addr) ||
	    (src_addr && src_addr->sa_family != dst_addr->sa_family &&
	     !(src_addr->sa_family == AF_INET6 && sa_is_any(src_addr))))
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	if (cid->state == CS_IDLE && src_addr && !sa_is_any(src_addr) &&
	    cma_bind_sock(cid, src_addr, true)) {
		pthread_mutex_unlock(&cma_lock);
		return -1;
	}
	if (cid->state != CS_IDLE && cid->state != CS_BOUND) {
		pthread_mutex_unlock(&cma_lock);
		return cma_err(EINVAL);
	}
	memcpy(&id->route.addr.dst_storage, dst_addr, sa_len(dst_addr));
	e = cma_route_lookup(dst_addr, &src);
	/* A group with no route here (a host without a default route) is
	 * joined from the address the id is bound to. */
	if (e && cid->state == CS_BOUND && cma_sa_multicast(dst_addr) &&
	    !sa_is_any(&id->route.addr.src_addr)) {
		memcpy(&src, &id->route.addr.src_storage,
		       sa_len(&id->route.addr.src_addr));
		e = 0;
	}
	if (!e && cid->state == CS_IDLE) {
		/* A wildcard src may still name the port (same offset in v6). */
		((struct sockaddr_in *)&src)->sin_port =
			src_addr ? sa_port(src_addr) : 0;
		if (cma_bind_sock(cid, (struct sockaddr *)&src, true))
			e = -errno;
	}
	if (e) {
		cma_post(cid, RDMA_CM_EVENT_ADDR_ERROR, e, NULL);
	} else {
		/* (the socket's own address is in the route since its bind) */
		sa_to_gid(&id->route.addr.dst_addr,
			  &id->route.addr.addr.ibaddr.dgid);
		/* A wildcard-bound socket: the route's source is the address. */
		if (sa_is_any(&id->route.addr.src_addr)) {
			uint16_t port = sa_port(&id->route.addr.src_addr);

			memcpy(&id->route.addr.src_storage, &src, sa_len((struct sockaddr *)&src));
			((struct sockaddr_in *)&id->route.addr.src_storage)->sin_port = port;
			sa_to_gid(&id->route.addr.src_addr, &id->route.addr.addr.ibaddr.sgid);
			cma_set_device(id);
		}
		cid->state = CS_ADDR_RESOLVED;
		cma_post(cid, RDMA_CM_EVENT_ADDR_RESOLVED, 0, NULL);
	}
	pthread_mutex_unlock(&cma_lock);
	(void)timeout_ms; /* a routing lookup answers at once */
	return cid->sync ? cma_sync_wait(cid, RDMA_CM_EVENT_ADDR_RESOLVED) : 0;
}

EXPORT int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	struct cma_id *cid;

	(void)timeout_ms;
	if (!id)
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	if (cid->state != CS_ADDR_RESOLVED) {
		pthread_mutex_unlock(&cma_lock);
		return cma_err(EINVAL);
	}
	cma_fill_path(cid);
	cid->state = CS_ROUTE_RESOLVED;
	cma_post(cid, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, NULL);
	pthread_mutex_unlock(&cma_lock);
	return cid->sync ? cma_sync_wait(cid, RDMA_CM_EVENT_ROUTE_RESOLVED) : 0;
}
