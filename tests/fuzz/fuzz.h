/* SPDX-License-Identifier: MIT */
/* What the fuzz targets share: a failed check, and the replay mains'
 * deterministic random numbers (xorshift64). */
#ifndef URDMA_FUZZ_H
#define URDMA_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_ASSERT(c, ...)                                                  \
	do {                                                                 \
		if (!(c)) {                                                  \
			fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__,   \
				#c);                                         \
			fprintf(stderr, __VA_ARGS__);                        \
			fputc('\n', stderr);                                 \
			abort();                                             \
		}                                                            \
	} while (0)

static inline uint64_t fuzz_xorshift(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

#endif
