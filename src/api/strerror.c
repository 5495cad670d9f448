// SPDX-License-Identifier: MIT
/*
 * liburdma: urdma_strerror, the library's errors in words.  They are
 * negative errno values; the ones the library gives a meaning of its own
 * say so, the rest are strerror's.
 */
#include <errno.h>
#include <string.h>

#include "api/api.h"

API_EXPORT const char *urdma_strerror(int err)
{
	if (err > 0)
		err = -err; /* errno's sign, as strerror takes it */
	switch (err) {
	case 0:
		return "success";
	case -EAGAIN:
		return "no room now (credits, send queue or pool): try after "
		       "an event";
	case -ECONNRESET:
		return "the peer went away without closing";
	case -ECONNREFUSED:
		return "the peer refused the connection";
	case -ETIMEDOUT:
		return "timed out: the peer did not answer";
	case -ECANCELED:
		return "canceled: the connection closed first";
	case -ERANGE:
		return "outside the remote region";
	case -EACCES:
		return "the remote region does not allow this";
	case -EFAULT:
		return "local memory not registered (urdma_reg) nor a pool "
		       "buffer";
	case -EMSGSIZE:
		return "message larger than the buffer size";
	case -EPROTO:
		return "the peer does not speak the urdma API protocol";
	case -ENOBUFS:
		return "out of pool buffers or completion queue room";
	case -EXDEV:
		return "the address is on another RDMA device than the "
		       "context's";
	case -ENOTCONN:
		return "not connected";
	case -EPIPE:
		return "the peer closed the connection";
	default:
		return strerror(-err);
	}
}
