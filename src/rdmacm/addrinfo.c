// SPDX-License-Identifier: MIT
/*
 * rdma_getaddrinfo: getaddrinfo(3) with RDMA's view of the answer.  It needs
 * no device: the addresses are IP addresses, the port space is TCP (RC) or
 * UDP (UD) as the hints say.  Like rdma-core, it returns getaddrinfo's error
 * code (EAI_*) when the name does not resolve, and -1 with errno otherwise.
 */
#include "rdmacm/cma.h"

#include <netdb.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

static struct sockaddr *sa_dup(const struct sockaddr *sa, socklen_t len)
{
	struct sockaddr *d = malloc(len);

	if (d)
		memcpy(d, sa, len);
	return d;
}

static socklen_t sa_size(const struct sockaddr *sa)
{
	return sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) :
	       sa->sa_family == AF_INET  ? sizeof(struct sockaddr_in) : 0;
}

EXPORT void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
	while (res) {
		struct rdma_addrinfo *next = res->ai_next;

		free(res->ai_src_addr);
		free(res->ai_dst_addr);
		free(res->ai_src_canonname);
		free(res->ai_dst_canonname);
		free(res->ai_route);
		free(res->ai_connect);
		free(res);
		res = next;
	}
}

/* Copy an address the caller gave in the hints (len bytes): 0, or
 * EAFNOSUPPORT for one that is not IPv4 or IPv6 (or too short). */
static int sa_take(struct sockaddr **dst, socklen_t *dst_len,
		   const struct sockaddr *sa, socklen_t len)
{
	socklen_t need;

	if (len < sizeof(sa_family_t))
		return EAFNOSUPPORT;
	need = sa_size(sa);
	if (!need || len < need)
		return EAFNOSUPPORT;
	*dst = sa_dup(sa, need);
	if (!*dst)
		return ENOMEM;
	*dst_len = need;
	return 0;
}

/* The answer for node/service, as getaddrinfo(3) has it: 0 or an EAI_*
 * code. */
static int by_name(const char *node, const char *service, int flags,
		   const struct rdma_addrinfo *hints, struct rdma_addrinfo *r)
{
	struct addrinfo ah = { .ai_socktype = SOCK_STREAM }, *ai;
	int ret;

	if (flags & RAI_PASSIVE)
		ah.ai_flags |= AI_PASSIVE;
	if (flags & RAI_NUMERICHOST)
		ah.ai_flags |= AI_NUMERICHOST;
	if (hints)
		ah.ai_family = hints->ai_family;
	if (!ah.ai_family && !node && (flags & RAI_PASSIVE))
		ah.ai_family = AF_INET; /* rdma-core binds wildcards to IPv4 */
	ret = getaddrinfo(node, service, &ah, &ai);
	if (ret)
		return ret;
	r->ai_family = ai->ai_family;
	if (flags & RAI_PASSIVE) {
		r->ai_src_len = ai->ai_addrlen;
		r->ai_src_addr = sa_dup(ai->ai_addr, ai->ai_addrlen);
		ret = r->ai_src_addr ? 0 : EAI_MEMORY;
	} else {
		r->ai_dst_len = ai->ai_addrlen;
		r->ai_dst_addr = sa_dup(ai->ai_addr, ai->ai_addrlen);
		ret = r->ai_dst_addr ? 0 : EAI_MEMORY;
	}
	freeaddrinfo(ai);
	return ret;
}

/* Names resolve through getaddrinfo; without node and service the
 * addresses come from the hints (ai_dst_addr, and ai_src_addr either
 * way), as rdma-core's do (libfabric's verbs provider asks so). */
EXPORT int rdma_getaddrinfo(const char *node, const char *service,
			    const struct rdma_addrinfo *hints,
			    struct rdma_addrinfo **res)
{
	struct rdma_addrinfo *r;
	int flags = hints ? hints->ai_flags : 0, ret = 0;

	if (!res || (!node && !service && !hints))
		return cma_err(EINVAL);
	if (flags & ~(RAI_PASSIVE | RAI_NUMERICHOST | RAI_NOROUTE | RAI_FAMILY))
		return cma_err(EINVAL);
	if (hints && hints->ai_family == AF_IB)
		return cma_err(EAFNOSUPPORT);
	r = calloc(1, sizeof(*r));
	if (!r)
		return cma_err(ENOMEM);
	r->ai_flags = flags;
	r->ai_port_space = hints && hints->ai_port_space ? hints->ai_port_space :
							  RDMA_PS_TCP;
	r->ai_qp_type = hints && hints->ai_qp_type ? hints->ai_qp_type :
		r->ai_port_space == RDMA_PS_UDP || r->ai_port_space == RDMA_PS_IPOIB ?
						    IBV_QPT_UD : IBV_QPT_RC;
	if (node || service) {
		ret = by_name(node, service, flags, hints, r);
		if (ret) {
			rdma_freeaddrinfo(r);
			return ret == EAI_MEMORY ? cma_err(ENOMEM) : ret;
		}
	} else {
		r->ai_family = hints->ai_family;
		if (hints->ai_dst_addr && hints->ai_dst_len)
			ret = sa_take(&r->ai_dst_addr, &r->ai_dst_len,
				      hints->ai_dst_addr, hints->ai_dst_len);
	}
	if (!ret && !r->ai_src_len && hints && hints->ai_src_addr)
		ret = sa_take(&r->ai_src_addr, &r->ai_src_len,
			      hints->ai_src_addr,
			      hints->ai_src_len ? hints->ai_src_len :
						  sa_size(hints->ai_src_addr));
	if (!ret && !r->ai_family)
		r->ai_family = r->ai_dst_len ? r->ai_dst_addr->sa_family :
			       r->ai_src_len ? r->ai_src_addr->sa_family : 0;
	if (ret) {
		rdma_freeaddrinfo(r);
		return cma_err(ret);
	}
	*res = r;
	return 0;
}
