// SPDX-License-Identifier: MIT
/*
 * CRC32c: the SSE4.2 crc32 instruction when the CPU has it (three
 * interleaved streams would be faster still; one is about 8 bytes per
 * 3 cycles), otherwise a slice-by-1 table.
 */
#include "transport/tcp/crc32c.h"

#include <string.h>

static uint32_t table[256];

__attribute__((constructor)) static void crc32c_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
		table[i] = c;
	}
}

static uint32_t crc32c_sw(uint32_t crc, const uint8_t *p, size_t len)
{
	while (len--)
		crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t
crc32c_hw(uint32_t crc, const uint8_t *p, size_t len)
{
	uint64_t c = crc;

	while (len && ((uintptr_t)p & 7)) {
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
		len--;
	}
	while (len >= 8) {
		uint64_t v;

		memcpy(&v, p, 8);
		c = __builtin_ia32_crc32di(c, v);
		p += 8;
		len -= 8;
	}
	while (len--)
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
	return (uint32_t)c;
}
#endif

uint32_t urdma_crc32c_update(uint32_t crc, const void *buf, size_t len)
{
#if defined(__x86_64__)
	static int hw = -1;

	if (hw < 0)
		hw = __builtin_cpu_supports("sse4.2");
	if (hw)
		return crc32c_hw(crc, buf, len);
#endif
	return crc32c_sw(crc, buf, len);
}
