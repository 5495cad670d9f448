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

EXPORT int rdma_getaddrinfo(const char *node, const char *service,
			    const struct rdma_addrinfo *hints,
			    struct rdma_addrinfo **res)
{
	struct addrinfo ah = { .ai_socktype = SOCK_STREAM }, *ai;
	struct rdma_addrinfo *r;
	int flags = hints ? hints->ai_flags : 0, ret;

	if (!res || (!node && !service && !(flags & RAI_PASSIVE)))
		return cma_err(EINVAL);
	if (flags & ~(RAI_PASSIVE | RAI_NUMERICHOST | RAI_NOROUTE | RAI_FAMILY))
		return cma_err(EINVAL);
	if (hints && hints->ai_family == AF_IB)
		return cma_err(EAFNOSUPPORT);
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
	r = calloc(1, sizeof(*r));
	if (!r) {
		freeaddrinfo(ai);
		return cma_err(ENOMEM);
	}
	r->ai_flags = flags;
	r->ai_family = ai->ai_family;
	r->ai_port_space = hints && hints->ai_port_space ? hints->ai_port_space :
							  RDMA_PS_TCP;
	r->ai_qp_type = hints && hints->ai_qp_type ? hints->ai_qp_type :
		r->ai_port_space == RDMA_PS_UDP || r->ai_port_space == RDMA_PS_IPOIB ?
						    IBV_QPT_UD : IBV_QPT_RC;
	if (flags & RAI_PASSIVE) {
		r->ai_src_len = ai->ai_addrlen;
		r->ai_src_addr = sa_dup(ai->ai_addr, ai->ai_addrlen);
		if (!r->ai_src_addr)
			goto nomem;
	} else {
		r->ai_dst_len = ai->ai_addrlen;
		r->ai_dst_addr = sa_dup(ai->ai_addr, ai->ai_addrlen);
		if (!r->ai_dst_addr)
			goto nomem;
		if (hints && hints->ai_src_addr) {
			r->ai_src_len = sa_size(hints->ai_src_addr);
			if (!r->ai_src_len) {
				freeaddrinfo(ai);
				rdma_freeaddrinfo(r);
				return cma_err(EAFNOSUPPORT);
			}
			r->ai_src_addr = sa_dup(hints->ai_src_addr, r->ai_src_len);
			if (!r->ai_src_addr)
				goto nomem;
		}
	}
	freeaddrinfo(ai);
	*res = r;
	return 0;
nomem:
	freeaddrinfo(ai);
	rdma_freeaddrinfo(r);
	return cma_err(ENOMEM);
}
