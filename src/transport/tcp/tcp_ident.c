// SPDX-License-Identifier: MIT
/*
 * Who is on the other end of a TCP connection that a QP accepts: the peer
 * its RTR attributes name, or someone who claims to be it.
 *
 * The MPA Request names the connecting QP; nothing on the wire proves it.
 * What the kernel knows is checked instead:
 *  - the connection comes from the address the QP was given (its RTR
 *    GID, or loopback for a peer addressed by LID, which is on this host;
 *    the active side binds its source to its own GID, tcp_bind_source);
 *  - when that address is this host's, the connecting socket belongs to
 *    the user who owns the listener of the QPN it claims (a QPN names a
 *    listening port, port << 8 | index): sock_diag tells the owner of both.
 *    So another user of this host cannot join a QP by claiming its peer's
 *    number.  A peer on another host is known by its address alone, as on
 *    any RDMA network.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/tcp/tcp_ident.h"
#include "util/log.h"

/*
 * The owner (uid) of the TCP socket that a packet from (dst, dport) to
 * (src, sport) would reach: a connected socket with those ends, else one
 * listening on (src, sport).  -1 if there is none or sock_diag can't say.
 */
static long sock_uid(const struct in6_addr *src, uint16_t sport,
		     const struct in6_addr *dst, uint16_t dport)
{
	struct {
		struct nlmsghdr nh;
		struct inet_diag_req_v2 r;
	} req = {
		.nh = { .nlmsg_len = sizeof(req),
			.nlmsg_type = SOCK_DIAG_BY_FAMILY,
			.nlmsg_flags = NLM_F_REQUEST },
		.r = { .sdiag_family = AF_INET6,
		       .sdiag_protocol = IPPROTO_TCP,
		       .idiag_states = ~0u,
		       .id = { .idiag_sport = htons(sport),
			       .idiag_dport = htons(dport),
			       .idiag_cookie = { INET_DIAG_NOCOOKIE,
						 INET_DIAG_NOCOOKIE } } },
	};
	union {
		struct nlmsghdr nh;
		char buf[1024];
	} ans;
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	long uid = -1;
	ssize_t n;
	int fd;

	memcpy(req.r.id.idiag_src, src, 16);
	memcpy(req.r.id.idiag_dst, dst, 16);
	fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (fd < 0)
		return -1;
	if (sendto(fd, &req, sizeof(req), 0, (struct sockaddr *)&sa,
		   sizeof(sa)) == sizeof(req) &&
	    (n = recv(fd, &ans, sizeof(ans), 0)) > 0 &&
	    NLMSG_OK(&ans.nh, (size_t)n) &&
	    ans.nh.nlmsg_type == SOCK_DIAG_BY_FAMILY &&
	    ans.nh.nlmsg_len >= NLMSG_LENGTH(sizeof(struct inet_diag_msg))) {
		const struct inet_diag_msg *m = NLMSG_DATA(&ans.nh);

		uid = m->idiag_uid;
	}
	close(fd);
	return uid;
}

int urdma_tcp_peer_check(int fd, const struct sockaddr_in6 *expect,
			 bool local, uint32_t claimed_qpn)
{
	struct sockaddr_in6 peer, self;
	socklen_t plen = sizeof(peer), slen = sizeof(self);
	long conn_uid, owner_uid;

	if (getpeername(fd, (struct sockaddr *)&peer, &plen) ||
	    getsockname(fd, (struct sockaddr *)&self, &slen) ||
	    peer.sin6_family != AF_INET6)
		return -EPROTO;
	if (memcmp(&peer.sin6_addr, &expect->sin6_addr, 16))
		return -EADDRNOTAVAIL;
	if (!local)
		return 0;
	/* The connecting socket, seen from its side: its ends swapped. */
	conn_uid = sock_uid(&peer.sin6_addr, ntohs(peer.sin6_port),
			    &self.sin6_addr, ntohs(self.sin6_port));
	/* The listener of the claimed QPN: a "packet" to its port from a
	 * port nothing is connected from finds the listener. */
	owner_uid = sock_uid(&peer.sin6_addr, claimed_qpn >> 8,
			     &self.sin6_addr, 0);
	if (conn_uid < 0 || owner_uid < 0)
		return -ENOENT;
	return conn_uid == owner_uid ? 0 : -EACCES;
}

/* The active side's source: its own GID's address, so that the passive side
 * sees the address it was given (a host with several addresses would
 * otherwise pick one by route). */
int urdma_tcp_bind_source(int fd, const uint8_t gid[16])
{
	struct sockaddr_in6 sa = { .sin6_family = AF_INET6 };

	if (IN6_IS_ADDR_LINKLOCAL((const struct in6_addr *)gid))
		return 0; /* link-local: not reachable over TCP anyway */
	memcpy(&sa.sin6_addr, gid, 16);
	if (IN6_IS_ADDR_UNSPECIFIED(&sa.sin6_addr))
		return 0;
	/* The port is chosen by connect(), from the whole 4-tuple: a bind
	 * to port 0 would search for one no other socket of that address
	 * holds (the kernel's inet_bhash2_conflict was a third of setting up
	 * 8,192 QPs' streams). */
	setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &(int){ 1 },
		   sizeof(int));
	return bind(fd, (struct sockaddr *)&sa, sizeof(sa)) ? -errno : 0;
}
