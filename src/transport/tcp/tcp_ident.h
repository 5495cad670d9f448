/* SPDX-License-Identifier: MIT */
/* Who is on the other end of an accepted TCP connection (tcp_ident.c). */
#ifndef URDMA_TCP_IDENT_H
#define URDMA_TCP_IDENT_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>

/* May the connection fd, whose MPA Request claims QP claimed_qpn, join a QP
 * that expects its peer at address expect (local: an address of this
 * host)?  0, or -EADDRNOTAVAIL (another address), -EACCES (a local socket
 * of another user than the claimed QP's listener's), -ENOENT (the kernel
 * could not say: refused), -EPROTO. */
int urdma_tcp_peer_check(int fd, const struct sockaddr_in6 *expect,
			 bool local, uint32_t claimed_qpn);
/* Bind an active side's socket to its GID's address (port 0). */
int urdma_tcp_bind_source(int fd, const uint8_t gid[16]);

#endif
