/* SPDX-License-Identifier: MIT */
/*
 * What the rsocket tests share: 127.0.0.1 addresses and an errno check.
 */
#ifndef URDMA_RS_TEST_H
#define URDMA_RS_TEST_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>

#include "harness.h"

static inline struct sockaddr_in loop_addr(uint16_t port)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };

	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return sin;
}

/* call must fail (-1) with errno err. */
#define EXPECT_ERR(call, err)                                                        \
	do {                                                                         \
		errno = 0;                                                           \
		long r_ = (long)(call);                                              \
		CHECK(r_ == -1 && errno == (err), #call ": %ld, %s (wanted %s)", r_,  \
		      strerror(errno), strerror(err));                                \
	} while (0)

#endif
